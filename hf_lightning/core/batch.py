"""The batch contract that ``data/`` (which builds batches) and ``module/`` (which consumes them) share.

Both packages import these names from here, so neither imports the other.

- ``IGNORE_INDEX``: the label value that receives no loss term (HF's and PyTorch's ``-100``).
- :class:`Window`: one optimizer step's training batch, the accumulation window's micro-batches with their
  target counts (HF ``Trainer.get_batch_samples`` counts a whole window before its first forward), what
  ``HFLightningModule.training_step`` receives.
- The window keys the micro-batch loader of a module on Lightning's automatic optimization attaches to every
  training micro-batch: ``num_items_in_batch`` (the window's target count, an ``int``),
  ``num_items_in_micro_batch`` (this micro-batch's own count) and ``num_batches_in_window`` (the window's
  number of micro-batches).
- ``PLACEHOLDER_KEY``: marks an evaluation batch that only stands for a rank with no example
  (:class:`~hf_lightning.data.collators.PlaceholderAwareCollator`); the module leaves it out of metrics and
  predictions.
- :func:`padding_mask`: which positions of a batch are padding (the real-token counts of the throughput
  figures and of the run's tokens/s leave them out).
- :func:`to_device`: a flat batch's tensors on a device (the DataModule's transfer hook and the module's
  per-micro-batch move share it).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

IGNORE_INDEX = -100

NUM_ITEMS_KEY = "num_items_in_batch"
MICRO_ITEMS_KEY = "num_items_in_micro_batch"
WINDOW_LENGTH_KEY = "num_batches_in_window"
WINDOW_KEYS = (NUM_ITEMS_KEY, MICRO_ITEMS_KEY, WINDOW_LENGTH_KEY)


@dataclass
class Window:
    """The training batch of one optimizer step: its accumulation window.

    Attributes:
        micro_batches: the window's collated micro-batches (dicts of CPU tensors), in order; at most HF's
            ``gradient_accumulation_steps`` of them (fewer for the last window of an epoch).
        counts: each micro-batch's number of label targets (host ``int``,
            :func:`~hf_lightning.module.loss.count_loss_items`), or ``None`` when nothing counts them.

    ``num_items_in_batch`` is the window's target count on this process, ``sum(counts)`` (``None`` when not
    counted); the module sums it across ranks.
    """

    micro_batches: Sequence[dict[str, Any]]
    counts: Sequence[int] | None = None

    @property
    def num_items_in_batch(self) -> int | None:
        return None if self.counts is None else int(sum(self.counts))

    def __len__(self) -> int:
        return len(self.micro_batches)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.micro_batches)


def to_device(batch: Mapping[str, Any], device: torch.device) -> dict[str, Any]:
    """A new ``dict`` of ``batch`` with every tensor value moved to ``device`` (other values as they are).

    The copies are non-blocking as Lightning's are, except to the CPU and to MPS (blocking device types).
    """
    non_blocking = device.type not in ("cpu", "mps")
    return {
        k: v.to(device, non_blocking=non_blocking) if isinstance(v, torch.Tensor) else v
        for k, v in batch.items()
    }


#: batch key (a Python ``bool``, never a model input) marking a batch made only of placeholder rows
PLACEHOLDER_KEY = "placeholder_batch"


def padding_mask(batch: Mapping[str, Any], pad_token_id: int | None) -> torch.Tensor:
    """``True`` at padded positions of ``input_ids``.

    With ``attention_mask``: where it is 0. Without (padding-free or packed rows): the trailing run of each
    row whose ids are the pad id and whose labels are -100 (a real EOS that doubles as pad is a target, so it
    is not counted).
    """
    ids = batch["input_ids"]
    if "attention_mask" in batch:
        return batch["attention_mask"] == 0
    labels = batch.get("labels")
    if pad_token_id is None or labels is None or labels.shape != ids.shape:
        return torch.zeros_like(ids, dtype=torch.bool)
    pad_like = (ids == pad_token_id) & (labels == IGNORE_INDEX)
    # the trailing run: positions from which every later position is pad-like (a running minimum from the
    # right), in a few tensor ops and without a host sync, so the throughput callback can call it per batch
    return pad_like.flip(-1).to(torch.uint8).cummin(-1).values.flip(-1).bool()
