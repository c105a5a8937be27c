"""Padding-free and packed batches give the padded batch's loss and per-sequence logits on a real tiny Llama.

``transformers`` separates flattened sequences by their ``position_ids`` only when ``attention_mask`` is None
and no KV cache is built (``masking_utils._preprocess_mask_arguments``); the last test shows what happens
when a cache is built.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hf_lightning import HFLightningModule
from hf_lightning.data.collators import (
    PackedCollator,
    PaddingCollator,
    PaddingFreeCollator,
    sequence_boundaries,
)
from hf_lightning.data.packing import pack_bfd
from hf_lightning.module.loss import count_loss_items, token_cross_entropy_sum
from tests.data_support import tiny_llama

SEQS = [[10, 11, 12, 13], [20, 21, 22], [30, 31]]


@pytest.fixture(scope="module")
def model():
    return tiny_llama()


def _loss(module, batch):
    count = count_loss_items(batch)
    loss, out = module.compute_loss(batch, torch.tensor(count))
    if module.lean.active:
        # the lean loss never computes the logits of every position: the module's forward does
        assert out.logits is None
        with torch.no_grad():
            return loss, module(batch).logits, count
    return loss, out.logits, count


@pytest.mark.parametrize("lean_loss", [True, False])
@pytest.mark.parametrize("training", [True, False])
def test_same_loss_and_logits_through_the_lightning_module(model, training, lean_loss):
    module = HFLightningModule(model, lean_loss=lean_loss)
    module.train(training)
    examples = [{"input_ids": s} for s in SEQS]
    padded = PaddingCollator(pad_token_id=0)(examples)
    flat = PaddingFreeCollator()(examples)
    # padded labels keep position 0 of each row; it is never a causal target, so both count 6
    loss_p, logits_p, n_p = _loss(module, padded)
    loss_f, logits_f, n_f = _loss(module, flat)
    assert n_p == n_f == 6
    torch.testing.assert_close(loss_f, loss_p, rtol=1e-5, atol=1e-6)
    bounds = sequence_boundaries(flat["position_ids"]).tolist()
    for i, seq in enumerate(SEQS):
        torch.testing.assert_close(
            logits_f[0, bounds[i] : bounds[i + 1]], logits_p[i, : len(seq)], rtol=1e-5, atol=1e-5
        )


@pytest.mark.parametrize("lean_loss", [True, False])
def test_validation_step_gives_the_same_token_mean_loss(model, lean_loss):
    examples = [{"input_ids": s} for s in SEQS]
    losses = []
    for batch in (PaddingCollator(0)(examples), PaddingFreeCollator()(examples)):
        module = HFLightningModule(model, lean_loss=lean_loss).eval()
        with torch.no_grad():
            module.validation_step(batch, 0)
        losses.append(module.eval_metrics["val"]["loss"].compute())
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-6)


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.lists(st.tuples(st.integers(3, 31), st.booleans()), min_size=1, max_size=10),
        min_size=1,
        max_size=4,
    )
)
def test_padding_free_equals_padded_loss_on_random_batches(model, rows):
    """Random token ids; ``False`` marks a position whose label is -100 (a prompt token)."""
    examples = [
        {"input_ids": [t for t, _ in r], "labels": [t if keep else -100 for t, keep in r]} for r in rows
    ]
    padded, flat = PaddingCollator(0)(examples), PaddingFreeCollator()(examples)
    assert count_loss_items(padded) == count_loss_items(flat)
    with torch.no_grad():
        lp = model(**padded, use_cache=False).logits
        lf = model(**flat, use_cache=False).logits
    sum_p = token_cross_entropy_sum(lp, padded["labels"])
    sum_f = token_cross_entropy_sum(lf, flat["labels"])
    torch.testing.assert_close(sum_f, sum_p, rtol=1e-5, atol=1e-5)


def test_bfd_packed_rows_give_each_document_its_own_logits(model):
    import datasets

    docs = [[4, 5, 6], [7, 8], [9, 10], [11, 12, 13, 14, 15]]
    packed = pack_bfd(datasets.Dataset.from_dict({"input_ids": docs, "labels": docs}), max_length=8)
    batch = PackedCollator(pad_token_id=0)(packed.to_list())
    assert "attention_mask" not in batch
    with torch.no_grad():
        logits = model(**{k: v for k, v in batch.items() if k != "labels"}, use_cache=False).logits
        for row, pos in enumerate(batch["position_ids"]):
            starts = (pos == 0).nonzero().reshape(-1).tolist() + [pos.numel()]
            for a, b in zip(starts, starts[1:]):
                doc = batch["input_ids"][row, a:b]
                if batch["labels"][row, a + 1 : b].eq(-100).all() and b - a > 1:
                    continue  # the padding tail
                alone = model(input_ids=doc[None], use_cache=False).logits[0]
                torch.testing.assert_close(logits[row, a:b], alone, rtol=1e-5, atol=1e-5)


def test_a_kv_cache_hides_the_sequence_boundaries(model):
    """Why ``use_cache=False`` matters: with a cache the flattened sequences attend to each other."""
    flat = PaddingFreeCollator()([{"input_ids": s} for s in SEQS])
    inputs = {"input_ids": flat["input_ids"], "position_ids": flat["position_ids"]}
    with torch.no_grad():
        separate = model(**inputs, use_cache=False).logits
        cached = model(**inputs, use_cache=True).logits
    torch.testing.assert_close(cached[0, :4], separate[0, :4])  # the first sequence sees nothing before it
    assert not torch.allclose(cached[0, 4:], separate[0, 4:], atol=1e-4)
