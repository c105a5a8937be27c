"""A row too large to read or tokenize (``data.max_row_bytes``), a hold-out that leaves nothing to train on,
and the ``datasets`` reader's own ERROR lines before our message.

The large cases use a small ``data.max_row_bytes`` so that the files stay small; the line scan is checked
against ``bytes.split`` on random files and chunk sizes, the row sizes against Python's ``len(s.encode())``.
"""

from __future__ import annotations

import json
import logging
import random

import datasets
import pytest
import torch

from hf_lightning import DataError, HFDataModule
from tests.errors.support import TEXT_ROWS, write_jsonl


def setup_dm(tokenizer, path, **kwargs):
    dm = HFDataModule(tokenizer=tokenizer, path=path, **{"validation_split": 0.0, **kwargs})
    dm.setup("fit")
    return dm


# ------------------------------------------------------------------------------------------- long rows
def test_the_line_scan_finds_what_splitting_the_file_finds(tmp_path, monkeypatch):
    from hf_lightning.data import sources as row_size

    rng = random.Random(0)
    path = tmp_path / "lines.bin"
    for _ in range(400):
        lines = [b"x" * rng.choice([0, 1, 2, 5, 8, 13, 40]) for _ in range(rng.randint(0, 12))]
        path.write_bytes(b"\n".join(lines) + (b"\n" if rng.random() < 0.5 else b""))
        monkeypatch.setattr(row_size, "CHUNK", rng.randint(1, 30))
        limit = rng.randint(0, 30)
        expected = next(
            (
                (i + 1, len(line))
                for i, line in enumerate(path.read_bytes().split(b"\n"))
                if len(line) > limit
            ),
            None,
        )
        assert row_size.first_long_line(str(path), limit) == expected


def test_row_text_bytes_are_what_python_counts():
    # every string of a row, chat contents nested in lists of structs included; nulls count 0; the table is
    # read in record batches (slices whose list offsets point into the whole child array)
    import pyarrow as pa

    from hf_lightning.data.sources import _text_bytes

    rng = random.Random(0)
    rows = []
    for i in range(2000):
        turns = [
            {
                "role": rng.choice(["user", "assistant"]),
                "content": None if rng.random() < 0.1 else "é" * rng.randint(0, 5),
            }
            for _ in range(rng.randint(0, 3))
        ]
        rows.append(
            {"text": "x" * rng.randint(0, 9), "messages": turns if rng.random() > 0.1 else None, "id": i}
        )

    def by_hand(row):
        turns = row["messages"] or []
        return len(row["text"].encode()) + sum(
            len(t["role"].encode()) + len((t["content"] or "").encode()) for t in turns
        )

    for batch in pa.Table.from_pylist(rows).to_batches(max_chunksize=257):
        assert list(sum(_text_bytes(c) for c in batch.columns)) == [by_hand(r) for r in batch.to_pylist()]


def test_a_long_json_line_is_refused_before_datasets_reads_it(word_tokenizer, tmp_path, monkeypatch):
    # before: a 200 MB line was read and tokenized whole until the kernel killed the process
    rows = [*TEXT_ROWS[:10], {"text": "a b " * 2_000}, *TEXT_ROWS[10:20]]
    path = write_jsonl(tmp_path / "long.jsonl", rows)
    size = len(json.dumps(rows[10]).encode())
    read = []
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: read.append(a) or pytest.fail("read"))
    with pytest.raises(DataError) as err:
        setup_dm(word_tokenizer, path, max_row_bytes=4096)
    assert str(err.value) == (
        f"data.path={path}: line 11 is {size:,} bytes (7.8 KiB), longer than data.max_row_bytes=4096 "
        "(4.0 KiB) allows: a row is read and tokenized whole, so one this size takes many times its size in "
        "memory. Split the document into rows below that size, or raise data.max_row_bytes (null: no bound) "
        "on a machine with the memory for it"
    )
    assert read == []


def test_a_long_csv_line_is_refused_and_null_lifts_the_bound(word_tokenizer, tmp_path):
    path = tmp_path / "long.csv"
    path.write_text("text\n" + "a b\n" * 5 + "c d " * 300 + "\n" + "a b\n")
    with pytest.raises(DataError, match=r"^data.path=.*long.csv: line 7 is 1,200 bytes \(1.2 KiB\), longer "):
        setup_dm(word_tokenizer, path, max_row_bytes=1000)
    assert len(setup_dm(word_tokenizer, path, max_row_bytes=None).train_dataset) == 7


def test_a_parquet_row_with_too_much_text_is_refused(word_tokenizer, tmp_path):
    texts = ["a b"] * 6 + ["é " * 400] + ["c d"]
    chats = [[{"role": "user", "content": t}, {"role": "assistant", "content": "b"}] for t in texts]
    path = tmp_path / "chats.parquet"
    datasets.Dataset.from_dict({"messages": chats}).to_parquet(str(path))
    by_hand = sum(len(m["content"].encode()) + len(m["role"].encode()) for m in chats[6])
    with pytest.raises(DataError) as err:
        setup_dm(word_tokenizer, path, max_row_bytes=1000)
    assert str(err.value).startswith(
        f"data.path={path} row 6 of the file: the row holds {by_hand:,} bytes (1.2 KiB) of text, longer than "
        "data.max_row_bytes=1000 (1000 bytes) allows"
    )


def test_an_in_memory_row_outside_the_selection_is_not_judged(word_tokenizer):
    ds = datasets.Dataset.from_dict({"text": ["a b", "c " * 600, "d e", "a c"]})
    with pytest.raises(DataError, match=r"^data.path=<in-memory dataset> row 1: the row holds 1,200 bytes"):
        setup_dm(word_tokenizer, ds, max_row_bytes=1000)
    assert len(setup_dm(word_tokenizer, ds.select([0, 2, 3]), max_row_bytes=1000).train_dataset) == 3


def test_a_saved_folder_read_as_a_stream_is_judged_before_it_streams(word_tokenizer, tmp_path):
    datasets.Dataset.from_dict({"text": ["a b", "d e", "c " * 600]}).save_to_disk(str(tmp_path / "saved"))
    with pytest.raises(DataError, match=r"^data.path=.*saved row 2: the row holds 1,200 bytes \(1.2 KiB\)"):
        HFDataModule(word_tokenizer, path=tmp_path / "saved", streaming=True, max_row_bytes=1000).setup("fit")


def test_the_limit_is_a_data_key_of_the_schema(compose_cfg, tmp_path):
    from hf_lightning.config.build import build
    from hf_lightning.core.errors import ConfigError

    path = write_jsonl(tmp_path / "long.jsonl", [*TEXT_ROWS[:20], {"text": "a b " * 400}])
    run = build(compose_cfg("+experiment=clm", f"data.path={path}", "data.max_row_bytes=1024"), "train")
    with pytest.raises(DataError, match="line 21 is 1,612 bytes"):
        run.datamodule.setup("fit")
    with pytest.raises(ConfigError, match="data.max_row_bytes=0"):
        build(compose_cfg("+experiment=clm", f"data.path={path}", "data.max_row_bytes=0"), "train")


# ------------------------------------------------------------------------------------------ hold-outs
def test_one_row_cannot_hold_out_validation_and_says_what_to_set(word_tokenizer, tmp_path):
    path = write_jsonl(tmp_path / "one.jsonl", TEXT_ROWS[:1])
    with pytest.raises(DataError) as err:
        setup_dm(word_tokenizer, path, validation_split=0.05)
    assert str(err.value) == (
        f"data.path={path}: 1 row, too few to hold out a validation split: data.validation_split=0.05 holds "
        "out 1 (at least one row) and leaves none to train on. Set data.validation_split=0 to train on every "
        "row without validation, or give the validation rows in their own file with "
        "data.validation_path=FILE"
    )
    assert len(setup_dm(word_tokenizer, path, validation_split=0).train_dataset) == 1  # the named fix


@pytest.mark.parametrize("kind", ["datasets", "torch"])
def test_a_hold_out_of_every_row_is_refused_the_same_way(word_tokenizer, kind):
    # before: datasets' "the resulting train set will be empty" ValueError; a torch dataset trained on nothing
    rows = TEXT_ROWS[:3]
    source = datasets.Dataset.from_list(rows) if kind == "datasets" else ListDataset(rows)
    # Dataset.train_test_split holds out ceil(0.9 * 3) = 3 rows; a torch dataset max(1, round(0.9 * 3)) = 3
    with pytest.raises(DataError) as err:
        setup_dm(word_tokenizer, source, validation_split=0.9)
    assert str(err.value).startswith(
        "data.path=<in-memory dataset>: 3 rows, too few to hold out a validation split: "
        "data.validation_split=0.9 holds out 3 (at least one row) and leaves none to train on."
    )
    if kind == "datasets":
        with pytest.raises(ValueError, match="train set will be empty"):  # the oracle agrees on the count
            source.train_test_split(test_size=0.9, seed=0)


class ListDataset(torch.utils.data.Dataset):
    def __init__(self, rows):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


# ------------------------------------------------------------------------------ the reader's own lines
def test_a_broken_json_line_prints_no_datasets_error_before_ours(word_tokenizer, tmp_path, caplog, capfd):
    # before: datasets' json reader printed "Failed to load JSON from file ... ArrowInvalid ... in row 56"
    # twice (its own handler and the root logger's) before the one line naming line 57
    path = write_jsonl(tmp_path / "broken.jsonl", TEXT_ROWS, raw={56: '{"text": "a b'})
    with caplog.at_level(logging.ERROR), pytest.raises(DataError, match="line 57 is not a JSON object"):
        setup_dm(word_tokenizer, path)
    assert not [r for r in caplog.records if r.name.startswith("datasets")]
    assert "Failed to load JSON" not in capfd.readouterr().err
