"""Accumulation windows: the count covers exactly the micro-batches of one optimizer step."""

from __future__ import annotations

import torch

from hf_lightning.data.sampling import AccumulationWindowLoader
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
    batches = [
        _batch([0, 1, 1]),
        _batch([0, 1, -100]),
        _batch([0, 1, 1]),
        _batch([0, -100, -100]),
        _batch([0, 1, 1]),
    ]
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


def test_resume_skips_the_consumed_batches_and_keeps_windows_aligned():
    batches = [_batch([0, 1, 1])] * 3 + [_batch([0, 1, -100])] * 4  # counts 2, 2, 2, 1, 1, 1, 1
    marked = [{**b, "i": torch.tensor(i)} for i, b in enumerate(batches)]
    trained = AccumulationWindowLoader(marked, 2, count_loss_items)
    trained._epoch = lambda: 0  # a plain list has no sampler epoch
    assert trained.state_dict() == {}  # no pass yet
    batches = iter(trained)
    for _ in range(5):  # Lightning fetches one batch ahead of the one it trains
        next(batches)
    for _ in range(4):  # the DataModule's transfer hook: 4 batches went to their training step
        trained.handed_out()
    saved = trained.state_dict()
    assert saved == {"epoch": 0, "batches_consumed": 4}  # the batch fetched ahead is not counted
    resumed = AccumulationWindowLoader(marked, 2, count_loss_items)
    resumed.load_state_dict(saved)
    assert resumed.state_dict() == saved  # restored, not read yet: the restored position stands
    resumed._epoch = lambda: 0  # a plain list has no sampler epoch; the epoch matches the saved one
    out = list(resumed)
    assert [int(b["i"]) for b in out] == [4, 5, 6]
    assert [b["num_items_in_batch"] for b in out] == [2, 2, 1]  # windows (4, 5) and (6,)
    assert [int(b["i"]) for b in resumed] == list(range(7))  # the next epoch starts from the beginning


def test_resume_state_of_another_epoch_is_ignored():
    loader = AccumulationWindowLoader([_batch([0, 1, 1])] * 3, 1, count_loss_items)
    loader.load_state_dict({"epoch": 0, "batches_consumed": 3})
    loader._epoch = lambda: 1  # the checkpoint closed epoch 0; Lightning moved on to epoch 1
    assert len(list(loader)) == 3


def test_sampler_jump_reads_nothing_before_the_resume_point():
    from hf_lightning.data.dataloaders import EpochDataLoader
    from hf_lightning.data.sampling import ExactDistributedSampler

    read = []

    class Recording(torch.utils.data.Dataset):
        def __len__(self):
            return 10

        def __getitem__(self, i):
            read.append(i)
            return i

    sampler = ExactDistributedSampler(range(10), shuffle=True, seed=3)
    loader = EpochDataLoader(Recording(), sampler=sampler, batch_size=3)
    full = [b.tolist() for b in loader]
    read.clear()
    assert [b.tolist() for b in loader.iter_from(2)] == full[2:]
    assert sorted(read) == sorted(i for b in full[2:] for i in b)  # the first 6 examples were never read
    assert sampler.start == 0
