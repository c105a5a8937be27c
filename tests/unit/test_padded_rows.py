"""Pre-tokenized rows that arrive padded (``attention_mask`` with zeros): padding is never a target, never
content.

The oracle is ``transformers.DataCollatorForLanguageModeling(mlm=False)`` run side by side on the same rows:
its labels are ``input_ids`` with -100 wherever the id is the pad id. Ours are -100 wherever
``attention_mask`` is 0, which is the same on rows that hold no real pad-id token, and right where HF is wrong
(below).
"""

from __future__ import annotations

import json
import logging

import datasets
import pytest
import torch

from hf_lightning import HFDataModule
from tests.data_support import shared_data

IGNORE = -100


def _dm(tok, rows, **kw):
    kw = {"validation_split": 0.0, "shuffle": False, "per_device_train_batch_size": 4, **kw}
    dm = HFDataModule(tok, path=datasets.Dataset.from_dict(rows), **kw)
    dm.setup()
    return dm


def _c4_padded(tok, n=8, length=64):
    """The first ``n`` c4-demo documents tokenized as transformers' own gradient-accumulation test feeds them:
    ``padding="max_length"``; the two shortest first, so the first batch holds padding."""
    texts = [
        json.loads(line)["text"]
        for line in (shared_data() / "c4-demo" / "c4_demo.jsonl").read_text().splitlines()
    ]
    texts = sorted(texts[:40], key=lambda t: len(tok(t)["input_ids"]))[:2] + texts[: n - 2]
    enc = tok(texts, truncation=True, max_length=length, padding="max_length")
    return {k: [list(x) for x in v] for k, v in enc.items()}


def test_padded_rows_without_labels_match_hf_language_modeling_collator(gpt2_tokenizer):
    """Before: the padding was trained on (labels copied from ``input_ids`` everywhere)."""
    from transformers import DataCollatorForLanguageModeling

    rows = _c4_padded(gpt2_tokenizer)
    assert any(0 in m for m in rows["attention_mask"][:4])
    hf = DataCollatorForLanguageModeling(gpt2_tokenizer, mlm=False)(
        [{k: rows[k][i] for k in rows} for i in range(4)]
    )
    ours = next(iter(_dm(gpt2_tokenizer, rows, max_length=64).train_dataloader()))
    for key in ("input_ids", "attention_mask", "labels"):
        assert torch.equal(ours[key], hf[key]), key
    assert int((ours["labels"][:, 1:] != IGNORE).sum()) == int((hf["labels"][:, 1:] != IGNORE).sum())


def test_a_real_eos_stays_a_target_where_hf_masks_it(word_tokenizer):
    """HF's collator compares ids with the pad id, so with ``pad_token == eos_token`` it also masks the real
    EOS that ends a document (the model never learns to stop). Masking by ``attention_mask`` keeps it: HF is
    wrong here, on purpose we differ."""
    import copy

    from transformers import DataCollatorForLanguageModeling

    tok = copy.deepcopy(word_tokenizer)
    tok.pad_token = tok.eos_token  # pad = eos = 2
    rows = {"input_ids": [[4, 5, 2, 2], [6, 7, 8, 2]], "attention_mask": [[1, 1, 1, 0], [1, 1, 1, 1]]}
    ours = next(iter(_dm(tok, rows).train_dataloader()))
    hf = DataCollatorForLanguageModeling(tok, mlm=False)([{k: rows[k][i] for k in rows} for i in (0, 1)])
    assert ours["labels"].tolist() == [[4, 5, 2, IGNORE], [6, 7, 8, 2]]
    assert hf["labels"].tolist() == [[4, 5, IGNORE, IGNORE], [6, 7, 8, IGNORE]]


def test_an_all_padding_row_is_dropped_and_counted(word_tokenizer, caplog):
    rows = {
        "input_ids": [[4, 5, 0], [0, 0, 0], [6, 7, 8]],
        "attention_mask": [[1, 1, 0], [0, 0, 0], [1, 1, 1]],
    }
    with caplog.at_level(logging.WARNING, logger="hf_lightning"):
        dm = _dm(word_tokenizer, rows)
    assert dm.train_dataset["input_ids"] == [[4, 5, 0], [6, 7, 8]]
    assert dm.train_dataset["labels"] == [[4, 5, IGNORE], [6, 7, 8]]
    assert (
        "train: dropped 1 of 3 rows with no trained-on token: all padding (attention_mask 0 everywhere): 1 "
        "(train row 1)"
    ) in caplog.text


def test_given_labels_on_padding_are_masked_and_counted(word_tokenizer, caplog):
    """``labels`` copied from padded ``input_ids`` (a common pre-processing slip): the 3 label positions under
    ``attention_mask == 0`` become -100, and the log says how many (counted by hand)."""
    rows = {
        "input_ids": [[4, 5, 0, 0], [6, 7, 8, 0], [9, 10, 11, 12]],
        "attention_mask": [[1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]],
        "labels": [[4, 5, 0, 0], [IGNORE, 7, 8, 0], [IGNORE, IGNORE, 11, 12]],
    }
    with caplog.at_level(logging.WARNING, logger="hf_lightning"):
        dm = _dm(word_tokenizer, rows)
    assert dm.train_dataset["labels"] == [
        [4, 5, IGNORE, IGNORE],
        [IGNORE, 7, 8, IGNORE],
        [IGNORE, IGNORE, 11, 12],
    ]
    assert (
        "train: 3 label positions in 2 rows lie on padding (attention_mask 0) and were set to -100"
        in caplog.text
    )


@pytest.mark.parametrize("option", [{"packing": "bfd"}, {"packing": "wrapped"}, {"padding_free": True}])
def test_padding_is_not_packed_or_flattened_as_content(word_tokenizer, caplog, option):
    """Before: packing took the pad tokens in as content (and trained on them); padding-free batches refused
    the rows. Expected by hand: the pad positions leave, the real tokens stay in order."""
    rows = {
        "input_ids": [[4, 5, 6, 0, 0], [0, 7, 8, 9, 10]],
        "attention_mask": [[1, 1, 1, 0, 0], [0, 1, 1, 1, 1]],
    }
    with caplog.at_level(logging.INFO, logger="hf_lightning"):
        dm = _dm(word_tokenizer, rows, max_length=8, **option)
    batch = next(iter(dm.train_dataloader()))
    assert sorted(t for t in batch["input_ids"].reshape(-1).tolist() if t != 0) == [4, 5, 6, 7, 8, 9, 10]
    # targets: bfd and padding-free mask each document's first token; wrapped rows run on (7 tokens, 6
    # targets)
    targets = int((batch["labels"][:, 1:] != IGNORE).sum())
    assert targets == (6 if option.get("packing") == "wrapped" else 5)
    assert "3 padding positions (attention_mask 0) in 2 rows were removed" in caplog.text
