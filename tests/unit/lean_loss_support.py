"""Helpers of the lean-loss tests: the tolerance and the relative error they compare with."""

from __future__ import annotations

import torch

TOL = 1e-6


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """``|a - b| / |b|`` in the 2-norm (``b``'s norm floored at 1e-30)."""
    return float((a - b).detach().norm() / b.detach().norm().clamp(min=1e-30))
