"""Evaluation batches that stand for a rank with no example.

With fewer evaluation examples than ranks (8 rows, a 5% hold-out of 1 row, 2 ranks), some rank's share is
empty. Lightning refuses a loader of length zero on one rank, and a rank that skipped the loop would leave the
others waiting in the loop's collectives (DDP's buffer broadcast in the first forward, the metric sync at the
end). So that rank evaluates one *placeholder*: a masked copy of an example (every label -100,
:class:`~hf_lightning.data.sampling.PlaceholderRow`), which adds nothing to the loss, accuracy or F1 sums.

A LightningModule that sets ``handles_placeholder_batches = True`` (as
:class:`~hf_lightning.HFLightningModule` does) gets such a batch marked with ``batch[PLACEHOLDER_KEY] =
True``, and leaves it out of ``compute_metrics`` and of the predictions too. Any other module receives the
masked copy as it is, like the masked top-up rows of training.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from hf_lightning.core.batch import PLACEHOLDER_KEY
from hf_lightning.data.sampling import PlaceholderRow

__all__ = ["PLACEHOLDER_KEY", "PlaceholderAwareCollator"]


class PlaceholderAwareCollator:
    """Wraps an evaluation collator: a batch whose examples are all placeholders gets ``PLACEHOLDER_KEY:
    True``."""

    def __init__(self, collate: Callable[[Sequence[Any]], Any]) -> None:
        self.collate = collate

    def __call__(self, examples: Sequence[Any]) -> Any:
        batch = self.collate(examples)
        if examples and isinstance(batch, dict) and all(isinstance(ex, PlaceholderRow) for ex in examples):
            batch[PLACEHOLDER_KEY] = True
        return batch
