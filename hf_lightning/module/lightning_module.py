"""``HFLightningModule``: HF-style models trained with HF's loss semantics under Lightning."""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Mapping
from typing import Annotated, Any

import lightning as L
import torch
from torch import nn

from hf_lightning.adapters.checkpoint import AdapterCheckpointState
from hf_lightning.checkpointing.loop_state import steps_windows_from_micro_batches
from hf_lightning.compat import attached_trainer
from hf_lightning.core.arguments import FRACTION, OPTIONAL_NON_NEGATIVE, OPTIONAL_POSITIVE_INT, check_call
from hf_lightning.core.batch import MICRO_ITEMS_KEY, Window
from hf_lightning.core.errors import ConfigError
from hf_lightning.data.checks import forward_parameters
from hf_lightning.models.loading import pretrained_causal_lm
from hf_lightning.module.eval_steps import EvalStepsMixin
from hf_lightning.module.grad_norm import SharedGradNorm, StepGradNorm
from hf_lightning.module.lean_loss import LeanLoss, arguments_reason, strategy_reason
from hf_lightning.module.loss import (
    FALLBACK_WARNING,
    ComputeLoss,
    Count,
    check_loss_arguments,
    logits_of,
    loss_is_share,
    loss_shifts_labels,
    loss_source,
    resolve_model_loss,
)
from hf_lightning.module.optim import make_optimizer
from hf_lightning.module.run_plan import training_steps
from hf_lightning.module.schedules import is_metric_driven, make_scheduler, metric_key, step_on_validation
from hf_lightning.module.train_log import TrainLog, warn_empty_window
from hf_lightning.strategies.gradient_sync import gradient_sync

log = logging.getLogger(__name__)


class HFLightningModule(
    AdapterCheckpointState, ComputeLoss, TrainLog, SharedGradNorm, EvalStepsMixin, L.LightningModule
):
    """Train and evaluate any HF-style model (``forward(**batch)`` returning ``.logits``) with HF
    ``Trainer``'s loss semantics. Losses are in nats per target token.

    Reproduced from HF ``Trainer``: ``training_step`` / ``compute_loss`` with the window count of
    ``get_batch_samples`` (:meth:`training_step`, the one place the step's loss scale is decided),
    ``create_optimizer`` / ``create_scheduler`` (:mod:`~hf_lightning.module.optim`), ``evaluation_loop`` /
    ``prediction_step`` for ``compute_metrics`` (:class:`~hf_lightning.module.eval_steps.EvalStepsMixin`), and
    ``model.train()`` before training (``from_pretrained`` returns the model in eval mode).

    The loss of one optimizer step is the sum of the loss terms over every micro-batch of the accumulation
    window divided by ``num_items_in_batch``, the window's number of targets summed across data-parallel
    ranks: it does not depend on how the window is split into micro-batches or ranks. Where the loss comes
    from, first match wins (:func:`~hf_lightning.module.loss.loss_source`): a subclass overriding
    :meth:`compute_loss`; HF's ``compute_loss_func(outputs, labels, num_items_in_batch)``; the model's own
    ``outputs.loss`` when ``use_model_loss`` (by default: when the model is *declared* to honour
    ``num_items_in_batch``, ``model_accepts_loss_kwargs`` or ``accepts_loss_kwargs = True``; never inferred
    from a bare ``**kwargs`` as HF does, since a model that swallows it inflates the gradients by accumulation
    x world size); otherwise the token cross-entropy from the logits
    (:func:`~hf_lightning.module.loss.token_cross_entropy_sum`, HF's ``LabelSmoother`` when
    ``label_smoothing_factor > 0``), computed without the ``(tokens x vocab)`` logits for a causal LM whose
    head ``get_output_embeddings()`` reaches (``lean_loss``). A loss that does not take the count is HF's
    fallback, a mean per micro-batch divided by the window length, with one warning.

    Args:
        model: an ``nn.Module`` whose ``forward(**batch)`` returns an object with ``.logits`` ``(B, L, V)``
            (or ``(B, C)`` for sequence classification); or the folder or hub id of a causal LM
            (:func:`~hf_lightning.models.loading.pretrained_causal_lm`), so that a config can name it.
        tokenizer: saved next to the model by the export callback (optional: the data has its own).
        optim: keyword arguments of :func:`~hf_lightning.module.optim.build_optimizer` (``name``, ``lr``,
            ...); a ``torch.optim.Optimizer`` class or partial (a ``_target_`` node with ``_partial_: true``;
            HF's ``optimizer_cls_and_kwargs``); or a callable ``(model) -> Optimizer`` (the ``optim`` config
            node). Every optimizer gets HF's parameter groups
            (:func:`~hf_lightning.module.optim.make_optimizer`).
        scheduler: keyword arguments of :func:`~hf_lightning.module.optim.build_scheduler` (``name``,
            ``warmup_steps``, ``warmup_ratio``); a ``torch.optim.lr_scheduler`` class or partial; or a
            callable taking ``num_training_steps`` (:func:`~hf_lightning.module.schedules.make_scheduler`).
            Stepped after every optimizer step.
        average_tokens_across_devices: sum the target count across ranks (HF's default, exact); ``False``
            normalises by each rank's own count (biased when ranks hold different numbers of targets).
        compute_loss_func: ``(outputs, labels, num_items_in_batch) -> 0-dim loss``, as HF ``Trainer``'s
            argument: ``outputs`` from ``model(**inputs)`` without labels, ``labels`` ``(B, L)`` int64, and
            ``num_items_in_batch`` an ``int`` (one process) or 0-dim int64 tensor (summed across ranks), never
            0. It must return the micro-batch's *share*: a sum over its items divided by
            ``num_items_in_batch``.
        use_model_loss: use ``model(**inputs, labels=...).loss``. ``None``: only when the model is declared to
            honour ``num_items_in_batch`` (see above) and no label smoothing is asked for.
        model_accepts_loss_kwargs: declare that the model's ``forward`` divides its summed loss by a
            ``num_items_in_batch`` keyword (HF's attribute name). ``None``: read
            ``model.accepts_loss_kwargs``.
        label_smoothing_factor: HF's ``TrainingArguments.label_smoothing_factor`` for the built-in loss, in
        [0, 1). causal: the labels are aligned for a causal LM (shifted by one). ``None``: HF's rule
            (:func:`~hf_lightning.module.loss.loss_shifts_labels`).
        compute_metrics: HF-style ``compute_metrics(EvalPrediction) -> dict`` over the whole evaluation set
            (numpy arrays padded with -100, in dataset order); its keys are logged as ``val/<key>``.
        preprocess_logits_for_metrics: HF-style ``(logits, labels) -> preds`` applied per batch before
            anything is kept (e.g. ``argmax``), so memory holds predictions, not logits.
        eval_accumulation_steps: move collected predictions to the CPU every this many batches (HF's).
        batch_eval_metrics: call ``compute_metrics(EvalPrediction, compute_result=is_last_batch)`` per batch
            instead of once (HF's); the last call's result is logged.
        lean_loss: the built-in token loss (and ``val/loss``, ``val/accuracy``) from the final hidden states
            and the LM head in chunks of tokens, never holding the ``(tokens x vocab)`` logits
            (:class:`~hf_lightning.module.lean_loss.LeanLoss`, which says with one INFO line when it falls
            back to the logits); ``compute_loss`` then returns outputs whose ``logits`` is ``None``.
        metric_for_best_model: the logged metric (HF's name, ``loss`` -> ``val/loss``) that steps a
            ``reduce_lr_on_plateau`` / ``greedy`` schedule after each validation, as HF does.
        max_grad_norm: HF's ``max_grad_norm``: before each optimizer step the gradients' total 2-norm is
            clipped to it (``torch.nn.utils.clip_grad_norm_``); ``None`` or 0: no clipping. Lightning's
            ``Trainer(gradient_clip_val=...)`` does not apply (this module steps its windows itself) and
            Lightning refuses it.

    Raises:
        ConfigError: conflicting or out-of-range loss arguments (named); a metric-driven schedule without
            validation (at ``configure_optimizers``).

    Logged (x-axis ``step`` = optimizer steps done, as HF; :mod:`~hf_lightning.module.train_log`):
    ``train/loss`` (mean of the window losses since the last row, over ranks: HF's ``loss``), ``lr`` (the rate
    used in that step), ``grad_norm`` (before clipping; logged steps only); ``val/loss`` (token-weighted mean
    over the whole validation set), ``val/perplexity``, ``val/accuracy``.
    """

    # HF's logging_first_step: a train/loss row after the first optimizer step too (set by HFSteps)
    logging_first_step: bool = False
    # the run's optimizer steps, known once configure_optimizers has run
    planned_steps: int | None = None

    #: HF ``Trainer``'s attribute: whether :meth:`compute_loss` returns a share of the window loss (``True``)
    #: or a per-micro-batch mean (``False``, HF's fallback). ``None``: decided from the loss source; a
    #: subclass overriding :meth:`compute_loss` counts as ``True`` unless it sets this.
    loss_is_scaled_for_ga: bool | None = None
    #: an evaluation rank with no example gets a marked placeholder batch
    #: (:class:`hf_lightning.data.collators.PlaceholderAwareCollator`)
    handles_placeholder_batches: bool = True
    #: :meth:`on_train_batch_start` skips the batch after a preemption's save
    #: (:class:`~hf_lightning.callbacks.preemption.Preemption`)
    skips_training_when_preempted: bool = True

    def __init__(
        self,
        model: nn.Module | str | os.PathLike,
        tokenizer: Any = None,
        optim: Mapping[str, Any] | Callable[..., torch.optim.Optimizer] | None = None,
        scheduler: Mapping[str, Any] | Callable[..., Any] | None = None,
        average_tokens_across_devices: bool = True,
        compute_loss_func: Callable[..., torch.Tensor] | None = None,
        use_model_loss: bool | None = None,
        model_accepts_loss_kwargs: bool | None = None,
        label_smoothing_factor: Annotated[float, FRACTION] = 0.0,
        causal: bool | None = None,
        compute_metrics: Callable[..., Mapping[str, float]] | None = None,
        preprocess_logits_for_metrics: Callable[[torch.Tensor, torch.Tensor], Any] | None = None,
        eval_accumulation_steps: Annotated[int | None, OPTIONAL_POSITIVE_INT] = None,
        batch_eval_metrics: bool = False,
        lean_loss: bool = True,
        metric_for_best_model: str | None = None,
        max_grad_norm: Annotated[float | None, OPTIONAL_NON_NEGATIVE] = 1.0,
    ) -> None:
        super().__init__()
        check_call(HFLightningModule.__init__, locals(), "module")  # the annotations' value rules
        check_loss_arguments(compute_loss_func, use_model_loss, label_smoothing_factor)
        #: HF's max_grad_norm: the total gradient 2-norm each step is clipped to (``None`` or 0: no clipping)
        self.max_grad_norm = float(max_grad_norm) if max_grad_norm else None
        # training_step steps each accumulation window itself (Lightning's manual optimization)
        self.automatic_optimization = False
        if isinstance(model, (str, os.PathLike)):  # a folder or hub id, as a config gives it
            model = pretrained_causal_lm(model, "module.model")
        self.model = model
        self.tokenizer = tokenizer
        self.optim = optim if callable(optim) else dict(optim or {})
        self.scheduler = scheduler if callable(scheduler) else dict(scheduler or {})
        #: the logged metric that steps reduce_lr_on_plateau / greedy after each validation (HF's)
        self.schedule_metric = metric_key(metric_for_best_model)
        self.average_tokens_across_devices = average_tokens_across_devices
        self.compute_loss_func = compute_loss_func
        self.label_smoothing_factor = float(label_smoothing_factor)
        self.model_accepts_loss_kwargs, self.use_model_loss = resolve_model_loss(
            model, model_accepts_loss_kwargs, use_model_loss, compute_loss_func, label_smoothing_factor
        )
        self.causal = loss_shifts_labels(model) if causal is None else bool(causal)
        self._encoder_decoder = bool(getattr(getattr(model, "config", None), "is_encoder_decoder", False))
        #: keyword arguments every ``model(...)`` call gets: ``use_cache=False`` when ``forward`` takes it (no
        #: KV cache in training, which packed batches need); read through PEFT / torch.compile wrappers, whose
        #: own forward passes it on; read by the DataModule's packing message
        self.forward_kwargs = {"use_cache": False} if "use_cache" in forward_parameters(model) else {}
        #: whether :meth:`compute_loss` returns a share of the window loss (else HF's fallback)
        self.loss_is_share, self._fallback_reason = loss_is_share(self)
        decoder_only = self.causal and not self._encoder_decoder
        self.lean = LeanLoss(model, arguments_reason(lean_loss, self.loss_source, decoder_only))
        self._init_evaluation(
            compute_metrics, preprocess_logits_for_metrics, eval_accumulation_steps, batch_eval_metrics
        )
        self._init_train_log()
        self._grad_norm = StepGradNorm()
        #: the optimizer step this process's fit started from (``None``: training never started, e.g. a resume
        #: of a run that had already reached its end)
        self.fit_start_step: int | None = None
        self._warned_unwrapped = False

    def data_binding(self) -> dict[str, Any]:
        """What :class:`~hf_lightning.HFDataModule` needs from this module, as keyword arguments of
        :meth:`HFDataModule.bind <hf_lightning.data.datamodule.HFDataModule.bind>`: the model (pruning, the
        checks against the data), :meth:`count_loss_items` (the window keys), ``forward_kwargs``, whether
        ``compute_metrics`` needs a label key, and that placeholder batches are handled. The DataModule asks
        for it at ``setup`` when nobody called ``bind``."""
        return {
            "model": self.model,
            "count_loss_items": self.count_loss_items,
            "forward_kwargs": self.forward_kwargs,
            "metrics": self.compute_metrics is not None,
            "handles_placeholder_batches": self.handles_placeholder_batches,
            "steps_windows": True,
        }

    @property
    def loss_source(self) -> str:
        """``"compute_loss"`` (a subclass override), ``"compute_loss_func"``, ``"model"`` or
        ``"token_cross_entropy"``."""
        return loss_source(self)

    def _say_lean(self) -> None:
        """The lean loss's INFO line, when its state changed (rank zero)."""
        trainer = attached_trainer(self)
        self.lean.say(trainer is None or trainer.is_global_zero)

    # ------------------------------------------------------------------------------- the step's loss
    def training_step(self, batch: Window | Mapping[str, Any], batch_idx: int) -> torch.Tensor:
        """One optimizer step over one accumulation window: every factor of the step's loss scale.

        HF ``Trainer``'s inner loop for one step (``get_batch_samples``, ``training_step`` / ``compute_loss``
        per micro-batch, clipping at ``max_grad_norm``, ``optimizer.step``, ``lr_scheduler.step``), on
        Lightning's manual optimization. The gradient applied is exactly d(window loss)/dθ, with
        window loss = Σ loss terms over the window's micro-batches and ranks / ``num_items_in_batch``.

        Args:
            batch: a :class:`~hf_lightning.core.batch.Window` (:class:`~hf_lightning.HFDataModule`'s training
                batches); a plain dict batch is a window of one micro-batch without a count (HF's fallback).

        Returns:
            The window's loss on this process (0-dim float tensor, detached; its mean over ranks is the
            window loss).
        """
        window = batch if isinstance(batch, Window) else Window([dict(batch)], None)
        world = self.trainer.world_size
        # (1) the count, HF get_batch_samples: the window's label targets, counted on the host when the window
        #     was formed; (2) summed across ranks (average_tokens_across_devices), one collective per window
        count = self._window_count(window, self.average_tokens_across_devices and world > 1)
        # (3) compute_loss returns each micro-batch's share: its summed loss / count (else HF's fallback: its
        #     mean / the window's length)
        scaled = self.loss_is_share and count is not None
        # (4) DDP, FSDP and DeepSpeed average gradients over ranks; a count that spans ranks is multiplied
        #     back, as HF's compute_loss does
        factor = world if scaled and self.average_tokens_across_devices else 1
        loss = torch.zeros((), device=self.device)
        last = len(window) - 1
        for i, micro in enumerate(window):
            micro = self._to_device(micro, window.counts[i] if window.counts is not None else None)
            if scaled:
                share = self.compute_loss(micro, count)[0]
                share = share * factor if factor != 1 else share
            elif window.counts is not None and window.counts[i] == 0:
                share = logits_of(self(micro)).sum() * 0.0  # the fallback's mean over no targets is NaN
            else:
                share = self.compute_loss(micro, None)[0] / len(window)
            # (5) gradients reduced across ranks at the window's last backward only
            with gradient_sync(self.trainer.strategy, sync=i == last):
                self.manual_backward(share)
            loss = loss + share.detach()
        self.add_window_share(loss)
        # (6) one update: on_before_optimizer_step reads the gradient norm and clips it to max_grad_norm
        # (after AMP's unscale), then the optimizer steps, the gradients go, the schedule moves on
        optimizer = self.optimizers()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        self._step_schedule()
        return loss

    def _window_count(self, window: Window, across: bool) -> Count | None:
        """The window's target count, at least 1: a host ``int``, or a 0-dim tensor summed across ranks when
        ``across``. ``None`` when the window carries no count."""
        local = window.num_items_in_batch
        if local is None:
            if not self._warned_unwrapped:
                log.warning(
                    "training batches carry no num_items_in_batch (the train dataloader is not an "
                    "HFDataModule one, nor wrapped in hf_lightning.data.sampling.WindowLoader): each "
                    "micro-batch is normalised by its own count, HF's fallback, which weights targets "
                    "unequally"
                )
                self._warned_unwrapped = True
            return None
        if across:
            count = self.trainer.strategy.reduce(torch.tensor(local, device=self.device), reduce_op="sum")
            self.check_window_count(self.global_step + 1, count)  # read at the next row: no sync here
            return count.clamp(min=1)
        if local == 0:
            world = self.trainer.world_size
            warn_empty_window(self.global_step + 1, rank=self.global_rank if world > 1 else None)
        return max(local, 1)

    def _to_device(self, micro: Mapping[str, Any], count: int | None) -> dict[str, Any]:
        """One micro-batch on the module's device (only the one being computed), with its own target count
        (``num_items_in_micro_batch``, host ``int``: the lean head skips rows without targets without a
        host-device sync)."""
        device = self.device
        if device.type == "cpu":  # the loader's tensors are on the host already
            moved = dict(micro)
        else:
            non_blocking = device.type != "mps"  # as Lightning: MPS copies are blocking
            moved = {
                k: v.to(device, non_blocking=non_blocking) if isinstance(v, torch.Tensor) else v
                for k, v in micro.items()
            }
        if count is not None:
            moved[MICRO_ITEMS_KEY] = count
        return moved

    def _step_schedule(self) -> None:
        """The learning-rate schedule after an optimizer step (a metric-driven one waits for validation)."""
        for config in self.trainer.lr_scheduler_configs:
            if not is_metric_driven(config.scheduler):
                config.scheduler.step()

    # ------------------------------------------------------------------------------ fit and optimizer
    def configure_callbacks(self) -> list[L.Callback]:
        """No callbacks of its own. Refuses, before Lightning's own check does in its words, the ``Trainer``
        arguments that cannot apply to a module that steps its windows itself.

        Raises:
            ConfigError: ``Trainer(accumulate_grad_batches > 1)`` (the window is the DataModule's
                ``gradient_accumulation_steps``) or ``Trainer(gradient_clip_val=...)`` (``max_grad_norm``).
        """
        trainer = self.trainer
        if trainer.accumulate_grad_batches > 1:
            raise ConfigError(
                f"Trainer(accumulate_grad_batches={trainer.accumulate_grad_batches}): HFLightningModule "
                "steps each accumulation window itself; set HFDataModule(gradient_accumulation_steps="
                f"{trainer.accumulate_grad_batches}) (data.gradient_accumulation_steps, HF's name) and leave "
                "the Trainer's at 1"
            )
        if trainer.gradient_clip_val:
            raise ConfigError(
                f"Trainer(gradient_clip_val={trainer.gradient_clip_val}): HFLightningModule clips at its "
                f"max_grad_norm (HF's name, module.max_grad_norm); set HFLightningModule(max_grad_norm="
                f"{trainer.gradient_clip_val}) and leave the Trainer's unset"
            )
        return []

    def on_fit_start(self) -> None:
        if self._fallback_reason is not None and self.trainer.is_global_zero:
            log.warning(FALLBACK_WARNING, self._fallback_reason)

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        super().on_before_optimizer_step(optimizer)  # the train log's lr and gradient norm
        if self.max_grad_norm is not None:
            self.clip_step_gradients(optimizer, self.max_grad_norm)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        # a checkpoint of the micro-batch loop (before this module stepped its windows): its counts as windows
        saved = (checkpoint.get("hf_lightning") or {}).get("signature") or {}
        accumulation = (
            saved.get("accumulate_grad_batches") if "gradient_accumulation_steps" not in saved else 1
        )
        trainer = attached_trainer(self)
        if accumulation is None:  # no signature (a Trainer without ResumeState): this run's window
            accumulation = getattr(getattr(trainer, "datamodule", None), "gradient_accumulation_steps", 1)
        if steps_windows_from_micro_batches(checkpoint, int(accumulation or 1)):
            log.info(
                "the checkpoint counts micro-batches (accumulation %d): its loop state is read as optimizer "
                "steps, one accumulation window per training batch",
                accumulation,
            )

    def on_train_start(self) -> None:
        self._steps_seen = self.global_step  # a resumed run starts at its checkpoint's step
        self.fit_start_step = self.global_step
        self._grad_norm.reset()

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> int | None:
        """``-1`` (Lightning: skip the rest of the epoch) once :class:`~hf_lightning.callbacks.preemption.
        Preemption` saved after a stop signal: the run ends at the saved step."""
        return -1 if getattr(self, "preempted", None) else None

    def setup(self, stage: str) -> None:
        reason = strategy_reason(self.trainer.strategy)
        if self.lean.active and reason is not None:
            self.lean.turn_off(reason)
        self._say_lean()
        if stage == "fit":
            # HF Trainer calls model.train() before its loop. from_pretrained returns the model in eval mode
            # and Lightning (>= 2.2) keeps each submodule's mode, so without this dropout would silently stay
            # off. Here rather than in on_train_start, so that the model summary and Lightning's mode check
            # agree
            self.model.train()

    def configure_optimizers(self) -> dict[str, Any]:
        optimizer = make_optimizer(self.optim, self.model)
        total = self.total_training_steps()
        if not math.isfinite(total):
            raise ValueError("the number of training steps is unknown: set trainer.max_steps")
        self.planned_steps = int(total)  # HF's max_steps, for the eval/save/logging step ratios (HFSteps)
        scheduler = make_scheduler(self.scheduler, optimizer, int(total))
        # a metric-driven schedule is stepped by on_validation_epoch_end with the metric, as HF steps it after
        # each evaluation
        if is_metric_driven(scheduler) and self.trainer.limit_val_batches == 0:
            settings = getattr(self.scheduler, "keywords", self.scheduler)  # a partial's or the dict
            name = settings.get("name") if isinstance(settings, Mapping) else None
            raise ConfigError(
                f"scheduler.name={name or type(scheduler).__name__} steps on the validation metric "
                f"{self.schedule_metric}, but validation is off (trainer.limit_val_batches=0): turn it on"
            )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def on_validation_epoch_end(self) -> None:
        super().on_validation_epoch_end()
        trainer = self.trainer
        if trainer.sanity_checking or trainer.state.fn != "fit":
            return
        for config in trainer.lr_scheduler_configs:
            if is_metric_driven(config.scheduler):
                step_on_validation(config.scheduler, self.last_logged, self.schedule_metric)

    def total_training_steps(self) -> float:
        """Optimizer steps of the whole run, for the LR schedule
        (:func:`~hf_lightning.module.run_plan.training_steps`, which logs when ``max_epochs`` ends the run
        first and when windows are shorter than asked)."""
        return training_steps(self.trainer)
