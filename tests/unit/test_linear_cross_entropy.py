"""The chunked ``linear_cross_entropy``: loss, gradients and evaluation stats equal
``torch.nn.functional.cross_entropy`` of the full logits (each model family's logit transform written out).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

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
