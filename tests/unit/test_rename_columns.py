"""data.rename_columns: a banking77 CSV (`text,category`) read by the classification format (`text,label`)."""

from __future__ import annotations

import pytest

from hf_lightning.core.errors import DataError
from hf_lightning.data import HFDataModule


def write_csv(path, header, rows):
    path.write_text(header + "\n" + "".join(f"{t},{c}\n" for t, c in rows))
    return path


ROWS = [
    ("my card has not arrived", "card_arrival"),
    ("top up failed", "top_up_failed"),
    ("where is my card", "card_arrival"),
    ("exchange rate today", "exchange_rate"),
]


def test_category_becomes_label(tmp_path, default_tokenizer):
    path = write_csv(tmp_path / "b77.csv", "text,category", ROWS)
    dm = HFDataModule(
        default_tokenizer,
        path=str(path),
        validation_path=str(path),
        format="classification",
        rename_columns={"category": "label"},
    )
    dm.setup("fit")
    assert sorted(dm.id2label.values()) == ["card_arrival", "exchange_rate", "top_up_failed"]
    label2id = {v: k for k, v in dm.id2label.items()}
    assert [label2id[c] for _, c in ROWS] == list(dm.train_dataset["label"])


def test_a_missing_source_column_is_named(tmp_path, default_tokenizer):
    # the file has the format's own name already: the fix drops the rename
    path = write_csv(tmp_path / "b77.csv", "text,label", ROWS)
    dm = HFDataModule(
        default_tokenizer, path=str(path), format="classification", rename_columns={"category": "label"}
    )
    with pytest.raises(DataError) as err:
        dm.setup("fit")
    assert str(err.value) == (
        f"data.rename_columns renames 'category' to 'label', but data.path={path} has no 'category' column "
        "(its columns: ['text', 'label']; the classification format reads 'label'): drop the rename (the "
        "file has 'label' already): '~data.rename_columns.category'"
    )


def test_a_missing_source_column_names_the_column_to_rename_instead(tmp_path, default_tokenizer):
    # before: "data.rename_columns: ['category'] not in data.path=... (columns: [...])", no fix
    path = write_csv(
        tmp_path / "intents.csv", "id,text,intent", [(f"{i},{t}", c) for i, (t, c) in enumerate(ROWS)]
    )
    dm = HFDataModule(
        default_tokenizer, path=str(path), format="classification", rename_columns={"category": "label"}
    )
    with pytest.raises(DataError) as err:
        dm.setup("fit")
    assert str(err.value) == (
        f"data.rename_columns renames 'category' to 'label', but data.path={path} has no 'category' column "
        "(its columns: ['id', 'text', 'intent']; the classification format reads 'label'): drop the rename "
        "and rename the file's own column, e.g. '~data.rename_columns.category' "
        "data.rename_columns.intent=label"
    )


def test_a_classification_file_without_a_label_column_names_the_rename(tmp_path, default_tokenizer):
    # before: datasets' "Column name ['label'] not in the dataset" from reading the labels, a traceback
    path = write_csv(tmp_path / "intents.csv", "text,intent", ROWS)
    dm = HFDataModule(default_tokenizer, path=str(path), format="classification")
    with pytest.raises(DataError) as err:
        dm.setup("fit")
    assert str(err.value) == (
        f"data.path={path}: format 'classification' needs a 'label' field; the train split has ['text', "
        "'intent']; rename the file's columns to the format's, e.g. +data.rename_columns='{intent: label}'"
    )
    renamed = HFDataModule(
        default_tokenizer,
        path=str(path),
        format="classification",
        rename_columns={"intent": "label"},
        validation_split=0,
    )
    renamed.setup("fit")  # the fix the message names
    assert sorted(renamed.id2label.values()) == ["card_arrival", "exchange_rate", "top_up_failed"]
