"""The chunked ``linear_cross_entropy``: loss, gradients and evaluation stats equal
``torch.nn.functional.cross_entropy`` of the full logits (each model family's logit transform written out).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from hf_lightning.module.linear_cross_entropy import (
    CHUNK_BYTES,
    LogitTransform,
    default_chunk_size,
    linear_cross_entropy,
    linear_cross_entropy_stats,
)
from tests.unit.lean_loss_support import TOL, rel


# ------------------------------------------------------------------------------ the chunked function
def written_out(logits, multiplier=None, divisor=None, softcap=None):
    """Cohere multiplies by logit_scale, Granite divides by logits_scaling, Gemma-2 soft-caps (modeling
    files)."""
    if multiplier is not None:
        logits = logits * multiplier
    if divisor is not None:
        logits = logits / divisor
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    return logits


TRANSFORM_CASES = [
    {},
    {"multiplier": 0.3},
    {"divisor": 4.0},
    {"softcap": 2.0},
    {"multiplier": 3.0, "softcap": 1.5},
]


def _problem(seed=0, n=45, h=8, v=50, bias=True):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=g)
    weight = torch.randn(v, h, generator=g)
    b = torch.randn(v, generator=g) if bias else None
    targets = torch.randint(0, v, (n,), generator=g)
    targets[::4] = -100
    return hidden, weight, b, targets


@pytest.mark.parametrize("transform", TRANSFORM_CASES, ids=lambda t: ",".join(t) or "none")
@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("bias", [False, True])
def test_chunked_loss_and_gradients_equal_cross_entropy_of_the_full_logits(transform, eps, bias):
    hidden, weight, b, targets = _problem(bias=bias)
    leaves = [t.clone().requires_grad_() for t in (hidden, weight, b) if t is not None]
    ref = F.cross_entropy(
        written_out(F.linear(leaves[0], leaves[1], leaves[2] if bias else None), **transform),
        targets,
        ignore_index=-100,
        reduction="sum",
        label_smoothing=eps,
    )
    (ref * 0.37).backward()
    ours_leaves = [t.clone().requires_grad_() for t in (hidden, weight, b) if t is not None]
    ours = linear_cross_entropy(
        ours_leaves[0],
        ours_leaves[1],
        targets,
        ours_leaves[2] if bias else None,
        LogitTransform(**transform),
        eps,
        chunk_size=7,  # 45 rows: 6 chunks of 7 and one of 3
    )
    (ours * 0.37).backward()
    assert ours.dtype == torch.float32 and rel(ours.detach(), ref.detach()) <= TOL
    for mine, theirs in zip(ours_leaves, leaves):
        assert rel(mine.grad, theirs.grad) <= TOL


def test_no_target_gives_zero_loss_and_zero_gradients():
    hidden, weight, _, targets = _problem()
    hidden.requires_grad_()
    loss = linear_cross_entropy(hidden, weight.requires_grad_(), torch.full_like(targets, -100), chunk_size=8)
    loss.backward()
    assert float(loss.detach()) == 0.0
    assert torch.equal(hidden.grad, torch.zeros_like(hidden)) and torch.equal(
        weight.grad, torch.zeros_like(weight)
    )


def test_evaluation_stats_equal_the_full_logits():
    hidden, weight, b, targets = _problem(n=60)
    transform = {"multiplier": 3.0, "softcap": 1.5}
    logits = written_out(F.linear(hidden, weight, b), **transform)
    # half the targets are the argmax, so the count is neither 0 nor all
    targets[1::2] = logits.argmax(-1)[1::2]
    valid = targets != -100
    expected_correct = int(((logits.argmax(-1) == targets) & valid).sum())
    assert 0 < expected_correct < int(valid.sum())
    loss, correct = linear_cross_entropy_stats(
        hidden, weight, targets, b, LogitTransform(**transform), chunk_size=9
    )
    assert int(correct) == expected_correct
    assert float(loss) == pytest.approx(float(F.cross_entropy(logits, targets, reduction="sum")), rel=TOL)
    with torch.no_grad():  # the loss alone, without gradients
        alone = linear_cross_entropy(hidden, weight, targets, b, LogitTransform(**transform), chunk_size=9)
    assert float(alone) == pytest.approx(float(loss), rel=TOL)


def test_default_chunks_hold_the_byte_budget():
    for vocab in (32000, 50257, 128256, 262144):
        rows = default_chunk_size(vocab, "cpu")
        assert rows * vocab * 4 <= CHUNK_BYTES["cpu"] or rows == 16
    assert default_chunk_size(128256, "cpu") == 65 and default_chunk_size(32000, "cpu") == 262


# ------------------------------------------------------------------ bfloat16: what runs in which dtype
class OpDtypes(TorchDispatchMode):
    """Records ``(op name, input dtypes, output dtype)`` of every op run."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, tuple[torch.dtype, ...], torch.dtype | None]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = tuple(a.dtype for a in tree_flatten((args, kwargs or {}))[0] if isinstance(a, torch.Tensor))
        self.ops.append(
            (func.overloadpacket.__name__, inputs, out.dtype if isinstance(out, torch.Tensor) else None)
        )
        return out


def _head_case(dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(12, 16, generator=g).to(dtype).requires_grad_()
    weight = (torch.randn(300, 16, generator=g) * 0.3).to(dtype).requires_grad_()
    targets = torch.randint(0, 300, (12,), generator=g)
    targets[3] = -100
    return hidden, weight, targets


def test_under_bf16_autocast_the_head_runs_in_bf16_and_the_loss_in_float32():
    """``trainer.precision=bf16-mixed``: the head's matrix product in bfloat16 (autocast's choice for a
    linear, as the model's own ``lm_head`` under autocast), the softmax and the loss in float32 (HF's
    ``ForCausalLMLoss`` upcasts the logits with ``.float()``); the loss equals that plain path's."""
    hidden, weight, targets = _head_case()
    with torch.autocast("cpu", dtype=torch.bfloat16), OpDtypes() as ops:
        loss = linear_cross_entropy(hidden, weight, targets, chunk_size=5)
    assert loss.dtype == torch.float32
    products = [(inputs, out) for name, inputs, out in ops.ops if name in ("mm", "addmm", "linear")]
    # the head's logits (the first product of each of the 3 chunks) are bfloat16
    assert products and products[0][1] == torch.bfloat16
    assert all(
        out == torch.float32 for name, _, out in ops.ops if name in ("exp_", "exp", "log", "logsumexp")
    )
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plain = F.cross_entropy(F.linear(hidden, weight).float(), targets, reduction="sum")
    assert rel(loss, plain) <= 1e-6  # the same bf16 logits, the same float32 loss
    fp32 = F.cross_entropy(F.linear(hidden, weight), targets, reduction="sum")
    assert float(loss) != float(fp32)  # autocast did change the head's dtype


def test_a_bfloat16_default_dtype_keeps_the_loss_and_gradients_exact():
    """``trainer.precision=bf16-true``: Lightning runs the training step with bfloat16 as the default dtype,
    so a tensor made from a Python number is bfloat16 there; the gradient written in place stays float32."""
    hidden, weight, targets = _head_case(torch.bfloat16)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        loss = linear_cross_entropy(hidden, weight, targets, chunk_size=5)
        loss.backward()
    finally:
        torch.set_default_dtype(previous)
    grads = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    plain = F.cross_entropy(F.linear(hidden, weight).float(), targets, reduction="sum")
    plain.backward()
    assert loss.dtype == torch.float32 and rel(loss, plain) <= 1e-6
    assert (
        rel(grads[0].float(), hidden.grad.float()) < 1e-2
        and rel(grads[1].float(), weight.grad.float()) < 1e-2
    )
