"""Hypothesis-driven random input: no crash without a message, no NaN.

Random datasets (lengths 0..max, random label masks, random packing) go through the DataModule, the collators,
the samplers and the loss. The property everywhere: either the result is right (checked against an independent
count or computation), or the failure is an :class:`~hf_lightning.core.errors.HFLightningError` whose message
names the data. Random constructor arguments and config overrides are in ``test_fuzz_settings.py``.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import datasets
import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hf_lightning import DataError, HFDataModule, HFLightningError
from hf_lightning.data import (
    ClassificationCollator,
    ExactDistributedSampler,
    PackedCollator,
    PaddingCollator,
    PaddingFreeCollator,
    length_grouped_indices,
)
from hf_lightning.data.packing import best_fit_decreasing
from hf_lightning.module.loss import IGNORE_INDEX, count_loss_items, token_cross_entropy_sum

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
VOCAB = 20


@st.composite
def token_rows(draw, min_rows=1, max_rows=6, max_len=9, min_len=0):
    """Examples with ``input_ids`` of length min_len..max_len and labels masked at random positions."""
    rows = []
    for _ in range(draw(st.integers(min_rows, max_rows))):
        n = draw(st.integers(min_len, max_len))
        ids = draw(st.lists(st.integers(1, VOCAB - 1), min_size=n, max_size=n))
        mask = draw(st.lists(st.booleans(), min_size=n, max_size=n))
        rows.append({"input_ids": ids, "labels": [IGNORE_INDEX if m else t for t, m in zip(ids, mask)]})
    return rows


def causal_targets(rows):
    """Targets a causal LM trains on: label positions 1.. that are not -100 (independent of the library)."""
    return sum(sum(1 for t in r["labels"][1:] if t != IGNORE_INDEX) for r in rows)


# ------------------------------------------------------------------------------------------ collators
@FUZZ
@given(rows=token_rows(), multiple=st.sampled_from([None, 1, 4, 8]))
def test_padding_collator(rows, multiple):
    batch = PaddingCollator(pad_token_id=0, pad_to_multiple_of=multiple)(rows)
    longest = max(len(r["input_ids"]) for r in rows)
    width = math.ceil(longest / multiple) * multiple if multiple else longest
    assert (
        batch["input_ids"].shape
        == batch["labels"].shape
        == batch["attention_mask"].shape
        == (len(rows), width)
    )
    for i, r in enumerate(rows):
        n = len(r["input_ids"])
        assert (
            batch["input_ids"][i, :n].tolist() == r["input_ids"]
            and batch["labels"][i, :n].tolist() == r["labels"]
        )
        assert batch["attention_mask"][i].tolist() == [1] * n + [0] * (width - n)
        assert (batch["labels"][i, n:] == IGNORE_INDEX).all()
    assert count_loss_items(batch) == causal_targets(rows)


@FUZZ
@given(rows=token_rows())
def test_padding_free_collator(rows):
    lengths = [len(r["input_ids"]) for r in rows]
    if not any(lengths):
        with pytest.raises(DataError, match="every example of the batch is empty"):
            PaddingFreeCollator()(rows)
        return
    batch = PaddingFreeCollator()(rows)
    kept = [r for r in rows if r["input_ids"]]
    assert batch["input_ids"].shape == (1, sum(lengths))
    assert batch["position_ids"][0].tolist() == [p for r in kept for p in range(len(r["input_ids"]))]
    # every sequence start is -100: the causal count of the flat row equals the per-sequence count
    assert count_loss_items(batch) == causal_targets(kept)


@FUZZ
@given(rows=token_rows(min_len=1), capacity=st.integers(9, 20))
def test_packing_and_packed_collator(rows, capacity):
    bins = best_fit_decreasing([len(r["input_ids"]) for r in rows], capacity)
    assert sorted(i for b in bins for i in b) == list(range(len(rows)))
    assert all(sum(len(rows[i]["input_ids"]) for i in b) <= capacity for b in bins)
    assert len(bins) >= math.ceil(sum(len(r["input_ids"]) for r in rows) / capacity)
    packed = []
    for b in bins:
        packed.append(
            {
                "input_ids": [t for i in b for t in rows[i]["input_ids"]],
                "labels": [t for i in b for t in [IGNORE_INDEX] + rows[i]["labels"][1:]],
                "position_ids": [p for i in b for p in range(len(rows[i]["input_ids"]))],
            }
        )
    batch = PackedCollator(pad_token_id=0)(packed)
    assert count_loss_items(batch) == causal_targets(rows)


@FUZZ
@given(labels=st.lists(st.integers(0, 4), min_size=1, max_size=6), lengths=st.data())
def test_classification_collator(labels, lengths):
    rows = [{"input_ids": [1] * lengths.draw(st.integers(1, 7)), "label": y} for y in labels]
    batch = ClassificationCollator(pad_token_id=0)(rows)
    assert batch["labels"].tolist() == labels and batch["labels"].dtype == torch.long
    assert batch["attention_mask"].sum(1).tolist() == [len(r["input_ids"]) for r in rows]


@FUZZ
@given(
    junk=st.one_of(
        st.text(max_size=3),
        st.lists(st.text(max_size=2), min_size=1, max_size=3),
        st.lists(st.lists(st.integers(0, 3), max_size=3), min_size=2, max_size=3),
        st.none(),
    )
)
def test_collators_reject_junk_rows_with_a_message(junk):
    rows = [{"input_ids": [1, 2]}, {"input_ids": junk}]
    # a list of int lists is a (1, n)-style row that as_row flattens; text and None are never token ids
    int_rows = isinstance(junk, list) and all(isinstance(r, list) for r in junk)
    for collate in (PaddingCollator(0), PaddingFreeCollator(), ClassificationCollator(0)):
        try:
            batch = collate(rows)
        except HFLightningError as err:
            assert "input_ids" in str(err) or "token row" in str(err), str(err)
        except Exception as err:  # noqa: BLE001 - the property under test: nothing else escapes
            pytest.fail(f"{type(collate).__name__} raised {type(err).__name__}: {err} for input_ids={junk!r}")
        else:
            assert int_rows, f"{type(collate).__name__} accepted input_ids={junk!r}"
            flat = [i for r in junk for i in r]
            ids = batch["input_ids"]
            second = ids[0, 2:] if isinstance(collate, PaddingFreeCollator) else ids[1, : len(flat)]
            assert second.tolist() == flat


# ------------------------------------------------------------------------------------------ samplers
@FUZZ
@given(
    n=st.integers(1, 60),
    world=st.integers(1, 6),
    shuffle=st.booleans(),
    drop_last=st.booleans(),
    grouped=st.booleans(),
    seed=st.integers(0, 2**16),
    epoch=st.integers(0, 3),
)
def test_exact_distributed_sampler(n, world, shuffle, drop_last, grouped, seed, epoch):
    lengths = [(i * 7919) % 13 for i in range(n)] if grouped else None
    shares = []
    for rank in range(world):
        s = ExactDistributedSampler(
            range(n),
            num_replicas=world,
            rank=rank,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
            lengths=lengths,
            group_batch_size=2,
        )
        s.set_epoch(epoch)
        shares.append(list(s))
    assert len({len(x) for x in shares}) == 1  # every rank runs the same number of steps
    real = sorted(i for x in shares for i in x if i >= 0)
    if drop_last:
        assert len(real) == n - n % world and len(set(real)) == len(real)
    else:
        assert real == list(range(n))  # every example exactly once; top-ups are masked copies (~i)
        assert sum(1 for x in shares for i in x if i < 0) == (-n) % world


@FUZZ
@given(lengths=st.lists(st.integers(0, 50), max_size=80), batch=st.integers(1, 8), seed=st.integers(0, 99))
def test_length_grouped_indices_is_a_permutation(lengths, batch, seed):
    order = length_grouped_indices(lengths, batch, generator=torch.Generator().manual_seed(seed))
    assert sorted(order) == list(range(len(lengths)))
    if lengths:
        assert lengths[order[0]] == max(lengths)


# ------------------------------------------------------------------------------------------ loss
@FUZZ
@given(
    rows=token_rows(min_len=1),
    scale=st.sampled_from([1e-3, 1.0, 30.0, 1e4]),
    seed=st.integers(0, 99),
    causal=st.booleans(),
)
def test_token_loss_is_finite_and_exact(rows, scale, seed, causal):
    batch = PaddingCollator(pad_token_id=0)(rows)
    logits = (
        torch.randn(*batch["input_ids"].shape, VOCAB, generator=torch.Generator().manual_seed(seed)) * scale
    )
    total = token_cross_entropy_sum(logits, batch["labels"], causal=causal)
    count = count_loss_items(batch, causal=causal)
    assert torch.isfinite(total) and total >= 0
    # independent computation: one log-softmax term per target position
    expected, n = 0.0, 0
    for b, r in enumerate(rows):
        for t, y in enumerate(r["labels"]):
            if y == IGNORE_INDEX or (causal and t == 0):
                continue
            expected -= F.log_softmax(logits[b, t - 1 if causal else t].double(), -1)[y].item()
            n += 1
    assert count == n
    assert total.item() == pytest.approx(expected, rel=1e-4, abs=1e-3)
    assert torch.isfinite(total / torch.tensor(count).clamp(min=1))  # an all-masked window gives 0, not NaN


# ------------------------------------------------------------------------------------------ the DataModule
# end to end
@FUZZ
@given(
    rows=token_rows(max_rows=12, max_len=12),
    mode=st.sampled_from(["pad", "bfd", "wrapped", "padding_free"]),
    batch=st.integers(1, 4),
    max_length=st.integers(2, 12),
    group=st.booleans(),
    drop_last=st.booleans(),
)
def test_random_datasets_through_the_datamodule(rows, mode, batch, max_length, group, drop_last):
    dm = HFDataModule(
        SimpleNamespace(pad_token_id=0, eos_token_id=None, model_input_names=["input_ids", "attention_mask"]),
        path=datasets.Dataset.from_list(rows),
        validation_split=0.0,
        max_length=max_length,
        per_device_train_batch_size=batch,
        packing=mode if mode in ("bfd", "wrapped") else False,
        padding_free=mode == "padding_free",
        group_by_length=group,
        drop_last=drop_last,
        shuffle=True,
        seed=0,
    )
    truncated = [{k: v[:max_length] for k, v in r.items()} for r in rows]
    kept = [r for r in truncated if any(t != IGNORE_INDEX for t in r["labels"][1:])]
    try:
        dm.setup("fit")
        loader = dm.train_dataloader()
    except DataError as err:  # nothing to train on, or fewer rows than one batch with drop_last
        assert not kept or (drop_last and "fewer than one batch" in str(err)), str(err)
        return
    counted = 0
    for b in loader:
        assert all(torch.is_tensor(v) for v in b.values())
        counted += count_loss_items(b)
        logits = torch.zeros(*b["input_ids"].shape, VOCAB)
        assert torch.isfinite(token_cross_entropy_sum(logits, b["labels"]))
    if mode != "wrapped" and not drop_last:  # wrapping joins documents, so targets cross their boundaries
        assert counted == causal_targets(kept)
