"""data.rename_columns: a banking77 CSV (`text,category`) read by the classification format (`text,label`)."""

from __future__ import annotations

import pytest

from hf_lightning.data import HFDataModule
from hf_lightning.errors import DataError


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
    path = write_csv(tmp_path / "b77.csv", "text,label", ROWS)
    dm = HFDataModule(
        default_tokenizer, path=str(path), format="classification", rename_columns={"category": "label"}
    )
    with pytest.raises(DataError, match=r"data.rename_columns: \['category'\] not in data.path=.*b77.csv"):
        dm.setup("fit")
