"""``data.layout=auto`` (``hf_lightning/data/layout.py``): which layout it takes, the one log line, the
fallbacks, and that the chosen layout's loss is the padded loss per target token (computed here row by row,
independently).
"""

from __future__ import annotations

import logging

import datasets
import pytest
import torch
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

import hf_lightning.data.layout as layout_module
from hf_lightning import HFDataModule, HFLightningModule
from hf_lightning.core.batch import padding_mask
from hf_lightning.core.errors import ConfigError
from hf_lightning.data.collators import BatchPackingCollator, PaddingFreeCollator
from hf_lightning.data.layout import choose_layout
from hf_lightning.module.loss import count_loss_items
from tests.data_support import PadOnly, tiny_llama

# pre-tokenized rows of unequal lengths (ids 1..31; 0 is the pad id), the first token of each not a target
LENGTHS = [3, 9, 4, 12, 5, 7, 2, 11, 6, 8, 10, 3]
IDS = [[1 + (7 * i + 3 * j) % 31 for j in range(n)] for i, n in enumerate(LENGTHS)]
ROWS = [{"input_ids": ids, "labels": [-100] + ids[1:]} for ids in IDS]


def _leaky(module, query, key, value, attention_mask, **kwargs):
    """An attention that ignores the mask (plain causal over the whole row): packed documents see each
    other."""
    kwargs.pop("is_causal", None)
    return sdpa_attention_forward(module, query, key, value, None, is_causal=True, **kwargs)


AttentionInterface.register("leaky_test", _leaky)
AttentionMaskInterface.register("leaky_test", sdpa_mask)


@pytest.fixture
def varlen_sdpa(monkeypatch):
    """Treat ``sdpa`` as a variable-length kernel, so that ``auto`` flattens on this CPU (no flash-attn
    here)."""
    monkeypatch.setattr(layout_module, "VARLEN_ATTENTION", ("sdpa",))


def _dm(model, **kwargs):
    kwargs.setdefault("layout", "auto")
    dm = HFDataModule(
        PadOnly(),
        path=datasets.Dataset.from_list(ROWS),
        validation_split=0.0,
        per_device_train_batch_size=4,
        format="tokenized",
        seed=3,
        **kwargs,
    )
    dm.bind(model)
    return dm


def _layout_lines(caplog):
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("layout:")]


def test_auto_packs_each_batch_under_sdpa_and_says_so_with_the_real_share(caplog):
    model = tiny_llama()
    assert model.config._attn_implementation == "sdpa"
    dm = _dm(model)
    with caplog.at_level(logging.INFO, logger="hf_lightning"):
        dm.setup("fit")
    assert (dm.group_by_length, dm.packing, dm.padding_free) == (False, None, True)
    assert isinstance(dm.train_collator, BatchPackingCollator)
    assert isinstance(dm.eval_collator, BatchPackingCollator)  # evaluation too: no dense (T, T) attention
    lines = _layout_lines(caplog)
    assert len(lines) == 1
    assert lines[0].startswith(
        "layout: packed per batch (data.layout=auto; each batch's documents in the fewest rows of its "
        "longest one, per-document positions; under 'sdpa' attention one flat row would cost a dense"
    )
    # the share in the line: real tokens / slots of the epoch's batches, counted here from the batches
    real = slots = 0
    for batch in dm.train_dataloader():
        real += int((~padding_mask(batch, 0)).sum())
        slots += batch["input_ids"].numel()
    assert real == sum(LENGTHS)
    assert f"{100.0 * real / slots:.1f}% of slots real (epoch 1, one rank)" in lines[0]


def test_each_packed_batch_holds_the_padded_batch_documents_and_loss():
    """Step for step: the same seed gives the same documents per batch, and the same loss (rel 1e-5)."""
    model = tiny_llama()
    module = HFLightningModule(model).eval()
    loaders = []
    for layout in ("auto", None):
        dm = _dm(model, layout=layout)
        dm.setup("fit")
        loaders.append(list(dm.train_dataloader()))
    packed, padded = loaders
    assert len(packed) == len(padded) == 3
    for p, q in zip(packed, padded):
        assert p["input_ids"].shape[0] < q["input_ids"].shape[0]  # fewer rows ...
        assert p["input_ids"].shape[1] == q["input_ids"].shape[1]  # ... of the padded batch's length
        assert sorted(_documents(p)) == sorted(
            tuple(r[m.bool()].tolist()) for r, m in zip(q["input_ids"], q["attention_mask"])
        )
        n = count_loss_items(q)
        assert count_loss_items(p) == n
        with torch.no_grad():
            loss_p, _ = module.compute_loss(p, torch.tensor(n))
            loss_q, _ = module.compute_loss(q, torch.tensor(n))
        torch.testing.assert_close(loss_p, loss_q, rtol=1e-5, atol=1e-6)


def test_evaluation_batches_are_packed_too_with_the_padded_batches_loss():
    """Packed per batch, evaluation gets rows of each batch's longest document, not one flat row (whose dense
    ``(T, T)`` attention under sdpa costs about B times the rows'): the same documents per batch and the
    same summed loss as the padded layout's evaluation batches (rel 1e-5)."""
    model = tiny_llama()
    module = HFLightningModule(model).eval()
    loaders = []
    for layout in ("auto", None):
        dm = _dm(model, layout=layout, validation_path=datasets.Dataset.from_list(ROWS))
        dm.setup("fit")
        loaders.append(list(dm.val_dataloader()))
    packed, padded = loaders
    assert len(packed) == len(padded) > 0
    for p, q in zip(packed, padded):
        assert p["input_ids"].shape[0] < q["input_ids"].shape[0]  # fewer rows of the padded length
        assert p["input_ids"].shape[1] == q["input_ids"].shape[1]
        assert sorted(_documents(p)) == sorted(
            tuple(r[m.bool()].tolist()) for r, m in zip(q["input_ids"], q["attention_mask"])
        )
        n = count_loss_items(q)
        with torch.no_grad():
            loss_p, _ = module.compute_loss(p, torch.tensor(n))
            loss_q, _ = module.compute_loss(q, torch.tensor(n))
        torch.testing.assert_close(loss_p, loss_q, rtol=1e-5, atol=1e-6)


def _documents(batch) -> list[tuple[int, ...]]:
    """The documents of packed rows: the non-padding tokens of each row, cut where ``position_ids``
    restart."""
    docs = []
    for ids, pos, pad in zip(batch["input_ids"], batch["position_ids"], padding_mask(batch, 0)):
        ids, pos = ids[~pad].tolist(), pos[~pad].tolist()
        starts = [i for i, p in enumerate(pos) if p == 0] + [len(ids)]
        docs += [tuple(ids[a:b]) for a, b in zip(starts, starts[1:])]
    return docs


def test_auto_flattens_for_a_varlen_attention_model(varlen_sdpa, caplog):
    dm = _dm(tiny_llama())
    with caplog.at_level(logging.INFO, logger="hf_lightning"):
        dm.setup("fit")
    assert (dm.group_by_length, dm.padding_free) == (False, True)
    assert isinstance(dm.train_collator, PaddingFreeCollator)
    assert _layout_lines(caplog) == [
        "layout: padding-free (data.layout=auto; one flat row per batch, per-document positions, sdpa "
        "attention): 100% of slots real"
    ]
    batch = next(iter(dm.train_dataloader()))
    assert batch["input_ids"].shape[0] == 1 and "attention_mask" not in batch
    assert int((batch["position_ids"] == 0).sum()) == 4  # four documents in the one row


def test_fallback_for_a_model_whose_attention_lets_documents_see_each_other(caplog):
    dm = _dm(tiny_llama(attn_implementation="leaky_test"))
    with caplog.at_level(logging.INFO, logger="hf_lightning"):
        dm.setup("fit")
    assert (dm.group_by_length, dm.packing, dm.padding_free) == (False, None, False)
    assert _layout_lines(caplog) == [
        "layout: padded (data.layout=auto; padding-free does not apply: LlamaForCausalLM with "
        "'leaky_test' attention lets the documents of one row attend to each other (probed); "
        "no window to sort (one micro-batch per step))"
    ]
    assert "attention_mask" in next(iter(dm.train_dataloader()))


class NoPositions(torch.nn.Module):
    """A causal LM whose ``forward`` takes no ``position_ids`` (it cannot be told where documents start)."""

    def __init__(self):
        super().__init__()
        self.inner = tiny_llama()
        self.config = self.inner.config

    def forward(self, input_ids, attention_mask=None, labels=None):
        return self.inner(input_ids=input_ids, attention_mask=attention_mask, labels=labels)


def test_fallback_for_a_model_without_position_ids(caplog):
    dm = _dm(NoPositions())
    with caplog.at_level(logging.INFO, logger="hf_lightning"):
        dm.setup("fit")
    (line,) = _layout_lines(caplog)
    assert line.startswith(
        "layout: padded (data.layout=auto; padding-free does not apply: NoPositions.forward takes no "
        "position_ids"
    )
    assert not (dm.group_by_length or dm.padding_free)


def test_formats_that_cannot_be_flattened():
    def choose(fmt, **kwargs):
        return choose_layout(
            "auto",
            group_by_length=False,
            packing=None,
            padding_free=False,
            fmt=fmt,
            model=tiny_llama(),
            **kwargs,
        )

    # one loss per example: grouping by length changes no example's weight
    classification = choose("classification")
    assert (classification.name, classification.padding_free) == ("length-grouped", False)
    seq2seq = choose("seq2seq")
    assert (seq2seq.name, seq2seq.reason) == (
        "padded",
        "no padding-free layout for the 'seq2seq' format (causal-LM rows only); no window to sort (one "
        "micro-batch per step)",
    )
    # several micro-batches per step: each window's documents sorted by length across them
    windows = choose("seq2seq", accumulation=4)
    assert (windows.name, windows.sort_windows, windows.padding_free) == (
        "padded, sorted within windows",
        True,
        False,
    )
    assert windows.reason.endswith("; 4 micro-batches per step")
    assert not choose("seq2seq", accumulation=4, stream=True).sort_windows


def test_windows_are_sorted_and_keep_their_documents():
    from hf_lightning.data.sampling import ExactDistributedSampler, sorted_within_windows

    # by hand: windows of 3, the last one short; a masked copy ~1 has index 1's length (9); ties keep order
    assert sorted_within_windows([0, 1, 2, 3, 4, ~1], [5, 9, 1, 4, 4, 7], 3) == [1, 0, 2, ~1, 3, 4]
    assert sorted_within_windows([2, 0, 3, 5, 1], [5, 9, 1, 4, 4, 7], 2) == [0, 2, 5, 3, 1]
    lengths = [len(ids) for ids in IDS]
    for rank in (0, 1):
        kwargs = dict(num_replicas=2, rank=rank, seed=5, group_batch_size=3)
        plain = list(ExactDistributedSampler(ROWS, **kwargs))
        sorted_ = list(ExactDistributedSampler(ROWS, window_lengths=lengths, window_size=3, **kwargs))
        for start in range(0, len(plain), 3):
            window = sorted_[start : start + 3]
            assert sorted(window) == sorted(plain[start : start + 3])
            assert [lengths[i] for i in window] == sorted((lengths[i] for i in window), reverse=True)


def _seq2seq_run(tmp_path, layout, word_tokenizer):
    """Three optimizer steps of a tiny T5 on source/target pairs, 2 micro-batches of 2 per step: the final
    weights and the padded slots of every training micro-batch."""
    import lightning as L
    from transformers import T5Config, T5ForConditionalGeneration

    words = [chr(ord("a") + i) for i in range(26)]
    pairs = [
        {"source": " ".join(words[i : i + n]), "target": " ".join(words[n : n + 1 + (5 * i) % 7])}
        for i, n in enumerate([3, 11, 2, 9, 4, 12, 5, 1, 10, 6, 8, 7])
    ]
    torch.manual_seed(0)
    model = T5ForConditionalGeneration(
        T5Config(
            vocab_size=32,
            d_model=16,
            d_ff=32,
            num_layers=1,
            num_heads=2,
            d_kv=8,
            dropout_rate=0.0,
            decoder_start_token_id=0,
            pad_token_id=0,
        )
    )
    dm = HFDataModule(
        word_tokenizer,
        path=datasets.Dataset.from_list(pairs),
        validation_split=0.0,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        layout=layout,
        seed=1,
    )
    module = HFLightningModule(model, optim={"lr": 1e-2}, max_grad_norm=None)
    slots = []
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=3,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
    )

    class Slots(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            for micro in batch:
                slots.append(int((micro["attention_mask"] == 0).sum()) + int((micro["labels"] == -100).sum()))

    trainer.callbacks.append(Slots())
    trainer.fit(module, datamodule=dm)
    return {n: p.detach().clone() for n, p in model.named_parameters()}, slots, dm


def test_a_seq2seq_run_sorted_within_windows_is_the_padded_run(tmp_path, word_tokenizer, caplog):
    """The same documents in every optimizer step: the same weights after three steps, with fewer padded
    slots (encoder and decoder) than the padded run."""
    padded, padded_slots, _ = _seq2seq_run(tmp_path, None, word_tokenizer)
    with caplog.at_level(logging.INFO, logger="hf_lightning"):
        weights, slots, dm = _seq2seq_run(tmp_path, "auto", word_tokenizer)
    assert dm.sort_windows
    (line,) = _layout_lines(caplog)
    assert line.startswith("layout: padded, sorted within windows (data.layout=auto; no padding-free layout")
    assert "% unsorted (epoch 1, one rank, source + target tokens)" in line
    assert len(slots) == len(padded_slots) == 6
    assert sum(slots) < sum(padded_slots)
    for name, value in padded.items():
        torch.testing.assert_close(weights[name], value, rtol=1e-5, atol=1e-6, msg=name)


def test_a_layout_set_by_hand_wins_and_null_changes_nothing(caplog):
    dm = _dm(tiny_llama(), packing="bfd")
    with caplog.at_level(logging.INFO, logger="hf_lightning"):
        dm.setup("fit")
    assert (dm.group_by_length, dm.packing, dm.padding_free) == (False, "bfd", False)
    assert _layout_lines(caplog) == [
        "layout: packing=bfd (data.layout=auto; as set by hand; auto chooses only when none is)"
    ]
    caplog.clear()
    dm = _dm(tiny_llama(), layout=None)
    with caplog.at_level(logging.INFO, logger="hf_lightning"):
        dm.setup("fit")
    assert (dm.group_by_length, dm.packing, dm.padding_free) == (False, None, False)
    assert _layout_lines(caplog) == []


def test_a_bad_layout_value_is_refused():
    with pytest.raises(ConfigError, match=r"data.layout='fast': allowed values: auto .* or null"):
        HFDataModule(PadOnly(), layout="fast")


def _reference_token_loss(model) -> torch.Tensor:
    """Mean cross-entropy over every target token of ROWS, each row run alone (no padding, no batch): the
    padded loss's definition, independent of any collator or of our loss code."""
    total, count = torch.zeros((), dtype=torch.float64), 0
    with torch.no_grad():
        for row in ROWS:
            logits = model(input_ids=torch.tensor([row["input_ids"]]), use_cache=False).logits[0]
            labels = torch.tensor(row["labels"])
            target = labels[1:] != -100
            total += torch.nn.functional.cross_entropy(
                logits[:-1][target].double(), labels[1:][target], reduction="sum"
            )
            count += int(target.sum())
    return total / count


@pytest.mark.parametrize("flatten", [False, True], ids=["packed-per-batch", "padding-free"])
def test_the_chosen_layout_gives_the_padded_per_token_loss(flatten, monkeypatch):
    if flatten:
        monkeypatch.setattr(layout_module, "VARLEN_ATTENTION", ("sdpa",))
    model = tiny_llama()
    dm = _dm(model)
    dm.setup("fit")
    assert isinstance(dm.train_collator, PaddingFreeCollator if flatten else BatchPackingCollator)
    module = HFLightningModule(model).eval()
    total, count = torch.zeros((), dtype=torch.float64), 0
    with torch.no_grad():
        for batch in dm.train_dataloader():
            n = count_loss_items(batch)
            loss, _ = module.compute_loss(batch, torch.tensor(n))
            total += loss.double() * n  # the batch's summed loss
            count += n
    assert count == sum(n - 1 for n in LENGTHS)
    torch.testing.assert_close(total / count, _reference_token_loss(model), rtol=1e-5, atol=1e-6)


def test_batch_packing_collator_by_hand():
    """The module docstring's example: lengths 5, 2, 3, 1 in rows of 5 (best fit: a | b c | d + tail)."""
    a, b, c, d = [11, 12, 13, 14, 15], [21, 22], [31, 32, 33], [41]
    out = BatchPackingCollator(pad_token_id=0)([{"input_ids": x} for x in (a, b, c, d)])
    assert out["input_ids"].tolist() == [a, b + c, [41, 0, 0, 0, 0]]
    assert out["position_ids"].tolist() == [[0, 1, 2, 3, 4], [0, 1, 0, 1, 2], [0, 0, 1, 2, 3]]
    assert out["labels"].tolist() == [
        [-100, 12, 13, 14, 15],
        [-100, 22, -100, 32, 33],
        [-100, -100, -100, -100, -100],
    ]
    assert set(out) == {"input_ids", "labels", "position_ids"}
