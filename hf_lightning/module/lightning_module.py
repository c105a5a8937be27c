"""``HFLightningModule``: HF-style models trained with HF's loss semantics under Lightning."""

from __future__ import annotations

import inspect
import logging
import math
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import lightning as L
import torch
from torch import nn

from hf_lightning.batch import MICRO_ITEMS_KEY, NUM_ITEMS_KEY, WINDOW_KEYS, WINDOW_LENGTH_KEY
from hf_lightning.data.describe import padding_mask
from hf_lightning.data.placeholder import PLACEHOLDER_KEY
from hf_lightning.errors import ConfigError, ModelError
from hf_lightning.module.eval_steps import EvalStepsMixin
from hf_lightning.module.grad_norm import StepGradNorm
from hf_lightning.module.lean_loss import LeanLoss, arguments_reason, strategy_reason
from hf_lightning.module.loss import (
    IGNORE_INDEX,
    accepts_num_items,
    count_loss_items,
    declares_num_items_support,
    loss_shifts_labels,
    loss_targets,
    token_cross_entropy_sum,
)
from hf_lightning.module.optim import build_optimizer, build_scheduler
from hf_lightning.module.run_plan import plan_run
from hf_lightning.module.run_plan import report as report_plan
from hf_lightning.module.train_log import TrainLogState

log = logging.getLogger(__name__)

# HFLightningModule overrides transfer_batch_to_device (a fast path for flat dict batches); Lightning then
# warns on every fit with a DataModule that the module's implementation is used, which is the intent
warnings.filterwarnings(
    "ignore",
    message="You have overridden `transfer_batch_to_device` in `LightningModule` but have passed in a",
)
# Lightning's own batch flattening calls a torch pytree API deprecated in newer torch, once per fit: nothing a
# user can act on (Lightning's to fix)
warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")
# Lightning counts log_every_n_steps within an epoch; HFLightningModule logs every n optimizer steps across
# epochs (HF's logging_steps), so Lightning's warning that short epochs log nothing is wrong here
warnings.filterwarnings(
    "ignore", message=r"The number of training batches \(\d+\) is smaller than the logging interval"
)

NON_MODEL_KEYS = ("labels", "shift_labels", *WINDOW_KEYS, PLACEHOLDER_KEY)

Count = int | torch.Tensor


class HFLightningModule(TrainLogState, EvalStepsMixin, L.LightningModule):
    """Train and evaluate any HF-style model (``forward(**batch)`` returning ``.logits``).

    What it reproduces of HF ``Trainer``: ``training_step`` / ``compute_loss`` with the window count of
    ``get_batch_samples`` (the loss below), ``create_optimizer`` (``get_decay_parameter_names`` groups) and
    ``create_scheduler`` (``get_scheduler``) through :mod:`~hf_lightning.module.optim`, ``evaluation_loop`` /
    ``prediction_step`` for ``compute_metrics``, and ``model.train()`` before training (a model loaded with
    ``from_pretrained`` arrives in eval mode; dropout is on while training, off while evaluating). Losses are
    in nats per target token.

    The loss of one optimizer step is HF's: the sum of the loss terms over every micro-batch of the
    gradient-accumulation window divided by ``num_items_in_batch``, the window's number of targets (summed
    across data-parallel ranks). It does not depend on how the window is split into micro-batches or ranks.

    Where the loss comes from, first match wins:

    1. a subclass overriding :meth:`compute_loss`;
    2. ``compute_loss_func(outputs, labels, num_items_in_batch)``, HF's ``Trainer`` argument;
    3. the model's own ``outputs.loss`` when ``use_model_loss`` (by default: when the model is *declared* to
       honour ``num_items_in_batch``);
    4. otherwise the token cross-entropy computed here from the logits
       (:func:`~hf_lightning.module.loss.token_cross_entropy_sum`, label-smoothed as HF's ``LabelSmoother``
       when ``label_smoothing_factor > 0``). This is the default for every ``transformers`` model. For a causal
       LM whose head ``get_output_embeddings()`` reaches, it is computed without the ``(tokens x vocab)`` logits
       (``lean_loss``, :mod:`~hf_lightning.module.lean_loss`): the same loss and gradients, a fraction of the
       memory.

    "Declared" means ``model_accepts_loss_kwargs=True`` here, or an ``accepts_loss_kwargs = True`` attribute on
    the model. Unlike HF ``Trainer`` we never infer it from a bare ``**kwargs`` in ``forward``: a model that
    swallows the keyword and still averages per micro-batch would get gradients inflated by accumulation x
    world size. A loss that does not take the count (the model's loss of an undeclared model, a
    ``compute_loss_func`` without a ``num_items_in_batch`` parameter, or a subclass that sets
    ``loss_is_scaled_for_ga = False``) is HF's fallback: a mean per micro-batch, divided by the number of
    micro-batches in the window; one warning says so, since it weights targets unequally.

    Lightning's automatic optimization divides the returned loss by ``accumulate_grad_batches`` and DDP averages
    gradients over ranks; ``training_step`` returns ``loss * accumulate_grad_batches * world_size`` (the world
    size factor only when the count is summed across ranks) so that the applied gradient is exactly
    d(window loss)/dθ. Lightning already skips DDP's gradient all-reduce on all but the last micro-batch of a
    window (``no_sync``).

    Args:
        model: an ``nn.Module`` whose ``forward(**batch)`` returns an object with ``.logits`` ``(B, L, V)``
            (or ``(B, C)`` for sequence classification).
        tokenizer: saved next to the model by the export callback (optional).
        optim: keyword arguments of :func:`~hf_lightning.module.optim.build_optimizer` (``name``, ``lr``, ...).
        scheduler: keyword arguments of :func:`~hf_lightning.module.optim.build_scheduler` (``name``,
            ``warmup_steps``, ``warmup_ratio``).
        average_tokens_across_devices: sum the target count across ranks (HF's default, exact); ``False``
            normalises by each rank's own count (biased when ranks hold different numbers of targets).
        compute_loss_func: ``(outputs, labels, num_items_in_batch) -> 0-dim loss``, as HF ``Trainer``'s
            argument: ``outputs`` from ``model(**inputs)`` without labels, ``labels`` ``(B, L)`` int64, and
            ``num_items_in_batch`` an ``int`` (one process) or 0-dim int64 tensor (summed across ranks), never 0.
            It must return the micro-batch's *share*: a sum over its items divided by ``num_items_in_batch``.
        use_model_loss: use ``model(**inputs, labels=...).loss``. ``None``: only when the model is declared to
            honour ``num_items_in_batch`` (see above) and no label smoothing is asked for.
        model_accepts_loss_kwargs: declare that the model's ``forward`` divides its summed loss by a
            ``num_items_in_batch`` keyword (HF's attribute name). ``None``: read ``model.accepts_loss_kwargs``.
        label_smoothing_factor: HF's ``TrainingArguments.label_smoothing_factor`` for the built-in loss, in [0, 1).
        causal: the labels are aligned for a causal LM (shifted by one). ``None``: HF's rule
            (:func:`~hf_lightning.module.loss.loss_shifts_labels`).
        compute_metrics: HF-style ``compute_metrics(EvalPrediction) -> dict`` over the whole evaluation set
            (numpy arrays padded with -100, in dataset order); its keys are logged as ``val/<key>``.
        preprocess_logits_for_metrics: HF-style ``(logits, labels) -> preds`` applied per batch before
            anything is kept (e.g. ``argmax``), so memory holds predictions, not logits.
        eval_accumulation_steps: move collected predictions to the CPU every this many batches (HF's).
        batch_eval_metrics: call ``compute_metrics(EvalPrediction, compute_result=is_last_batch)`` per batch
            instead of once (HF's); the last call's result is logged.
        lean_loss: compute the built-in token loss (and ``val/loss``, ``val/accuracy``) from the final hidden
            states and the LM head in chunks of tokens, never holding the ``(tokens x vocab)`` logits
            (:class:`~hf_lightning.module.lean_loss.LeanLoss`). It falls back to the logits, with one INFO line
            saying why, for a model it cannot handle, a ``compute_loss_func``, the model's own loss, a strategy
            that shards parameters (FSDP, DeepSpeed), and in evaluation for ``compute_metrics``. With it,
            ``compute_loss`` returns outputs whose ``logits`` is ``None``.

    Raises:
        ConfigError: conflicting or out-of-range loss arguments (named).

    Logged (x-axis ``step`` = optimizer steps done, as HF): ``train/loss`` (mean of the window losses since
    the last log, averaged over ranks: HF's ``loss``), ``lr`` (the rate used in that step), ``grad_norm``
    (before clipping; computed for the logged steps only, so a run stopped between two log steps, e.g. by early
    stopping, has no ``grad_norm`` in its last row); ``val/loss`` (token-weighted mean over the whole validation
    set), ``val/perplexity``, ``val/accuracy`` (see :class:`~hf_lightning.module.eval_steps.EvalStepsMixin`).
    """

    # HF's logging_first_step: a train/loss row after the first optimizer step too (set by HFSteps)
    logging_first_step: bool = False
    # the run's optimizer steps, known once configure_optimizers has run
    planned_steps: int | None = None

    #: HF ``Trainer``'s attribute: whether :meth:`compute_loss` returns a share of the window loss (``True``)
    #: or a per-micro-batch mean (``False``, HF's fallback). ``None``: decided from the loss source; a
    #: subclass overriding :meth:`compute_loss` counts as ``True`` unless it sets this.
    loss_is_scaled_for_ga: bool | None = None
    #: an evaluation rank with no example gets a marked placeholder batch (:mod:`hf_lightning.data.placeholder`)
    handles_placeholder_batches: bool = True

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any = None,
        optim: Mapping[str, Any] | None = None,
        scheduler: Mapping[str, Any] | None = None,
        average_tokens_across_devices: bool = True,
        compute_loss_func: Callable[..., torch.Tensor] | None = None,
        use_model_loss: bool | None = None,
        model_accepts_loss_kwargs: bool | None = None,
        label_smoothing_factor: float = 0.0,
        causal: bool | None = None,
        compute_metrics: Callable[..., Mapping[str, float]] | None = None,
        preprocess_logits_for_metrics: Callable[[torch.Tensor, torch.Tensor], Any] | None = None,
        eval_accumulation_steps: int | None = None,
        batch_eval_metrics: bool = False,
        lean_loss: bool = True,
    ) -> None:
        super().__init__()
        if not 0.0 <= label_smoothing_factor < 1.0:
            raise ConfigError(
                f"module.label_smoothing_factor must be in [0, 1), got {label_smoothing_factor!r}"
            )
        if compute_loss_func is not None and not callable(compute_loss_func):
            raise ConfigError(f"module.compute_loss_func must be callable, got {compute_loss_func!r}")
        if compute_loss_func is not None and use_model_loss:
            raise ConfigError(
                "module.compute_loss_func and module.use_model_loss=true both define the loss; pick one"
            )
        if label_smoothing_factor and (compute_loss_func is not None or use_model_loss):
            # HF ignores label smoothing silently in these cases; a silent no-op is a bug here
            raise ConfigError(
                "module.label_smoothing_factor applies to the built-in token loss only; it cannot be combined "
                "with module.compute_loss_func or module.use_model_loss=true"
            )
        self.model = model
        self.tokenizer = tokenizer
        self.optim = dict(optim or {})
        self.scheduler = dict(scheduler or {})
        self.average_tokens_across_devices = average_tokens_across_devices
        self.compute_loss_func = compute_loss_func
        self.label_smoothing_factor = float(label_smoothing_factor)
        self.model_accepts_loss_kwargs = (
            declares_num_items_support(model)
            if model_accepts_loss_kwargs is None
            else bool(model_accepts_loss_kwargs)
        )
        if use_model_loss is None:
            use_model_loss = (
                self.model_accepts_loss_kwargs and compute_loss_func is None and not label_smoothing_factor
            )
        self.use_model_loss = bool(use_model_loss)
        self.causal = loss_shifts_labels(model) if causal is None else bool(causal)
        config = getattr(model, "config", None)
        self._encoder_decoder = bool(getattr(config, "is_encoder_decoder", False))
        # inspected once: the forward signature decides whether use_cache can be turned off
        params = inspect.signature(model.forward).parameters
        self._forward_extra = {"use_cache": False} if "use_cache" in params else {}
        self._loss_scaled, self._fallback_reason = self._resolve_loss_scaling()
        decoder_only = self.causal and not self._encoder_decoder
        self.lean = LeanLoss(model, arguments_reason(lean_loss, self.loss_source, decoder_only))
        self._init_evaluation(
            compute_metrics, preprocess_logits_for_metrics, eval_accumulation_steps, batch_eval_metrics
        )
        self._window: tuple[int, int] | None = None
        self._window_count: Count | None = None
        self._window_loss: torch.Tensor | None = None
        self._loss_since_log: list[torch.Tensor] = []
        self._unchecked_counts: list[tuple[int, torch.Tensor]] = []
        self._last_lr: float | None = None
        self._last_grad_norm: torch.Tensor | None = None
        self._grad_norm = StepGradNorm()
        self._extra_train_metrics: dict[str, float] = {}
        self._bar_loss: float | None = None
        #: the newest value of every metric written to the loggers (``final_metrics.json`` is built from it)
        self.last_logged: dict[str, float] = {}
        self._steps_seen = 0
        self._step_epoch: int | None = None
        #: the optimizer step this process's fit started from (``None``: training never started, e.g. a resume
        #: of a run that had already reached its end)
        self.fit_start_step: int | None = None
        self.tokens_seen = torch.zeros((), dtype=torch.long)
        self._warned_unwrapped = False

    @property
    def loss_source(self) -> str:
        """``"compute_loss"`` (a subclass override), ``"compute_loss_func"``, ``"model"`` or ``"token_cross_entropy"``."""
        if type(self).compute_loss is not HFLightningModule.compute_loss:
            return "compute_loss"
        if self.compute_loss_func is not None:
            return "compute_loss_func"
        return "model" if self.use_model_loss else "token_cross_entropy"

    def _resolve_loss_scaling(self) -> tuple[bool, str | None]:
        """``(scaled, why not)``: does :meth:`compute_loss` return a share of the window loss?"""
        source = self.loss_source
        if self.loss_is_scaled_for_ga is not None:
            scaled = bool(self.loss_is_scaled_for_ga)
            return scaled, None if scaled else f"{type(self).__name__}.loss_is_scaled_for_ga is False"
        if source == "compute_loss_func" and not accepts_num_items(self.compute_loss_func):
            return False, "compute_loss_func has no num_items_in_batch parameter"
        if source == "model" and not self.model_accepts_loss_kwargs:
            return False, (
                f"use_model_loss=True but {type(self.model).__name__} is not declared to honour "
                "num_items_in_batch (model_accepts_loss_kwargs / accepts_loss_kwargs)"
            )
        return True, None

    def _say_lean(self) -> None:
        """The lean loss's INFO line, when its state changed (rank zero). ``_trainer`` is Lightning's private
        attribute: the public property raises for a module used without a ``Trainer``."""
        self.lean.say(self._trainer is None or self.trainer.is_global_zero)

    def on_fit_start(self) -> None:
        if self._fallback_reason is not None and self.trainer.is_global_zero:
            log.warning(
                "%s: the loss is a mean over each micro-batch, so, as HF Trainer does, each micro-batch mean is "
                "divided by the number of micro-batches in its accumulation window. This weights the targets of a "
                "micro-batch with few targets more than those of a full one: the loss and gradient change with "
                "the micro-batch size, accumulate_grad_batches and the number of ranks. For the exact token mean, "
                "take num_items_in_batch and return sum / num_items_in_batch (or use the built-in token loss).",
                self._fallback_reason,
            )

    # ------------------------------------------------------------------------------------------ loss
    def count_loss_items(self, batch: Mapping[str, Any]) -> int:
        """Targets in one micro-batch (host side); the DataModule sums it over a window."""
        return count_loss_items(batch, causal=self.causal)

    def _model_inputs(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        inputs = {k: v for k, v in batch.items() if k not in NON_MODEL_KEYS}
        if (
            self._encoder_decoder
            and "decoder_input_ids" not in inputs
            and batch.get("labels") is not None
            and hasattr(self.model, "prepare_decoder_input_ids_from_labels")
        ):
            # the decoder is fed the labels shifted right, as the model does itself when given labels
            inputs["decoder_input_ids"] = self.model.prepare_decoder_input_ids_from_labels(
                labels=batch["labels"]
            )
        return inputs

    def forward(self, batch: Mapping[str, Any]) -> Any:
        """``model(**inputs)`` without the labels and the window keys, with ``use_cache=False`` when the model
        takes it (no KV cache in training, which packed batches need); the model's output (``.logits``
        ``(B, L, V)``, or ``(B, C)`` for classification)."""
        return self.model(**self._model_inputs(batch), **self._forward_extra)

    def compute_loss(
        self, batch: Mapping[str, Any], num_items_in_batch: Count | None
    ) -> tuple[torch.Tensor, Any]:
        """``(loss, model outputs)`` for one micro-batch.

        Args:
            batch: the collated micro-batch (``labels`` ``(B, L)`` or ``(B,)``; the window keys of
                :mod:`hf_lightning.data.windows` are never passed to the model).
            num_items_in_batch: the window's target count (``int``, or a 0-dim int64 tensor when summed across
                ranks), at least 1; ``None`` when the batches carry no count (HF: "not counted") or the loss is
                HF's fallback (``loss_is_scaled_for_ga`` resolved to ``False``): the loss is then a mean over
                this micro-batch, which ``training_step`` divides by the window length.

        Returns:
            The micro-batch's share of the window loss (a sum over its items divided by ``num_items_in_batch``)
            as a 0-dim float tensor, and the model outputs. An override must return the same (or set
            ``loss_is_scaled_for_ga = False`` and return a per-micro-batch mean) for the step to stay exact.
        """
        if self.compute_loss_func is not None:
            outputs = self(batch)
            if not self._loss_scaled:
                return self.compute_loss_func(outputs, batch.get("labels")), outputs
            return self.compute_loss_func(
                outputs, batch.get("labels"), num_items_in_batch=num_items_in_batch
            ), outputs
        if self.use_model_loss:
            return self._model_loss(batch, num_items_in_batch)
        labels = batch["labels"]
        if labels.is_floating_point():
            raise ConfigError(
                "labels are floating point (regression or multi-label): the built-in token cross-entropy needs "
                "integer class ids; set module.use_model_loss=true or pass module.compute_loss_func"
            )
        loss_sum, outputs = self._token_loss_sum(batch, labels)
        if num_items_in_batch is None:
            # HF's "not counted" path: this micro-batch's own targets, counted on the device (no sync)
            targets = loss_targets(labels, self.causal, batch.get("shift_labels"))
            num_items_in_batch = (targets != IGNORE_INDEX).sum().clamp(min=1)
        return loss_sum / num_items_in_batch, outputs

    def _token_loss_sum(self, batch: Mapping[str, Any], labels: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """The summed token CE of the micro-batch and the model outputs: lean when it can be, else from the logits."""
        if self.lean.active:
            targets = loss_targets(labels, self.causal, batch.get("shift_labels"))
            lean = self.lean.forward(lambda: self(batch), targets.shape)
            if lean is not None:
                # the window loader's count of this micro-batch lets the head skip the non-target rows without a
                # host-device sync; it counts the targets when count_loss_items is ours
                own_count = type(self).count_loss_items is HFLightningModule.count_loss_items
                count = batch.get(MICRO_ITEMS_KEY) if own_count else None
                return self.lean.loss_sum(lean[1], targets, self.label_smoothing_factor, count), lean[0]
            self._say_lean()  # the model did not fit: say why
        outputs = self(batch)
        loss_sum = token_cross_entropy_sum(
            _logits(outputs),
            labels,
            causal=self.causal,
            shift_labels=batch.get("shift_labels"),
            label_smoothing=self.label_smoothing_factor,
        )
        return loss_sum, outputs

    def _model_loss(
        self, batch: Mapping[str, Any], num_items_in_batch: Count | None
    ) -> tuple[torch.Tensor, Any]:
        inputs = self._model_inputs(batch)
        inputs["labels"] = batch["labels"]
        if self.model_accepts_loss_kwargs:
            if "shift_labels" in batch:
                inputs["shift_labels"] = batch["shift_labels"]
            if num_items_in_batch is not None:
                inputs["num_items_in_batch"] = num_items_in_batch
        outputs = self.model(**inputs, **self._forward_extra)
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs[0]
        if loss is None or not isinstance(loss, torch.Tensor) or loss.dim() != 0:
            raise ModelError(
                f"use_model_loss=True but {type(self.model).__name__}(labels=...) returned no scalar loss; "
                "leave module.use_model_loss unset to use the built-in token loss"
            )
        return loss, outputs

    def _global_window_count(self, batch: Mapping[str, Any], batch_idx: int) -> Count | None:
        """The window's target count: a host ``int``, or a 0-dim tensor summed across ranks (one collective per
        window). ``None`` when the batch carries no count (not an :class:`~hf_lightning.HFDataModule` loader)."""
        if NUM_ITEMS_KEY not in batch:
            if not self._warned_unwrapped:
                log.warning(
                    "training batches carry no num_items_in_batch (the train dataloader is not an "
                    "HFDataModule one, nor wrapped in hf_lightning.data.windows.AccumulationWindowLoader): each "
                    "micro-batch is normalised by its own count and divided by the window length, HF's fallback, "
                    "which weights targets unequally"
                )
                self._warned_unwrapped = True
            return None
        window = (self.current_epoch, batch_idx // self.trainer.accumulate_grad_batches)
        if window != self._window:
            self._window = window
            local = int(batch[NUM_ITEMS_KEY])
            world = self.trainer.world_size
            if self.average_tokens_across_devices and world > 1:
                count = self.trainer.strategy.reduce(torch.tensor(local, device=self.device), reduce_op="sum")
                # checked for zero at the next log, where a sync happens anyway
                self._unchecked_counts.append((self.global_step + 1, count))
                self._window_count = count.clamp(min=1)
            else:
                if local == 0:
                    self._warn_empty_window(
                        self.global_step + 1, rank=self.global_rank if world > 1 else None
                    )
                self._window_count = max(local, 1)
        return self._window_count

    def _warn_empty_window(self, step: int, rank: int | None = None) -> None:
        where = "on any rank" if rank is None else f"on rank {rank}"
        log.warning(
            "optimizer step %d: its accumulation window has no label targets %s (every label is -100): its loss is "
            "0 and its gradient zero (the optimizer still steps, so weight decay and momentum still move weights)",
            step,
            where,
        )

    def _window_length(self, batch: Mapping[str, Any], batch_idx: int) -> int:
        """Micro-batches in this batch's window: HF's ``current_gradient_accumulation_steps``."""
        if WINDOW_LENGTH_KEY in batch:
            return int(batch[WINDOW_LENGTH_KEY])
        k = self.trainer.accumulate_grad_batches
        total = self.trainer.num_training_batches
        start = batch_idx // k * k
        return k if not math.isfinite(total) else int(min(k, total - start))

    # -------------------------------------------------------------------------------------- training
    def training_step(self, batch: Mapping[str, Any], batch_idx: int) -> torch.Tensor:
        count = self._global_window_count(batch, batch_idx)
        scaled = self._loss_scaled and count is not None
        if not scaled and batch.get(MICRO_ITEMS_KEY) == 0:
            # a mean over no targets is NaN (HF's fallback would poison the weights); this micro-batch adds 0
            outputs = self(batch)
            loss = _logits(outputs).sum() * 0.0
        else:
            loss, _ = self.compute_loss(batch, count if scaled else None)
        k = self.trainer.accumulate_grad_batches
        world = self.trainer.world_size
        if scaled:
            # the share was divided by the count of all ranks: undo DDP's mean over ranks, and log it the same
            # way so that the mean over ranks at log time is the window loss (HF's compute_loss does the same)
            rank_factor = world if self.average_tokens_across_devices else 1
        else:
            loss = loss / self._window_length(batch, batch_idx)
            rank_factor = 1
        detached = loss.detach() * rank_factor
        self._window_loss = detached if self._window_loss is None else self._window_loss + detached
        if "input_ids" in batch:
            # real tokens as the throughput figures define them (data.describe.padding_mask): padded batches by
            # their attention_mask, packed and padding-free rows (which carry none) by their trailing pad run
            real = (~padding_mask(batch, getattr(self.tokenizer, "pad_token_id", None))).sum()
            self.tokens_seen = self.tokens_seen.to(self.device) + real
        # Lightning divides by k (always k, even for a shorter last window): cancel it
        return loss * (k * rank_factor)

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        """A flat ``dict`` batch (every :class:`~hf_lightning.HFDataModule` batch) moves in one comprehension.

        Lightning's default walks the batch with ``apply_to_collection``, whose fast path needs a dict of
        tensors only; the window counts (``int``) send every batch down its slow path (ABC ``isinstance``
        checks per value, per micro-batch). Any other batch type keeps Lightning's behaviour.
        """
        if type(batch) is not dict:
            return super().transfer_batch_to_device(batch, device, dataloader_idx)
        # as Lightning: non-blocking copies except to the CPU / MPS (blocking device types)
        non_blocking = device.type not in ("cpu", "mps")
        return {
            k: v.to(device, non_blocking=non_blocking) if isinstance(v, torch.Tensor) else v
            for k, v in batch.items()
        }

    def _is_log_step(self, step: int) -> bool:
        """Whether the train logs are flushed after optimizer step ``step`` (1-based)."""
        trainer = self.trainer
        if step == 1 and self.logging_first_step:
            return True
        return step % max(trainer.log_every_n_steps, 1) == 0 or step >= trainer.max_steps > 0

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        self._last_lr = optimizer.param_groups[0]["lr"]
        # the norm is read only by the log line of this step (or the final flush after the last step of an
        # epoch): a pass over every gradient on the other steps would be wasted work
        if (
            self._is_log_step(self.global_step + 1)
            or self.trainer.fit_loop.epoch_loop.batch_progress.is_last_batch
        ):
            self._last_grad_norm = self.step_gradient_norm(optimizer)
        else:
            self._last_grad_norm = None

    def step_gradient_norm(self, optimizer: torch.optim.Optimizer) -> torch.Tensor | None:
        """The total gradient 2-norm of the optimizer step being taken (before clipping; 0-dim float tensor on
        the gradients' device, no host sync), computed once per step and shared by the ``grad_norm`` log column,
        norm clipping and :class:`~hf_lightning.callbacks.NonFiniteGuard` (:mod:`hf_lightning.module.grad_norm`).
        ``None`` without gradients or under DeepSpeed. Valid between ``backward`` and ``optimizer.step``."""
        return self._grad_norm.get(self.trainer, optimizer)

    def configure_gradient_clipping(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        """Norm clipping with the step's shared norm (``clip_grad_norm_``'s result, one pass fewer); under FSDP
        through the root module's ``clip_grad_norm_``. Value clipping and the cases the shared norm cannot serve
        keep Lightning's ``clip_gradients``."""
        by_norm = gradient_clip_algorithm is None or gradient_clip_algorithm == "norm"
        if (
            gradient_clip_val
            and by_norm
            and self._grad_norm.clip(self.trainer, optimizer, float(gradient_clip_val))
        ):
            return
        super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)

    def on_train_start(self) -> None:
        self._steps_seen = self.global_step  # a resumed run starts at its checkpoint's step
        self.fit_start_step = self.global_step
        self._grad_norm.reset()

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if (
            self.global_step != self._steps_seen
        ):  # else still accumulating, or a checkpoint already ended the step
            self._end_step()
        if self._bar_loss is not None:  # the progress bar shows the newest row (self.log: not from a save)
            self.log("train/loss", self._bar_loss, prog_bar=True, logger=False, on_step=True, on_epoch=False)
            self._bar_loss = None

    def _end_step(self) -> None:
        """The bookkeeping of a finished optimizer step: its window loss joins the next row; a log step writes it."""
        self._steps_seen = self.global_step
        # the epoch of the step's batches: by the final flush (on_train_end) Lightning has already counted the
        # epoch a stop or the last batch ended, and the row would show the next one
        self._step_epoch = self.current_epoch
        self._grad_norm.reset()
        if self._window_loss is not None:
            self._loss_since_log.append(self._window_loss)
        self._window_loss = None
        if self._is_log_step(self.global_step):
            self._flush_train_logs()

    def setup(self, stage: str) -> None:
        reason = strategy_reason(self.trainer.strategy)
        if self.lean.active and reason is not None:
            self.lean.turn_off(reason)
        self._say_lean()
        if stage == "fit":
            # HF Trainer calls model.train() before its loop. from_pretrained returns the model in eval mode and
            # Lightning (>= 2.2) keeps each submodule's mode, so without this dropout would silently stay off.
            # Here rather than in on_train_start, so that the model summary and Lightning's mode check agree
            self.model.train()

    def on_train_end(self) -> None:
        if getattr(self, "preempted", None):
            return  # stopped on a signal: the losses since the last row are in last.ckpt, the resume goes on
        self._flush_train_logs(progress_bar=False)  # the steps since the last log boundary

    def _flush_train_logs(self, progress_bar: bool = True) -> None:
        if self._unchecked_counts:
            steps = [s for s, c in self._unchecked_counts]
            counts = torch.stack([c for s, c in self._unchecked_counts]).tolist()
            self._unchecked_counts = []
            if self.trainer.is_global_zero:
                for step, n in zip(steps, counts):
                    if n == 0:
                        self._warn_empty_window(step)
        if not self._loss_since_log:
            return
        loss = torch.stack(self._loss_since_log).mean()
        self._loss_since_log = []
        if self.trainer.world_size > 1:
            # training_step logs each rank's share times world size: the mean over ranks is the window loss
            loss = self.trainer.strategy.reduce(loss, reduce_op="mean")
        metrics = {"train/loss": loss.item(), "lr": self._last_lr}
        if self._last_grad_norm is not None:
            metrics["grad_norm"] = self._last_grad_norm.item()
        metrics["epoch"] = self._step_epoch if self._step_epoch is not None else self.current_epoch
        metrics.update(self._extra_train_metrics)
        self._extra_train_metrics = {}
        if progress_bar:
            self._bar_loss = metrics["train/loss"]
        self._log_to_loggers(metrics)

    def add_train_metrics(self, metrics: Mapping[str, float]) -> None:
        """Add ``metrics`` (host floats) to the next train log row, so that a callback's figures for a step share
        the row of ``train/loss`` (e.g. :class:`~hf_lightning.callbacks.Throughput`)."""
        self._extra_train_metrics.update(metrics)

    def _log_to_loggers(self, metrics: dict[str, float | None]) -> None:
        """Write to every logger with ``step`` = optimizer steps done (HF's ``global_step``)."""
        clean = {k: float(v) for k, v in metrics.items() if v is not None}
        self.last_logged.update(clean)
        for logger in self.loggers:
            logger.log_metrics(clean, step=self.global_step)
            logger.save()

    # ----------------------------------------------------------------------------------- optimizers
    def configure_optimizers(self) -> dict[str, Any]:
        optimizer = build_optimizer(self.model, **self.optim)
        total = self.total_training_steps()
        if not math.isfinite(total):
            raise ValueError("the number of training steps is unknown: set trainer.max_steps")
        self.planned_steps = int(total)  # HF's max_steps, for the eval/save/logging step ratios (HFSteps)
        scheduler = build_scheduler(optimizer, int(total), **self.scheduler)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def total_training_steps(self) -> float:
        """Optimizer steps of the whole run, for the LR schedule (:func:`~hf_lightning.module.run_plan.plan_run`:
        ``trainer.estimated_stepping_batches``'s formula). Logs one WARNING when ``max_epochs`` ends the run before
        ``max_steps``, and one when windows are shorter than ``accumulate_grad_batches`` (how many steps).

        Lightning's property builds the train loader through ``fit_loop.setup_data()`` while the optimizers are
        configured, before a checkpoint's loop state is restored; the loader state of a mid-epoch resume is
        then never loaded. Here the length comes from the DataModule's own loader, and Lightning's loader is
        left to be built after the restore.
        """
        trainer = self.trainer
        datamodule = trainer.datamodule
        if datamodule is None:
            return trainer.estimated_stepping_batches
        try:
            batches: float = len(datamodule.train_dataloader())
        except TypeError:  # a stream of unknown length
            batches = float("inf")
        limit = trainer.limit_train_batches
        if isinstance(limit, int):
            batches = min(batches, limit)
        elif limit is not None and batches != float("inf"):
            batches = int(batches * limit)
        plan = plan_run(batches, trainer.accumulate_grad_batches, trainer.max_epochs, trainer.max_steps)
        if trainer.is_global_zero:
            report_plan(plan, trainer.max_epochs)
        return plan.total_steps

    def trained_tokens(self) -> int:
        """Real (non-padding) input tokens seen by training on this process."""
        return int(self.tokens_seen)


def _logits(outputs: Any) -> torch.Tensor:
    """``outputs.logits`` of a ``ModelOutput``, a dict or a tuple (first element)."""
    if isinstance(outputs, Mapping):
        return outputs["logits"]
    logits = getattr(outputs, "logits", None)
    return logits if logits is not None else outputs[0]
