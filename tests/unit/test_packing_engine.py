"""The Arrow packing engine against the pure-Python packing it replaced (``tests/packing_oracle.py``), row for
row, on the edge cases; its memory without timing anything. TRL and the real data sets:
tests/parity/test_packing_engine.py.
"""

from __future__ import annotations

import logging
import os
import random
import tracemalloc

import datasets
import numpy as np
import pyarrow as pa
import pytest

from hf_lightning.data import packing
from hf_lightning.data.packing import best_fit_decreasing, pack_bfd, pack_dataset, pack_wrapped
from tests import packing_oracle as old

IGNORE = -100


def _docs(lengths, seed=0, labels=True):
    """Documents of the given lengths with distinct token ids; labels with some positions -100."""
    rng = random.Random(seed)
    rows = []
    for i, n in enumerate(lengths):
        ids = [1000 * i + k for k in range(n)]
        row = {"input_ids": ids}
        if labels:
            row["labels"] = [IGNORE if rng.random() < 0.3 else t for t in ids]
        rows.append(row)
    return rows


def _dataset(rows):
    if not rows:
        return datasets.Dataset.from_dict({"input_ids": [], "labels": []})
    return datasets.Dataset.from_list(rows)


EDGE_CASES = {
    "exactly max_length": [8, 8, 3],
    "length 1": [1, 1, 7, 1, 5, 1],
    "single document": [5],
    "many equal lengths (ties)": [4] * 9 + [3] * 7 + [2] * 5,
    "tie to the bin that came to the room first": [7, 5, 4, 2, 1],
    "mixed": [3, 7, 2, 5, 1, 8, 6, 6, 2],
}


@pytest.mark.parametrize("case", list(EDGE_CASES))
@pytest.mark.parametrize("labels", [True, False])
def test_bfd_and_wrapped_rows_equal_the_previous_implementation(case, labels):
    rows = _docs(EDGE_CASES[case], labels=labels)
    ds = _dataset(rows)
    assert pack_bfd(ds, 8).to_list() == old.pack_bfd(rows, 8)
    assert pack_wrapped(ds, 8).to_list() == old.pack_wrapped(rows, 8)
    assert best_fit_decreasing(EDGE_CASES[case], 8) == old.best_fit_decreasing(EDGE_CASES[case], 8)


def test_documents_longer_than_a_row():
    """bfd refuses them with the previous message (tokenization truncates first); wrapped keeps every
    token."""
    rows = _docs([3, 11, 2, 11])
    with pytest.raises(ValueError, match="example 1 has 11 tokens, more than the bin capacity 8"):
        pack_bfd(_dataset(rows), 8)
    with pytest.raises(ValueError, match="example 1 has 11 tokens"):
        old.pack_bfd(rows, 8)
    assert pack_wrapped(_dataset(rows), 8).to_list() == old.pack_wrapped(rows, 8)


def test_empty_input_gives_no_rows_and_a_log_line_instead_of_a_crash(caplog):
    """Before, ``pack_dataset`` divided by zero slots on a split with no document."""
    ds = _dataset([])
    assert pack_bfd(ds, 8).to_list() == old.pack_bfd([], 8) == []
    assert pack_wrapped(ds, 8).to_list() == old.pack_wrapped([], 8) == []
    with caplog.at_level(logging.INFO, logger="hf_lightning"):
        for strategy in ("bfd", "wrapped"):
            assert len(pack_dataset(ds, strategy, 8)) == 0
    assert (
        "packed 0 documents into 0 rows of 8 (bfd): efficiency 0.0% (0 real tokens / 0 slots)" in caplog.text
    )


def test_empty_documents_are_in_no_row_and_counted(caplog):
    """The previous code put an empty document in a row of its own when no row had room left (an empty row);
    TRL leaves empty documents out, and so do we, with a WARNING."""
    rows = _docs([8, 0, 8, 0])
    assert old.pack_bfd(rows, 8)[-1]["input_ids"] == []  # the old empty row
    with caplog.at_level(logging.INFO, logger="hf_lightning"):
        packed = pack_dataset(_dataset(rows), "bfd", 8)
    assert packed.to_list() == [r for r in old.pack_bfd(rows, 8) if r["input_ids"]]
    assert "train: 2 empty documents (no token) are in no packed row" in caplog.text
    assert old.best_fit_decreasing([8, 0, 8, 0], 8) == [[0], [2], [1, 3]]
    assert best_fit_decreasing([8, 0, 8, 0], 8) == [[0], [2]]


def test_random_lengths_bins_and_rows_equal_the_previous_implementation():
    rng = random.Random(1)
    for _ in range(150):
        lengths = [rng.randint(1, 16) for _ in range(rng.randint(1, 40))]
        assert best_fit_decreasing(lengths, 16) == old.best_fit_decreasing(lengths, 16), lengths
    lengths = [rng.randint(1, 64) for _ in range(500)]
    rows = _docs(lengths)
    assert pack_bfd(_dataset(rows), 64).to_list() == old.pack_bfd(rows, 64)
    assert pack_wrapped(_dataset(rows), 64).to_list() == old.pack_wrapped(rows, 64)


def test_rows_gathered_in_many_small_blocks_equal_one_block(monkeypatch):
    """The bfd gather fills its output a block of documents at a time; a block boundary inside a row changes
    nothing."""
    rows = _docs([5, 3, 7, 2, 6, 1, 4, 8, 8, 1] * 3)
    monkeypatch.setattr(packing, "BLOCK_TOKENS", 5)
    assert pack_bfd(_dataset(rows), 8).to_list() == old.pack_bfd(rows, 8)
    rows = _docs([5, 3, 7, 2, 6, 1, 4, 8, 8, 1] * 3, labels=False)
    assert pack_bfd(_dataset(rows), 8).to_list() == old.pack_bfd(rows, 8)


def test_selected_and_multi_chunk_tables_pack_like_plain_ones():
    """The DataModule packs filtered splits (an index mapping over the table) and tables of many record
    batches; the engine reads the rows the dataset shows, in its order."""
    rows = _docs([5, 3, 7, 2, 6, 1, 4] * 3)
    parts = [_dataset(rows[i : i + 4]) for i in range(0, len(rows), 4)]
    chunked = datasets.concatenate_datasets(parts)
    assert chunked.data.column("input_ids").num_chunks > 1
    selected = chunked.select([20, 3, 3, 0, 11, 7, 15])
    expected = [rows[i] for i in [20, 3, 3, 0, 11, 7, 15]]
    for ds, want in ((chunked, rows), (selected, expected)):
        assert pack_bfd(ds, 8).to_list() == old.pack_bfd(want, 8)
        assert pack_wrapped(ds, 8).to_list() == old.pack_wrapped(want, 8)


def test_packed_columns_are_int32_lists_the_token_columns_sharing_one_offsets_array():
    packed = pack_bfd(_dataset(_docs([3, 5, 2, 6])), 8).with_format("arrow")[:]
    assert packed.column_names == ["input_ids", "labels", "seq_lengths"]
    assert all(packed.column(c).type == pa.list_(pa.int32()) for c in packed.column_names)
    offsets = [packed.column(c).chunk(0).offsets.to_pylist() for c in packed.column_names]
    assert offsets[0] == offsets[1] == [0, 8, 16]
    assert offsets[2] == [0, 2, 4]  # two documents per row: 6 + 2, 5 + 3
    assert packed.column("seq_lengths").to_pylist() == [[6, 2], [5, 3]]


def test_memory_is_linear_in_the_output_and_no_token_goes_through_python():
    """40,000 documents, about 1.6 M tokens. The output is two int32 token columns over one offsets array each
    (8 bytes per token) and each row's document lengths (4 bytes per document); the peak of Python allocations
    (``tracemalloc``: Python objects and numpy arrays, not Arrow's own pool) stays under 12 bytes per token.
    The previous implementation held every token as a Python int in lists: 48 bytes per token under
    ``tracemalloc`` on this case."""
    rng = np.random.default_rng(0)
    lengths = np.minimum(rng.lognormal(3.5, 0.6, 40_000).astype(np.int64) + 1, 256)
    offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int32)
    values = pa.array(rng.integers(0, 50_000, int(lengths.sum()), dtype=np.int32))
    ids = pa.ListArray.from_arrays(pa.array(offsets), values)
    ds = datasets.Dataset(pa.table({"input_ids": ids}))
    tokens = int(lengths.sum())
    for pack in (pack_bfd, pack_wrapped):
        tracemalloc.start()
        try:
            out = pack(ds, 256)
            python_peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        table = out.with_format("arrow")[:]
        rows = table.num_rows
        docs = sum(len(r) for r in table.column("seq_lengths").to_pylist())
        assert docs == (len(lengths) if pack is pack_bfd else rows)
        assert 8 * tokens < table.nbytes <= 2 * (4 * tokens + 4 * (rows + 1)) + 4 * docs + 4 * (rows + 1)
        assert python_peak < 12 * tokens, (pack.__name__, python_peak / tokens)


@pytest.mark.parametrize("labels", [True, False])
def test_a_file_backed_dataset_is_packed_into_a_cache_file_in_batches_equal_to_the_in_memory_rows(
    tmp_path, monkeypatch, labels
):
    """Documents in a ``datasets`` cache file of record batches of 4 rows, read through a ``select`` index
    mapping, packed a few rows per written batch: the rows of the oracle and of the same documents in memory,
    in a memory-mapped file of several batches, one file per strategy and ``max_length``."""
    rows = _docs([5, 3, 7, 2, 6, 1, 4, 8, 8, 0, 1] * 3, labels=labels)
    on_disk = _dataset(rows).map(
        batched=True, cache_file_name=str(tmp_path / "tokenized.arrow"), writer_batch_size=4
    )
    assert on_disk.data.column("input_ids").num_chunks > 1
    picked = [20, 3, 3, 0, 11, 7, 15, 9, 30, 31, 32, 1, 2]
    monkeypatch.setattr(packing, "BLOCK_TOKENS", 10)
    files = set()
    for ds, want in ((on_disk, rows), (on_disk.select(picked), [rows[i] for i in picked])):
        for strategy, oracle in (("bfd", old.pack_bfd), ("wrapped", old.pack_wrapped)):
            out = pack_dataset(ds, strategy, 8)
            [file] = [f["filename"] for f in out.cache_files]
            assert os.path.dirname(file) == str(tmp_path)
            files.add(file)
            assert out.data.column("input_ids").num_chunks > 1
            expected = oracle([r for r in want if r["input_ids"]], 8)  # empty documents: in no row
            assert out.to_list() == expected
            assert out.to_list() == pack_dataset(_dataset(want), strategy, 8).to_list()
    assert len(files) == 4
    assert len({f["filename"] for f in pack_wrapped(on_disk, 7).cache_files} | files) == 5
