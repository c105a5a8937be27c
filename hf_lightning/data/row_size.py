"""Bound the size of one row before it is read or tokenized (``data.max_row_bytes``).

A single row of hundreds of megabytes is read whole by ``datasets``' JSON Lines and CSV readers and then
tokenized whole (``tokenizer(text, truncation=True)`` encodes the full text before it truncates, and
counting what truncation cuts needs that encoding too), so the memory it takes grows with the row until the
kernel kills the process, with nothing printed. Two checks stop such a row with a message instead:

- :func:`check_line_sizes`: the lines of a JSON Lines or CSV file, before ``datasets`` reads it. The file is
  read in chunks of :data:`CHUNK` bytes, so the check never holds a whole line; a file no larger than the
  limit cannot hold a longer line and is not read at all.
- :func:`check_row_sizes`: the text of each row of a loaded ``datasets.Dataset`` (every string value, nested
  ones such as chat messages included), measured from the Arrow offsets without reading the text: parquet
  files, JSON arrays, ``save_to_disk`` folders, hub and in-memory datasets.

``None`` as the limit turns both checks off.
"""

from __future__ import annotations

import os
from typing import Any

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from hf_lightning.compat import selection_indices
from hf_lightning.errors import DataError

#: bytes read at a time by the line scan
CHUNK = 8 << 20
#: the default of ``data.max_row_bytes`` (16 MiB)
DEFAULT_MAX_ROW_BYTES = 16 << 20


def human_bytes(n: int) -> str:
    """``13 bytes``, ``4.0 KiB``, ``190.7 MiB``, ``1.5 GiB``."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} bytes"


def _size(n: int) -> str:
    """``200,000,021 bytes (190.7 MiB)``."""
    return f"{n:,} bytes" + (f" ({human_bytes(n)})" if n >= 1 << 10 else "")


def _remedy(limit: int) -> str:
    return (
        f"longer than data.max_row_bytes={limit} ({human_bytes(limit)}) allows: a row is read and tokenized "
        "whole, so one this size takes many times its size in memory. Split the document into rows below "
        "that size, or raise data.max_row_bytes (null: no bound) on a machine with the memory for it"
    )


def first_long_line(path: str, limit: int) -> tuple[int, int] | None:
    """``(1-based line number, bytes without its line break)`` of the first line of ``path`` longer than
    ``limit`` bytes, else ``None``. Reads :data:`CHUNK` bytes at a time and never holds a whole line."""
    line, since = 1, 0  # the current line's number and its bytes read so far
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            first = chunk.find(b"\n")
            if first == -1:
                since += len(chunk)
                if since > limit:
                    return line, _rest_of_line(fh, since)
                continue
            if since + first > limit:
                return line, since + first
            if limit >= len(chunk):  # every other line closed in this chunk is shorter than the chunk
                last = chunk.rfind(b"\n")
                line += chunk.count(b"\n")
            else:
                last = first
                line += 1
                while (end := chunk.find(b"\n", last + 1)) != -1:
                    if end - last - 1 > limit:
                        return line, end - last - 1
                    last, line = end, line + 1
            since = len(chunk) - last - 1
            if since > limit:
                return line, _rest_of_line(fh, since)
    return None


def _rest_of_line(fh: Any, size: int) -> int:
    """``size`` plus the bytes of the line still ahead in ``fh`` (read in chunks)."""
    while chunk := fh.read(CHUNK):
        end = chunk.find(b"\n")
        if end != -1:
            return size + end
        size += len(chunk)
    return size


def check_line_sizes(path: str, limit: int | None) -> None:
    """Refuse a file with a line longer than ``limit`` bytes (``data.max_row_bytes``) before it is read.

    Raises:
        DataError: ``data.path=FILE: line 11 is 200,000,021 bytes (190.7 MiB), longer than
            data.max_row_bytes=...``, with what to change.
    """
    if limit is None or os.path.getsize(path) <= limit:
        return
    found = first_long_line(path, limit)
    if found is not None:
        line, size = found
        raise DataError(f"data.path={path}: line {line} is {_size(size)}, {_remedy(limit)}")


_TEXT_TYPES = (pa.types.is_string, pa.types.is_large_string, pa.types.is_binary, pa.types.is_large_binary)


def _text_bytes(arr: pa.Array) -> np.ndarray:
    """Bytes of the string and binary values in each element of ``arr`` (nested lists and structs summed;
    nulls and other types count 0), from the Arrow offsets."""
    t = arr.type
    if any(is_kind(t) for is_kind in _TEXT_TYPES):
        return pc.fill_null(pc.binary_length(arr), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        offsets = arr.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
        first = int(offsets[0])  # a slice's offsets point into the whole child array: take its part only
        values = arr.values.slice(first, int(offsets[-1]) - first)
        child = np.concatenate([[0], np.cumsum(_text_bytes(values))])
        return child[offsets[1:] - first] - child[offsets[:-1] - first]
    if pa.types.is_struct(t):
        total = np.zeros(len(arr), dtype=np.int64)
        for field in arr.flatten():
            total += _text_bytes(field)
        return total
    return np.zeros(len(arr), dtype=np.int64)


def check_row_sizes(ds: Any, limit: int | None, name: Any) -> None:
    """Refuse a ``datasets.Dataset`` with a row holding more than ``limit`` bytes of text.

    ``name``: the source as the message names it (``data.path``). Other sources (streams, torch datasets)
    are not checked here.

    Raises:
        DataError: ``data.path=FILE row 10 of the file: the row holds 200,000,012 bytes (190.7 MiB) of
            text, longer than data.max_row_bytes=...``, with what to change.
    """
    if limit is None or not isinstance(ds, datasets.Dataset) or len(ds) == 0:
        return
    table = ds.data.table
    if table.nbytes <= limit:
        return
    indices = selection_indices(ds)
    chosen = None if indices is None else indices.column(0).to_numpy(zero_copy_only=False)
    start = 0
    for batch in table.to_batches(max_chunksize=1 << 16):
        sizes = np.zeros(batch.num_rows, dtype=np.int64)
        for column in batch.columns:
            sizes += _text_bytes(column)
        for offset in np.flatnonzero(sizes > limit):
            row = start + int(offset)
            if chosen is not None:
                where = np.flatnonzero(chosen == row)
                if not len(where):
                    continue  # a row of the table that the dataset's selection leaves out
                row = int(where[0])
            is_file = isinstance(name, (str, os.PathLike)) and os.path.isfile(name)
            place = f"data.path={name} row {row}{' of the file' if is_file else ''}"
            raise DataError(f"{place}: the row holds {_size(int(sizes[offset]))} of text, {_remedy(limit)}")
        start += batch.num_rows
