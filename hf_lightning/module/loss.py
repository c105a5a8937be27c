"""The token loss: one home for how a loss term is counted and summed, and for which loss a model gets.

HF `Trainer` (transformers >= 4.46) normalises the loss of one optimizer step by ``num_items_in_batch``, the
number of label positions that receive a loss term across every micro-batch of the gradient-accumulation
window (``Trainer.get_batch_samples``), summed across data-parallel ranks when
``average_tokens_across_devices`` is true. The functions here compute the two halves of that quotient: the
count (cheap, on the host, before the first forward of the step) and the sum of per-token cross-entropy
(optionally label-smoothed exactly as HF's ``LabelSmoother``). They also hold the two decisions HF takes by
inspecting the model: whether its loss shifts labels, and whether its ``forward`` honours
``num_items_in_batch``; which loss a module gets (:func:`loss_source`, :func:`loss_is_share`); and
:class:`ComputeLoss`, HF's ``compute_loss`` for one micro-batch. How the micro-batch losses add up to the
step's loss (the count across ranks, the fallback, the factor against DDP's mean over ranks) is decided in one
place: ``HFLightningModule.training_step``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F

from hf_lightning.compat import loss_is_causal_lm
from hf_lightning.core.batch import IGNORE_INDEX, MICRO_ITEMS_KEY, PLACEHOLDER_KEY, WINDOW_KEYS
from hf_lightning.core.errors import ConfigError, ModelError


def count_loss_items(batch: Mapping[str, torch.Tensor], causal: bool = True) -> int:
    """Number of label positions of ``batch`` that get a loss term.

    Args:
        batch: a collated batch. ``shift_labels`` (already shifted by the collator) is counted as is;
            otherwise ``labels`` of shape ``(B, L)`` (int64, ``-100`` = ignored).
        causal: ``True`` for causal LMs, whose first label position is never a target (the loss compares
            ``logits[:, :-1]`` with ``labels[:, 1:]``); ``False`` counts every ``labels != -100``
            (encoder-decoder, masked LM, token classification). A 1-D ``labels`` (sequence classification)
            counts one item per example whose label is not ``-100`` (every example for float labels).

    Returns:
        The count as a Python ``int`` (0 if the batch holds no labels). It is a host computation: call it on
        CPU tensors (the DataModule does, before the batch moves to the device).

    Example: rows ``[5, 6, 7, -100]`` and ``[-100, -100, 8, 9]`` hold 4 causal targets, not 5.
    """
    if "shift_labels" in batch:
        return int((batch["shift_labels"] != IGNORE_INDEX).sum())
    labels = batch.get("labels")
    if labels is None:
        return 0
    if labels.dim() == 1:
        return int(labels.numel()) if labels.is_floating_point() else int((labels != IGNORE_INDEX).sum())
    if causal:
        labels = labels[..., 1:]
    return int((labels != IGNORE_INDEX).sum())


def loss_targets(
    labels: torch.Tensor, causal: bool = True, shift_labels: torch.Tensor | None = None
) -> torch.Tensor:
    """The target of every logit position: ``labels`` shifted left by one for causal LMs.

    Shapes: ``labels`` ``(B, L)`` or ``(B,)`` int64 -> the same shape. A 1-D ``labels`` is never shifted.
    The causal shift pads one ignored position at the end instead of slicing the logits (no copy of the
    ``(B, L, V)`` logits), as ``transformers.loss.loss_utils.ForCausalLMLoss`` does.
    """
    if shift_labels is not None:
        return shift_labels
    if causal and labels.dim() > 1:
        return F.pad(labels[..., 1:], (0, 1), value=IGNORE_INDEX)
    return labels


def token_cross_entropy_sum(
    logits: torch.Tensor,
    labels: torch.Tensor,
    causal: bool = True,
    shift_labels: torch.Tensor | None = None,
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """Sum of per-token cross-entropy over the positions that get a loss term.

    The causal shift matches ``transformers.loss.loss_utils.ForCausalLMLoss``: position ``t`` of the logits
    predicts ``labels[t + 1]``; ``-100`` positions are skipped. Computed in float32 whatever the logits'
    dtype, as HF does.

    With ``label_smoothing = eps > 0`` each term is ``(1 - eps) * nll + eps * mean_v(-log p_v)``, which is the
    numerator of ``transformers.trainer_pt_utils.LabelSmoother``: dividing this sum by
    ``num_items_in_batch`` gives exactly ``LabelSmoother(eps)(outputs, labels, shift_labels=causal,
    num_items_in_batch=...)``. (``torch``'s ``label_smoothing`` uses the same formula.)

    Args:
        logits: ``(B, L, V)`` float (or ``(B, C)`` for sequence classification).
        labels: ``(B, L)`` int64 with ``-100`` for ignored positions (or ``(B,)``).
        causal: shift by one position (causal LM) or not (encoder-decoder, classification).
        shift_labels: ``(B, L)`` labels already shifted by the collator; if given, used as is.
        label_smoothing: HF's ``label_smoothing_factor``, in ``[0, 1)``.

    Returns:
        A 0-dim float32 tensor on the logits' device (0.0 when nothing is a target, with a zero gradient;
        never NaN).
    """
    targets = loss_targets(labels, causal, shift_labels)
    return F.cross_entropy(
        logits.float().reshape(-1, logits.size(-1)),
        targets.reshape(-1).to(logits.device),
        ignore_index=IGNORE_INDEX,
        reduction="sum",
        label_smoothing=label_smoothing,
    )


def loss_shifts_labels(model: Any) -> bool:
    """Whether the model's labels are aligned for a causal LM (the loss compares logit ``t`` with label
    ``t+1``).

    The loss the model itself would compute (``PreTrainedModel.loss_function``) is ``ForCausalLMLoss`` and the
    model is not encoder-decoder. ``loss_function`` maps ``loss_type`` through ``LOSS_MAPPING`` and falls back
    to ``ForCausalLMLoss`` when ``loss_type`` is unset or unknown: ``GPT2LMHeadModel`` (no ``ForCausalLM`` in
    its class name, so ``loss_type is None``) shifts its labels. HF ``Trainer``'s ``_loss_shifts_labels``
    skips that fallback and then counts ``num_items_in_batch`` without the shift, one
    extra target per row, so its logged GPT-2 loss is lower than the token mean. A module that is not a
    ``PreTrainedModel`` (no ``loss_type``) counts as causal unless its config says ``is_encoder_decoder``: a
    ``forward`` that returns ``(B, L, V)`` logits is a causal LM unless told otherwise (pass ``causal=False``
    to :class:`~hf_lightning.HFLightningModule` for a custom token classifier).
    """
    config = getattr(model, "config", None)
    if getattr(config, "is_encoder_decoder", False):
        return False
    if not hasattr(model, "loss_type"):
        return True
    return loss_is_causal_lm(model)


def declares_num_items_support(model: Any) -> bool:
    """Whether ``model`` is *declared* to honour ``num_items_in_batch`` in its ``forward`` loss.

    Only an explicit ``accepts_loss_kwargs = True`` attribute counts (HF's own declaration, which
    ``transformers.Trainer`` reads first). Unlike HF we never infer it from a bare ``**kwargs`` in
    ``forward``: a model that swallows the keyword and still averages per micro-batch would have its
    gradients multiplied by ``accumulate_grad_batches x world_size`` (HF's known footgun).
    """
    return getattr(model, "accepts_loss_kwargs", None) is True


def accepts_num_items(fn: Callable[..., Any]) -> bool:
    """Whether a user loss callable has a parameter named ``num_items_in_batch`` (``**kwargs`` does not
    count)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    param = params.get("num_items_in_batch")
    return param is not None and param.kind in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.KEYWORD_ONLY,
    )


def loss_source(module: Any) -> str:
    """Where :class:`~hf_lightning.HFLightningModule`'s loss comes from, first match wins: ``"compute_loss"``
    (a subclass overrides ``compute_loss``), ``"compute_loss_func"``, ``"model"`` (``use_model_loss``) or
    ``"token_cross_entropy"`` (the built-in loss)."""
    if type(module).compute_loss is not ComputeLoss.compute_loss:
        return "compute_loss"
    if module.compute_loss_func is not None:
        return "compute_loss_func"
    return "model" if module.use_model_loss else "token_cross_entropy"


def loss_is_share(module: Any) -> tuple[bool, str | None]:
    """``(share, why not)``: does the module's ``compute_loss`` return a share of the window loss (a sum
    divided by ``num_items_in_batch``), or a per-micro-batch mean (HF's fallback, with the reason)? HF
    ``Trainer`` decides the same in ``__init__`` (``model_accepts_loss_kwargs``, ``compute_loss_func``) and
    names it ``loss_is_scaled_for_ga``, which a subclass may set to override this."""
    source = loss_source(module)
    if module.loss_is_scaled_for_ga is not None:
        share = bool(module.loss_is_scaled_for_ga)
        return share, None if share else f"{type(module).__name__}.loss_is_scaled_for_ga is False"
    if source == "compute_loss_func" and not accepts_num_items(module.compute_loss_func):
        return False, "compute_loss_func has no num_items_in_batch parameter"
    if source == "model" and not module.model_accepts_loss_kwargs:
        return False, (
            f"use_model_loss=True but {type(module.model).__name__} is not declared to honour "
            "num_items_in_batch (model_accepts_loss_kwargs / accepts_loss_kwargs)"
        )
    return True, None


#: the WARNING of HF's fallback, ``%s`` = the reason of :func:`loss_is_share`
FALLBACK_WARNING = (
    "%s: the loss is a mean over each micro-batch, so, as HF Trainer does, each micro-batch mean is "
    "divided by the number of micro-batches in its accumulation window. This weights the targets of a "
    "micro-batch with few targets more than those of a full one: the loss and gradient change with "
    "the micro-batch size, accumulate_grad_batches and the number of ranks. For the exact token mean, "
    "take num_items_in_batch and return sum / num_items_in_batch (or use the built-in token loss)."
)


def check_loss_arguments(
    compute_loss_func: Callable[..., Any] | None, use_model_loss: bool | None, label_smoothing_factor: float
) -> None:
    """Refuse loss arguments of :class:`~hf_lightning.HFLightningModule` that conflict.

    Raises:
        ConfigError: naming the ``module.*`` key(s).
    """
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


def resolve_model_loss(
    model: Any,
    model_accepts_loss_kwargs: bool | None,
    use_model_loss: bool | None,
    compute_loss_func: Callable[..., Any] | None,
    label_smoothing_factor: float,
) -> tuple[bool, bool]:
    """``(model_accepts_loss_kwargs, use_model_loss)`` with their ``None`` defaults resolved: the model is
    declared to honour ``num_items_in_batch`` per :func:`declares_num_items_support`, and its own loss is used
    only when it is declared so, with no ``compute_loss_func`` and no label smoothing."""
    accepts = (
        declares_num_items_support(model)
        if model_accepts_loss_kwargs is None
        else bool(model_accepts_loss_kwargs)
    )
    if use_model_loss is None:
        use_model_loss = accepts and compute_loss_func is None and not label_smoothing_factor
    return accepts, bool(use_model_loss)


NON_MODEL_KEYS = ("labels", "shift_labels", *WINDOW_KEYS, PLACEHOLDER_KEY)

#: a window count: a host ``int``, or a 0-dim int64 tensor when summed across ranks
Count = int | torch.Tensor


class ComputeLoss:
    """Mixin of :class:`~hf_lightning.HFLightningModule`: HF ``Trainer.compute_loss`` for one micro-batch.

    Needs ``model``, ``compute_loss_func``, ``use_model_loss``, ``model_accepts_loss_kwargs``,
    ``loss_is_share``, ``causal``, ``label_smoothing_factor``, ``forward_kwargs``, ``lean`` (a
    :class:`~hf_lightning.module.lean_loss.LeanLoss`) and ``_say_lean()``. The scale of the step's loss is
    decided by the caller, ``HFLightningModule.training_step``.
    """

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
        """``model(**inputs, **forward_kwargs)`` without the labels and the window keys; the model's output
        (``.logits`` ``(B, L, V)``, or ``(B, C)`` for classification)."""
        return self.model(**self._model_inputs(batch), **self.forward_kwargs)

    def compute_loss(
        self, batch: Mapping[str, Any], num_items_in_batch: Count | None
    ) -> tuple[torch.Tensor, Any]:
        """``(loss, model outputs)`` for one micro-batch.

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
                own_count = type(self).count_loss_items is ComputeLoss.count_loss_items
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


def logits_of(outputs: Any) -> torch.Tensor:
    """``outputs.logits`` of a ``ModelOutput``, a dict or a tuple (first element)."""
    if isinstance(outputs, Mapping):
        return outputs["logits"]
    logits = getattr(outputs, "logits", None)
    return logits if logits is not None else outputs[0]
