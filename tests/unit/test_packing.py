"""Packing: exact rows for bfd and wrapped, the efficiency in the log, refusals with a reason."""

from __future__ import annotations

import logging
import os

import datasets
import pytest
import torch

from hf_lightning import ConfigError, HFDataModule
from hf_lightning.data.collators import PackedCollator
from hf_lightning.data.packing import best_fit_decreasing, pack_bfd, pack_dataset, pack_wrapped

IGNORE = -100


def test_best_fit_decreasing_bins():
    # 7 opens bin 0 (room 1); 5 opens bin 1 (room 3); 3 fills bin 1; 2 opens bin 2; 1 fills bin 0
    assert best_fit_decreasing([3, 7, 2, 5, 1], 8) == [[1, 4], [3, 0], [2]]
    assert best_fit_decreasing([4, 4, 4], 8) == [[0, 1], [2]]
    with pytest.raises(ValueError, match="example 0 has 9 tokens"):
        best_fit_decreasing([9], 8)


def test_bfd_ties_go_to_the_bin_that_came_to_that_room_first():
    """TRL's rule (before: the bin opened first). Capacity 10: 7 -> bin 0 (room 3), 5 -> bin 1 (room 5), 4 ->
    bin 1 (room 1), 2 -> bin 0 (room 1): bin 1 came to room 1 first, so the 1 goes there."""
    assert best_fit_decreasing([7, 5, 4, 2, 1], 10) == [[0, 3], [1, 2, 4]]


def test_bfd_rows_restart_positions_and_mask_each_document_start():
    docs = {
        "input_ids": [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [11, 12]],
        "labels": [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [-100, 12]],
    }
    rows = pack_bfd(datasets.Dataset.from_dict(docs), max_length=8).to_list()
    assert rows == [
        {
            "input_ids": [4, 5, 6, 7, 8, 9, 10],
            "labels": [IGNORE, 5, 6, 7, 8, 9, 10],
            "seq_lengths": [7],
        },
        {
            "input_ids": [1, 2, 3, 11, 12],
            "labels": [IGNORE, 2, 3, IGNORE, 12],
            "seq_lengths": [3, 2],
        },
    ]
    # the collator turns each row's document lengths into positions restarting at every document
    batch = PackedCollator(pad_token_id=0)(rows)
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3, 4, 5, 6], [0, 1, 2, 0, 1, 0, 1]]


def test_wrapped_concatenates_the_documents_as_given_and_cuts():
    docs = {"input_ids": [[1, 2, 3], [4, 5, 2], [6]]}
    rows = pack_wrapped(datasets.Dataset.from_dict(docs), max_length=4).to_list()
    # the documents bring their own ends (text rows get an EOS before packing): nothing is added here
    assert [r["input_ids"] for r in rows] == [[1, 2, 3, 4], [5, 2, 6]]
    assert [r["labels"] for r in rows] == [[1, 2, 3, 4], [5, 2, 6]]
    assert [r["seq_lengths"] for r in rows] == [[4], [3]]  # one sequence per row: positions 0..n-1


def test_packed_collator_pads_rows_with_a_separate_position_segment():
    batch = PackedCollator(pad_token_id=0)(
        [
            {"input_ids": [1, 2, 3, 4], "labels": [-100, 2, -100, 4], "position_ids": [0, 1, 0, 1]},
            {"input_ids": [5, 6], "labels": [-100, 6], "position_ids": [0, 1]},
        ]
    )
    assert batch["input_ids"].tolist() == [[1, 2, 3, 4], [5, 6, 0, 0]]
    assert batch["labels"].tolist() == [[-100, 2, -100, 4], [-100, 6, -100, -100]]
    assert batch["position_ids"].tolist() == [[0, 1, 0, 1], [0, 1, 0, 1]]
    assert set(batch) == {"input_ids", "labels", "position_ids"}


def test_packed_collators_take_seq_lengths_and_refuse_ones_that_do_not_add_up():
    """TRL's ``seq_lengths`` column gives the same batch as the positions it stands for."""
    from hf_lightning.core.errors import DataError
    from hf_lightning.data.collators import PaddingFreeCollator

    with_positions = [
        {"input_ids": [1, 2, 3, 4, 5], "labels": [-100, 2, 3, -100, 5], "position_ids": [0, 1, 2, 0, 1]},
        {"input_ids": [6, 7], "labels": [-100, 7], "position_ids": [0, 1]},
    ]
    with_lengths = [
        {"input_ids": [1, 2, 3, 4, 5], "labels": [-100, 2, 3, -100, 5], "seq_lengths": [3, 2]},
        {"input_ids": [6, 7], "labels": [-100, 7], "seq_lengths": [2]},
    ]
    for collator in (PackedCollator(pad_token_id=0), PaddingFreeCollator()):
        a, b = collator(with_positions), collator(with_lengths)
        assert set(a) == set(b) == {"input_ids", "labels", "position_ids"}
        assert all(torch.equal(a[k], b[k]) for k in a)
    assert PaddingFreeCollator()(with_lengths)["position_ids"].tolist() == [[0, 1, 2, 0, 1, 0, 1]]
    bad = [{"input_ids": [1, 2, 3], "labels": [1, 2, 3], "seq_lengths": [2, 2]}]
    with pytest.raises(
        DataError, match="example 0: 'seq_lengths' \\[2, 2\\] must be document lengths adding up to its 3"
    ):
        PackedCollator(pad_token_id=0)(bad)


def test_datamodule_packs_and_logs_the_efficiency(word_tokenizer, caplog):
    texts = ["a b c", "d e f g h i j", "k l", "m"]  # 3 + 7 + 2 + 1 = 13 tokens, + 4 EOS
    ds = datasets.Dataset.from_dict({"text": texts})
    with caplog.at_level(logging.INFO, logger="hf_lightning"):
        dm = HFDataModule(
            word_tokenizer,
            path=ds,
            validation_split=0.0,
            packing="bfd",
            max_length=8,
            shuffle=False,
            per_device_train_batch_size=2,
        )
        dm.setup()
    # documents with their EOS: 4, 8, 3, 2 tokens; bins: [8] [4 + 3] [2] -> 3 rows of 8 slots, 17 real tokens
    assert (
        "packed 4 documents into 3 rows of 8 (bfd): efficiency 70.8% (17 real tokens / 24 slots)"
        in caplog.text
    )
    batch = next(iter(dm.train_dataloader()))
    assert batch["input_ids"].tolist() == [[7, 8, 9, 10, 11, 12, 13, 2], [4, 5, 6, 2, 14, 15, 2, 0]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3, 4, 5, 6, 7], [0, 1, 2, 3, 0, 1, 2, 0]]
    assert batch["labels"].tolist() == [
        [IGNORE, 8, 9, 10, 11, 12, 13, 2],
        [IGNORE, 5, 6, 2, IGNORE, 15, 2, IGNORE],
    ]


def test_wrapped_keeps_every_token_and_ends_only_real_documents(word_tokenizer, caplog):
    """Before: each document was cut to ``max_length`` before concatenating (``a..g`` lost ``e f g``) and an
    EOS followed the cut; the log counted one truncated row though wrapping cuts nothing off. Expected by
    hand: every token of ``tokenizer(text)`` plus one EOS per document, cut every 4 tokens (HF ``run_clm``'s
    ``group_texts`` and TRL's ``wrapped`` keep them all too)."""
    texts = ["a b c d e f g", "h i", "j k l m n"]
    with caplog.at_level(logging.INFO, logger="hf_lightning"):
        dm = HFDataModule(
            word_tokenizer,
            path=datasets.Dataset.from_dict({"text": texts}),
            validation_split=0.0,
            packing="wrapped",
            max_length=4,
            shuffle=False,
        )
        dm.setup()
    flat = [4, 5, 6, 7, 8, 9, 10, 2, 11, 12, 2, 13, 14, 15, 16, 17, 2]
    assert dm.train_dataset["input_ids"] == [flat[i : i + 4] for i in range(0, 17, 4)]
    assert dm.train_dataset["labels"] == dm.train_dataset["input_ids"]
    assert "truncated" not in caplog.text
    assert (
        "packed 3 documents into 5 rows of 4 (wrapped): efficiency 85.0% (17 real tokens / 20 slots)"
        in caplog.text
    )
    assert "2 documents continue from one row into the next (nothing is cut off)" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="hf_lightning"):
        pack_dataset(datasets.Dataset.from_dict({"input_ids": [[1, 2, 3], [4, 5]]}), "wrapped", 4)
    assert "packed 2 documents into 2 rows of 4 (wrapped)" in caplog.text
    assert "1 document continues from one row into the next" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="hf_lightning"):
        pack_dataset(datasets.Dataset.from_dict({"input_ids": [[1, 2, 3]]}), "bfd", 4)
    assert "packed 1 document into 1 row of 4 (bfd)" in caplog.text


def test_packed_text_documents_end_with_one_eos_said_once(word_tokenizer, caplog):
    """TRL appends ``eos_token`` to each text before packing; before, no packed document ended with one. A
    document that already ends with EOS gets no second one; the log says it once (not once per split)."""
    texts = ["a b", "c <eos>", "d e f", "g", "h i j k"] * 4
    with caplog.at_level(logging.INFO, logger="hf_lightning"):
        dm = HFDataModule(
            word_tokenizer,
            path=datasets.Dataset.from_dict({"text": texts}),
            validation_split=0.25,
            packing="bfd",
            max_length=16,
        )
        dm.setup()
    ends = 0
    for ids, seq in zip(dm.train_dataset["input_ids"], dm.train_dataset["seq_lengths"]):
        starts = [sum(seq[:k]) for k in range(len(seq) + 1)]
        assert starts[-1] == len(ids)
        docs = [ids[a:b] for a, b in zip(starts, starts[1:])]
        assert all(d[-1] == 2 and 2 not in d[:-1] for d in docs)
        ends += len(docs)
    assert ends == 15
    assert caplog.text.count("each text document ends with the EOS token '<eos>' (id 2)") == 1


def test_bfd_truncates_a_document_longer_than_a_row_and_counts_the_cut_tokens(word_tokenizer, caplog):
    """bfd keeps a document whole in one row (as TRL's ``bfd``, which cuts the overflow silently): a longer
    one is truncated like an unpacked row, its EOS included in what is cut. By hand: 9 + EOS = 10 tokens into
    8 (2 cut); 8 + EOS = 9 into 8 (the EOS cut)."""
    texts = ["a b c d e f g h i", "a b c d e f g h", "j k"]
    with caplog.at_level(logging.WARNING, logger="hf_lightning"):
        dm = HFDataModule(
            word_tokenizer,
            path=datasets.Dataset.from_dict({"text": texts}),
            validation_split=0.0,
            packing="bfd",
            max_length=8,
            shuffle=False,
        )
        dm.setup()
    assert sorted(dm.train_dataset["input_ids"]) == [[4, 5, 6, 7, 8, 9, 10, 11]] * 2 + [[13, 14, 2]]
    assert (
        "train: 2 of 3 rows were longer than data.max_length=8 and were truncated (3 tokens cut off)"
        in caplog.text
    )


def test_unpacked_and_padding_free_text_are_exactly_the_tokenizers_rows(gpt2_tokenizer, shared_data):
    """No EOS is added without packing: each row stays ``tokenizer(text, truncation=True, max_length=...)``,
    so the padded and padding-free losses stay equal."""
    import json
    from pathlib import Path

    lines = Path(shared_data, "c4-demo", "c4_demo.jsonl").read_text().splitlines()
    texts = [json.loads(line)["text"] for line in lines][:20]
    expected = [gpt2_tokenizer(t, truncation=True, max_length=64)["input_ids"] for t in texts]
    for padding_free in (False, True):
        dm = HFDataModule(
            gpt2_tokenizer,
            path=datasets.Dataset.from_dict({"text": texts}),
            validation_split=0.0,
            max_length=64,
            shuffle=False,
            padding_free=padding_free,
        )
        dm.setup()
        assert dm.train_dataset["input_ids"] == expected


def test_packing_with_padding_free_flattens_packed_rows(word_tokenizer):
    ds = datasets.Dataset.from_dict({"text": ["a b c", "d e", "f"]})
    dm = HFDataModule(
        word_tokenizer,
        path=ds,
        validation_split=0.0,
        packing="bfd",
        padding_free=True,
        max_length=4,
        shuffle=False,
        per_device_train_batch_size=2,
    )
    dm.setup()
    batch = next(iter(dm.train_dataloader()))
    # with EOS: a b c eos (4), d e eos (3), f eos (2); bins: [a b c eos] [d e eos] [f eos]
    assert batch["input_ids"].tolist() == [[4, 5, 6, 2, 7, 8, 2]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3, 0, 1, 2]]
    assert batch["labels"].tolist() == [[IGNORE, 5, 6, 2, IGNORE, 8, 2]]
    assert batch["labels"].dtype == torch.long


def test_packing_is_refused_for_classification(word_tokenizer):
    cls = datasets.Dataset.from_dict({"text": ["a", "b"], "label": [0, 1]})
    with pytest.raises(ConfigError, match="the 'classification' format cannot be packed"):
        HFDataModule(word_tokenizer, path=cls, validation_split=0.0, packing="bfd").setup()
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
    assert rows[0] == rows[1] and len(rows[0]) == 3  # with their EOS: 4, 8, 3, 2 tokens -> [8] [4 + 3] [2]


def test_check_packing_holds_the_rules_the_schema_and_the_datamodule_share():
    """One function, every rule: the schema calls it with the model's task before anything is built, the
    DataModule once at setup with the format, the source kind and the model."""
    from hf_lightning.data.packing import check_packing

    assert check_packing(True) == "bfd"
    assert check_packing("wrapped") == "wrapped"
    assert check_packing(False, fmt="seq2seq", encoder_decoder=True) is None
    with pytest.raises(ConfigError, match=r"^data.packing='greedy': allowed values: false, true \(= bfd\)"):
        check_packing("greedy")
    with pytest.raises(
        ConfigError, match=r"with an encoder-decoder model \(model.task=seq2seq_lm\).*allowed values"
    ):
        check_packing("bfd", task="seq2seq_lm", encoder_decoder=True)
    with pytest.raises(ConfigError, match="model.task=sequence_classification; allowed values: false"):
        check_packing(True, task="sequence_classification", encoder_decoder=False)
    with pytest.raises(ConfigError, match="the 'classification' format cannot be packed"):
        check_packing("bfd", fmt="classification")
    assert check_packing("wrapped", fmt="text") == "wrapped"  # a stream is packed as it is read
    with pytest.raises(ConfigError, match="the 'seq2seq' format cannot be flattened"):
        check_packing(False, padding_free=True, fmt="seq2seq")


def test_a_file_is_packed_into_a_datasets_cache_file_that_a_second_setup_reuses(
    word_tokenizer, tmp_path, caplog
):
    """A file-backed split is packed as ``Dataset.map`` writes its results: to an Arrow file beside the
    tokenized split's cache file, memory-mapped, and read back (not packed again) by the next set-up."""
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(f'{{"text": "{t}"}}\n' for t in ["a b c", "d e f g h i j", "k l", "m"]))

    def packed() -> datasets.Dataset:
        dm = HFDataModule(word_tokenizer, path=str(path), validation_split=0.0, packing="bfd", max_length=8)
        dm.setup()
        return dm.train_dataset

    with caplog.at_level(logging.INFO, logger="hf_lightning"):
        first = packed()
    [file] = [f["filename"] for f in first.cache_files]
    assert os.path.basename(file).startswith("cache-") and file.endswith(".arrow")
    written = os.stat(file).st_mtime_ns
    assert "read from the datasets cache" not in caplog.text
    # the rows of test_datamodule_packs_and_logs_the_efficiency (the same documents, in memory), by hand
    assert first.to_list() == [
        {
            "input_ids": [7, 8, 9, 10, 11, 12, 13, 2],
            "labels": [IGNORE, 8, 9, 10, 11, 12, 13, 2],
            "seq_lengths": [8],
        },
        {
            "input_ids": [4, 5, 6, 2, 14, 15, 2],
            "labels": [IGNORE, 5, 6, 2, IGNORE, 15, 2],
            "seq_lengths": [4, 3],
        },
        {"input_ids": [16, 2], "labels": [IGNORE, 2], "seq_lengths": [2]},
    ]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="hf_lightning"):
        second = packed()
    assert [f["filename"] for f in second.cache_files] == [file]
    assert os.stat(file).st_mtime_ns == written  # read, not written again
    assert (
        f"train: packed rows read from the datasets cache ({file}; packed by an earlier run)" in caplog.text
    )
    assert "packed 4 documents into 3 rows of 8 (bfd): efficiency 70.8%" in caplog.text  # the same lines
    assert second.to_list() == first.to_list()
