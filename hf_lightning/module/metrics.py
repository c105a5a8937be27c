"""Evaluation metrics as torchmetrics states (synced across ranks, never a tensor of logits kept)."""

from __future__ import annotations

import torch
from torchmetrics import Metric


class TokenMeanLoss(Metric):
    """Token-weighted mean loss over a whole evaluation set: ``sum of token CE / number of targets``.

    HF ``Trainer.evaluate`` reports the sample-weighted mean of per-batch means, which differs when batches
    hold different numbers of targets; this is the exact mean over all targets of all ranks.

    ``update(loss_sum, count)``: a 0-dim float tensor (summed CE, nats) and the number of targets.
    ``compute()``: 0-dim float32 mean in nats (0 when no target was seen).
    """

    full_state_update = False

    def __init__(self) -> None:
        super().__init__()
        self.add_state("loss_sum", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, loss_sum: torch.Tensor, count: torch.Tensor | int) -> None:
        self.loss_sum += loss_sum.detach().double()
        self.count += int(count) if not isinstance(count, torch.Tensor) else count.to(self.count)

    def compute(self) -> torch.Tensor:
        return (self.loss_sum / self.count.clamp(min=1)).float()
