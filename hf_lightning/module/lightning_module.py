"""``HFLightningModule``: HF-style models trained with HF's loss semantics under Lightning."""

from __future__ import annotations

import inspect
import logging
import math
from collections.abc import Callable, Mapping
from typing import Any

import lightning as L
import torch
from torch import nn

from hf_lightning.data.windows import NUM_ITEMS_KEY
from hf_lightning.module.eval_steps import EvalStepsMixin
from hf_lightning.module.loss import count_loss_items, token_cross_entropy_sum
from hf_lightning.module.optim import build_optimizer, build_scheduler

log = logging.getLogger(__name__)

NON_MODEL_KEYS = ("labels", "shift_labels", NUM_ITEMS_KEY)


class HFLightningModule(EvalStepsMixin, L.LightningModule):
    """Train and evaluate any HF-style model (``forward(**batch)`` returning ``.logits``).

    The loss of one optimizer step is HF's: the sum of token cross-entropy over every micro-batch of the
    gradient-accumulation window divided by ``num_items_in_batch``, the window's number of targets (summed
    across data-parallel ranks). It does not depend on how the window is split into micro-batches or ranks.

    The token loss is computed here from the logits (:func:`~hf_lightning.module.loss.token_cross_entropy_sum`)
    and labels are not passed to the model: we never rely on a model's ``forward`` honouring
    ``num_items_in_batch`` (HF infers that from a bare ``**kwargs``, and a model that ignores it gets gradients
    inflated by accumulation x world size).

    Lightning's automatic optimization divides the returned loss by ``accumulate_grad_batches`` and DDP averages
    gradients over ranks; ``training_step`` returns ``loss * accumulate_grad_batches * world_size`` so that the
    applied gradient is exactly d(window loss)/dθ.

    Args:
        model: an ``nn.Module`` whose ``forward(**batch)`` returns an object with ``.logits`` ``(B, L, V)``.
        tokenizer: saved next to the model by the export callback (optional).
        optim: keyword arguments of :func:`~hf_lightning.module.optim.build_optimizer` (``name``, ``lr``, ...).
        scheduler: keyword arguments of :func:`~hf_lightning.module.optim.build_scheduler` (``name``,
            ``warmup_steps``, ``warmup_ratio``).
        average_tokens_across_devices: sum the target count across ranks (HF's default, exact); ``False``
            normalises by each rank's own count (biased when ranks hold different numbers of targets).
        compute_metrics: HF-style ``compute_metrics(EvalPrediction) -> dict`` over the whole evaluation set
            (numpy arrays padded with -100, in dataset order); its keys are logged as ``val/<key>``.
        preprocess_logits_for_metrics: HF-style ``(logits, labels) -> preds`` applied per batch before
            anything is kept (e.g. ``argmax``), so memory holds predictions, not logits.
        eval_accumulation_steps: move collected predictions to the CPU every this many batches (HF's).
        batch_eval_metrics: call ``compute_metrics(EvalPrediction, compute_result=is_last_batch)`` per batch
            instead of once (HF's); the last call's result is logged.

    Logged (x-axis ``step`` = optimizer steps done, as HF): ``train/loss`` (mean of the window losses since
    the last log, averaged over ranks), ``lr`` (the rate used in that step), ``grad_norm`` (before clipping);
    ``val/loss`` (token-weighted mean over the whole validation set), ``val/perplexity``, ``val/accuracy``
    (see :class:`~hf_lightning.module.eval_steps.EvalStepsMixin`).
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any = None,
        optim: Mapping[str, Any] | None = None,
        scheduler: Mapping[str, Any] | None = None,
        average_tokens_across_devices: bool = True,
        compute_metrics: Callable[..., Mapping[str, float]] | None = None,
        preprocess_logits_for_metrics: Callable[[torch.Tensor, torch.Tensor], Any] | None = None,
        eval_accumulation_steps: int | None = None,
        batch_eval_metrics: bool = False,
    ) -> None:
        super().__init__()
        self.model = model
        self.tokenizer = tokenizer
        self.optim = dict(optim or {})
        self.scheduler = dict(scheduler or {})
        self.average_tokens_across_devices = average_tokens_across_devices
        config = getattr(model, "config", None)
        self.causal = not getattr(config, "is_encoder_decoder", False)
        # inspected once: the forward signature decides whether use_cache can be turned off
        params = inspect.signature(model.forward).parameters
        self._forward_extra = {"use_cache": False} if "use_cache" in params else {}
        self._init_evaluation(compute_metrics, preprocess_logits_for_metrics, eval_accumulation_steps, batch_eval_metrics)
        self._window: tuple[int, int] | None = None
        self._window_count: torch.Tensor | None = None
        self._window_loss: torch.Tensor | None = None
        self._loss_since_log: list[torch.Tensor] = []
        self._last_lr: float | None = None
        self._last_grad_norm: torch.Tensor | None = None
        self._steps_seen = 0
        self.tokens_seen = torch.zeros((), dtype=torch.long)
        self._warned_unwrapped = False

    # ------------------------------------------------------------------------------------------ loss
    def count_loss_items(self, batch: Mapping[str, Any]) -> int:
        """Targets in one micro-batch (host side); the DataModule sums it over a window."""
        return count_loss_items(batch, causal=self.causal)

    def forward(self, batch: Mapping[str, Any]) -> Any:
        inputs = {k: v for k, v in batch.items() if k not in NON_MODEL_KEYS}
        return self.model(**inputs, **self._forward_extra)

    def compute_loss(self, batch: Mapping[str, Any], num_items_in_batch: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """``(sum of token CE / num_items_in_batch, model outputs)`` for one micro-batch.

        Override to define another loss; it must be the micro-batch's share of the window loss (a sum over
        its items divided by ``num_items_in_batch``) for the step to stay split-invariant.
        """
        outputs = self(batch)
        loss_sum = token_cross_entropy_sum(
            outputs.logits, batch["labels"], causal=self.causal, shift_labels=batch.get("shift_labels")
        )
        return loss_sum / num_items_in_batch.clamp(min=1), outputs

    def _global_window_count(self, batch: Mapping[str, Any], batch_idx: int) -> torch.Tensor:
        """The window's target count, summed across ranks once per window (one collective per step)."""
        k = self.trainer.accumulate_grad_batches
        if NUM_ITEMS_KEY not in batch:
            if not self._warned_unwrapped:
                log.warning(
                    "training batches carry no num_items_in_batch (the train dataloader is not an "
                    "HFDataModule one): each micro-batch is normalised by its own count and divided by "
                    "accumulate_grad_batches, HF's fallback, which weights targets unequally"
                )
                self._warned_unwrapped = True
            count = torch.tensor(self.count_loss_items(batch) * k, device=self.device)
            return self._reduce_count(count)
        window = (self.current_epoch, batch_idx // k)
        if window != self._window:
            self._window = window
            self._window_count = self._reduce_count(torch.tensor(batch[NUM_ITEMS_KEY], device=self.device))
        return self._window_count

    def _reduce_count(self, count: torch.Tensor) -> torch.Tensor:
        if self.average_tokens_across_devices and self.trainer.world_size > 1:
            count = self.trainer.strategy.reduce(count, reduce_op="sum")
        return count

    # -------------------------------------------------------------------------------------- training
    def training_step(self, batch: Mapping[str, Any], batch_idx: int) -> torch.Tensor:
        count = self._global_window_count(batch, batch_idx)
        loss, _ = self.compute_loss(batch, count)
        detached = loss.detach()
        self._window_loss = detached if self._window_loss is None else self._window_loss + detached
        if "attention_mask" in batch:
            self.tokens_seen = self.tokens_seen.to(self.device) + batch["attention_mask"].sum()
        scale = self.trainer.accumulate_grad_batches
        if self.average_tokens_across_devices:
            scale *= self.trainer.world_size
        return loss * scale

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        self._last_lr = optimizer.param_groups[0]["lr"]
        grads = [p.grad for p in self.parameters() if p.grad is not None]
        if grads:
            self._last_grad_norm = torch.nn.utils.get_total_norm(grads)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.global_step == self._steps_seen:
            return  # still accumulating
        self._steps_seen = self.global_step
        if self._window_loss is not None:
            self._loss_since_log.append(self._window_loss)
        self._window_loss = None
        every = max(self.trainer.log_every_n_steps, 1)
        if self.global_step % every == 0 or self.global_step >= self.trainer.max_steps > 0:
            self._flush_train_logs()

    def on_train_start(self) -> None:
        # HF Trainer calls model.train() before its loop. from_pretrained returns the model in eval mode and
        # Lightning (>= 2.2) keeps each submodule's mode, so without this dropout would silently stay off
        self.model.train()

    def on_train_end(self) -> None:
        self._flush_train_logs(progress_bar=False)  # the steps since the last log boundary

    def _flush_train_logs(self, progress_bar: bool = True) -> None:
        if not self._loss_since_log:
            return
        loss = torch.stack(self._loss_since_log).mean()
        self._loss_since_log = []
        if self.trainer.world_size > 1:
            loss = self.trainer.strategy.reduce(loss, reduce_op="mean")
        metrics = {"train/loss": loss.item(), "lr": self._last_lr}
        if self._last_grad_norm is not None:
            metrics["grad_norm"] = self._last_grad_norm.item()
        metrics["epoch"] = self.current_epoch
        if progress_bar:
            self.log("train/loss", metrics["train/loss"], prog_bar=True, logger=False, on_step=True, on_epoch=False)
        self._log_to_loggers(metrics)

    def _log_to_loggers(self, metrics: dict[str, float | None]) -> None:
        """Write to every logger with ``step`` = optimizer steps done (HF's ``global_step``)."""
        clean = {k: float(v) for k, v in metrics.items() if v is not None}
        for logger in self.loggers:
            logger.log_metrics(clean, step=self.global_step)
            logger.save()

    # ----------------------------------------------------------------------------------- optimizers
    def configure_optimizers(self) -> dict[str, Any]:
        optimizer = build_optimizer(self.model, **self.optim)
        total = self.trainer.estimated_stepping_batches
        if not math.isfinite(total):
            raise ValueError("the number of training steps is unknown: set trainer.max_steps")
        scheduler = build_scheduler(optimizer, int(total), **self.scheduler)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def trained_tokens(self) -> int:
        """Real (non-padding) input tokens seen by training on this process."""
        return int(self.tokens_seen)

