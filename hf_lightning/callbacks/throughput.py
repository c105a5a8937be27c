"""``Throughput``: tokens/s (real and padded), samples/s, padding share and MFU, logged every few steps.

It costs almost nothing per micro-batch: the counts that need the batch's contents (real tokens, sequences,
attention work) are reductions queued on the device and kept as 0-dim tensors; nothing is read back until a
log step, where the module's own log line syncs anyway. The clock is read only there, after that read-back,
so the interval covers the device work it reports. Time spent in validation is left out.

Definitions, per log interval (all ranks summed):

- ``throughput/tokens_per_s``: real (non-padding) input tokens per second. Padding follows
  :func:`~hf_lightning.core.batch.padding_mask` (``attention_mask == 0``; for packed rows without one, the
  trailing pad tokens whose labels are -100).
- ``throughput/padded_tokens_per_s``: input slots (``B x L``) per second, padding included.
- ``throughput/samples_per_s``: sequences per second: batch rows, or the documents of packed / padding-free
  rows (each starts at ``position_ids == 0``).
- ``throughput/padding_share``: ``1 - real / slots``.
- ``throughput/mfu`` (CUDA only): model FLOPs per second over the device's dense peak for the run's compute
  dtype. Model FLOPs are the PaLM estimate (Chowdhery et al. 2022, appendix B), counted on real tokens:
  ``6 N`` per token (``N``: parameters except the input embedding, whose lookup does no matmul) plus
  ``12 n_layers d_model T`` per token of a sequence of length ``T`` for attention (``12 n_layers d_model sum
  T_i^2`` over a batch's sequences). Padding counts as no useful work, so MFU falls with the padding share.
  The estimate is the decoder-only one: for an encoder-decoder model it counts the encoder's input tokens
  only.
"""

from __future__ import annotations

import logging
import time
from typing import Annotated, Any

import lightning as L
import torch

from hf_lightning.core.arguments import OPTIONAL_POSITIVE, check_call
from hf_lightning.core.batch import Window, padding_mask
from hf_lightning.core.errors import ConfigError

log = logging.getLogger(__name__)

# Dense (no sparsity) tensor-core peaks in FLOP/s for 16-bit matmuls, per device, from NVIDIA's data sheets.
# Matched in order against the lower-cased torch device name. Lightning's own table
# (``lightning.fabric.utilities.throughput``) lists some parts with their 2:4-sparsity figure and does not
# match "NVIDIA H200", hence this one.
DENSE_BF16_PEAK = (
    ("h200 nvl", 835e12),
    ("h200", 989e12),  # also GH200
    ("h100 nvl", 835e12),
    ("h100 pcie", 756e12),
    ("h100", 989e12),  # SXM / HBM3
    ("b200", 2250e12),
    ("a100", 312e12),
    ("l40s", 362e12),
    ("l4", 121e12),
)


def dense_peak_flops(device_name: str) -> float | None:
    """Dense bf16/fp16 peak FLOP/s of a CUDA device named ``device_name`` (``torch.cuda.get_device_name``), or
    ``None`` when it is not in :data:`DENSE_BF16_PEAK`."""
    name = device_name.lower()
    return next((peak for key, peak in DENSE_BF16_PEAK if key in name), None)


def model_flop_constants(model: torch.nn.Module) -> tuple[int, int, int]:
    """``(N, n_layers, d_model)`` for the PaLM estimate: parameters except the input embedding, and the
    config's layer count and width (0 when the config does not say; the attention term is then left out)."""
    embedding = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    skip = {id(p) for p in embedding.parameters()} if isinstance(embedding, torch.nn.Module) else set()
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if isinstance(output, torch.nn.Module):
        skip -= {id(p) for p in output.parameters()}  # a tied head is a matmul: it counts
    n = sum(p.numel() for p in model.parameters() if id(p) not in skip)
    config = getattr(model, "config", None)
    layers = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer", None) or 0
    width = getattr(config, "hidden_size", None) or getattr(config, "n_embd", None) or 0
    return n, int(layers), int(width)


def batch_counts(batch: dict[str, Any], pad_token_id: int | None, squares: bool) -> tuple[Any, int, Any, Any]:
    """``(real tokens, slots, sequences, sum of squared sequence lengths)`` of one batch.

    ``slots`` is a host ``int`` (from the shape), and so is the sequence count of a batch without
    ``position_ids`` (one sequence per row); the others are 0-dim device tensors. The last is ``None`` unless
    ``squares``. Never syncs with the device.

    Raises:
        ConfigError: the batch is not a dict with ``input_ids``.
    """
    ids = batch.get("input_ids") if isinstance(batch, dict) else None
    if ids is None:
        keys = sorted(batch) if isinstance(batch, dict) else type(batch).__name__
        raise ConfigError(
            f"callbacks.throughput counts tokens in input_ids, and a training batch has none ({keys}); "
            "remove the throughput callback for this model"
        )
    slots = ids.numel()
    positions = batch.get("position_ids")
    mask = batch.get("attention_mask")
    if mask is not None and positions is None:
        # the common padded batch: one reduction (a 0/1 mask sums to its real tokens)
        lengths = mask.sum(-1) if squares else None
        return mask.sum(), slots, ids.shape[0], (lengths**2).sum() if squares else None
    real_mask = ~padding_mask(batch, pad_token_id)
    real = real_mask.sum()
    if positions is not None:
        sequences = ((positions == 0) & real_mask).sum()
        sq = ((2 * positions + 1) * real_mask).sum() if squares else None
    else:
        sequences = ids.shape[0]
        sq = (real_mask.sum(-1) ** 2).sum() if squares else None
    return real, slots, sequences, sq


class Throughput(L.Callback):
    """Logs training throughput every ``trainer.log_every_n_steps`` optimizer steps (with
    :class:`~hf_lightning.HFLightningModule`: in each of its train rows, the final one included).

    With :class:`~hf_lightning.HFLightningModule` the figures go into its log row of the step (next to
    ``train/loss``); with any other LightningModule they are written to every logger directly.

    Args:
        pad_token_id: the pad id, to find the padding of packed rows (which carry no ``attention_mask``);
            default: the LightningModule's ``tokenizer.pad_token_id`` if it has one.
        peak_flops: the device's peak FLOP/s for MFU; default: the dense bf16/fp16 figure of
            :data:`DENSE_BF16_PEAK` for a CUDA device in a 16-bit precision. MFU is not logged on the CPU, nor
            for a device or precision without a known peak (said once at INFO).

    Logged (``step`` = optimizer steps done): ``throughput/tokens_per_s``, ``throughput/padded_tokens_per_s``,
    ``throughput/samples_per_s``, ``throughput/padding_share`` and, where it applies, ``throughput/mfu``
    (definitions in the module docstring). Batches must be mappings with ``input_ids``.

    Raises:
        ConfigError: ``peak_flops`` not positive.
    """

    def __init__(
        self, pad_token_id: int | None = None, peak_flops: Annotated[float | None, OPTIONAL_POSITIVE] = None
    ) -> None:
        check_call(Throughput.__init__, locals(), "callbacks.throughput")
        self.pad_token_id = pad_token_id
        self.peak_flops = peak_flops
        self._flops: tuple[int, int, int] | None = None
        self._peak: float | None = None
        self.last_metrics: dict[str, float] = {}
        # the whole training of this fit (all ranks, validation excluded): the done line's real tokens/s
        self.run_real_tokens = 0.0
        self.run_seconds = 0.0
        self._step_seen = 0
        self._t0 = 0.0
        self._reset()

    def _reset(self) -> None:
        # counters: real tokens, slots, sequences, sum of squared lengths. Host ints add up here; device
        # tensors are queued per counter and reduced only at a log step
        self._host = [0, 0, 0, 0]
        self._queued: tuple[list[torch.Tensor], ...] = ([], [], [], [])
        self._excluded = 0.0
        self._val_start: float | None = None

    # ------------------------------------------------------------------------------------------ setup
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.pad_token_id is None:
            self.pad_token_id = getattr(getattr(pl_module, "tokenizer", None), "pad_token_id", None)
        device = trainer.strategy.root_device
        self._peak = self.peak_flops
        dtype = _precision_dtype(trainer.precision)
        if self._peak is None and device.type == "cuda":
            if dtype in (torch.bfloat16, torch.float16):
                self._peak = dense_peak_flops(torch.cuda.get_device_name(device))
                if self._peak is None:
                    log.info(
                        "Throughput: no dense peak known for %s; pass peak_flops to log MFU",
                        torch.cuda.get_device_name(device),
                    )
            else:
                log.info(
                    "Throughput: MFU is logged for 16-bit precisions only (this run: %s)", trainer.precision
                )
        model = getattr(pl_module, "model", pl_module)
        self._flops = model_flop_constants(model) if self._peak else None
        self._trainer = trainer
        self._reset()
        restored, self._restored = getattr(self, "_restored", None), None
        self.run_real_tokens, self.run_seconds = 0.0, 0.0
        if restored and trainer.is_global_zero:  # the sums over ranks: counted once, on rank 0
            self._host = [int(v) for v in restored]
            self.run_real_tokens = -float(restored[0])  # trained before the stop: not this fit's tokens
        self._step_seen = trainer.global_step
        self._t0 = time.perf_counter()

    # ------------------------------------------------------------------------------------- per batch
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        # a training batch is one micro-batch, or a window of them (HFLightningModule)
        for micro in batch if isinstance(batch, Window) else (batch,):
            for i, value in enumerate(batch_counts(micro, self.pad_token_id, self._flops is not None)):
                if isinstance(value, torch.Tensor):
                    self._queued[i].append(value)
                elif value is not None:
                    self._host[i] += value

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._val_start = time.perf_counter()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._val_start is not None:
            self._excluded += time.perf_counter() - self._val_start
            self._val_start = None

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step
        if step == self._step_seen:
            return  # still accumulating
        self._step_seen = step
        # HFLightningModule's rule for its train rows (every log_every_n_steps, the first step with
        # logging_first_step, the last one at max_steps): the figures go into each of its rows
        log_step = getattr(pl_module, "is_log_step", None)
        if log_step(step) if callable(log_step) else step % max(trainer.log_every_n_steps, 1) == 0:
            self._flush(trainer)

    # ------------------------------------------------------------------------------------------ state
    def _totals(self, trainer: L.Trainer) -> torch.Tensor:
        """The four counters since the last flush, summed over ranks (a collective under DDP), float64."""
        device = trainer.strategy.root_device
        zero = torch.zeros((), dtype=torch.float64, device=device)
        queued = torch.stack([torch.stack(q).to(torch.float64).sum() if q else zero for q in self._queued])
        totals = queued + torch.tensor(self._host, dtype=torch.float64, device=device)
        if trainer.world_size > 1:
            totals = trainer.strategy.reduce(totals, reduce_op="sum")
        return totals

    def state_dict(self) -> dict[str, Any]:
        # the counts since the last row go into the checkpoint, so that the next row after a resume covers the
        # same batches as in a run that never stopped (its padding_share is exact; its rates cover the resumed
        # part only). Lightning collects callback states on every rank, so the sum over ranks can be taken
        # here
        trainer = getattr(self, "_trainer", None)
        counts = self._totals(trainer).cpu().tolist() if trainer is not None and trainer.training else None
        return {"counts_since_log": counts}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._restored = state.get("counts_since_log")

    # ------------------------------------------------------------------------------------------ flush
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """The counts since the last log step join the run totals; with a final ``train/loss`` row due (the
        run ended between log steps), their rates go into it. A stopped run keeps them for its resume's next
        row."""
        if getattr(self, "_trainer", None) is None:
            return  # the training loop never started (a resume at the run's end)
        if getattr(pl_module, "has_pending_train_log", False) and not getattr(pl_module, "preempted", None):
            # HFLightningModule writes a final row for the steps since the last log step (its hook runs
            # next): the rates of those steps go into it, as into every other row
            self._flush(trainer)
            return
        real = float(self._totals(trainer)[0])
        self.run_real_tokens += real
        self.run_seconds += max(time.perf_counter() - self._t0 - self._excluded, 0.0)
        self._t0, self._excluded = time.perf_counter(), 0.0

    def run_tokens_per_s(self) -> float | None:
        """Real tokens per second over this fit's training (all ranks, validation excluded): the definition of
        ``throughput/tokens_per_s``, over the whole run instead of one log interval. ``None`` before any."""
        return self.run_real_tokens / self.run_seconds if self.run_seconds > 0 else None

    def _flush(self, trainer: L.Trainer) -> None:
        real, slots, sequences, squares = self._totals(trainer).tolist()  # the one read-back of the interval
        now = time.perf_counter()
        elapsed = now - self._t0 - self._excluded
        self.run_real_tokens += real
        self.run_seconds += max(elapsed, 0.0)
        self._reset()
        self._t0 = now
        if elapsed <= 0 or slots == 0:
            return
        metrics = {
            "throughput/tokens_per_s": real / elapsed,
            "throughput/padded_tokens_per_s": slots / elapsed,
            "throughput/samples_per_s": sequences / elapsed,
            "throughput/padding_share": 1.0 - real / slots,
        }
        if self._flops is not None and self._peak:
            n, layers, width = self._flops
            flops = 6.0 * n * real + 12.0 * layers * width * squares
            metrics["throughput/mfu"] = flops / elapsed / (self._peak * trainer.world_size)
        self.last_metrics = metrics
        add = getattr(trainer.lightning_module, "add_train_metrics", None)
        if callable(add):
            add(metrics)  # HFLightningModule writes them into its log row of this step (its hook runs next)
            return
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)


def _precision_dtype(precision: Any) -> torch.dtype | None:
    text = str(precision)
    if text.startswith("bf16"):
        return torch.bfloat16
    if text.startswith("16"):
        return torch.float16
    return None
