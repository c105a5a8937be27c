"""The token loss: one home for how a loss term is counted and summed.

HF `Trainer` (transformers >= 4.46) normalises the loss of one optimizer step by ``num_items_in_batch``, the
number of label positions that receive a loss term across every micro-batch of the gradient-accumulation
window (``Trainer.get_batch_samples``), summed across data-parallel ranks when
``average_tokens_across_devices`` is true. The functions here compute the two halves of that quotient: the
count (cheap, on the host, before the first forward of the step) and the sum of per-token cross-entropy.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100


def count_loss_items(batch: Mapping[str, torch.Tensor], causal: bool = True) -> int:
    """Number of label positions of ``batch`` that get a loss term.

    Args:
        batch: a collated batch. ``shift_labels`` (already shifted by the collator) is counted as is;
            otherwise ``labels`` of shape ``(B, L)`` (int64, ``-100`` = ignored).
        causal: ``True`` for causal LMs, whose first label position is never a target (the loss compares
            ``logits[:, :-1]`` with ``labels[:, 1:]``); ``False`` counts every ``labels != -100``
            (encoder-decoder, token classification). A 1-D ``labels`` (sequence classification) counts
            one item per example.

    Returns:
        The count as a Python ``int`` (0 if the batch holds no labels).

    Example: rows ``[5, 6, 7, -100]`` and ``[-100, -100, 8, 9]`` hold 4 causal targets, not 5.
    """
    if "shift_labels" in batch:
        return int((batch["shift_labels"] != IGNORE_INDEX).sum())
    labels = batch.get("labels")
    if labels is None:
        return 0
    if labels.dim() == 1:
        return int(labels.numel())
    if causal:
        labels = labels[..., 1:]
    return int((labels != IGNORE_INDEX).sum())


def token_cross_entropy_sum(
    logits: torch.Tensor, labels: torch.Tensor, causal: bool = True, shift_labels: torch.Tensor | None = None
) -> torch.Tensor:
    """Sum of per-token cross-entropy over the positions that get a loss term.

    The causal shift matches ``transformers.loss.loss_utils.ForCausalLMLoss``: position ``t`` of the logits
    predicts ``labels[t + 1]``; ``-100`` positions are skipped. Computed in float32 whatever the logits'
    dtype, as HF does.

    Args:
        logits: ``(B, L, V)`` float.
        labels: ``(B, L)`` int64 with ``-100`` for ignored positions.
        causal: shift by one position (causal LM) or not (encoder-decoder).
        shift_labels: ``(B, L)`` labels already shifted by the collator; if given, used as is.

    Returns:
        A 0-dim float32 tensor on the logits' device (0.0 when nothing is a target; never NaN).
    """
    if shift_labels is not None:
        targets = shift_labels
    elif causal:
        # pad one ignored position at the end instead of slicing the logits: no copy of the (B, L, V) tensor
        targets = F.pad(labels[..., 1:], (0, 1), value=IGNORE_INDEX)
    else:
        targets = labels
    return F.cross_entropy(
        logits.float().reshape(-1, logits.size(-1)),
        targets.reshape(-1).to(logits.device),
        ignore_index=IGNORE_INDEX,
        reduction="sum",
    )
