"""The token loss: one home for how a loss term is counted and summed, and for which loss a model gets.

HF `Trainer` (transformers >= 4.46) normalises the loss of one optimizer step by ``num_items_in_batch``, the
number of label positions that receive a loss term across every micro-batch of the gradient-accumulation
window (``Trainer.get_batch_samples``), summed across data-parallel ranks when
``average_tokens_across_devices`` is true. The functions here compute the two halves of that quotient: the
count (cheap, on the host, before the first forward of the step) and the sum of per-token cross-entropy
(optionally label-smoothed exactly as HF's ``LabelSmoother``). They also hold the two decisions HF takes by
inspecting the model: whether its loss shifts labels, and whether its ``forward`` honours
``num_items_in_batch``; and whether a module's loss is a share of the window's (:func:`loss_is_share`).
``HFLightningModule.compute_loss`` (HF's ``compute_loss`` for one micro-batch) calls them. How the micro-batch
losses add up to the step's loss (the count across ranks, the fallback, the factor against DDP's mean over
ranks) is decided in one place: ``HFLightningModule.training_step``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F

from hf_lightning.compat import loss_is_causal_lm
from hf_lightning.core.batch import IGNORE_INDEX, PLACEHOLDER_KEY, WINDOW_KEYS
from hf_lightning.core.errors import ConfigError


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


def loss_is_share(module: Any) -> tuple[bool, str | None]:
    """``(share, why not)``: does the module's ``compute_loss`` return a share of the window loss (a sum
    divided by ``num_items_in_batch``), or a per-micro-batch mean (HF's fallback, with the reason)? HF
    ``Trainer`` decides the same in ``__init__`` (``model_accepts_loss_kwargs``, ``compute_loss_func``) and
    names it ``loss_is_scaled_for_ga``, which a subclass may set to override this. ``module.loss_source``
    says where the loss comes from (``HFLightningModule.loss_source``)."""
    source = module.loss_source
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


def logits_of(outputs: Any) -> torch.Tensor:
    """``outputs.logits`` of a ``ModelOutput``, a dict or a tuple (first element)."""
    if isinstance(outputs, Mapping):
        return outputs["logits"]
    logits = getattr(outputs, "logits", None)
    return logits if logits is not None else outputs[0]
