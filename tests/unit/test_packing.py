"""Packing: exact rows for bfd and wrapped, the efficiency in the log, refusals with a reason."""

from __future__ import annotations

import logging

import datasets
import pytest
import torch

from hf_lightning import ConfigError, HFDataModule
from hf_lightning.data.packing import PackedCollator, best_fit_decreasing, pack_bfd, pack_wrapped

IGNORE = -100


def test_best_fit_decreasing_bins():
    # 7 opens bin 0 (room 1); 5 opens bin 1 (room 3); 3 fills bin 1; 2 opens bin 2; 1 fills bin 0
    assert best_fit_decreasing([3, 7, 2, 5, 1], 8) == [[1, 4], [3, 0], [2]]
    assert best_fit_decreasing([4, 4, 4], 8) == [[0, 1], [2]]
    with pytest.raises(ValueError, match="example 0 has 9 tokens"):
        best_fit_decreasing([9], 8)


def test_bfd_rows_restart_positions_and_mask_each_document_start():
    docs = {"input_ids": [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [11, 12]], "labels": [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [-100, 12]]}
    rows = pack_bfd(datasets.Dataset.from_dict(docs), max_length=8).to_list()
    assert rows == [
        {"input_ids": [4, 5, 6, 7, 8, 9, 10], "labels": [IGNORE, 5, 6, 7, 8, 9, 10], "position_ids": [0, 1, 2, 3, 4, 5, 6]},
        {"input_ids": [1, 2, 3, 11, 12], "labels": [IGNORE, 2, 3, IGNORE, 12], "position_ids": [0, 1, 2, 0, 1]},
    ]


def test_wrapped_concatenates_with_eos_and_cuts():
    docs = {"input_ids": [[1, 2, 3], [4, 5, 2], [6]]}
    rows = pack_wrapped(datasets.Dataset.from_dict(docs), max_length=4, eos_token_id=2).to_list()
    # [1 2 3 +eos] [4 5 2] [6 +eos] -> 1 2 3 2 | 4 5 2 6 | 2
    assert [r["input_ids"] for r in rows] == [[1, 2, 3, 2], [4, 5, 2, 6], [2]]
    assert [r["labels"] for r in rows] == [[1, 2, 3, 2], [4, 5, 2, 6], [2]]
    assert [r["position_ids"] for r in rows] == [[0, 1, 2, 3], [0, 1, 2, 3], [0]]


def test_packed_collator_pads_rows_with_a_separate_position_segment():
    batch = PackedCollator(pad_token_id=0)(
        [{"input_ids": [1, 2, 3, 4], "labels": [-100, 2, -100, 4], "position_ids": [0, 1, 0, 1]},
         {"input_ids": [5, 6], "labels": [-100, 6], "position_ids": [0, 1]}]
    )
    assert batch["input_ids"].tolist() == [[1, 2, 3, 4], [5, 6, 0, 0]]
    assert batch["labels"].tolist() == [[-100, 2, -100, 4], [-100, 6, -100, -100]]
    assert batch["position_ids"].tolist() == [[0, 1, 0, 1], [0, 1, 0, 1]]
    assert set(batch) == {"input_ids", "labels", "position_ids"}


def test_datamodule_packs_and_logs_the_efficiency(word_tokenizer, caplog):
    texts = ["a b c", "d e f g h i j", "k l", "m"]  # 3 + 7 + 2 + 1 = 13 tokens
    ds = datasets.Dataset.from_dict({"text": texts})
    with caplog.at_level(logging.INFO, logger="hf_lightning"):
        dm = HFDataModule(word_tokenizer, path=ds, validation_split=0.0, packing="bfd", max_length=8, shuffle=False,
                          per_device_train_batch_size=2)
        dm.setup()
    # bins: [7 +1] [3 +2] -> 2 rows of 8 slots, 13 real tokens
    assert "packed 4 documents into 2 rows of 8 (bfd): efficiency 81.2% (13 real tokens / 16 slots)" in caplog.text
    batch = next(iter(dm.train_dataloader()))
    assert batch["input_ids"].tolist() == [[7, 8, 9, 10, 11, 12, 13, 16], [4, 5, 6, 14, 15, 0, 0, 0]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3, 4, 5, 6, 0], [0, 1, 2, 0, 1, 0, 1, 2]]
    assert batch["labels"].tolist() == [[IGNORE, 8, 9, 10, 11, 12, 13, IGNORE], [IGNORE, 5, 6, IGNORE, 15] + [IGNORE] * 3]


def test_packing_with_padding_free_flattens_packed_rows(word_tokenizer):
    ds = datasets.Dataset.from_dict({"text": ["a b c", "d e", "f"]})
    dm = HFDataModule(word_tokenizer, path=ds, validation_split=0.0, packing="bfd", padding_free=True, max_length=4,
                      shuffle=False, per_device_train_batch_size=2)
    dm.setup()
    batch = next(iter(dm.train_dataloader()))
    # bins: [a b c | f] [d e]
    assert batch["input_ids"].tolist() == [[4, 5, 6, 9, 7, 8]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 0, 1]]
    assert batch["labels"].tolist() == [[IGNORE, 5, 6, IGNORE, IGNORE, 8]]
    assert batch["labels"].dtype == torch.long


def test_packing_is_refused_for_classification_and_streams(word_tokenizer):
    cls = datasets.Dataset.from_dict({"text": ["a", "b"], "label": [0, 1]})
    with pytest.raises(ConfigError, match="the 'classification' format cannot be packed"):
        HFDataModule(word_tokenizer, path=cls, validation_split=0.0, packing="bfd").setup()
    stream = datasets.Dataset.from_dict({"text": ["a", "b"]}).to_iterable_dataset()
    with pytest.raises(ConfigError, match="this source is a stream"):
        HFDataModule(word_tokenizer, path=stream, validation_split=0.0, packing="wrapped").setup()
    with pytest.raises(ConfigError, match=r"data.packing='greedy'"):
        HFDataModule(word_tokenizer, packing="greedy")


def test_a_plain_torch_dataset_packs_like_a_datasets_dataset(word_tokenizer):
    texts = ["a b c", "d e f g h i j", "k l", "m"]

    class Texts(torch.utils.data.Dataset):
        def __len__(self):
            return len(texts)

        def __getitem__(self, i):
            return {"text": texts[i]}

    rows = []
    for source in (Texts(), datasets.Dataset.from_dict({"text": texts})):
        dm = HFDataModule(word_tokenizer, path=source, validation_split=0.0, packing="bfd", max_length=8)
        dm.setup()
        rows.append(dm.train_dataset.to_list())
    assert rows[0] == rows[1] and len(rows[0]) == 2
