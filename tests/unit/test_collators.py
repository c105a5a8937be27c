"""Padding collator: exact tensors, written out by hand."""

from __future__ import annotations

import pytest
import torch

from hf_lightning.data.collators import PaddingCollator


def test_labels_padded_by_position_not_by_pad_id():
    # pad = eos = 2: the real EOS at the end of each row stays a target; only padding becomes -100
    batch = PaddingCollator(pad_token_id=2)([{"input_ids": [10, 11, 2]}, {"input_ids": [12, 2]}])
    assert batch["input_ids"].tolist() == [[10, 11, 2], [12, 2, 2]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
    assert batch["labels"].tolist() == [[10, 11, 2], [12, 2, -100]]
    assert all(t.dtype == torch.long for t in batch.values())


def test_user_labels_are_kept_and_pad_to_multiple_of():
    examples = [
        {"input_ids": [5, 6, 7], "labels": [-100, 6, 7]},
        {"input_ids": [8], "labels": [8]},
    ]
    batch = PaddingCollator(pad_token_id=0, pad_to_multiple_of=4)(examples)
    assert batch["input_ids"].tolist() == [[5, 6, 7, 0], [8, 0, 0, 0]]
    assert batch["labels"].tolist() == [[-100, 6, 7, -100], [8, -100, -100, -100]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 0], [1, 0, 0, 0]]


def test_matches_hf_collator_when_pad_differs_from_eos():
    from tokenizers import Tokenizer, models
    from transformers import DataCollatorForLanguageModeling, PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(20)}
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t1")))
    tok.pad_token, tok.eos_token = "t0", "t3"
    rows = [{"input_ids": [5, 6, 7, 3]}, {"input_ids": [9, 3]}, {"input_ids": [4]}]
    hf = DataCollatorForLanguageModeling(tok, mlm=False)(rows)
    ours = PaddingCollator(pad_token_id=0)(rows)
    for key in ("input_ids", "attention_mask", "labels"):
        assert torch.equal(ours[key], hf[key]), key


def test_mismatched_labels_are_refused_with_the_example_index():
    with pytest.raises(ValueError, match="example 1: 'labels' has 1 positions but 'input_ids' has 2"):
        PaddingCollator(0)([{"input_ids": [1]}, {"input_ids": [1, 2], "labels": [1]}])
