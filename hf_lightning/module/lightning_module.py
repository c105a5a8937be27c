"""``HFLightningModule``: HF-style models trained with HF's loss semantics under Lightning.

One class, one file: the module's Lightning hooks and its own methods, in sections (the step's loss, the train
log, the gradient norm, fit and optimizer, checkpoints, evaluation). What they call lives in the file of its
concern: the loss math in :mod:`~hf_lightning.module.loss` and :mod:`~hf_lightning.module.lean_loss`, the rows
in :mod:`~hf_lightning.module.train_log`, the metrics in :mod:`~hf_lightning.module.eval_metrics`, the shared
gradient norm in :mod:`~hf_lightning.module.grad_norm`, adapter checkpoints in
:mod:`~hf_lightning.adapters.checkpoint`.
"""

from __future__ import annotations

import inspect
import logging
import math
import os
from collections.abc import Callable, Mapping
from typing import Annotated, Any

import lightning as L
import torch
from torch import nn

from hf_lightning.adapters.checkpoint import drop_frozen, fill_frozen
from hf_lightning.checkpointing.loop_state import steps_windows_from_micro_batches
from hf_lightning.compat import attached_trainer, epoch_batch_index, is_compiled_in_place
from hf_lightning.core.arguments import (
    FRACTION,
    OPTIONAL_NON_NEGATIVE,
    OPTIONAL_POSITIVE_INT,
    check_call,
    one_of,
)
from hf_lightning.core.batch import IGNORE_INDEX, MICRO_ITEMS_KEY, PLACEHOLDER_KEY, Window, to_device
from hf_lightning.core.errors import ConfigError, ModelError
from hf_lightning.data.checks import forward_parameters
from hf_lightning.models.loading import pretrained_causal_lm
from hf_lightning.module.compiled import CompileReport, mark_batch_dynamic
from hf_lightning.module.eval_metrics import (
    STAGES,
    PredictionCollector,
    all_gather_object,
    position_wise_problem,
    returned_results,
    sequence_classes,
    stage_metrics,
    warn_if_logits_kept,
)
from hf_lightning.module.grad_norm import StepGradNorm, engine_grad_norm, gradients_outside_params
from hf_lightning.module.lean_loss import LeanLoss, arguments_reason, strategy_reason
from hf_lightning.module.linear_cross_entropy import NotPositionWise, check_holds_ignore_index
from hf_lightning.module.loss import (
    FALLBACK_WARNING,
    NON_MODEL_KEYS,
    Count,
    check_loss_arguments,
    count_loss_items,
    logits_of,
    loss_is_share,
    loss_shifts_labels,
    loss_targets,
    resolve_model_loss,
    token_cross_entropy_sum,
)
from hf_lightning.module.optim import make_optimizer
from hf_lightning.module.run_plan import training_steps
from hf_lightning.module.schedules import is_metric_driven, make_scheduler, metric_key, step_on_validation
from hf_lightning.module.train_log import KEY as TRAIN_LOG_KEY
from hf_lightning.module.train_log import StepClock, TrainRows, epoch_fraction, say_row, warn_empty_window
from hf_lightning.run.loggers import adopt_csv_header
from hf_lightning.strategies.gradient_sync import gradient_sync

log = logging.getLogger(__name__)

#: where ``preprocess_logits_for_metrics`` is applied: every position (HF's), or those with a loss target
PREPROCESS_POSITIONS = ("all", "targets")
_TARGETS_NEED_POSITIONS = (
    "preprocess_logits_positions='targets' needs a preprocess_logits_for_metrics that returns one value (or "
    "vector) per position ({why}): use preprocess_logits_positions='all' for this function"
)


class HFLightningModule(L.LightningModule):
    """Train and evaluate any HF-style model (``forward(**batch)`` returning ``.logits``) with HF
    ``Trainer``'s loss semantics. Losses are in nats per target token.

    Reproduced from HF ``Trainer``: ``training_step`` / ``compute_loss`` with the window count of
    ``get_batch_samples`` (:meth:`training_step`, the one place the step's loss scale is decided),
    ``create_optimizer`` / ``create_scheduler`` (:mod:`~hf_lightning.module.optim`), ``evaluation_loop`` /
    ``prediction_step`` for ``compute_metrics`` (:meth:`validation_step`, :meth:`test_step`), and
    ``model.train()`` before training (``from_pretrained`` returns the model in eval mode).

    The loss of one optimizer step is the sum of the loss terms over every micro-batch of the accumulation
    window divided by ``num_items_in_batch``, the window's number of targets summed across data-parallel
    ranks: it does not depend on how the window is split into micro-batches or ranks. Where the loss comes
    from, first match wins (:attr:`loss_source`): a subclass overriding
    :meth:`compute_loss`; HF's ``compute_loss_func(outputs, labels, num_items_in_batch)``; the model's own
    ``outputs.loss`` when ``use_model_loss`` (by default: when the model is *declared* to honour
    ``num_items_in_batch``, ``model_accepts_loss_kwargs`` or ``accepts_loss_kwargs = True``; never inferred
    from a bare ``**kwargs`` as HF does, since a model that swallows it inflates the gradients by accumulation
    x world size); otherwise the token cross-entropy from the logits
    (:func:`~hf_lightning.module.loss.token_cross_entropy_sum`, HF's ``LabelSmoother`` when
    ``label_smoothing_factor > 0``), computed without the ``(tokens x vocab)`` logits for a causal LM whose
    head ``get_output_embeddings()`` reaches, where that is faster (``lean_loss``). A loss that does not take
    the count is HF's fallback, a mean per micro-batch divided by the window length, with one warning.

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
            anything is kept (e.g. ``argmax``), so memory holds predictions, not logits. Under the lean loss
            it is applied to the logits of chunks of positions (``logits (1, n, V)``, ``labels (1, n)``,
            results concatenated along dim 1), so no batch's whole logits exist, when it is position-wise.
        preprocess_logits_position_wise: declare whether ``preprocess_logits_for_metrics`` is position-wise
            (each position's result depends only on that position's logits and label: argmax, top-k,
            log-softmax). ``None``: checked on the first evaluation batch, whose first two rows' chunked
            predictions are compared with the function's result on those rows' logits taken whole (half as
            many positions as a chunk holds); a function that is not position-wise gets the whole logits of
            each batch, with one INFO line.
        preprocess_logits_positions: ``"all"`` (HF's): ``preprocess_logits_for_metrics`` sees every
            position's logits. ``"targets"``: only the positions with a loss target (a causal LM's positions
            whose next label is not -100, an encoder-decoder's whose label is not -100; so the head runs on
            those positions only), and the other positions' predictions are -100, as HF pads predictions
            between batches; for a ``compute_metrics`` that reads the predictions where the labels are set,
            as HF's examples do, the results are HF's. It declares the function position-wise; its result
            must be a signed integer or floating tensor (``TypeError`` otherwise).
        eval_accumulation_steps: move collected predictions to the CPU every this many batches (HF's).
        batch_eval_metrics: call ``compute_metrics(EvalPrediction, compute_result=is_last_batch)`` per batch
            instead of once (HF's); the last call's result is logged.
        lean_loss: the built-in token loss (and ``val/loss``, ``val/accuracy``) from the final hidden states
            and the LM head in chunks of tokens, never holding the ``(tokens x vocab)`` logits
            (:class:`~hf_lightning.module.lean_loss.LeanLoss`); ``compute_loss`` then returns outputs whose
            ``logits`` is ``None``. ``None`` (auto): the lean loss where it is the faster exact path, an LM
            head whose vocabulary is at least :data:`~hf_lightning.module.lean_loss.LEAN_MIN_VOCAB`, the full
            logits below it; ``True``: whenever the model allows it; ``False``: never. One INFO line at
            ``setup`` says which path runs and why (and another if the model turns out not to fit).
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
    over the whole validation set), ``val/perplexity``, ``val/accuracy`` (``val/f1`` instead of perplexity for
    a sequence classifier; a user ``compute_metrics``'s keys under the same prefix; ``test/...`` likewise).
    ``lightning.Trainer.validate()`` / ``.test()`` return the same floats: ``[{"val/loss": float, ...}]``.
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
        preprocess_logits_position_wise: bool | None = None,
        preprocess_logits_positions: Annotated[str, one_of(PREPROCESS_POSITIONS)] = "all",
        eval_accumulation_steps: Annotated[int | None, OPTIONAL_POSITIVE_INT] = None,
        batch_eval_metrics: bool = False,
        lean_loss: bool | None = None,
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
        # a causal LM's targets are its labels shifted by one, an encoder-decoder's its decoder's labels: both
        # are the LM head's token targets
        token_targets = self.causal or self._encoder_decoder
        self.lean = LeanLoss(
            model, arguments_reason(lean_loss, self.loss_source, token_targets), auto=lean_loss is None
        )
        # evaluation: HF's compute_metrics hooks, and the metric states of each stage
        takes_result = (
            compute_metrics is not None and "compute_result" in inspect.signature(compute_metrics).parameters
        )
        if batch_eval_metrics and compute_metrics is not None and not takes_result:
            raise ConfigError(
                "batch_eval_metrics=true calls compute_metrics(eval_pred, compute_result=...) per batch; "
                "the given compute_metrics takes no compute_result argument (as in HF Trainer)"
            )
        #: the optimizer step whose weights the newest validation measured (``None``: not validated yet)
        self.last_validated_step: int | None = None
        self.compute_metrics = compute_metrics
        self.preprocess_logits_for_metrics = preprocess_logits_for_metrics
        #: whether ``preprocess_logits_for_metrics`` runs on chunks of positions under the lean loss
        #: (``None``: not known yet, checked on the first evaluation batch)
        self.preprocess_chunks = preprocess_logits_position_wise
        #: whether predictions are computed at the positions with a target only (-100 elsewhere)
        self.preprocess_targets_only = preprocess_logits_positions == "targets"
        if self.preprocess_targets_only:
            if preprocess_logits_for_metrics is None:
                raise ConfigError(
                    "preprocess_logits_positions='targets' says where preprocess_logits_for_metrics runs: "
                    "pass preprocess_logits_for_metrics too, or leave it 'all'"
                )
            if preprocess_logits_position_wise is False:
                raise ConfigError(
                    "preprocess_logits_positions='targets' computes predictions position by position: it "
                    "cannot go with preprocess_logits_position_wise=False"
                )
            self.preprocess_chunks = True
        self.batch_eval_metrics = batch_eval_metrics
        num_classes = sequence_classes(self.model)
        self.eval_metrics = nn.ModuleDict(
            {s: nn.ModuleDict(stage_metrics(self.causal, num_classes)) for s in STAGES}
        )
        self._collector = PredictionCollector(eval_accumulation_steps)
        self._lean_eval_said = False
        self._replaced_said: set[str] = set()  # built-in metric names a compute_metrics key replaced (warned)
        #: whether the caller declared preprocess_logits_for_metrics position-wise (else checked, or not yet)
        self._position_wise_declared = self.preprocess_chunks is not None
        #: what the next ``train/loss`` row is made of (:class:`~hf_lightning.module.train_log.TrainRows`)
        self.train_rows = TrainRows()
        self._clock = StepClock()  # the log line's elapsed and remaining time
        #: the newest value of every metric written to the loggers (``final_metrics.json`` is built from it)
        self.last_logged: dict[str, float] = {}
        self._steps_seen = 0  # optimizer steps whose bookkeeping ended (_end_step)
        self._grad_norm = StepGradNorm()
        self._engine_norm_due = (
            False  # this step's grad_norm is read from the DeepSpeed engine after its step
        )
        #: the optimizer step this process's fit started from (``None``: training never started, e.g. a resume
        #: of a run that had already reached its end)
        self.fit_start_step: int | None = None
        self._warned_unwrapped = False
        #: whether the model (or a module inside it, under PEFT) was compiled by ``model.compile()``; read at
        #: the first forward and at each fit's start
        self._compiled: bool | None = None

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
        """Where the loss comes from, first match wins: ``"compute_loss"`` (a subclass overrides
        :meth:`compute_loss`), ``"compute_loss_func"``, ``"model"`` (``use_model_loss``) or
        ``"token_cross_entropy"`` (the built-in loss)."""
        if type(self).compute_loss is not HFLightningModule.compute_loss:
            return "compute_loss"
        if self.compute_loss_func is not None:
            return "compute_loss_func"
        return "model" if self.use_model_loss else "token_cross_entropy"

    def _say_lean(self) -> None:
        """The lean loss's INFO line, when its state changed (rank zero)."""
        trainer = attached_trainer(self)
        self.lean.say(trainer is None or trainer.is_global_zero)

    # ------------------------------------------------------------------------ one micro-batch's loss
    def count_loss_items(self, batch: Mapping[str, Any]) -> int:
        """Targets in one micro-batch (host side); the DataModule sums it over a window."""
        return count_loss_items(batch, causal=self.causal)

    def _model_inputs(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        inputs = {k: v for k, v in batch.items() if k not in NON_MODEL_KEYS}
        if self._compiled is None:
            self._compiled = is_compiled_in_place(self.model)
        if self._compiled:  # model.compile=true: lengths vary without a recompilation
            mark_batch_dynamic(inputs)
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
        """``model(**inputs, **forward_kwargs)`` without the labels and the window keys; the model's output
        (``.logits`` ``(B, L, V)``, or ``(B, C)`` for classification)."""
        return self.model(**self._model_inputs(batch), **self.forward_kwargs)

    def compute_loss(
        self, batch: Mapping[str, Any], num_items_in_batch: Count | None
    ) -> tuple[torch.Tensor, Any]:
        """``(loss, model outputs)`` for one micro-batch: HF ``Trainer.compute_loss``. The scale of the step's
        loss is decided by the caller, :meth:`training_step`; a subclass may override this, as HF's.

        Args:
            batch: the collated micro-batch (``labels`` ``(B, L)`` or ``(B,)``; the window keys of
                :mod:`hf_lightning.data.sampling` are never passed to the model).
            num_items_in_batch: the window's target count (``int``, or a 0-dim int64 tensor when summed across
                ranks), at least 1; ``None`` when the batches carry no count (HF: "not counted") or the loss
                is HF's fallback (``loss_is_scaled_for_ga`` resolved to ``False``): the loss is then a mean
                over this micro-batch, which ``training_step`` divides by the window length.

        Returns:
            The micro-batch's share of the window loss (a sum over its items divided by
            ``num_items_in_batch``) as a 0-dim float tensor, and the model outputs. An override must return
            the same (or set ``loss_is_scaled_for_ga = False`` and return a per-micro-batch mean) for the step
            to stay exact.
        """
        if self.compute_loss_func is not None:
            outputs = self(batch)
            if not self.loss_is_share:
                return self.compute_loss_func(outputs, batch.get("labels")), outputs
            return self.compute_loss_func(
                outputs, batch.get("labels"), num_items_in_batch=num_items_in_batch
            ), outputs
        if self.use_model_loss:
            return self._model_loss(batch, num_items_in_batch)
        labels = batch["labels"]
        if labels.is_floating_point():
            raise ConfigError(
                "labels are floating point (regression or multi-label): the built-in token cross-entropy "
                "needs integer class ids; set module.use_model_loss=true or pass module.compute_loss_func"
            )
        loss_sum, outputs = self._token_loss_sum(batch, labels)
        if num_items_in_batch is None:
            # HF's "not counted" path: this micro-batch's own targets, counted on the device (no sync)
            targets = loss_targets(labels, self.causal, batch.get("shift_labels"))
            num_items_in_batch = (targets != IGNORE_INDEX).sum().clamp(min=1)
        return loss_sum / num_items_in_batch, outputs

    def _token_loss_sum(self, batch: Mapping[str, Any], labels: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """The summed token CE of the micro-batch and the model outputs: lean when it can be, else from the
        logits."""
        if self.lean.active:
            targets = loss_targets(labels, self.causal, batch.get("shift_labels"))
            lean = self.lean.forward(lambda: self(batch), targets.shape)
            if lean is not None:
                # the window loader's count of this micro-batch lets the head skip the non-target rows without
                # a host-device sync; it counts the targets when count_loss_items is ours
                own_count = type(self).count_loss_items is HFLightningModule.count_loss_items
                count = batch.get(MICRO_ITEMS_KEY) if own_count else None
                return self.lean.loss_sum(lean[1], targets, self.label_smoothing_factor, count), lean[0]
            self._say_lean()  # the model did not fit: say why
        outputs = self(batch)
        loss_sum = token_cross_entropy_sum(
            logits_of(outputs),
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
        outputs = self.model(**inputs, **self.forward_kwargs)
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs[0]
        if loss is None or not isinstance(loss, torch.Tensor) or loss.dim() != 0:
            raise ModelError(
                f"use_model_loss=True but {type(self.model).__name__}(labels=...) returned no scalar loss; "
                "leave module.use_model_loss unset to use the built-in token loss"
            )
        return loss, outputs

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
        loss = torch.zeros((), dtype=torch.float32, device=self.device)
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
        if self._engine_norm_due:  # DeepSpeed: the engine computed the norm in its step
            self._engine_norm_due = False
            self.train_rows.grad_norm = engine_grad_norm(self.trainer)
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
        # the loader's tensors are on the host already: on the CPU a copy of the dict is enough
        moved = dict(micro) if device.type == "cpu" else to_device(micro, device)
        if count is not None:
            moved[MICRO_ITEMS_KEY] = count
        return moved

    def _step_schedule(self) -> None:
        """The learning-rate schedule after an optimizer step (a metric-driven one waits for validation)."""
        for config in self.trainer.lr_scheduler_configs:
            if not is_metric_driven(config.scheduler):
                config.scheduler.step()

    # ------------------------------------------------------------------------------------ the train log
    # HF's loss row every logging_steps optimizer steps (hf_lightning.module.train_log says why it is ours)
    def add_window_share(self, share: torch.Tensor) -> None:
        """Add one micro-batch's logged share (detached, 0-dim) to the loss of its optimizer step's window."""
        self.train_rows.add_share(share)

    def check_window_count(self, step: int, count: torch.Tensor) -> None:
        """Warn at the next row if the window count of optimizer step ``step`` (summed across ranks) is 0."""
        self.train_rows.unchecked_counts.append((step, count))

    def add_train_metrics(self, metrics: Mapping[str, float]) -> None:
        """Add ``metrics`` (host floats) to the next train log row, so that a callback's figures for a step
        share the row of ``train/loss`` (e.g. :class:`~hf_lightning.callbacks.Throughput`)."""
        self.train_rows.extra.update(metrics)

    def skip_step_in_log(self) -> None:
        """The optimizer step being taken is skipped (no update): its window loss and gradient norm stay out
        of the train log. Called by :class:`~hf_lightning.callbacks.NonFiniteGuard` between ``backward`` and
        ``optimizer.step`` (in ``on_before_optimizer_step``, which runs before this module's)."""
        self.train_rows.step_skipped = True

    def is_log_step(self, step: int) -> bool:
        """Whether the train row is written after optimizer step ``step`` (1-based): every
        ``trainer.log_every_n_steps`` steps across epochs (HF's ``logging_steps``), at ``max_steps``, and
        after the first step with ``logging_first_step``."""
        trainer = self.trainer
        if step == 1 and self.logging_first_step:  # HF's logging_first_step (set by HFSteps)
            return True
        return step % max(trainer.log_every_n_steps, 1) == 0 or step >= trainer.max_steps > 0

    def wants_grad_norm(self) -> bool:
        """Whether the optimizer step being taken is logged (its row, or the final flush after an epoch's last
        batch): only then is ``grad_norm`` worth a pass over every gradient."""
        return self.is_log_step(self.global_step + 1) or bool(self.trainer.is_last_batch)

    @property
    def has_pending_train_log(self) -> bool:
        """Whether losses were accumulated since the last ``train/loss`` row (a final row is due)."""
        return self.train_rows.pending

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.global_step != self._steps_seen:  # else still accumulating, or a checkpoint ended the step
            self._end_step()
        rows = self.train_rows
        if rows.bar_loss is not None:  # the progress bar shows the newest row (self.log: not from a save)
            self.log("train/loss", rows.bar_loss, prog_bar=True, logger=False, on_step=True, on_epoch=False)
            rows.bar_loss = None

    def _end_step(self) -> None:
        """The bookkeeping of a finished optimizer step: its window loss joins the next row; a log step
        writes it."""
        self._steps_seen = self.global_step
        # HF's state.epoch, from the epoch of the step's batches: by the final flush (on_train_end) Lightning
        # has already counted the epoch a stop or the last batch ended, and the row would show the next one
        self.train_rows.end_step(self._epoch_done())
        self._clock.step_ended(self.global_step)
        self._grad_norm.reset()
        if self.is_log_step(self.global_step):
            self.flush_train_log()

    def _epoch_done(self) -> float:
        """HF ``Trainer``'s ``state.epoch`` at the end of the current optimizer step: the fraction of epochs
        done (:func:`~hf_lightning.module.train_log.epoch_fraction`), in the epoch's micro-batches when the
        train loader is a window loader of known length."""
        trainer = self.trainer
        loader = trainer.train_dataloader
        accumulation = int(getattr(loader, "gradient_accumulation_steps", 1) or 1)
        try:
            micro = len(loader.loader) if accumulation > 1 else None  # type: ignore[union-attr]
        except (AttributeError, TypeError):
            micro = None
        return epoch_fraction(
            self.current_epoch,
            epoch_batch_index(trainer) + 1,
            trainer.num_training_batches,
            micro,
            accumulation,
        )

    def on_train_end(self) -> None:
        if getattr(self, "preempted", None):
            return  # stopped on a signal: the losses since the last row are in last.ckpt, the resume goes on
        self.flush_train_log(progress_bar=False)  # the steps since the last log boundary

    def flush_train_log(self, progress_bar: bool = True) -> None:
        """Write the row of the steps since the last one (nothing when there are none); every rank must call
        it (the mean over ranks is a collective)."""
        rows, trainer = self.train_rows, self.trainer
        rows.warn_empty_windows(trainer.is_global_zero)
        if not rows.pending:
            return
        # every rank skips the same steps (the guard's verdict is all-reduced): the same branch on every rank
        loss = rows.take_loss()
        if loss is not None and trainer.world_size > 1:
            # training_step logs each rank's share times world size: the mean over ranks is the window loss
            loss = trainer.strategy.reduce(loss, reduce_op="mean")
        metrics = rows.metrics(loss.item() if loss is not None else None, self.current_epoch)
        if progress_bar:
            rows.bar_loss = metrics.get("train/loss")
        self.log_to_loggers(metrics)
        if trainer.is_global_zero and trainer.progress_bar_callback is None:
            # no bar shows it (output to a file): the row as a log line, as HF prints; the total is the run's
            # planned optimizer steps (trainer.max_epochs with trainer.max_steps=-1 too)
            total = self.planned_steps or trainer.max_steps
            say_row(metrics, self.global_step, total, self._clock.text(self.global_step, total))

    def log_to_loggers(self, metrics: Mapping[str, float | None], step: int | None = None) -> None:
        """Write one row to every logger at ``step`` (default: optimizer steps done, HF's ``global_step``);
        ``None`` values are left out. The one place where hf_lightning writes metrics to the loggers: the
        ``train/loss`` rows, the evaluation rows and the :class:`~hf_lightning.callbacks.NonFiniteGuard`
        counters.

        Why not ``self.log`` (what Lightning's ``_LoggerConnector`` does with it):

        - Lightning writes a step's logged values after every ``on_train_batch_end`` hook has run, i.e. after
          ``ModelCheckpoint`` / ``Preemption`` saved the checkpoint of that step. The row of step N must be on
          disk before checkpoint N: a kill between the two would resume from N without its row (the i15 kill
          harness's ``after_save`` point). Here the row is written from ``on_save_checkpoint`` first.
        - Lightning writes only when ``(batches_that_stepped + 1) % log_every_n_steps == 0`` or on
          ``should_stop``: the rows of ``max_steps`` and of HF's ``logging_first_step`` would be dropped, and
          it refuses ``self.log`` in ``on_train_end`` (the final flush) and in ``on_save_checkpoint``.
        - Its step is ``batches_that_stepped``, one less than HF's inside ``on_train_batch_end`` and for a
          validation inside ``fit``; the explicit ``"step"`` key that fixes it is also copied into
          ``trainer.callback_metrics`` (hence ``final_metrics.json``) and the dicts ``trainer.validate()``
          returns, and without it Lightning adds an ``epoch`` column to the evaluation rows.

        The cost is the same as Lightning's: one ``log_metrics`` and one ``save`` per row, on log steps only
        (Lightning's ``log_metrics`` also calls ``save`` after every write), plus the first line of a CSV
        logger's file read (:func:`~hf_lightning.run.loggers.adopt_csv_header`: a ``trainer.test`` under
        ``ddp_spawn`` writes from a new process whose logger has not seen the training columns)."""
        clean = {k: float(v) for k, v in metrics.items() if v is not None}
        self.last_logged.update(clean)
        for logger in self.loggers:
            adopt_csv_header(logger)
            logger.log_metrics(clean, step=self.global_step if step is None else step)
            logger.save()

    # --------------------------------------------------------------------------------- the gradient norm
    def step_gradient_norm(self, optimizer: torch.optim.Optimizer) -> torch.Tensor | None:
        """The total gradient 2-norm of the optimizer step being taken (before clipping; 0-dim float tensor on
        the gradients' device, no host sync), computed once per step and shared by the ``grad_norm`` log
        column, norm clipping and :class:`~hf_lightning.callbacks.NonFiniteGuard`
        (:mod:`hf_lightning.module.grad_norm`). ``None`` without gradients or under DeepSpeed. Valid between
        ``backward`` and ``optimizer.step``."""
        return self._grad_norm.get(self.trainer, optimizer, self.max_grad_norm)

    def clip_step_gradients(self, optimizer: torch.optim.Optimizer, max_norm: float) -> None:
        """Clip the step's gradients to total 2-norm ``max_norm`` with the shared norm (``clip_grad_norm_``'s
        result, one pass fewer); under FSDP through the root module's ``clip_grad_norm_``; where the shared
        norm cannot serve, Lightning's ``clip_gradients`` (the precision plugin's, a no-op under DeepSpeed,
        whose engine clips at ``gradient_clipping``). Call after AMP's unscale
        (``on_before_optimizer_step``)."""
        if not self._grad_norm.clip(self.trainer, optimizer, float(max_norm)):
            self.clip_gradients(optimizer, gradient_clip_val=float(max_norm), gradient_clip_algorithm="norm")

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """The train log's ``lr`` (the rate this step uses, read before the scheduler) and gradient norm
        (read only when the step's row is logged: a pass over every gradient on the other steps would be
        wasted; a skipped step has none); then clipping at ``max_grad_norm``."""
        rows = self.train_rows
        rows.lr = optimizer.param_groups[0]["lr"]
        wanted = self.wants_grad_norm() and not rows.step_skipped
        rows.grad_norm = self.step_gradient_norm(optimizer) if wanted else None
        # DeepSpeed's gradients live in its engine, which computes their norm in its own step: read after it
        self._engine_norm_due = wanted and gradients_outside_params(self.trainer)
        if self.max_grad_norm is not None:
            self.clip_step_gradients(optimizer, self.max_grad_norm)

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
        self._compiled = is_compiled_in_place(self.model)
        self._compile_report = CompileReport() if self._compiled else None
        if self._compile_report is not None:
            self._compile_report.start()

    def on_fit_end(self) -> None:
        """``model.compile=true``: one INFO line, the compilations of this fit and why each recompilation
        happened (:class:`~hf_lightning.module.compiled.CompileReport`)."""
        if getattr(self, "_compile_report", None) is not None:
            self._compile_report.say(self.trainer.is_global_zero)

    def on_train_start(self) -> None:
        self._steps_seen = self.global_step  # a resumed run starts at its checkpoint's step
        self.fit_start_step = self.global_step
        self._grad_norm.reset()
        self._clock.start()

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

    def configure_model(self) -> None:
        """Nothing to build: the model exists from the constructor on. Lightning's ``ModelParallelStrategy``
        (``strategy=fsdp``) requires this hook; :class:`~hf_lightning.strategies.fsdp.HFFSDPStrategy` shards
        the module in its own ``setup``, after it."""

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

    def total_training_steps(self) -> float:
        """Optimizer steps of the whole run, for the LR schedule
        (:func:`~hf_lightning.module.run_plan.training_steps`, which logs when ``max_epochs`` ends the run
        first and when windows are shorter than asked)."""
        return training_steps(self.trainer)

    # -------------------------------------------------------------------------------------- checkpoints
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """The train log's state (every rank's losses since the last row, gathered: rank 0 writes the
        checkpoint for all of them; the newest step's ``lr``, ``grad_norm``, ``epoch``) and the step validated
        last; an adapter model's checkpoint keeps its trainable weights only
        (:func:`~hf_lightning.adapters.checkpoint.drop_frozen`)."""
        trainer = self.trainer
        if trainer.training and self.global_step != self._steps_seen:
            # the callbacks' on_train_batch_end (where checkpoints are saved) run before ours: the row of this
            # step is written before its checkpoint
            self._end_step()
        pending = self.train_rows.pending_losses()
        if trainer.world_size > 1:
            pending = trainer.strategy.all_gather(pending.to(self.device)).reshape(trainer.world_size, -1)
        else:
            pending = pending.reshape(1, -1)
        checkpoint[TRAIN_LOG_KEY] = {
            **self.train_rows.state_dict(pending),
            "last_validated_step": self.last_validated_step,
        }
        drop_frozen(self, checkpoint)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """An adapter checkpoint's frozen weights filled back from the model as built
        (:func:`~hf_lightning.adapters.checkpoint.fill_frozen`); the train log's state restored; a checkpoint
        of the micro-batch loop (before this module stepped its windows) read as windows
        (:func:`~hf_lightning.checkpointing.loop_state.steps_windows_from_micro_batches`)."""
        fill_frozen(self, checkpoint)
        trainer = attached_trainer(self)
        state = checkpoint.get(TRAIN_LOG_KEY)
        if state:
            world = trainer.world_size if trainer is not None else 1
            rank = trainer.global_rank if trainer is not None else 0
            self.train_rows.load_state_dict(state, rank, world, self.device)
            self.last_validated_step = state.get("last_validated_step")
        saved = (checkpoint.get("hf_lightning") or {}).get("signature") or {}
        accumulation = (
            saved.get("accumulate_grad_batches") if "gradient_accumulation_steps" not in saved else 1
        )
        if accumulation is None:  # no signature (a Trainer without ResumeState): this run's window
            accumulation = getattr(getattr(trainer, "datamodule", None), "gradient_accumulation_steps", 1)
        if steps_windows_from_micro_batches(checkpoint, int(accumulation or 1)):
            log.info(
                "the checkpoint counts micro-batches (accumulation %d): its loop state is read as optimizer "
                "steps, one accumulation window per training batch",
                accumulation,
            )

    # --------------------------------------------------------------------------------------- evaluation
    # Per stage (val, test): {stage}/loss is the token-weighted mean over the whole set and all ranks (sum
    # of token CE / number of targets; HF's eval_loss is a sample-weighted mean of per-batch means and
    # differs when batches hold different numbers of targets), {stage}/perplexity = exp(loss),
    # {stage}/accuracy the token accuracy with the causal shift. A *ForSequenceClassification model gets
    # {stage}/loss (mean CE per example), {stage}/accuracy (per example) and {stage}/f1 (macro) instead of
    # perplexity. A user compute_metrics adds its keys under the same prefix. Without compute_metrics, a
    # causal LM's loss and accuracy come from the lean path when it is on (the argmax per chunk of tokens, no
    # logits held).
    def validation_step(self, batch: Mapping[str, Any], batch_idx: int) -> None:
        self._eval_step(batch, batch_idx, "val")

    def test_step(self, batch: Mapping[str, Any], batch_idx: int) -> None:
        self._eval_step(batch, batch_idx, "test")

    def _eval_step(self, batch: Mapping[str, Any], batch_idx: int, stage: str) -> None:
        if self.lean.active and self._lean_eval_step(batch, batch_idx, stage):
            return
        self._eval_from_logits(batch, self(batch).logits, batch_idx, stage)

    def _eval_from_logits(
        self, batch: Mapping[str, Any], logits: torch.Tensor, batch_idx: int, stage: str
    ) -> None:
        """The stage's metrics of one batch from its whole ``(B, L, V)`` logits."""
        metrics = self.eval_metrics[stage]
        labels = batch["labels"]
        loss_sum = token_cross_entropy_sum(
            logits, labels, causal=self.causal, shift_labels=batch.get("shift_labels")
        )
        # a placeholder (hf_lightning.data.collators.PlaceholderAwareCollator) has no target: it adds 0 to
        # these sums, and nothing below
        metrics["loss"].update(loss_sum, self.count_loss_items(batch))
        metrics["accuracy"].update(logits, labels)
        if "f1" in metrics:
            metrics["f1"].update(logits.argmax(-1), labels)
        if self.compute_metrics is None or batch.get(PLACEHOLDER_KEY):
            return
        preds = logits
        if self.preprocess_logits_for_metrics is not None:
            preds = self.preprocess_logits_for_metrics(logits, labels)
        if self.preprocess_targets_only:
            preds = self._only_at_targets(preds, batch)
        self._keep_predictions(preds, labels, batch_idx, stage)

    def _only_at_targets(self, preds: torch.Tensor, batch: Mapping[str, Any]) -> torch.Tensor:
        """``preds`` ``(B, L, ...)`` with -100 at the positions without a loss target."""
        targets = loss_targets(batch["labels"], self.causal, batch.get("shift_labels")).to(preds.device)
        if not isinstance(preds, torch.Tensor) or tuple(preds.shape[:2]) != tuple(targets.shape):
            found = tuple(preds.shape) if isinstance(preds, torch.Tensor) else type(preds).__name__
            why = f"it returned {found} for logits of shape {tuple(batch['labels'].shape)} + (vocab,)"
            raise ValueError(_TARGETS_NEED_POSITIONS.format(why=why))
        check_holds_ignore_index(preds.dtype)
        missing = (targets == IGNORE_INDEX).reshape(*targets.shape, *(1,) * (preds.dim() - targets.dim()))
        return preds.masked_fill(missing, IGNORE_INDEX)

    def _keep_predictions(self, preds: Any, labels: torch.Tensor, batch_idx: int, stage: str) -> None:
        """``compute_metrics``'s share of one batch: called now (``batch_eval_metrics``) or collected."""
        if self.batch_eval_metrics:
            from transformers import EvalPrediction

            last = batch_idx == self._num_eval_batches(stage) - 1
            result = self.compute_metrics(
                EvalPrediction(predictions=preds.detach().cpu().numpy(), label_ids=labels.cpu().numpy()),
                compute_result=last,
            )
            if last:
                self._user_metrics = dict(result or {})
        else:
            self._collector.add(preds, labels)

    def _lean_eval_step(self, batch: Mapping[str, Any], batch_idx: int, stage: str) -> bool:
        """Loss and token accuracy from the hidden states and the LM head, chunk by chunk (no logits held),
        and ``preprocess_logits_for_metrics`` applied to the same chunks' logits; ``False`` when the model
        turned out not to fit, or ``compute_metrics`` needs the whole logits (the caller takes the plain
        path)."""
        wants_preds = self.compute_metrics is not None and not batch.get(PLACEHOLDER_KEY)
        if wants_preds and (self.preprocess_logits_for_metrics is None or self.preprocess_chunks is False):
            return False
        labels = batch["labels"]
        targets = loss_targets(labels, self.causal, batch.get("shift_labels"))
        lean = self.lean.forward(lambda: self(batch), targets.shape)
        if lean is None:
            self._say_lean()
            return False
        hidden = lean[1]
        count = int((targets != IGNORE_INDEX).sum())
        if not wants_preds:
            loss_sum, correct = self.lean.stats(hidden, targets, count)
        else:
            chunked = self._chunked_predictions(hidden, targets, labels)
            if chunked is None:  # the whole logits, from the hidden states the forward gave
                self._eval_from_logits(batch, self.lean.logits(hidden), batch_idx, stage)
                return True
            loss_sum, correct, preds = chunked
        metrics = self.eval_metrics[stage]
        # the loss is averaged over the module's own target rule: the same count unless a subclass redefines
        # it
        own_count = type(self).count_loss_items is HFLightningModule.count_loss_items
        metrics["loss"].update(loss_sum, count if own_count else self.count_loss_items(batch))
        metrics["accuracy"].update(correct=correct, total=count)
        if wants_preds:
            self._keep_predictions(preds, labels, batch_idx, stage)
        return True

    def _chunked_predictions(
        self, hidden: torch.Tensor, targets: torch.Tensor, labels: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """``(loss sum, correct, predictions)`` with ``preprocess_logits_for_metrics`` applied to chunks of
        positions; ``None`` (and :attr:`preprocess_chunks` set to ``False`` with one INFO line) when it is
        not position-wise. While :attr:`preprocess_chunks` is ``None`` (the first batch) the predictions
        of the batch's first two rows (their first positions, half as many as a chunk holds) are compared with
        the function's result on those positions' logits, taken whole."""
        fn = self.preprocess_logits_for_metrics
        try:
            loss_sum, correct, preds = self.lean.predictions(
                hidden, targets, labels, fn, self.preprocess_targets_only
            )
        except NotPositionWise as err:
            if self.preprocess_targets_only:
                raise ValueError(_TARGETS_NEED_POSITIONS.format(why=err)) from None
            self._not_position_wise(str(err))
            return None
        if self.preprocess_chunks is None:
            # on the first positions (half as many as a chunk holds, so that no row's part lines up with a
            # chunk) of the batch's first two rows: enough to see a function mix positions or rows, with one
            # chunk's worth of logits
            part = (slice(0, 2), slice(0, max(1, self.lean.chunk_rows() // 2)))
            problem = position_wise_problem(preds[part], fn(self.lean.logits(hidden[part]), labels[part]))
            if problem is not None:
                self._not_position_wise(problem)
                return None
            self.preprocess_chunks = True
            self._say_lean_eval()
        return loss_sum, correct, preds

    def _say_lean_eval(self) -> None:
        """:meth:`_lean_eval_line` at INFO, once, on rank zero."""
        self._lean_eval_said = True
        if self.trainer.is_global_zero:
            log.info(self._lean_eval_line())

    def _not_position_wise(self, why: str) -> None:
        self.preprocess_chunks = False
        self._lean_eval_said = True  # this line says what evaluation does
        if self.trainer.is_global_zero:
            log.info(
                "preprocess_logits_for_metrics is not position-wise (%s): evaluation computes each batch's "
                "whole logits for it (HFLightningModule(preprocess_logits_position_wise=True) declares it "
                "position-wise)",
                why,
            )

    def _lean_eval_line(self) -> str:
        """What evaluation with ``compute_metrics`` does with the logits while training is lean."""
        if self.preprocess_logits_for_metrics is None:
            return "evaluation computes the full logits: compute_metrics needs them (training stays lean)"
        if self.preprocess_chunks is False:
            return (
                "evaluation computes each batch's whole logits for preprocess_logits_for_metrics "
                "(HFLightningModule(preprocess_logits_position_wise=False); training stays lean)"
            )
        if self.preprocess_targets_only:
            return (
                f"evaluation applies preprocess_logits_for_metrics to the logits of the positions with a "
                f"target only, at most {self.lean.chunk_rows()} at a time, and gives the others -100 "
                "(preprocess_logits_positions='targets')"
            )
        checked = (
            "declared position-wise"
            if self._position_wise_declared
            else "checked on the first batch against its first two rows' logits taken whole"
        )
        return (
            f"evaluation applies preprocess_logits_for_metrics to the logits of at most "
            f"{self.lean.chunk_rows()} positions at a time, never the whole batch's ({checked})"
        )

    def _num_eval_batches(self, stage: str) -> int:
        counts = self.trainer.num_val_batches if stage == "val" else self.trainer.num_test_batches
        return int(counts[0])

    def on_validation_start(self) -> None:
        self._eval_start("val")

    def on_test_start(self) -> None:
        self._eval_start("test")

    def _eval_start(self, stage: str) -> None:
        self._collector.reset()
        self._user_metrics: dict[str, float] = {}
        # said once; for a preprocess_logits_for_metrics not yet checked, by the first batch's check instead
        decided = self.preprocess_logits_for_metrics is None or self.preprocess_chunks is not None
        if self.compute_metrics is not None and self.lean.active and decided and not self._lean_eval_said:
            self._say_lean_eval()
        if (
            self.compute_metrics is None
            or self.preprocess_logits_for_metrics is not None
            or self.batch_eval_metrics
        ):
            return
        loader = self.trainer.val_dataloaders if stage == "val" else self.trainer.test_dataloaders
        warn_if_logits_kept(stage, getattr(loader, "dataset", None), self.model)

    def on_validation_epoch_end(self) -> None:
        """The validation metrics; inside ``fit`` a metric-driven schedule then steps on its metric (HF steps
        it after each evaluation)."""
        self._eval_epoch_end("val")
        trainer = self.trainer
        if trainer.sanity_checking or trainer.state.fn != "fit":
            return
        for config in trainer.lr_scheduler_configs:
            if is_metric_driven(config.scheduler):
                step_on_validation(config.scheduler, self.last_logged, self.schedule_metric)

    def on_test_epoch_end(self) -> None:
        self._eval_epoch_end("test")

    def _eval_epoch_end(self, stage: str) -> dict[str, float]:
        """The stage's values: logged (the progress bar; the loggers at ``step`` = optimizer steps done) and
        kept for the list ``trainer.validate()`` / ``.test()`` returns; the same floats everywhere."""
        metrics = self.eval_metrics[stage]
        loss = metrics["loss"].compute()
        values = {f"{stage}/loss": loss, f"{stage}/accuracy": metrics["accuracy"].compute()}
        if "f1" in metrics:
            values[f"{stage}/f1"] = metrics["f1"].compute()
        else:
            values[f"{stage}/perplexity"] = torch.exp(loss)
        for m in metrics.values():
            m.reset()
        world = self.trainer.world_size
        if self.compute_metrics is not None and not self.batch_eval_metrics:
            preds, labels = self._collector.gather(world, lambda obj: all_gather_object(obj, world))
            self._collector.reset()
            if preds is not None:
                from transformers import EvalPrediction

                self._user_metrics = dict(
                    self.compute_metrics(EvalPrediction(predictions=preds, label_ids=labels))
                )
        for key, value in getattr(self, "_user_metrics", {}).items():
            name = key.removeprefix("eval_")
            if f"{stage}/{name}" in values and name not in self._replaced_said:
                self._replaced_said.add(name)
                if self.trainer.is_global_zero:
                    log.warning(
                        "compute_metrics returned %r: its value replaces the built-in %s/%s; return another "
                        "key to keep both",
                        key,
                        stage,
                        name,
                    )
            values[f"{stage}/{name}"] = torch.as_tensor(float(value))
        # the values are already the same on every rank (the metrics sync their states); a max over ranks
        # keeps them exact and tells Lightning so (it warns about epoch-level values logged without sync_dist)
        synced = world > 1
        for key, value in values.items():
            self.log(
                key, value, prog_bar=key == f"{stage}/loss", logger=False, sync_dist=synced, reduce_fx="max"
            )
        floats = {k: float(v) for k, v in values.items()}
        if not self.trainer.sanity_checking:
            self.log_to_loggers(floats)
            if stage == "val":
                self.last_validated_step = self.global_step
            self._returned_results = (returned_results(self.trainer, stage), floats)
        return floats

    def on_validation_end(self) -> None:
        """``trainer.validate()`` returns ``[{"val/loss": ..., ...}]``: the values the loggers received."""
        self._fill_returned_results()

    def on_test_end(self) -> None:
        """``trainer.test()`` returns ``[{"test/loss": ..., ...}]``: the values the loggers received."""
        self._fill_returned_results()

    def _fill_returned_results(self) -> None:
        results, floats = getattr(self, "_returned_results", (None, {}))
        self._returned_results = (None, {})
        if results is None:
            return
        if not results:
            results.append({})
        for outputs in results:
            outputs.update(floats)

    def _lean_argmax(self, batch: Mapping[str, Any]) -> torch.Tensor | None:
        """The argmax token ``(B, L)`` at every position from the hidden states and the LM head, chunk by
        chunk (no logits held); ``None`` when the model turned out not to fit."""
        labels = batch["labels"]
        lean = self.lean.forward(lambda: self(batch), labels.shape)
        if lean is None:
            self._say_lean()
            return None
        # no target: the chunks compute no loss, only the argmax
        return self.lean.predictions(lean[1], torch.full_like(labels, IGNORE_INDEX), labels, _argmax)[2]

    def predict_step(self, batch: Mapping[str, Any], batch_idx: int) -> list[dict[str, Any]]:
        """Per example: the argmax token at every target position (causal shift), and the label there.

        Returns a list (one dict per example, in batch order) of ``{"positions", "predicted_ids",
        "label_ids"}``; positions index the label sequence. Every target is there (every assistant turn of a
        chat, the tokens ``val/loss`` averages over): HF ``Trainer.predict``'s predictions and ``label_ids``
        at the labels that are not -100. A placeholder batch (a rank with no example of the
        set, :class:`~hf_lightning.data.collators.PlaceholderAwareCollator`) returns ``[]``.
        """
        if batch.get(PLACEHOLDER_KEY):
            return []
        labels = batch["labels"]
        preds = self._lean_argmax(batch) if self.lean.active else None
        if preds is None:
            preds = self(batch).logits.argmax(-1)
        if self.causal:
            preds = torch.nn.functional.pad(preds[..., :-1], (1, 0), value=IGNORE_INDEX)
        out = []
        for p, lab in zip(preds.cpu(), labels.cpu()):
            pos = (lab != IGNORE_INDEX).nonzero().flatten()
            if self.causal:
                pos = pos[pos > 0]
            out.append(
                {"positions": pos.tolist(), "predicted_ids": p[pos].tolist(), "label_ids": lab[pos].tolist()}
            )
        return out


def _argmax(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return logits.argmax(-1)
