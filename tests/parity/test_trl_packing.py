"""Packed ``text`` data against TRL's ``SFTTrainer`` run side by side: c4-demo (300 web documents), GPT-2 BPE,
``max_length`` 512, row for row.

TRL (``SFTTrainer._prepare_dataset``) appends ``eos_token`` to each text, tokenizes it whole and packs with
``trl.pack_dataset``: ``wrapped`` concatenates and cuts every 512 tokens, ``bfd`` truncates each document to
512 (dropping the overflow without a word) and bins them best-fit decreasing.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import datasets
import pytest

from hf_lightning import HFDataModule

pytestmark = pytest.mark.slow
MAX_LENGTH = 512


@pytest.fixture(scope="module")
def c4(shared_data):
    return f"{shared_data}/c4-demo/c4_demo.jsonl"


def _trl_rows(tokenizer, path, strategy):
    trl = pytest.importorskip("trl")
    import tempfile

    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(
        GPT2Config(n_layer=1, n_head=2, n_embd=8, n_positions=MAX_LENGTH, vocab_size=50257)
    )
    with tempfile.TemporaryDirectory() as out:
        args = trl.SFTConfig(
            output_dir=out,
            packing=True,
            packing_strategy=strategy,
            max_length=MAX_LENGTH,
            report_to=[],
            use_cpu=True,
            shuffle_dataset=False,
        )
        ds = datasets.load_dataset("json", data_files=path, split="train")
        return trl.SFTTrainer(
            model=model, args=args, train_dataset=ds, processing_class=tokenizer
        ).train_dataset


def _ours(tokenizer, path, strategy, caplog):
    with caplog.at_level(logging.INFO, logger="hf_lightning"):
        dm = HFDataModule(
            tokenizer, path=path, validation_split=0.0, packing=strategy, max_length=MAX_LENGTH, shuffle=False
        )
        dm.setup()
    return dm.train_dataset


def test_wrapped_keeps_every_token_like_trl(gpt2_tokenizer, c4, caplog):
    """Before: 86,978 of the 161,482 tokens (text + one EOS per document) were kept. Every token now, counted
    by hand from the tokenizer, and row for row TRL's rows. (HF ``run_clm``'s ``group_texts`` keeps the same
    text tokens without the EOS separators and drops the short last block.)"""
    texts = [json.loads(line)["text"] for line in Path(c4).read_text().splitlines()]
    total = sum(len(gpt2_tokenizer(t)["input_ids"]) + 1 for t in texts)
    ours = _ours(gpt2_tokenizer, c4, "wrapped", caplog)
    assert sum(len(r) for r in ours["input_ids"]) == total == 161_482
    trl_rows = _trl_rows(gpt2_tokenizer, c4, "wrapped")
    assert ours["input_ids"] == trl_rows["input_ids"]
    assert ours["labels"] == trl_rows["labels"]
    assert "truncated" not in caplog.text


def test_bfd_rows_equal_trls_and_the_cut_is_counted(gpt2_tokenizer, c4, caplog):
    """Row for row TRL's ``bfd`` (documents and their lengths in each row). TRL drops the overflow of long
    documents silently; here the log counts the rows and the tokens cut, which must equal what TRL's rows
    lack."""
    texts = [json.loads(line)["text"] for line in Path(c4).read_text().splitlines()]
    lengths = [len(gpt2_tokenizer(t)["input_ids"]) + 1 for t in texts]
    ours = _ours(gpt2_tokenizer, c4, "bfd", caplog)
    trl_rows = _trl_rows(gpt2_tokenizer, c4, "bfd")
    assert ours["input_ids"] == trl_rows["input_ids"]
    assert ours["seq_lengths"] == trl_rows["seq_lengths"]
    cut = sum(lengths) - sum(len(r) for r in trl_rows["input_ids"])
    n_long = sum(n > MAX_LENGTH for n in lengths)
    assert (
        f"train: {n_long} of 300 rows were longer than data.max_length=512 and were truncated ({cut} tokens "
        "cut off)"
    ) in caplog.text


def test_bfd_bins_equal_trls_on_random_lengths():
    """``best_fit_decreasing`` against ``trl.pack_dataset(strategy="bfd")`` on 200 random length lists: the
    same documents in the same rows (ties included)."""
    import random

    trl = pytest.importorskip("trl")
    from hf_lightning.data.packing import best_fit_decreasing

    rng = random.Random(0)
    cases = [[rng.randint(1, 16) for _ in range(rng.randint(1, 30))] for _ in range(200)]
    docs = [[[i] * n for i, n in enumerate(lengths)] for lengths in cases]
    flat = datasets.Dataset.from_dict({"input_ids": [d for case in docs for d in case]})
    for k, lengths in enumerate(cases):
        start = sum(len(c) for c in cases[:k])
        packed = trl.pack_dataset(flat.select(range(start, start + len(lengths))), 16, "bfd")
        theirs = [sorted(set(row), key=row.index) for row in packed["input_ids"]]
        assert best_fit_decreasing(lengths, 16) == theirs, lengths
