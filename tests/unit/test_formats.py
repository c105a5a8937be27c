"""Formats: detection from the schema, and the exact ids and labels of each format (word-level vocab: a=4,
b=5...)."""

from __future__ import annotations

import json
import logging

import datasets
import pytest

from hf_lightning import DataError, HFDataModule
from hf_lightning.data.sources import detect_format
from tests.data_support import shared_data

IGNORE = -100


@pytest.mark.parametrize(
    "columns,expected",
    [
        (["input_ids", "text"], "tokenized"),
        (["messages", "text"], "messages"),
        (["id", "conversations"], "conversations"),
        (["prompt", "completion", "text"], "prompt_completion"),
        (["source", "target"], "seq2seq"),
        (["text", "label"], "classification"),
        (["text", "id"], "text"),
    ],
)
def test_format_is_detected_from_the_column_names(columns, expected):
    assert detect_format(columns) == expected


def test_detection_reads_the_schema_not_the_first_row(tmp_path):
    # the first row has no 'text' value; the schema still has the column
    ds = datasets.Dataset.from_list([{"text": None, "id": 1}, {"text": "a b", "id": 2}])
    assert detect_format(ds.column_names) == "text"


def test_unknown_layout_names_the_columns_and_the_layouts():
    with pytest.raises(
        DataError, match=r"columns \['question', 'answer'\].*prompt_completion: prompt\+completion"
    ):
        detect_format(["question", "answer"], "gsm8k.jsonl")


def _setup(tok, rows, **kw):
    dm = HFDataModule(tok, path=datasets.Dataset.from_list(rows), validation_split=0.0, shuffle=False, **kw)
    dm.setup()
    return dm


def test_prompt_completion_trains_on_the_completion_and_the_appended_eos(word_tokenizer):
    dm = _setup(
        word_tokenizer, [{"prompt": "a b", "completion": " c d"}, {"prompt": "e", "completion": " f <eos>"}]
    )
    assert dm.data_format == "prompt_completion"
    rows = dm.train_dataset.to_list()
    assert rows[0]["input_ids"] == [4, 5, 6, 7, 2]  # eos appended
    assert rows[0]["labels"] == [IGNORE, IGNORE, 6, 7, 2]
    assert rows[1]["input_ids"] == [8, 9, 2]  # already ends with eos: not doubled
    assert rows[1]["labels"] == [IGNORE, 9, 2]
    batch = next(iter(dm.train_dataloader()))
    assert batch["labels"].tolist() == [[IGNORE, IGNORE, 6, 7, 2], [IGNORE, 9, 2, IGNORE, IGNORE]]


def test_prompt_longer_than_max_length_is_dropped_and_counted(word_tokenizer, caplog):
    rows = [{"prompt": "a b c d", "completion": " e"}, {"prompt": "a", "completion": " b"}]
    with caplog.at_level(logging.WARNING):
        dm = _setup(word_tokenizer, rows, max_length=3)
    # pruned to the tokenizer's inputs + labels (no model attached)
    assert dm.train_dataset.to_list() == [
        {"input_ids": [4, 5, 2], "attention_mask": [1, 1, 1], "labels": [IGNORE, 5, 2]}
    ]
    assert "1 of 2 rows were longer than data.max_length=3 and were truncated" in caplog.text
    assert "dropped 1 of 2 rows with no trained-on token" in caplog.text


def test_sharegpt_conversations_map_human_gpt_to_user_assistant(word_tokenizer):
    conv = [{"from": "human", "value": "b c"}, {"from": "gpt", "value": "d e"}]
    dm = _setup(word_tokenizer, [{"id": "x", "conversations": conv}])
    assert dm.data_format == "conversations"
    row = dm.train_dataset.to_list()[0]
    # rendered "u b c <eos> a d e <eos> ": the reply and its eos are the only targets
    assert row["input_ids"] == [24, 5, 6, 2, 4, 7, 8, 2]
    assert row["labels"] == [IGNORE] * 5 + [7, 8, 2]
    messages = [{"role": "user", "content": "b c"}, {"role": "assistant", "content": "d e"}]
    assert _setup(word_tokenizer, [{"messages": messages}]).train_dataset[0]["labels"] == row["labels"]


def test_unknown_sharegpt_speaker_is_named(word_tokenizer):
    with pytest.raises(DataError, match="unknown ShareGPT speaker 'robot'"):
        _setup(word_tokenizer, [{"conversations": [{"from": "robot", "value": "b"}]}])


def test_fastchat_dummy_file_gives_assistant_only_labels(gpt2_tokenizer):
    import copy

    tok = copy.deepcopy(gpt2_tokenizer)
    tok.chat_template = (
        "{%- for m in messages %}{{- m['role'] + '\\n' + m['content'] + '<|endoftext|>' }}{%- endfor %}"
        "{%- if add_generation_prompt %}{{- 'assistant\\n' }}{%- endif %}"
    )
    path = shared_data() / "fastchat-dummy" / "dummy_conversation.json"
    first = json.loads(path.read_text())[0]["conversations"]
    dm = HFDataModule(tok, path=str(path), validation_split=0.0, shuffle=False)
    dm.setup()
    assert dm.data_format == "conversations" and len(dm.train_dataset) == 500
    row = dm.train_dataset[0]
    trained = [t for t in row["labels"] if t != IGNORE]
    replies = [t["value"] for t in first if t["from"] == "gpt"]
    assert tok.decode(trained) == "".join(r + "<|endoftext|>" for r in replies)


def test_classification_keeps_label_names_and_maps_strings_sorted(word_tokenizer):
    rows = [
        {"text": "a b", "label": "spam"},
        {"text": "c", "label": "ham"},
        {"text": "d e f", "label": "spam"},
    ]
    dm = _setup(word_tokenizer, rows)
    assert dm.data_format == "classification"
    assert dm.id2label == {0: "ham", 1: "spam"}
    batch = next(iter(dm.train_dataloader()))
    assert batch["labels"].tolist() == [1, 0, 1]
    assert batch["input_ids"].tolist() == [[4, 5, 0], [6, 0, 0], [7, 8, 9]]
    assert batch["attention_mask"].tolist() == [[1, 1, 0], [1, 0, 0], [1, 1, 1]]


def test_classification_class_label_names_come_from_the_features(word_tokenizer):
    features = datasets.Features(
        {"text": datasets.Value("string"), "label": datasets.ClassLabel(names=["neg", "pos"])}
    )
    ds = datasets.Dataset.from_dict({"text": ["a", "b"], "label": [1, 0]}, features=features)
    dm = HFDataModule(word_tokenizer, path=ds, validation_split=0.0, shuffle=False)
    dm.setup()
    assert dm.id2label == {0: "neg", 1: "pos"}
    assert next(iter(dm.train_dataloader()))["labels"].tolist() == [1, 0]


def test_banking77_validation_labels_use_the_training_mapping(gpt2_tokenizer):
    folder = shared_data() / "banking77"
    train = datasets.load_dataset("csv", data_files=str(folder / "train.csv"), split="train").select(
        range(200)
    )
    test = datasets.load_dataset("csv", data_files=str(folder / "test.csv"), split="train")
    names = sorted(set(train["category"]))
    test = test.filter(lambda c: c in names, input_columns="category").select(range(50))
    dm = HFDataModule(
        gpt2_tokenizer,
        path=train.rename_column("category", "label"),
        validation_path=test.rename_column("category", "label"),
        shuffle=False,
    )
    dm.setup()
    assert [dm.id2label[i] for i in range(len(names))] == names
    assert dm.val_dataset["label"] == [names.index(c) for c in test["category"]]


def test_seq2seq_targets_are_labels_and_source_is_the_input(word_tokenizer):
    dm = _setup(
        word_tokenizer,
        [{"source": "a b c", "target": "d"}, {"source": "e", "target": "f g"}],
        format="seq2seq",
    )
    assert dm.train_dataset["input_ids"] == [[4, 5, 6], [8]]
    assert dm.train_dataset["labels"] == [[7], [9, 10]]
    batch = next(iter(dm.train_dataloader()))
    assert batch["labels"].tolist() == [[7, IGNORE], [9, 10]]


def test_explicit_format_overrides_detection_and_names_a_missing_field(word_tokenizer):
    rows = [{"text": "a b", "prompt": "c", "completion": " d"}]
    assert _setup(word_tokenizer, rows, format="text").train_dataset["input_ids"] == [[4, 5]]
    with pytest.raises(DataError, match="format 'seq2seq' needs the fields 'source', 'target'"):
        _setup(word_tokenizer, rows, format="seq2seq")
