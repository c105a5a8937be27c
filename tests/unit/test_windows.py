"""Accumulation windows: the count covers exactly the micro-batches of one optimizer step."""

from __future__ import annotations

import torch

from hf_lightning.data.windows import AccumulationWindowLoader
from hf_lightning.module.loss import count_loss_items


def _batch(*rows):
    return {"labels": torch.tensor(rows)}


def test_count_skips_the_first_position_of_each_row():
    # rows [5, 6, 7, -100] and [-100, -100, 8, 9]: targets 6, 7 and 8, 9 -> 4, not 5
    assert count_loss_items(_batch([5, 6, 7, -100], [-100, -100, 8, 9])) == 4
    assert count_loss_items(_batch([5, 6, 7, -100], [-100, -100, 8, 9]), causal=False) == 5
    assert count_loss_items({"shift_labels": torch.tensor([[6, 7, -100, -100]])}) == 2
    assert count_loss_items({"labels": torch.tensor([3, 1, 0])}) == 3  # sequence classification


def test_windows_attach_their_total_and_the_last_window_is_shorter():
    batches = [_batch([0, 1, 1]), _batch([0, 1, -100]), _batch([0, 1, 1]), _batch([0, -100, -100]), _batch([0, 1, 1])]
    # per-batch counts: 2, 1, 2, 0, 2 ; windows of 2: (2+1), (2+0), (2)
    out = list(AccumulationWindowLoader(batches, 2, count_loss_items))
    assert [b["num_items_in_batch"] for b in out] == [3, 3, 2, 2, 2]
    assert [b["num_items_in_micro_batch"] for b in out] == [2, 1, 2, 0, 2]
    assert [b["num_batches_in_window"] for b in out] == [2, 2, 2, 2, 1]
    assert all(torch.equal(o["labels"], b["labels"]) for o, b in zip(out, batches))


def test_limit_cuts_the_window_at_the_last_consumed_batch():
    batches = [_batch([0, 1, 1])] * 5  # 2 targets each
    out = list(AccumulationWindowLoader(batches, 4, count_loss_items, max_batches=lambda: 5))
    assert [b["num_items_in_batch"] for b in out] == [8, 8, 8, 8, 2]
    out = list(AccumulationWindowLoader(batches, 4, count_loss_items, max_batches=lambda: 3))
    assert [b["num_items_in_batch"] for b in out] == [6, 6, 6]
