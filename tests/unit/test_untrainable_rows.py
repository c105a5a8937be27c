"""Rows with nothing to train on: dropped (streams: zero weight) and counted per cause, on every data path.

Word-level vocab (``tests/data_support.py``): ``a`` = 4 ... ``z`` = 29, ``<pad>`` 0, ``<eos>`` 2; whitespace
and the empty string tokenize to nothing. The chat template renders ``"<role initial> <content> <eos> "``.
"""

from __future__ import annotations

import json
import logging

import datasets
import pytest
import torch

from hf_lightning import DataError, HFDataModule

IGNORE = -100
TEXTS = ["a b c", "", "d e", "   ", "f"]  # rows 1 and 3 tokenize to nothing, row 4 to a single token


def test_unknown_words_are_content_not_empty(word_tokenizer):
    """``<unk>`` is a special token of the tokenizer but stands for real text: such a row is kept."""
    dm = _dm(word_tokenizer, datasets.Dataset.from_dict({"text": ["Hello World", "a b"]}))
    assert dm.train_dataset["input_ids"] == [[1, 1], [4, 5]]


def _dm(tok, source, **kw):
    kw = {"validation_split": 0.0, "shuffle": False, "per_device_train_batch_size": 1, **kw}
    dm = HFDataModule(tok, path=source, **kw)
    dm.setup()
    return dm


class _Rows(torch.utils.data.Dataset):
    def __init__(self, rows):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


class _Stream(torch.utils.data.IterableDataset):
    def __init__(self, rows):
        self.rows = rows

    def __iter__(self):
        return iter(self.rows)


def test_text_rows_that_tokenize_to_nothing_are_dropped_and_counted(word_tokenizer, caplog):
    """Before: ``""`` and ``"   "`` were kept, so batch size 1 gave a ``(1, 0)`` batch (the model raises)."""
    with caplog.at_level(logging.WARNING, logger="hf_lightning"):
        dm = _dm(word_tokenizer, datasets.Dataset.from_dict({"text": TEXTS}))
    assert dm.train_dataset["input_ids"] == [[4, 5, 6], [7, 8]]
    assert [tuple(b["input_ids"].shape) for b in dm.train_dataloader()] == [(1, 3), (1, 2)]
    assert (
        "train: dropped 3 of 5 rows with no trained-on token: empty after tokenization: 2 (train rows 1, 3); "
        "a single token (nothing after it to predict): 1 (train row 4)"
    ) in caplog.text


def test_the_row_numbers_are_the_lines_of_a_json_lines_file(word_tokenizer, tmp_path, caplog):
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps({"text": t}) for t in TEXTS) + "\n")
    with caplog.at_level(logging.WARNING, logger="hf_lightning"):
        _dm(word_tokenizer, str(path))
    assert f"empty after tokenization: 2 (data.path={path} lines 2, 4)" in caplog.text


def test_a_torch_dataset_drops_and_counts_them_the_same_way(word_tokenizer, caplog):
    with caplog.at_level(logging.WARNING, logger="hf_lightning"):
        dm = _dm(word_tokenizer, _Rows([{"text": t} for t in TEXTS]))
    assert [dm.train_dataset[i]["input_ids"] for i in range(len(dm.train_dataset))] == [[4, 5, 6], [7, 8]]
    assert (
        "train: dropped 3 of 5 rows with no trained-on token: empty after tokenization: 2 (train rows 1, 3)"
        in (caplog.text)
    )


@pytest.mark.parametrize("kind", ["datasets", "torch"])
def test_a_stream_gives_them_zero_weight_and_no_empty_batch(word_tokenizer, caplog, kind):
    """A stream cannot drop a row (ranks would run different numbers of steps): an empty row becomes one pad
    token with label -100, so no ``(1, 0)`` batch reaches the model; it is counted like the map-style
    drops."""
    rows = [{"text": t} for t in TEXTS]
    source = datasets.Dataset.from_list(rows).to_iterable_dataset() if kind == "datasets" else _Stream(rows)
    with caplog.at_level(logging.WARNING, logger="hf_lightning"):
        dm = _dm(word_tokenizer, source, streaming=True)
        batches = list(dm.train_dataloader())
    assert [b["input_ids"].tolist() for b in batches] == [[[4, 5, 6]], [[0]], [[7, 8]], [[0]], [[9]]]
    assert [b["labels"].tolist() for b in batches] == [
        [[4, 5, 6]],
        [[IGNORE]],
        [[7, 8]],
        [[IGNORE]],
        [[IGNORE]],
    ]
    assert (
        "3 of 5 rows have no trained-on token, kept with zero weight so that ranks stay in step: "
        "empty after tokenization: 2 "
        "(train stream rows 1, 3); a single token (nothing after it to predict): 1 (train stream row 4)"
    ) in caplog.text


def test_bfd_packs_no_label_without_its_token(word_tokenizer):
    """Before: an empty document added one label and no token to its packed row."""
    dm = _dm(
        word_tokenizer,
        datasets.Dataset.from_dict({"text": ["a b c", "", "d e"]}),
        packing="bfd",
        max_length=16,
    )
    for row in dm.train_dataset:
        assert len(row["labels"]) == len(row["input_ids"]) == sum(row["seq_lengths"])
        assert 0 not in row["seq_lengths"]


def test_pretokenized_rows_with_empty_input_ids_are_dropped(word_tokenizer, caplog):
    ds = datasets.Dataset.from_dict({"input_ids": [[4, 5], [], [6, 7, 8]]})
    with caplog.at_level(logging.WARNING, logger="hf_lightning"):
        dm = _dm(word_tokenizer, ds)
    assert dm.train_dataset["input_ids"] == [[4, 5], [6, 7, 8]]
    assert (
        "dropped 1 of 3 rows with no trained-on token: empty after tokenization: 1 (train row 1)"
        in caplog.text
    )


def test_chat_rows_name_the_missing_assistant_turn(word_tokenizer, caplog):
    """Before: every such row was said to lose its labels "after truncation", even with no assistant turn at
    all."""
    rows = [
        {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]},
        {"messages": [{"role": "user", "content": "c"}]},
        {"messages": [{"role": "system", "content": "d"}, {"role": "user", "content": "e"}]},
        {"messages": [{"role": "user", "content": "f g h i j"}, {"role": "assistant", "content": "k"}]},
    ]
    with caplog.at_level(logging.WARNING, logger="hf_lightning"):
        dm = _dm(word_tokenizer, datasets.Dataset.from_list(rows), max_length=6)
    assert dm.train_dataset["input_ids"] == [[24, 4, 2, 4, 5, 2]]
    assert (
        "train: dropped 3 of 4 rows with no trained-on token: no assistant turn: 2 (train rows 1, 2); "
        "all labels -100 after truncation to data.max_length: 1 (train row 3)"
    ) in caplog.text


def test_prompt_completion_rows(word_tokenizer, caplog):
    """An empty completion still trains on the EOS appended to it (the model learns to stop: TRL appends the
    EOS too); a row whose prompt and completion are both empty has nothing and is dropped."""
    rows = [
        {"prompt": "a", "completion": " b"},
        {"prompt": "c", "completion": ""},
        {"prompt": "", "completion": ""},
    ]
    with caplog.at_level(logging.WARNING, logger="hf_lightning"):
        dm = _dm(word_tokenizer, datasets.Dataset.from_list(rows))
    assert dm.train_dataset["input_ids"] == [[4, 5, 2], [6, 2]]
    assert dm.train_dataset["labels"] == [[IGNORE, 5, 2], [IGNORE, 2]]
    assert (
        "dropped 1 of 3 rows with no trained-on token: empty after tokenization: 1 (train row 2)"
        in caplog.text
    )


def test_a_split_with_nothing_to_train_on_names_the_causes(word_tokenizer):
    with pytest.raises(DataError) as err:
        _dm(word_tokenizer, datasets.Dataset.from_dict({"text": ["", " ", "a"]}))
    assert str(err.value).endswith(
        "the train split is empty after tokenization: 3 rows were read and none has a trained-on token "
        "[empty after tokenization: 2 (train rows 0, 1); a single token (nothing after it to predict): 1 "
        "(train row 2)]: check which fields hold the targets"
    )


def test_a_split_of_chats_without_assistant_turns_says_what_is_missing(word_tokenizer):
    # the remedy follows the cause: raising data.max_length (what the line used to advise) changes nothing
    rows = [{"messages": [{"role": "user", "content": "c"}]}] * 2
    with pytest.raises(DataError) as err:
        _dm(word_tokenizer, datasets.Dataset.from_list(rows))
    assert str(err.value).endswith(
        "[no assistant turn: 2 (train rows 0, 1)]: the conversations need an assistant turn to train on"
    )


@pytest.mark.slow
def test_the_cli_trains_past_an_empty_text_row_with_batch_size_one(tmp_path):
    """Before: the empty row reached the model as a ``(1, 0)`` batch and the run died with a traceback (exit
    1)."""
    from tests.errors.support import run_train_cli

    data = tmp_path / "data.jsonl"
    texts = ["the quick brown fox", "", "jumps over the lazy dog", "   ", "and runs away"] * 2
    data.write_text("\n".join(json.dumps({"text": t}) for t in texts) + "\n")
    proc = run_train_cli(
        "+experiment=clm",
        f"data.path={data}",
        f"hydra.run.dir={tmp_path / 'run'}",
        "data.validation_split=0",
        "data.per_device_train_batch_size=1",
        "data.shuffle=false",
        "trainer.max_steps=6",
        "data.max_length=32",
        "model.config.hidden_size=32",
        "model.config.intermediate_size=64",
        "model.config.num_hidden_layers=1",
        "trainer.enable_progress_bar=false",
        "trainer.enable_model_summary=false",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = (tmp_path / "run" / "train.log").read_text()
    # the run's BPE reads "   " as one token: a row with nothing after its first token to predict
    assert (
        f"dropped 4 of 10 rows with no trained-on token: empty after tokenization: 2 (data.path={data} lines "
        f"2, 7); a single token (nothing after it to predict): 2 (data.path={data} lines 4, 9)"
    ) in log
