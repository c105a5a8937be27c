"""Streams: each example exactly once across ranks x workers, per-epoch reshuffling, worker seeds, clear
errors."""

from __future__ import annotations

import logging
import random

import datasets
import lightning as L
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import IterableDataset

from hf_lightning import ConfigError, HFDataModule
from hf_lightning.data.dataloaders import EpochDataLoader
from hf_lightning.data.sampling import ExactDistributedSampler
from hf_lightning.data.streams import ShardedStream


class Rows(IterableDataset):
    """A plain torch stream of ``{"idx", "input_ids"}`` rows (it does not shard itself)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        for i in range(self.n):
            yield {"idx": i, "input_ids": [1] * (i % 7 + 1)}


class SizedRows(Rows):
    def __len__(self) -> int:
        return self.n


def _source(kind: str, n: int, shards: int = 1):
    if kind == "torch":
        return Rows(n)
    ds = datasets.Dataset.from_dict(
        {"idx": list(range(n)), "input_ids": [[1] * (i % 7 + 2) for i in range(n)]}
    )  # >= 2 tokens: a 1-token row has no causal target
    return ds.to_iterable_dataset(num_shards=min(shards, max(n, 1)))


def _read_all(stream: ShardedStream, world: int, workers: int) -> list[list[dict]]:
    """Every reader's rows, reader = (rank, worker), as the DataLoader workers of every rank would read
    them."""
    readers = max(workers, 1)
    out = []
    for rank in range(world):
        stream.rank, stream.world_size = rank, world
        for worker in range(readers):
            out.append(list(stream.read_shard(rank * readers + worker, world * readers)))
    return out


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 40),
    world=st.integers(1, 4),
    workers=st.integers(0, 2),
    kind=st.sampled_from(["datasets", "torch"]),
    shards=st.integers(1, 3),
    shuffle=st.booleans(),
    epoch=st.integers(0, 3),
)
def test_every_example_exactly_once_across_ranks_and_workers(n, world, workers, kind, shards, shuffle, epoch):
    stream = ShardedStream(_source(kind, n, shards), shuffle=shuffle, seed=1, buffer_size=8)
    stream.set_epoch(epoch)
    parts = _read_all(stream, world, workers)
    real = [
        r["idx"] for p in parts for r in p if "labels" not in r
    ]  # a top-up is a masked copy (labels -100)
    assert sorted(real) == list(range(n))
    assert len({len(p) for p in parts}) == 1  # every reader, so every rank, yields as many rows
    assert all(all(t == -100 for t in r["labels"]) for p in parts for r in p if "labels" in r)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 40), world=st.integers(1, 4), workers=st.integers(0, 2))
def test_length_grouped_stream_still_covers_every_example_once(n, world, workers):
    stream = ShardedStream(_source("torch", n), shuffle=True, seed=3, buffer_size=5, length_buffer=4)
    readers = max(workers, 1)
    parts = []
    for rank in range(world):
        for worker in range(readers):
            rows = list(stream._grouped(stream.read_shard(rank * readers + worker, world * readers), 4))
            for k in range(0, len(rows), 4):  # sorted longest first within each buffer of 4
                lengths = [len(r["input_ids"]) for r in rows[k : k + 4]]
                assert lengths == sorted(lengths, reverse=True)
            parts.append(rows)
    assert sorted(r["idx"] for p in parts for r in p if "labels" not in r) == list(range(n))


@pytest.mark.parametrize("kind", ["datasets", "torch"])
def test_set_epoch_reshuffles_and_the_same_epoch_repeats(kind):
    stream = ShardedStream(_source(kind, 50, shards=2), shuffle=True, seed=0, buffer_size=16)
    orders = {}
    for epoch in (0, 1, 0):
        stream.set_epoch(epoch)
        orders.setdefault(epoch, []).append([r["idx"] for r in stream.read_shard(0, 1)])
    assert orders[0][0] == orders[0][1]
    assert orders[0][0] != orders[1][0] and sorted(orders[1][0]) == list(range(50))


def _datamodule(tok, source, **kw):
    kw = {"validation_split": 0.0, "per_device_train_batch_size": 3, **kw}
    return HFDataModule(tok, path=source, format="tokenized", model_input_names=["input_ids", "idx"], **kw)


@pytest.mark.parametrize("workers", [0, 2])
def test_datamodule_stream_loaders_cover_each_example_once_across_simulated_ranks(word_tokenizer, workers):
    seen, lengths = [], []
    for rank in range(2):
        dm = _datamodule(word_tokenizer, _source("datasets", 17, shards=2), num_workers=workers)
        dm.setup()
        dm._world = lambda rank=rank: (2, rank)
        batches = list(dm.train_dataloader())
        lengths.append(len(batches))
        for b in batches:
            seen += b["idx"][b["labels"].ne(-100).any(dim=1)].tolist()
    assert sorted(seen) == list(range(17)) and lengths[0] == lengths[1]


def test_known_length_gives_the_exact_number_of_batches(word_tokenizer):
    dm = _datamodule(word_tokenizer, SizedRows(23), num_workers=2)
    dm.setup()
    loader = dm.train_dataloader()
    # 23 rows over 2 workers: 12 each (one top-up), batches of 3 -> 4 per worker
    assert len(loader) == 8 == len(list(loader))


def test_unknown_length_needs_max_steps(word_tokenizer):
    dm = _datamodule(word_tokenizer, _source("torch", 10))
    dm.trainer = L.Trainer(accelerator="cpu", logger=False, max_epochs=1)
    dm.setup()
    with pytest.raises(ConfigError, match="stream of unknown length.*set trainer.max_steps"):
        dm.train_dataloader()
    dm.trainer = L.Trainer(accelerator="cpu", logger=False, max_steps=5)
    assert len(list(dm.train_dataloader())) == 4


def test_group_by_length_on_a_stream_says_so(word_tokenizer, caplog):
    dm = _datamodule(word_tokenizer, _source("torch", 30), group_by_length=True)
    dm.setup()
    with caplog.at_level(logging.INFO, logger="hf_lightning"):
        first = next(iter(dm.train_dataloader()))
    assert "group_by_length on a stream: sorting by length within buffers of 150 examples" in caplog.text
    assert first["input_ids"].shape[1] == 7  # the longest rows come first


def test_stream_validation_holdout_is_disjoint_and_stable(word_tokenizer):
    rows = [
        {"text": " ".join("abcdefghij"[: i % 9 + 1]) + f" {chr(107 + i % 15)}", "id": i} for i in range(60)
    ]
    source = datasets.Dataset.from_list(rows).to_iterable_dataset(num_shards=3)
    dm = HFDataModule(
        word_tokenizer,
        path=source,
        validation_split=0.2,
        model_input_names=["input_ids", "id"],
        per_device_train_batch_size=4,
    )
    dm.setup()
    loader = dm.train_dataloader()
    train = [i for b in loader for i in b["id"].tolist()]
    val = [i for b in dm.val_dataloader() for i in b["id"].tolist()]
    assert not set(train) & set(val) and sorted(train + val) == list(range(60))
    assert 4 <= len(val) <= 24
    again = [i for b in loader for i in b["id"].tolist()]  # the second pass is epoch 1: new order, same rows
    assert again != train and sorted(again) == sorted(train)


class Draws(torch.utils.data.Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return torch.tensor([torch.rand(()).item(), random.random(), float(np.random.rand())])


def _draws(seed, rank, epoch):
    sampler = ExactDistributedSampler(range(4), num_replicas=1, rank=0, shuffle=False)
    sampler.set_epoch(epoch)
    loader = EpochDataLoader(Draws(), seed=seed, rank=rank, sampler=sampler, batch_size=2, num_workers=2)
    return torch.cat(list(loader))  # rows 0-1 from worker 0, rows 2-3 from worker 1


def test_worker_random_draws_differ_across_workers_epochs_ranks_and_repeat():
    base = _draws(seed=1, rank=0, epoch=0)
    assert not torch.equal(base[0], base[2])  # worker 0 vs worker 1 (torch, random and numpy alike)
    assert (base[0] != base[2]).all()
    assert (base != _draws(seed=1, rank=0, epoch=1)).all()
    assert (base != _draws(seed=1, rank=1, epoch=0)).all()
    assert torch.equal(base, _draws(seed=1, rank=0, epoch=0))


def test_worker_knobs_need_workers(word_tokenizer):
    with pytest.raises(ConfigError, match="data.prefetch_factor applies to worker processes only"):
        HFDataModule(word_tokenizer, prefetch_factor=2)
    with pytest.raises(ConfigError, match="data.persistent_workers applies to worker processes only"):
        HFDataModule(word_tokenizer, persistent_workers=True)
    dm = _datamodule(
        word_tokenizer,
        SizedRows(12),
        num_workers=2,
        prefetch_factor=3,
        persistent_workers=True,
        pin_memory=True,
        drop_last=True,
    )
    dm.setup()
    loader = dm.train_dataloader()
    assert (loader.prefetch_factor, loader.persistent_workers, loader.pin_memory, loader.drop_last) == (
        3,
        True,
        True,
        True,
    )
    assert len(loader) == 4 == len(list(loader))  # 6 rows per worker, 2 full batches each


def test_an_unshuffled_stream_keeps_the_dataset_order_in_every_epoch():
    stream = ShardedStream(_source("datasets", 30, shards=3), shuffle=False)
    for epoch in (0, 1, 2):
        stream.set_epoch(epoch)
        assert [r["idx"] for r in stream.read_shard(0, 1)] == list(range(30))
