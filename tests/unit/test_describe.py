"""The batch report of ``inspect_batch``: exact text for hand-made batches."""

from __future__ import annotations

import torch

from hf_lightning.data.collators import PaddingCollator, PaddingFreeCollator
from hf_lightning.data.describe import describe_batch


def test_padded_batch_report(word_tokenizer):
    batch = PaddingCollator(0)(
        [
            {"input_ids": [4, 5, 6, 7], "labels": [-100, -100, 6, 7]},
            {"input_ids": [8, 9], "labels": [-100, 9]},
        ]
    )
    batch["num_items_in_batch"] = 3
    text = describe_batch(batch, word_tokenizer, {"train": ["text", "id"], "validation": []})
    assert text.splitlines() == [
        "batch keys:",
        "  input_ids           (2, 4)  torch.int64",
        "  attention_mask      (2, 4)  torch.int64",
        "  labels              (2, 4)  torch.int64",
        "  num_items_in_batch  int = 3",
        "labels -100: 62.5% of label positions (5 of 8)",
        "             50.0% of non-padding positions",
        "padding: 25.0% of input positions (2 of 8)",
        "dropped columns: {'train': ['text', 'id']}",
        "first example (4 tokens; trained-on spans in [[ ]]):",
        "a b[[c d]]",
    ]


def test_padding_free_report_shows_the_first_sequence_only(word_tokenizer):
    batch = PaddingFreeCollator()([{"input_ids": [4, 5, 6]}, {"input_ids": [7, 8]}])
    text = describe_batch(batch, word_tokenizer)
    assert "padding: 0.0% of input positions (0 of 5)" in text
    assert text.splitlines()[-1] == "a[[b c]]"
    assert "dropped columns: none" in text


def test_classification_report_names_the_class(word_tokenizer):
    batch = {
        "input_ids": torch.tensor([[4, 5], [6, 0]]),
        "attention_mask": torch.tensor([[1, 1], [1, 0]]),
        "labels": torch.tensor([1, 0]),
    }
    text = describe_batch(batch, word_tokenizer, id2label={0: "ham", 1: "spam"})
    assert text.splitlines()[-2:] == ["a b", "label: 1 (spam)"]
