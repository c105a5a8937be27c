"""The token cross-entropy of an LM head computed in chunks of tokens: no ``(tokens x vocab)`` tensor ever
exists.

A causal LM's loss is ``CE(transform(hidden @ W.T + b), targets)``. Computing the logits of every token first
holds ``N x V`` floats (2,048 tokens x 128,256 vocabulary = 1 GiB in float32), then their float32 copy, the
softmax and the gradient of the same size. Here the tokens are taken ``chunk_size`` at a time: each chunk's
logits are computed, reduced to their loss sum and, when a gradient is needed, to their gradient with respect
to the hidden states and the head, and freed before the next chunk. The idea of LitGPT's
``chunked_cross_entropy``, torchtune's chunked output loss, Liger's fused linear cross-entropy and Apple's Cut
Cross-Entropy, in plain PyTorch (CPU and any GPU).

The gradients are computed in the forward pass (as Liger does), chunk by chunk, and kept until the backward
pass, which only multiplies them by the incoming scalar gradient: the head costs the same three matrix
products as the plain path (recomputing the logits in the backward pass would cost a fourth), and the extra
memory is one gradient of the hidden states ``(N, H)`` and one of the head ``(V, H)`` (float32), which the
plain path creates as well. Within a chunk the loss is the plain path's: the logits in the input's dtype (or
autocast's), upcast to float32, then the model's logit transform (:class:`LogitTransform`) and the terms of
``torch.nn.functional.cross_entropy`` (sum, ``ignore_index=-100``, ``label_smoothing``), with their gradient
written out and computed in place (one ``(rows, V)`` float32 tensor per chunk, two with a soft-cap). The loss
and every gradient equal the plain path's up to float rounding (relative 1e-6 in float32, tested).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from hf_lightning.core.batch import IGNORE_INDEX

#: float32 bytes of one chunk's logits, per device type: rows per chunk = bytes // (4 x vocabulary), at least
#: 16. CPU: 32 MiB, the fastest of the sizes compared by scripts/bench_memory.py (docs/benchmarks.md; smaller
#: chunks read the whole head more often), and at or below 32 MiB glibc reuses the freed chunk from its heap
#: instead of mapping fresh pages for every chunk. CUDA: large enough that the head's matrix products are not
#: bound by reading the weight once per chunk (512 rows of a 128,256 vocabulary), as Liger sizes its chunks.
CHUNK_BYTES = {"cpu": 32 * 2**20, "cuda": 256 * 2**20}
DEFAULT_CHUNK_BYTES = 64 * 2**20


@dataclass(frozen=True)
class LogitTransform:
    """What a model's forward does to the output of its LM head, applied in float32 in this order.

    ``multiplier`` (Cohere's ``logit_scale``: ``logits * s``), ``divisor`` (Granite's ``logits_scaling``:
    ``logits / s``), ``softcap`` (Gemma-2's ``final_logit_softcapping``: ``tanh(logits / c) * c``). ``None``
    skips a step; the default is the identity.
    """

    multiplier: float | None = None
    divisor: float | None = None
    softcap: float | None = None

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        if self.multiplier is not None:
            logits = logits * self.multiplier
        if self.divisor is not None:
            logits = logits / self.divisor
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def describe(self) -> str:
        parts = [
            f"{name} {value:g}"
            for name, value in (("x", self.multiplier), ("/", self.divisor), ("softcap", self.softcap))
            if value is not None
        ]
        return ", ".join(parts) if parts else "none"


IDENTITY = LogitTransform()


def default_chunk_size(vocab_size: int, device: torch.device | str = "cpu") -> int:
    """Rows per chunk on ``device``: :data:`CHUNK_BYTES` of float32 logits (262 rows of a 32,000 vocabulary
    and 65 of 128,256 on the CPU)."""
    budget = CHUNK_BYTES.get(torch.device(device).type, DEFAULT_CHUNK_BYTES)
    return max(16, budget // (4 * max(int(vocab_size), 1)))


def _chunk(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    transform: LogitTransform,
    eps: float,
    want_grad: bool,
    want_correct: bool,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """One chunk: ``(loss sum, d(loss)/d(head output) in the head output's dtype or None, correct or None)``.

    The loss is ``torch.nn.functional.cross_entropy(transform(logits.float()), targets, reduction="sum",
    ignore_index=-100, label_smoothing=eps)`` written out: per target ``(1 - eps) * (lse - z_t) + eps * (lse -
    mean_v z_v)`` with ``lse = logsumexp_v z_v``; its gradient ``softmax(z) - (1 - eps) * onehot(t) - eps /
    V`` (zero for ignored rows), times the transform's derivative. Computed in place on the one float32 logits
    tensor of the chunk (plus one for a soft-cap): a chunk allocates one or two ``(rows, V)`` tensors.
    """
    return _chunk_of_logits(F.linear(hidden, weight, bias), targets, transform, eps, want_grad, want_correct)


def _chunk_of_logits(
    raw: torch.Tensor,
    targets: torch.Tensor,
    transform: LogitTransform,
    eps: float,
    want_grad: bool,
    want_correct: bool,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """:func:`_chunk` from the head's output ``raw`` ``(rows, V)``, which it overwrites when float32."""
    z = raw.float()  # the head output itself when it is float32 (no copy): it is not needed afterwards
    if transform.multiplier is not None:
        z.mul_(transform.multiplier)
    if transform.divisor is not None:
        z.div_(transform.divisor)
    capped = None
    if transform.softcap is not None:
        capped = z.div_(transform.softcap).tanh_()
        z = capped * transform.softcap
    valid = targets != IGNORE_INDEX
    safe = targets.clamp(min=0).unsqueeze(1)
    z_target = z.gather(1, safe).squeeze(1)
    z_mean = z.mean(dim=-1) if eps else None
    correct = ((z.argmax(dim=-1) == targets) & valid).sum() if want_correct else None
    # logsumexp as torch computes it (max + log(sum(exp(z - max)))), in place: z becomes exp(z - max)
    top = z.amax(dim=-1, keepdim=True)
    total = z.sub_(top).exp_().sum(dim=-1, keepdim=True)
    lse = (top + total.log()).squeeze(1)
    per_row = lse - z_target
    if eps:
        per_row = (1.0 - eps) * per_row + eps * (lse - z_mean)
    loss = per_row.masked_fill(~valid, 0.0).sum()
    if not want_grad:
        return loss, None, correct
    # the softmax, in place; an ignored row is divided by infinity instead: its gradient is 0 with no extra
    # pass
    grad = z.div_(total.masked_fill_(~valid.unsqueeze(1), float("inf")))
    # in the gradient's dtype: a bf16-true run makes bfloat16 the default dtype of a Python number's tensor
    grad.scatter_add_(1, safe, valid.to(grad.dtype).mul_(eps - 1.0).unsqueeze(1))
    if eps:
        grad.sub_((eps / z.size(-1)) * valid.unsqueeze(1))
    if capped is not None:
        grad.mul_(capped.mul_(capped).neg_().add_(1.0))  # d(c tanh(x / c))/dx = 1 - tanh^2
    if transform.divisor is not None:
        grad.div_(transform.divisor)
    if transform.multiplier is not None:
        grad.mul_(transform.multiplier)
    return loss, grad.to(raw.dtype), correct


class _LinearCrossEntropy(torch.autograd.Function):
    """Loss sum of ``CE(transform(hidden @ weight.T + bias), targets)``, with its gradients computed chunk by
    chunk in the forward pass (see the module docstring)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, transform, eps, chunk_size):  # noqa: ANN001, ANN205
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        need_b = bias is not None and ctx.needs_input_grad[2]
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = None  # the first chunk's product, then each chunk's added in place (no zero-filled start)
        if need_w and hidden.size(0) == 0:
            grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        grad_b = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if need_b else None
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        for start in range(0, hidden.size(0), chunk_size):
            h = hidden[start : start + chunk_size]
            loss, g, _ = _chunk(
                h, weight, bias, targets[start : start + chunk_size], transform, eps, True, False
            )
            total += loss
            if need_h:
                grad_h[start : start + chunk_size] = torch.mm(g, weight)
            if need_w:
                if grad_w is None:
                    grad_w = torch.mm(g.t(), h).float()
                elif g.dtype == h.dtype == torch.float32:
                    grad_w.addmm_(g.t(), h)
                else:
                    grad_w += torch.mm(g.t(), h)
            if need_b:
                grad_b += g.sum(0)
            del g
        ctx.grads = (grad_h, grad_w, grad_b)
        ctx.dtypes = (weight.dtype, None if bias is None else bias.dtype)
        return total

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):  # noqa: ANN001, ANN205
        grad_h, grad_w, grad_b = ctx.grads
        ctx.grads = None
        w_dtype, b_dtype = ctx.dtypes
        # in place: the buffers are this call's own, and used once
        grad_h = None if grad_h is None else grad_h.mul_(grad_out.to(grad_h.dtype))
        grad_w = None if grad_w is None else grad_w.mul_(grad_out).to(w_dtype)
        grad_b = None if grad_b is None else grad_b.mul_(grad_out).to(b_dtype)
        return grad_h, grad_w, grad_b, None, None, None, None


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    bias: torch.Tensor | None = None,
    transform: LogitTransform = IDENTITY,
    label_smoothing: float = 0.0,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """Summed token cross-entropy of an LM head, ``chunk_size`` tokens at a time.

    Equal to ``module.loss.token_cross_entropy_sum(transform(hidden @ weight.T + bias), targets, causal=False,
    label_smoothing=...)`` (the targets already shifted), i.e. ``transformers``' ``ForCausalLMLoss`` with
    ``reduction="sum"``, and with label smoothing the numerator of HF's ``LabelSmoother``; the loss and the
    gradients of ``hidden``, ``weight`` and ``bias`` agree with that path to float32 rounding.

    Args:
        hidden: ``(N, H)`` final hidden states (the input of the LM head), any float dtype.
        weight: ``(V, H)`` the LM head's weight (a tied input embedding receives its gradient).
        targets: ``(N,)`` int64 target ids, ``-100`` = no loss term.
        bias: ``(V,)`` or ``None``.
        transform: the model's logit transform (scaling, soft-capping), applied in float32.
        label_smoothing: ``eps`` in ``[0, 1)``: each term is ``(1 - eps) * nll + eps * mean_v(-log p_v)``.
        chunk_size: rows per chunk; default :func:`default_chunk_size`.

    Returns:
        A 0-dim float32 tensor (0.0 when no target, with zero gradients). Differentiable once (no double
        backward). Under ``torch.no_grad`` or when nothing requires a gradient, only the loss is computed.
    """
    chunk = chunk_size or default_chunk_size(weight.size(0), hidden.device)
    targets = targets.to(hidden.device)
    tensors = (hidden, weight) if bias is None else (hidden, weight, bias)
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return _LinearCrossEntropy.apply(
            hidden, weight, bias, targets, transform, float(label_smoothing), chunk
        )
    loss, _ = _no_grad_stats(
        hidden, weight, bias, targets, transform, label_smoothing, chunk, with_correct=False
    )
    return loss


def linear_cross_entropy_stats(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    bias: torch.Tensor | None = None,
    transform: LogitTransform = IDENTITY,
    chunk_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Evaluation: ``(loss sum, correct)`` without gradients, chunk by chunk.

    ``loss sum`` as :func:`linear_cross_entropy` (no smoothing; 0-dim float32); ``correct`` the number of
    targets (``!= -100``) equal to the argmax of their transformed logits (0-dim int64), the count behind
    :class:`~hf_lightning.module.eval_metrics.TokenAccuracy`.
    """
    chunk = chunk_size or default_chunk_size(weight.size(0), hidden.device)
    return _no_grad_stats(
        hidden, weight, bias, targets.to(hidden.device), transform, 0.0, chunk, with_correct=True
    )


@torch.no_grad()
def linear_cross_entropy_predictions(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    labels: torch.Tensor,
    preprocess: Callable[[torch.Tensor, torch.Tensor], Any],
    bias: torch.Tensor | None = None,
    transform: LogitTransform = IDENTITY,
    chunk_size: int | None = None,
    targets_only: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Evaluation with HF's ``preprocess_logits_for_metrics`` applied chunk by chunk: ``(loss sum, correct,
    predictions)`` without gradients, and no ``(tokens x vocab)`` tensor.

    Args:
        hidden: ``(N, H)`` final hidden states, every position of the batch in order.
        targets: ``(N,)`` int64, the loss's targets (the causal shift applied; ``-100`` skipped).
        labels: ``(N,)`` int64, the labels as the batch holds them (what HF passes to ``preprocess``).
        preprocess: called as ``preprocess(logits (1, n, V), labels (1, n))`` per chunk of ``n`` positions,
            ``logits`` in the head's dtype after the model's logit transform (the model's own logits); it
            must return a tensor of shape ``(1, n, ...)``.
        targets_only: the head and ``preprocess`` run only at the positions with a target
            (``targets != -100``); the other positions' predictions are ``-100`` (HF's padding index for
            predictions), so ``preprocess`` must return a signed or floating dtype.

    Returns:
        ``loss sum`` and ``correct`` as :func:`linear_cross_entropy_stats`; predictions ``(1, N, ...)``, the
        chunks' results concatenated along dim 1 (with ``targets_only``, placed at their positions).

    Raises:
        NotPositionWise: ``preprocess`` returned something other than a ``(1, n, ...)`` tensor.
        TypeError: with ``targets_only``, ``preprocess`` returned a dtype that cannot hold ``-100``.
    """
    chunk = chunk_size or default_chunk_size(weight.size(0), hidden.device)
    targets, labels = targets.to(hidden.device), labels.to(hidden.device)
    total = torch.zeros((), dtype=torch.float32, device=hidden.device)
    correct = torch.zeros((), dtype=torch.long, device=hidden.device)
    n = hidden.size(0)
    # the rows the head multiplies: all of them, or those with a target (at least one, whose result gives
    # the predictions' dtype and trailing shape when the batch has no target at all)
    kept = (targets != IGNORE_INDEX).nonzero().squeeze(1) if targets_only else None
    rows = kept if kept is None or kept.numel() else torch.zeros(min(n, 1), dtype=torch.long)
    preds = []
    for start in range(0, n if kept is None else rows.numel(), chunk):
        where = slice(start, start + chunk) if kept is None else rows[start : start + chunk]
        raw = F.linear(hidden[where], weight, bias)
        part = preprocess(transform(raw).unsqueeze(0), labels[where].unsqueeze(0))
        count = raw.size(0)
        if not isinstance(part, torch.Tensor) or part.dim() < 2 or tuple(part.shape[:2]) != (1, count):
            found = tuple(part.shape) if isinstance(part, torch.Tensor) else type(part).__name__
            raise NotPositionWise(f"it returned {found} for logits of shape (1, {count}, {raw.size(1)})")
        if part.untyped_storage().data_ptr() == raw.untyped_storage().data_ptr():
            part = part.clone()  # a view of the logits, which the loss below overwrites
        preds.append(part)
        # the loss and the argmax count of the positions with a target only (a prompt's or padding's
        # positions add nothing to them)
        part_targets = targets[where]
        valid = part_targets != IGNORE_INDEX
        if not bool(valid.all()):  # (with targets_only every row has a target: no copy)
            raw, part_targets = raw[valid], part_targets[valid]
        if raw.size(0):
            loss, _, right = _chunk_of_logits(raw, part_targets, transform, 0.0, False, True)
            total += loss
            correct += right
    found = torch.cat(preds, dim=1) if preds else torch.zeros((1, 0), dtype=torch.long)
    if kept is None:
        return total, correct, found
    placed = at_positions(found[:, : kept.numel()], kept, n)
    return total, correct, placed


def at_positions(values: torch.Tensor, positions: torch.Tensor, n: int) -> torch.Tensor:
    """``values`` ``(1, k, ...)`` placed at ``positions`` ``(k,)`` of a ``(1, n, ...)`` tensor of ``-100``.

    Raises:
        TypeError: ``values``' dtype cannot hold ``-100`` (a bool or an unsigned integer).
    """
    check_holds_ignore_index(values.dtype)
    out = torch.full((1, n, *values.shape[2:]), IGNORE_INDEX, dtype=values.dtype, device=values.device)
    out[:, positions.to(values.device)] = values
    return out


def check_holds_ignore_index(dtype: torch.dtype) -> None:
    """Raise ``TypeError`` when ``dtype`` (of ``preprocess_logits_for_metrics``' result) cannot hold ``-100``
    (a bool or an unsigned integer), which marks the positions without a target."""
    if not dtype.is_signed:
        raise TypeError(
            f"preprocess_logits_positions='targets' marks the positions without a target with -100, which "
            f"{dtype} cannot hold: return a signed integer or floating tensor from "
            "preprocess_logits_for_metrics"
        )


class NotPositionWise(ValueError):
    """A ``preprocess_logits_for_metrics`` whose result is not one value (or vector) per position."""


@torch.no_grad()
def _no_grad_stats(hidden, weight, bias, targets, transform, eps, chunk, with_correct):  # noqa: ANN001, ANN202
    total = torch.zeros((), dtype=torch.float32, device=hidden.device)
    correct = torch.zeros((), dtype=torch.long, device=hidden.device)
    for start in range(0, hidden.size(0), chunk):
        # the argmax of the transformed float32 logits: scaling and tanh are monotonic, so it is the argmax of
        # the plain path's logits up to ties
        loss, _, right = _chunk(
            hidden[start : start + chunk],
            weight,
            bias,
            targets[start : start + chunk],
            transform,
            eps,
            False,
            with_correct,
        )
        total += loss
        if with_correct:
            correct += right
    return total, correct
