"""The packing engine: ``bfd`` and ``wrapped`` rows computed on Arrow offsets and lengths, never per token in
Python.

:mod:`~hf_lightning.data.packing` says what the rows are; this module computes them. Per document, Python
touches one length (the best-fit choice, a ``bisect`` over the distinct rooms left: O(n log max_length));
every token moves in Arrow or numpy (``pyarrow.compute.take`` on the list column, index arithmetic for labels
and positions). Memory: the input columns as they are (a memory-mapped ``datasets`` table stays mapped) plus
the output, three int32 columns: 12 bytes per packed token, and a few bytes per document.

Why ours rather than ``trl.pack_dataset`` (``trl/data_utils.py``), whose rows ``bfd`` and
``wrapped`` reproduce: TRL packs inside ``Dataset.map(batched=True)``, so each map batch (1,000 documents by
default, what ``SFTTrainer`` uses) is packed on its own: ``bfd`` bins documents only against the others of its
batch, and ``wrapped`` leaves a short row at the end of every batch. Its ``bfd`` cuts documents longer than
``seq_length`` and drops empty ones without a word (we count the cut at tokenization, see
:mod:`~hf_lightning.data.row_report`), gives ``seq_lengths`` but no ``position_ids`` and no label masking of
each document's first token, and its best-fit search walks a segment tree in Python per document.
"""

from __future__ import annotations

import bisect
from collections import deque
from typing import Any

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from datasets.fingerprint import generate_random_fingerprint

from hf_lightning.core.batch import IGNORE_INDEX

#: the type of every packed column: token ids, labels and positions all fit in int32
PACKED_TYPE = pa.int32()
#: tokens gathered per step of :func:`pack_bfd_table` (its scratch: about 16 bytes per token of one step)
BLOCK_TOKENS = 1 << 18


def best_fit_rows(lengths: np.ndarray, capacity: int) -> tuple[np.ndarray, np.ndarray]:
    """Best-fit decreasing over document lengths, as ``(order, docs_per_row)``.

    Documents go longest first (ties in dataset order), each into the row with the least room that still fits
    it; among rows with that room, the one that came to have it first (TRL's ``_pack_bfd`` rule); else a new
    row. Empty documents are left out (as TRL does).

    Args:
        lengths: int array ``(n,)``, tokens per document.
        capacity: tokens per row (``max_length``).

    Returns:
        ``order``: int64 ``(m,)``, the non-empty documents' indices, row after row (rows in the order they
        were opened, documents in each row in the order they were placed); ``docs_per_row``: int64
        ``(rows,)``.

    Raises:
        ValueError: a document longer than ``capacity`` (the longest, first in dataset order, is named).
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.size and lengths.max() > capacity:
        i = int(np.argmax(lengths))
        raise ValueError(f"example {i} has {int(lengths[i])} tokens, more than the bin capacity {capacity}")
    order = np.argsort(-lengths, kind="stable")
    order = order[: int(np.count_nonzero(lengths))]  # zeros sort last
    row_of = np.empty(order.size, dtype=np.int64)
    rooms: list[int] = []  # the distinct rooms (> 0) some row has left, ascending
    waiting: dict[int, deque[int]] = {}  # room -> rows with that room, in the order they came to have it
    rows = 0
    for k, n in enumerate(lengths[order].tolist()):
        j = bisect.bisect_left(rooms, n)
        if j < len(rooms):
            room = rooms[j]
            queue = waiting[room]
            row = queue.popleft()
            if not queue:
                del waiting[room]
                del rooms[j]
        else:
            room, row = capacity, rows
            rows += 1
        row_of[k] = row
        left = room - n
        if left:
            queue = waiting.get(left)
            if queue is None:
                bisect.insort(rooms, left)
                waiting[left] = deque((row,))
            else:
                queue.append(row)
    by_row = np.argsort(row_of, kind="stable")  # rows in opening order; placement order inside each
    return order[by_row], np.bincount(row_of, minlength=rows)


def list_column(table: pa.Table, name: str) -> pa.Array:
    """One list column of ``table`` as a single Arrow array (chunks joined only when there are several)."""
    column = table.column(name)
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def _values(column: pa.Array) -> pa.Array:
    """The tokens of a list array, one after the other (``flatten`` honours a sliced array's own offset)."""
    return column.flatten().cast(PACKED_TYPE)


def _rows(offsets: np.ndarray, values: pa.Array) -> pa.Array:
    if len(values) < 2**31:
        return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values)
    return pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()), values)


def _gather(
    ids: pa.Array, labels: pa.Array | None, order: np.ndarray, doc_lengths: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The tokens, labels (first of each document -100) and positions of the documents ``order``, one after
    the other: int32 ``(total,)`` each, filled :data:`BLOCK_TOKENS` at a time so that the scratch stays
    bounded."""
    ends = np.cumsum(doc_lengths)
    total = int(ends[-1]) if ends.size else 0
    out_ids, out_labels, out_pos = (np.empty(total, np.int32) for _ in range(3))
    first = 0
    while first < order.size:
        start = int(ends[first] - doc_lengths[first])
        last = max(int(np.searchsorted(ends, start + BLOCK_TOKENS, side="right")), first + 1)
        stop = int(ends[last - 1])
        take = pa.array(order[first:last], pa.int64())
        out_ids[start:stop] = _values(pc.take(ids, take)).to_numpy(zero_copy_only=False)
        source = out_ids[start:stop] if labels is None else _values(pc.take(labels, take)).to_numpy(False)
        out_labels[start:stop] = source
        starts = ends[first:last] - doc_lengths[first:last] - start
        out_labels[start + starts] = IGNORE_INDEX  # each document's first token has nothing before it
        pos = out_pos[start:stop]
        pos[:] = np.arange(stop - start, dtype=np.int32)
        pos -= np.repeat(starts.astype(np.int32), doc_lengths[first:last])
        first = last
    return out_ids, out_labels, out_pos


def pack_bfd_table(ids: pa.Array, labels: pa.Array | None, capacity: int) -> tuple[pa.Table, np.ndarray]:
    """Rows of whole documents (:func:`best_fit_rows`), positions restarting at 0 and each first label -100.

    Args:
        ids / labels: list arrays ``(n,)`` of the same row lengths; ``labels`` ``None``: a copy of ``ids``.
        capacity: ``max_length``.

    Returns:
        the packed table (``input_ids``, ``labels``, ``position_ids``: int32 lists) and each row's document
        lengths, int64 ``(m,)`` in row order (row ``r``'s are the next ``docs_per_row[r]``).

    Raises:
        pyarrow.ArrowInvalid: a token id or label outside int32.
    """
    lengths = pc.list_value_length(ids).to_numpy(zero_copy_only=False).astype(np.int64)
    order, per_row = best_fit_rows(lengths, capacity)
    doc_lengths = lengths[order]
    ends = np.cumsum(doc_lengths)
    offsets = np.concatenate(([0], ends[np.cumsum(per_row) - 1])) if per_row.size else np.zeros(1, np.int64)
    columns = _gather(ids, labels, order, doc_lengths)
    names = ("input_ids", "labels", "position_ids")
    table = pa.table({k: _rows(offsets, pa.array(v, PACKED_TYPE)) for k, v in zip(names, columns)})
    return table, doc_lengths


def pack_wrapped_table(ids: pa.Array, labels: pa.Array | None, capacity: int) -> pa.Table:
    """Every token of every document, concatenated as given and cut every ``capacity`` tokens.

    Returns:
        ``input_ids``, ``labels`` (as given, or ``input_ids``) and ``position_ids`` (``0..n-1`` per row):
        int32 lists; the last row may be shorter.
    """
    values = _values(ids)
    total = len(values)
    offsets = (
        np.append(np.arange(0, total, capacity, dtype=np.int64), total) if total else np.zeros(1, np.int64)
    )
    label_values = values if labels is None else _values(labels)
    # 0..capacity-1 broadcast over the rows (a copy per row; cheaper than arange % capacity)
    grid = np.empty((-(-total // capacity), capacity), np.int32)
    grid[:] = np.arange(capacity, dtype=np.int32)
    positions = grid.reshape(-1)[:total]
    return pa.table(
        {
            "input_ids": _rows(offsets, values),
            "labels": _rows(offsets, label_values),
            "position_ids": _rows(offsets, pa.array(positions.astype(np.int32), PACKED_TYPE)),
        }
    )


def token_columns(ds: datasets.Dataset) -> tuple[pa.Array, pa.Array | None]:
    """``input_ids`` and ``labels`` (``None`` when absent) of a ``datasets.Dataset`` as Arrow list arrays.

    Reads the Arrow table (``select``/``filter`` index mappings applied), not Python lists.
    """
    names = ["input_ids"] + (["labels"] if "labels" in ds.column_names else [])
    table = ds.select_columns(names).with_format("arrow")[:]
    ids = _list_or_empty(table, "input_ids")
    return ids, (_list_or_empty(table, "labels") if "labels" in names else None)


def _list_or_empty(table: pa.Table, name: str) -> pa.Array:
    column = list_column(table, name)
    if pa.types.is_null(column.type):  # an empty dataset: from_dict({"input_ids": []}) stores nulls
        return pa.array([], pa.list_(PACKED_TYPE))
    return column


def to_dataset(table: pa.Table) -> datasets.Dataset:
    """An in-memory ``datasets.Dataset`` over ``table`` (no copy).

    With a random fingerprint, as ``datasets`` gives in-memory tables it cannot hash: left to compute one, it
    would pickle the whole table (about 30 bytes of Python memory per token).
    """
    return datasets.Dataset(table, fingerprint=generate_random_fingerprint())


def documents_across(lengths: Any, capacity: int) -> int:
    """How many documents of ``lengths``, concatenated and cut every ``capacity`` tokens, span two rows or
    more."""
    lengths = np.asarray(lengths, dtype=np.int64)
    starts = np.cumsum(lengths) - lengths
    ends = starts + lengths - 1
    return int(np.count_nonzero((lengths > 0) & (starts // capacity != ends // capacity)))
