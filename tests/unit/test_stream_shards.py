"""Streams split by shards: a multi-file JSON Lines stream read by ranks x workers gives
each reader only its own files, every row exactly once per epoch, the same number of examples per reader
(masked copies at the tail), and a resume that continues where it stopped; too few or uneven shards keep the
split by rows, said in one line."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import datasets
import pytest

from hf_lightning import DataError, HFDataModule
from hf_lightning.data.streams import ShardedStream, ShardPlan, count_shard_rows, in_holdout

# rows per file: one file short, so a reader ends with a masked copy (no extra batch: the split by shards is
# taken)
FILE_ROWS = (4, 4, 4, 4, 4, 4, 4, 3)


def write_files(folder: Path, sizes=FILE_ROWS) -> list[str]:
    """One JSON Lines file per size; row ``{"file", "row", "input_ids"}``, distinct ``input_ids`` per row."""
    paths, k = [], 0
    for f, n in enumerate(sizes):
        path = folder / f"part{f}.jsonl"
        with open(path, "w") as fh:
            for r in range(n):
                k += 1
                fh.write(json.dumps({"file": f, "row": r, "input_ids": [4 + f, 4 + r, 4 + k % 20]}) + "\n")
        paths.append(str(path))
    return paths


def stream_of(paths) -> datasets.IterableDataset:
    return datasets.load_dataset("json", data_files=paths, streaming=True, split="train")


def real(rows):
    return [(r["file"], r["row"]) for r in rows if "labels" not in r]  # a masked copy carries labels all -100


@pytest.mark.parametrize(("world", "workers"), [(2, 2), (1, 2), (4, 2)])
@pytest.mark.parametrize("shuffle", [False, True])
def test_each_reader_reads_only_its_files_and_every_row_once(tmp_path, world, workers, shuffle):
    paths = write_files(tmp_path)
    readers = world * workers
    parts = []
    for rank in range(world):
        stream = ShardedStream(
            stream_of(paths), rank=rank, world_size=world, shuffle=shuffle, seed=3, buffer_size=4
        )
        stream.set_epoch(2)
        plan = stream.plan_readers(workers)
        assert plan == ShardPlan(FILE_ROWS, readers)
        for w in range(workers):
            parts.append(list(stream.read_shard(rank * workers + w, readers)))
    # by hand: reader r owns files r, r + S, ...; every reader yields as many as the largest share
    shares = [sum(FILE_ROWS[r::readers]) for r in range(readers)]
    assert [len(p) for p in parts] == [max(shares)] * readers
    for r, part in enumerate(parts):
        assert {f for f, _ in real(part)} == {f for f in range(len(FILE_ROWS)) if f % readers == r}
        assert len(real(part)) == shares[r]
    seen = [x for p in parts for x in real(p)]
    assert sorted(seen) == sorted((f, r) for f, n in enumerate(FILE_ROWS) for r in range(n))  # once each


def test_the_split_says_what_it_does_in_one_line(tmp_path, caplog):
    paths = write_files(tmp_path)
    (tmp_path / "uneven").mkdir()
    uneven = write_files(tmp_path / "uneven", sizes=(5, 3, 6, 2, 4, 7, 1, 4))
    with caplog.at_level(logging.INFO, logger="hf_lightning"):
        ShardedStream(stream_of(paths), rank=0, world_size=2).plan_readers(2)
        ShardedStream(stream_of(paths[:3]), rank=0, world_size=2).plan_readers(2)
        ShardedStream(stream_of(uneven), rank=0, world_size=2).plan_readers(2, batch_size=2)
        # one reader: nothing to say
        ShardedStream(stream_of(paths[:1]), rank=0, world_size=1).plan_readers(0)
    assert [r.getMessage() for r in caplog.records] == [
        "train stream: 8 shards over 4 readers (2 ranks x 2 DataLoader workers): each reader reads only its "
        "own shards, every row once per epoch (7 to 8 rows per reader; shorter readers end with 1 masked "
        "copies in all, so ranks stay in step)",
        "train stream: 3 shards for 4 readers (2 ranks x 2 DataLoader workers): every reader reads every row "
        "and keeps 1 in 4 (fewer shards than readers; split the source into at least 4 files to read each "
        "row once)",
        # readers own files {0, 4}, {1, 5}, {2, 6}, {3, 7}: 9, 10, 7, 6 rows; the split by rows: ceil(32 / 4)
        # = 8
        "train stream: 8 shards for 4 readers (2 ranks x 2 DataLoader workers): every reader reads every row "
        "and keeps 1 in 4 (uneven shards: split by shards the largest reader's 10 rows take 5 batches per "
        "epoch where the split by rows takes 4)",
    ]


def test_a_reader_without_rows_keeps_the_split_by_rows(tmp_path):
    paths = write_files(tmp_path, sizes=(3, 0, 2, 0))
    stream = ShardedStream(stream_of(paths), rank=0, world_size=2)
    assert stream.plan_readers(0) is None  # reader 1 owns the two empty files
    parts = [list(stream.read_shard(i, 2)) for i in range(2)]
    assert [len(p) for p in parts] == [3, 3] and sorted(x for p in parts for x in real(p)) == sorted(
        [(0, 0), (0, 1), (0, 2), (2, 0), (2, 1)]
    )


def _datamodule(tok, source, rank, workers, **kw):
    dm = HFDataModule(
        tok,
        path=source,
        format="tokenized",
        per_device_train_batch_size=2,
        num_workers=workers,
        model_input_names=["input_ids", "file", "row"],
        seed=5,
        **{"validation_split": 0.0, **kw},
    )
    dm.setup()
    dm._world = lambda: (2, rank)  # rank `rank` of 2, without a process group (the DDP test runs real ones)
    return dm


def _batch_rows(batch) -> list[tuple[int, int]]:
    kept = batch["labels"].ne(-100).any(dim=1)
    return list(zip(batch["file"][kept].tolist(), batch["row"][kept].tolist()))


def test_a_resume_continues_where_the_epoch_stopped(tmp_path, word_tokenizer):
    paths = write_files(tmp_path)
    for rank in range(2):
        loader = _datamodule(word_tokenizer, stream_of(paths), rank, 2).train_dataloader()
        whole = [_batch_rows(b) for b in loader]
        assert loader.dataset.plan is not None
        assert len(whole) == 8  # 2 workers x 8 rows (the largest reader's share) / batches of 2
        for stop in (1, 4, 7):
            resumed = _datamodule(word_tokenizer, stream_of(paths), rank, 2).train_dataloader()
            assert [_batch_rows(b) for b in resumed.iter_from(stop)] == whole[stop:]


def test_the_holdout_is_counted_through_its_filter(tmp_path):
    paths = write_files(tmp_path)

    def training_row(ex):
        return not in_holdout(ex, 0.3)

    by_hand = [
        sum(training_row(json.loads(line)) for line in Path(p).read_text().splitlines()) for p in paths
    ]
    assert 0 < sum(by_hand) < sum(FILE_ROWS)
    assert count_shard_rows(stream_of(paths), training_row) == tuple(by_hand)
    assert count_shard_rows(stream_of(paths)) == FILE_ROWS


def test_a_stream_with_a_holdout_covers_every_row_once(tmp_path, word_tokenizer):
    paths = write_files(tmp_path)
    train, validation, lengths = [], [], []
    for rank in range(2):
        dm = _datamodule(word_tokenizer, stream_of(paths), rank, 2, validation_split=0.3)
        loader = dm.train_dataloader()
        batches = [_batch_rows(b) for b in loader]
        lengths.append(len(batches))
        train += [x for b in batches for x in b]
        validation += [x for b in dm.val_dataloader() for x in _batch_rows(b)]  # split by rows over the ranks
    assert lengths[0] == lengths[1]
    assert len(train) == len(set(train)) and not set(train) & set(validation)
    assert sorted(train + validation) == sorted((f, r) for f, n in enumerate(FILE_ROWS) for r in range(n))


def test_a_file_that_changes_after_the_count_is_an_error(tmp_path):
    paths = write_files(tmp_path)
    stream = ShardedStream(stream_of(paths), rank=0, world_size=2)
    assert stream.plan_readers(2) is not None
    with open(paths[4], "a") as fh:  # reader 0 owns files 0 and 4
        fh.write(json.dumps({"file": 4, "row": 4, "input_ids": [8, 8, 8]}) + "\n")
    with pytest.raises(DataError) as err:
        list(stream.read_shard(0, 4))
    assert str(err.value) == (
        "the stream: reader 0 of 4 read 9 rows from its shards, but 8 were counted when the loader was "
        "built: the source changed while training read it"
    )
