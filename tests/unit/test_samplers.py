"""Map-style sampling: HF parity of length grouping, one global order on every rank, each index exactly
once."""

from __future__ import annotations

import datasets
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.trainer_pt_utils import get_length_grouped_indices

from hf_lightning import HFDataModule
from hf_lightning.data.sampling import (
    ExactDistributedSampler,
    TopUpDataset,
    length_grouped_indices,
    mask_example,
    sequence_lengths,
)


def _gen(seed):
    return torch.Generator().manual_seed(seed)


@settings(max_examples=30, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 50), min_size=0, max_size=300),
    batch_size=st.integers(1, 16),
    seed=st.integers(0, 2**31),
)
def test_length_grouped_indices_are_a_permutation_grouped_by_length(lengths, batch_size, seed):
    """HF's function (called by ours) on any input, and no rows at all (HF's argmax of nothing raises)."""
    order = length_grouped_indices(lengths, batch_size, generator=_gen(seed))
    assert sorted(order) == list(range(len(lengths)))
    if lengths:
        assert lengths[order[0]] == max(lengths)  # the longest row leads the first batch


def test_no_rows_give_an_empty_order():
    with pytest.raises((RuntimeError, IndexError)):  # the guard is needed: HF alone fails on an empty dataset
        get_length_grouped_indices([], 4, generator=_gen(0))
    assert length_grouped_indices([], 4, generator=_gen(0)) == []


def test_length_grouping_by_hand():
    # N=16, B=2: mega-batches of min(16 // 8, 50) * 2 = 4 indices of the permutation, each sorted longest
    # first; then the head of the mega-batch holding the longest item swaps places with the first head
    lengths = [3, 9, 1, 16, 4, 4, 2, 8, 5, 7, 6, 10, 12, 11, 14, 13]
    perm = torch.randperm(16, generator=_gen(0)).tolist()
    megas = [sorted(perm[k : k + 4], key=lambda i: -lengths[i]) for k in range(0, 16, 4)]
    top = next(k for k, m in enumerate(megas) if 3 in m)
    megas[0][0], megas[top][0] = megas[top][0], megas[0][0]
    order = length_grouped_indices(lengths, 2, generator=_gen(0))
    assert order == [i for m in megas for i in m]
    assert order[0] == 3  # the longest item (16 tokens) leads the first batch


def test_sampler_order_is_hf_length_grouping_seeded_by_seed_plus_epoch():
    lengths = [5, 1, 9, 3, 3, 7, 2, 8, 4, 6, 1, 2]
    sampler = ExactDistributedSampler(range(12), seed=42, lengths=lengths, group_batch_size=3)
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        assert list(sampler) == get_length_grouped_indices(lengths, 3, generator=_gen(42 + epoch))


def test_random_order_is_randperm_of_seed_plus_epoch_and_changes_with_the_epoch():
    sampler = ExactDistributedSampler(range(10), seed=7)
    first = list(sampler)
    assert first == torch.randperm(10, generator=_gen(7)).tolist()
    sampler.set_epoch(1)
    assert list(sampler) == torch.randperm(10, generator=_gen(8)).tolist() != first
    assert list(ExactDistributedSampler(range(5), shuffle=False)) == [0, 1, 2, 3, 4]


def _coverage(n, world, **kw):
    parts = []
    for rank in range(world):
        s = ExactDistributedSampler(range(n), num_replicas=world, rank=rank, **kw)
        s.set_epoch(3)
        parts.append(list(s))
        assert len(parts[-1]) == len(s)
    return parts


@settings(max_examples=80, deadline=None)
@given(n=st.integers(1, 60), world=st.integers(1, 4), seed=st.integers(0, 1000), grouped=st.booleans())
def test_every_index_exactly_once_across_ranks_with_equal_step_counts(n, world, seed, grouped):
    lengths = [(7 * i) % 11 + 1 for i in range(n)] if grouped else None
    parts = _coverage(n, world, seed=seed, lengths=lengths, group_batch_size=2)
    real = [i for p in parts for i in p if i >= 0]
    assert sorted(real) == list(range(n))  # exactly once
    assert len({len(p) for p in parts}) == 1  # same number of examples, so of steps, on every rank
    topups = [i for p in parts for i in p if i < 0]
    assert len(topups) == (-n) % world  # the short ranks get one masked copy each
    # the order is the same on every rank: rank r holds positions r, r + W, ...
    order = ExactDistributedSampler(range(n), seed=seed, lengths=lengths, group_batch_size=2)
    order.set_epoch(3)
    merged = [parts[j % world][j // world] for j in range(n)]
    assert merged == list(order)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 60), world=st.integers(1, 4))
def test_drop_last_leaves_out_the_tail_and_evaluation_splits_without_padding(n, world):
    dropped = _coverage(n, world, drop_last=True)
    real = [i for p in dropped for i in p]
    assert len(real) == len(set(real)) == n - n % world and all(i >= 0 for i in real)
    evaluation = _coverage(n, world, shuffle=False, top_up=False)
    assert sorted(i for p in evaluation for i in p if i >= 0) == list(range(n))
    assert evaluation[0][:2] == [0, world][: len(evaluation[0][:2])]
    # a rank with no example evaluates one placeholder (~0), every other rank only real examples
    assert [p for p in evaluation if any(i < 0 for i in p)] == [[~0]] * max(world - n, 0)


def test_top_up_is_a_fully_masked_copy():
    ds = datasets.Dataset.from_dict(
        {"input_ids": [[1, 2, 3], [4, 5]], "labels": [[1, 2, 3], [-100, 5]], "label": [1, 0]}
    )
    view = TopUpDataset(ds)
    assert view[1] == ds[1]
    assert view[~1] == {"input_ids": [4, 5], "labels": [-100, -100], "label": -100}
    assert mask_example({"input_ids": torch.tensor([[7, 8, 9]])})["labels"] == [-100] * 3


def test_lengths_count_elements_so_a_1_by_n_row_has_length_n():
    ds = datasets.Dataset.from_dict({"input_ids": [[[1, 2, 3, 4]], [[5, 6]], [[7]]]})
    assert sequence_lengths(ds) == [4, 2, 1]
    flat = datasets.Dataset.from_dict({"input_ids": [[1, 2, 3], [4], [5, 6]]}).select([2, 0])
    assert sequence_lengths(flat) == [2, 3]  # honours select / filter
    assert sequence_lengths([{"input_ids": torch.ones(1, 5)}]) == [5]


def test_datamodule_groups_by_length_with_accumulation_and_measures_lengths_once(word_tokenizer):
    import lightning as L

    # 2 to 14 tokens (a 1-token row has no causal target and would be dropped)
    texts = [" ".join("abcdefghijklmnopqrstuvwxyz"[: (i * 7) % 13 + 2]) for i in range(40)]
    dm = HFDataModule(
        word_tokenizer,
        path=datasets.Dataset.from_dict({"text": texts}),
        validation_split=0.0,
        group_by_length=True,
        per_device_train_batch_size=2,
        seed=5,
    )
    trainer = L.Trainer(accelerator="cpu", accumulate_grad_batches=3, logger=False)
    dm.trainer = trainer
    dm.setup()
    lengths = dm._train_lengths
    assert lengths == [(i * 7) % 13 + 2 for i in range(40)]
    loader = dm.train_dataloader()
    assert dm._train_lengths is lengths  # measured once, reused
    expected = get_length_grouped_indices(lengths, 2 * 3, generator=_gen(5))
    assert list(loader.sampler) == expected
    first = next(iter(loader))
    assert first["input_ids"].shape[1] == 14  # the longest item is in the first batch


@pytest.mark.parametrize("workers", [0, 2])
def test_map_style_loader_covers_each_row_once_per_rank_split_with_workers(word_tokenizer, workers):
    texts = [" ".join(["a"] * (i % 5 + 1)) + f" {chr(98 + i % 20)}" for i in range(23)]
    ds = datasets.Dataset.from_dict({"text": texts, "idx": list(range(23))})
    seen = []
    for rank in range(3):
        dm = HFDataModule(
            word_tokenizer,
            path=ds,
            validation_split=0.0,
            per_device_train_batch_size=4,
            num_workers=workers,
            model_input_names=["input_ids", "attention_mask", "idx"],
        )
        dm.setup()
        dm._world = lambda rank=rank: (3, rank)
        batches = list(dm.train_dataloader())
        assert len(batches) == 2  # ceil(23 / 3) = 8 rows per rank -> 2 batches each
        for b in batches:
            real = b["labels"].ne(-100).any(dim=1)  # a masked top-up has no label at all
            seen += b["idx"][real].tolist()
    assert sorted(seen) == list(range(23))
