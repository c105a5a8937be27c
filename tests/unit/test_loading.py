"""Sources: every file kind, save_to_disk folders, streams and torch datasets give the same tokenized rows."""

from __future__ import annotations

import json

import datasets
import pytest
import torch

from hf_lightning import DataError, HFDataModule

TEXTS = ["a b c", "d e", "f g h i", "j k"]
IDS = [[4, 5, 6], [7, 8], [9, 10, 11, 12], [13, 14]]


def _write(tmp_path, kind):
    rows = [{"text": t, "id": i} for i, t in enumerate(TEXTS)]
    path = tmp_path / f"data.{kind}"
    if kind == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif kind == "json":
        path.write_text(json.dumps(rows))
    elif kind == "csv":
        path.write_text("text,id\n" + "".join(f"{r['text']},{r['id']}\n" for r in rows))
    elif kind == "parquet":
        datasets.Dataset.from_list(rows).to_parquet(str(path))
    elif kind == "disk":
        datasets.Dataset.from_list(rows).save_to_disk(str(path))
    return path


def _rows(dm) -> list[list[int]]:
    out = []
    for batch in dm.train_dataloader():
        for ids, mask in zip(batch["input_ids"], batch["attention_mask"]):
            out.append(ids[mask.bool()].tolist())
    return out


@pytest.mark.parametrize("kind", ["jsonl", "json", "csv", "parquet", "disk"])
@pytest.mark.parametrize("streaming", [False, True])
def test_every_file_kind_map_style_and_streamed(word_tokenizer, tmp_path, kind, streaming):
    dm = HFDataModule(
        word_tokenizer,
        path=str(_write(tmp_path, kind)),
        validation_split=0.0,
        shuffle=False,
        streaming=streaming,
        per_device_train_batch_size=3,
    )
    dm.setup()
    assert isinstance(dm.train_dataset, datasets.IterableDataset) == streaming
    assert _rows(dm) == IDS


class TorchRows(torch.utils.data.Dataset):
    def __len__(self):
        return len(TEXTS)

    def __getitem__(self, i):
        return {"text": TEXTS[i]}


class TorchStream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter({"text": t} for t in TEXTS)


@pytest.mark.parametrize(
    "source", [TorchRows, TorchStream, "iterable"], ids=["torch_map", "torch_stream", "datasets_stream"]
)
def test_in_memory_sources(word_tokenizer, source):
    src = (
        datasets.Dataset.from_dict({"text": TEXTS}).to_iterable_dataset()
        if source == "iterable"
        else source()
    )
    dm = HFDataModule(
        word_tokenizer, path=src, validation_split=0.0, shuffle=False, per_device_train_batch_size=3
    )
    dm.setup()
    assert dm.data_format == "text"
    assert _rows(dm) == IDS


def test_torch_dataset_rows_without_targets_are_dropped_and_counted(word_tokenizer, caplog):
    import logging

    class Rows(torch.utils.data.Dataset):
        data = [{"prompt": "a b c", "completion": " d"}, {"prompt": "e", "completion": " f"}]

        def __len__(self):
            return 2

        def __getitem__(self, i):
            return self.data[i]

    with caplog.at_level(logging.WARNING):
        dm = HFDataModule(word_tokenizer, path=Rows(), validation_split=0.0, shuffle=False, max_length=3)
        dm.setup()
    assert len(dm.train_dataset) == 1 and dm.train_dataset[0]["input_ids"] == [8, 9, 2]
    assert "1 of 2 rows were longer than data.max_length" in caplog.text
    assert "dropped 1 of 2 rows with no trained-on token" in caplog.text


def test_tokenization_is_cached_by_datasets(word_tokenizer, tmp_path):
    path = _write(tmp_path, "jsonl")
    first = HFDataModule(word_tokenizer, path=str(path), validation_split=0.0)
    first.setup()
    second = HFDataModule(word_tokenizer, path=str(path), validation_split=0.0)
    second.setup()
    files = [f["filename"] for f in first.train_dataset.cache_files]
    assert files and files == [f["filename"] for f in second.train_dataset.cache_files]


def test_bad_sources_are_named(word_tokenizer, tmp_path):
    with pytest.raises(DataError, match="no such file or folder"):
        HFDataModule(word_tokenizer, path=str(tmp_path / "missing.jsonl")).setup()
    (tmp_path / "x.txt").write_text("hi")
    with pytest.raises(DataError, match=r"unsupported file type '.txt'"):
        HFDataModule(word_tokenizer, path=str(tmp_path / "x.txt")).setup()
    with pytest.raises(DataError, match="unsupported source of type int"):
        HFDataModule(word_tokenizer, path=3).setup()
