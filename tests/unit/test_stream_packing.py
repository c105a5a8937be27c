"""Packing a stream as it is read (``data.packing`` with ``data.streaming=true``), on real ``datasets``
streams of JSON Lines files: the rows are map-style packing's rows (``bfd`` per buffer of
``data.pack_buffer`` documents, ``wrapped`` over the whole stream), every document is in one row once per
epoch across ranks x workers, every reader yields the same number of rows, a resume continues with the rows
not yet read, and the loss over the packed rows is the per-token loss of the documents one by one."""

from __future__ import annotations

import json
import logging
import random
from collections import Counter

import datasets
import pytest
import torch

from hf_lightning import HFDataModule
from hf_lightning.data.packing import (
    PACK_BUFFER,
    StreamPacker,
    StreamPacking,
    best_fit_decreasing,
    pack_wrapped,
)
from tests.data_support import LETTERS, make_word_tokenizer, packed_documents, tiny_llama

EOS = 2  # the word tokenizer's <eos>; packed text documents end with it
N_DOCS = 37


def texts(n: int = N_DOCS, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(LETTERS) for _ in range(rng.randint(1, 9))) for _ in range(n)]


def token_ids(text: str) -> list[int]:
    """By hand: ``a`` is 4, ..., ``z`` 29, then the EOS packing adds."""
    return [ord(w) - ord("a") + 4 for w in text.split()] + [EOS]


def write_jsonl(folder, rows, files: int = 1) -> list[str]:
    paths = []
    for f in range(files):
        path = folder / f"part{f}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows[f::files]))
        paths.append(str(path))
    return paths


def stream_of(paths) -> datasets.IterableDataset:
    return datasets.load_dataset("json", data_files=paths, streaming=True, split="train")


def train_stream(source, rank=0, world=1, workers=0, **kw):
    """The training ``ShardedStream`` of a DataModule as rank ``rank`` of ``world`` builds it (no process
    group: the DDP test runs real ones)."""
    dm = HFDataModule(
        make_word_tokenizer(),
        path=source,
        format="text",
        model_input_names=["input_ids", "position_ids"],
        validation_split=0.0,
        num_workers=workers,
        seed=5,
        **{"packing": "bfd", "max_length": 12, "shuffle": False, "per_device_train_batch_size": 2, **kw},
    )
    dm.setup()
    dm._world = lambda: (world, rank)
    return dm, dm.train_dataloader()


def is_masked(row) -> bool:
    return all(v == -100 for v in row["labels"])


def read_all(source, world, workers, epoch=0, **kw):
    """Every reader's rows: ``[[rows of reader 0], ...]`` for ``world`` ranks x ``workers`` workers."""
    readers = world * max(workers, 1)
    parts = []
    for rank in range(world):
        stream = train_stream(source, rank, world, workers, **kw)[1].dataset
        stream.set_epoch(epoch)
        for w in range(max(workers, 1)):
            parts.append(list(stream.read_shard(rank * max(workers, 1) + w, readers)))
    return parts


# ------------------------------------------------------------------------------------------- the rows
def test_bfd_rows_are_best_fit_decreasing_of_each_buffer(tmp_path):
    rows_in = texts()
    paths = write_jsonl(tmp_path, [{"text": t, "id": i} for i, t in enumerate(rows_in)])
    [rows] = read_all(stream_of(paths), 1, 0, pack_buffer=10)
    docs = [token_ids(t) for t in rows_in]
    expected = []
    for k in range(0, len(docs), 10):  # the buffers, by hand: documents 0-9, 10-19, ...
        buffer = docs[k : k + 10]
        expected += [[buffer[i] for i in b] for b in best_fit_decreasing([len(d) for d in buffer], 12)]
    assert [packed_documents(r) for r in rows] == expected  # row for row, documents in placement order
    for row, docs_of_row in zip(rows, expected):
        assert row["input_ids"] == [t for d in docs_of_row for t in d]
        assert row["labels"] == [t if i else -100 for d in docs_of_row for i, t in enumerate(d)]
        assert row["seq_lengths"] == [len(d) for d in docs_of_row]
        assert len(row["input_ids"]) <= 12
    assert Counter(map(tuple, (d for r in rows for d in packed_documents(r)))) == Counter(map(tuple, docs))


@pytest.mark.parametrize("strategy", ["bfd", "wrapped"])
def test_a_stream_packs_into_map_style_packing_rows(tmp_path, strategy):
    """``bfd`` with one buffer of the whole stream, and ``wrapped`` whatever the buffer (its short rows are
    carried over), give the rows of the same file packed map-style."""
    paths = write_jsonl(tmp_path, [{"text": t} for t in texts()])
    map_style = HFDataModule(
        make_word_tokenizer(),
        path=paths[0],
        model_input_names=["input_ids", "position_ids"],
        validation_split=0.0,
        packing=strategy,
        max_length=12,
    )
    map_style.setup()
    expected = map_style.train_dataset.to_list()
    buffer = PACK_BUFFER if strategy == "bfd" else 5
    [rows] = read_all(stream_of(paths), 1, 0, packing=strategy, pack_buffer=buffer)
    assert rows == expected


def test_wrapped_rows_do_not_depend_on_the_buffer():
    rng = random.Random(1)
    docs = [{"input_ids": [rng.randrange(4, 30) for _ in range(rng.randint(0, 15))]} for _ in range(50)]
    whole = pack_wrapped(datasets.Dataset.from_list(docs), 8).to_list()
    for buffer in (1, 3, 7, 50):
        packer = StreamPacker(StreamPacking("wrapped", 8, buffer))
        assert list(packer.pack(docs)) == whole
        # by hand: documents that continue from one row into the next
        starts, total = [], 0
        for d in docs:
            starts.append(total)
            total += len(d["input_ids"])
        across = sum(
            1 for s, d in zip(starts, docs) if d["input_ids"] and s // 8 != (s + len(d["input_ids"]) - 1) // 8
        )
        counts = (packer.documents, packer.rows, packer.tokens, packer.across)
        assert counts == (50, len(whole), total, across)


# -------------------------------------------------------------------------------- ranks x workers
@pytest.mark.parametrize("strategy", ["bfd", "wrapped"])
@pytest.mark.parametrize("shuffle", [False, True])
def test_every_document_once_across_two_ranks_and_two_workers(tmp_path, strategy, shuffle):
    rows_in = texts(41)
    # 8 files: enough shards for 4 readers, but packing splits packed rows, not shards
    paths = write_jsonl(tmp_path, [{"text": t} for t in rows_in], files=8)
    kw = dict(packing=strategy, pack_buffer=9, shuffle=shuffle)
    parts = read_all(stream_of(paths), 2, 2, epoch=1, **kw)
    [whole] = read_all(stream_of(paths), 1, 0, epoch=1, **kw)  # one reader: the whole packed stream
    assert len({len(p) for p in parts}) == 1  # the same number of rows per reader: no rank waits
    assert len(parts[0]) == -(-len(whole) // 4)
    for r, part in enumerate(parts):  # reader r keeps packed rows r, r + 4, ...; then masked copies
        real = [row for row in part if not is_masked(row)]
        assert real == whole[r::4]
        assert len(part) - len(real) <= 1
    if strategy == "bfd":
        seen = Counter(
            tuple(d) for p in parts for row in p if not is_masked(row) for d in packed_documents(row)
        )
        assert seen == Counter(tuple(token_ids(t)) for t in rows_in)  # each document exactly once
    else:
        tokens = [t for p in parts for row in p if not is_masked(row) for t in row["input_ids"]]
        assert Counter(tokens) == Counter(t for text in rows_in for t in token_ids(text))


def test_a_shuffled_packed_stream_repeats_its_epoch_and_changes_between_epochs(tmp_path):
    paths = write_jsonl(tmp_path, [{"text": t} for t in texts(60)], files=2)
    kw = dict(shuffle=True, pack_buffer=16, shuffle_buffer_size=8)
    [a] = read_all(stream_of(paths), 1, 0, epoch=1, **kw)
    [b] = read_all(stream_of(paths), 1, 0, epoch=1, **kw)
    [c] = read_all(stream_of(paths), 1, 0, epoch=2, **kw)
    assert a == b and a != c
    docs = Counter(tuple(token_ids(t)) for t in texts(60))
    for rows in (a, c):
        assert Counter(tuple(d) for row in rows for d in packed_documents(row)) == docs


def test_a_resume_continues_with_the_packed_rows_not_yet_read(tmp_path):
    """Two DataLoader worker processes on rank 1 of 2: skipping the first k batches (what a resume does)
    leaves exactly the rest of the epoch's batches."""
    paths = write_jsonl(tmp_path, [{"text": t} for t in texts(60)], files=3)

    def batches(loader, start=0):
        return [{k: v.tolist() for k, v in b.items()} for b in loader.iter_from(start)]

    kw = dict(shuffle=True, pack_buffer=16, workers=2)
    whole = batches(train_stream(stream_of(paths), 1, 2, **kw)[1])
    assert len(whole) >= 4
    for stop in (1, 3):
        resumed = train_stream(stream_of(paths), 1, 2, **kw)[1]
        assert batches(resumed, stop) == whole[stop:]


# -------------------------------------------------------------------------------------- the loss
def test_the_loss_over_packed_rows_is_the_per_token_loss_of_the_documents(tmp_path):
    rows_in = texts(23, seed=3)
    paths = write_jsonl(tmp_path, [{"text": t} for t in rows_in])
    model = tiny_llama(vocab_size=32)
    _, loader = train_stream(stream_of(paths), pack_buffer=8, per_device_train_batch_size=3)
    total, count = torch.zeros((), dtype=torch.float64), 0
    with torch.no_grad():
        for batch in loader:
            assert set(batch) == {"input_ids", "labels", "position_ids"}
            logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits
            labels = batch["labels"][:, 1:]
            loss = torch.nn.functional.cross_entropy(
                logits[:, :-1].reshape(-1, 32), labels.reshape(-1), ignore_index=-100, reduction="sum"
            )
            total += loss.double()
            count += int(labels.ne(-100).sum())
        # unpacked: each document alone, every token after the first a target
        ref, ref_count = torch.zeros((), dtype=torch.float64), 0
        for text in rows_in:
            ids = torch.tensor([token_ids(text)])
            logits = model(input_ids=ids).logits
            ref += torch.nn.functional.cross_entropy(logits[0, :-1], ids[0, 1:], reduction="sum").double()
            ref_count += ids.shape[1] - 1
    assert count == ref_count
    torch.testing.assert_close(total / count, ref / ref_count, rtol=1e-5, atol=0)


# ----------------------------------------------------------------------------------- what it says
def test_it_says_what_each_reader_does_and_counts_what_it_drops(tmp_path, caplog):
    rows_in = texts(20) + [""]  # an empty text: no target, in no row (counted, as map-style packing)
    paths = write_jsonl(tmp_path, [{"text": t, "id": i} for i, t in enumerate(rows_in)], files=8)
    with caplog.at_level(logging.INFO, logger="hf_lightning"):
        parts = read_all(stream_of(paths), 2, 2, pack_buffer=8)
    said = [r.getMessage() for r in caplog.records]
    line = (
        "train stream packed as it is read (data.packing=bfd, bfd within buffers of 8 documents): each of "
        "the 4 readers (2 ranks x 2 DataLoader workers) reads and tokenizes every row and packs the whole "
        "stream the same way, then keeps packed row j when j mod 4 is its index (every document in one row "
        "once per epoch; readers end with masked copies to the same count); not split by its 8 shards: each "
        "reader packing its own would make a number of rows known only at its end, different per reader"
    )
    assert said.count(line) == 2  # once per rank, when its loader is built
    rows = sum(len([r for r in p if not is_masked(r)]) for p in parts)
    tokens = sum(len(token_ids(t)) for t in rows_in[:-1])
    efficiency = (
        f"train stream: packed 20 documents into {rows} rows of 12 (bfd within buffers of 8 documents): "
        f"efficiency {100.0 * tokens / (rows * 12):.1f}% ({tokens} real tokens / {rows * 12} slots)"
    )
    assert said.count(efficiency) == 1  # reader 0 speaks for the whole stream
    dropped = [s for s in said if "with no trained-on token" in s]
    assert len(dropped) == 1
    assert dropped[0].startswith("train stream: dropped 1 of 21 rows with no trained-on token: empty")
    left_out = [s for s in said if "packing leaves the columns" in s]
    assert left_out == [
        "train: packing leaves the columns ['id'] out (they cannot follow documents into shared rows)"
    ]


def test_a_packed_stream_has_no_known_length(tmp_path):
    paths = write_jsonl(tmp_path, [{"text": t} for t in texts(10)])
    sized = datasets.Dataset.from_list([{"text": t} for t in texts(10)]).to_iterable_dataset()
    for source in (stream_of(paths), sized):
        dm, loader = train_stream(source)
        assert dm.train_batches_per_epoch() is None
        with pytest.raises(TypeError, match="the length of this stream is unknown"):
            len(loader)


def test_pack_buffer_where_it_does_not_apply_is_said(tmp_path, caplog):
    paths = write_jsonl(tmp_path, [{"text": t} for t in texts(10)])
    with caplog.at_level(logging.INFO, logger="hf_lightning"):
        HFDataModule(
            make_word_tokenizer(), path=paths[0], validation_split=0.0, packing="bfd", pack_buffer=64
        ).setup()
        HFDataModule(
            make_word_tokenizer(),
            path=paths[0],
            streaming=True,
            validation_split=0.0,
            packing="wrapped",
            pack_buffer=64,
        ).setup()
    said = [r.getMessage() for r in caplog.records if "pack_buffer" in r.getMessage()]
    assert said == [
        "data.pack_buffer=64 does not apply: it bounds the documents a stream is packed within by "
        "data.packing=bfd, and this source is map-style (packed whole)",
        "data.pack_buffer=64 does not apply: it bounds the documents a stream is packed within by "
        "data.packing=bfd, and this run has data.packing=wrapped",
    ]
