"""Checks of the data against the model, run once at ``setup``, so that a mismatch stops with a message
instead of an ``IndexError`` inside an embedding (on a GPU: a device-side assert that kills the process) or a
silent mistake (zero training steps; packed sequences that attend to each other).

Each check names the split, the row and the value, and says what to change.

The size of one row is bounded before it is read or tokenized (``data.max_row_bytes``). A single row of
hundreds of megabytes is read whole by ``datasets``' JSON Lines and CSV readers and then tokenized whole
(``tokenizer(text, truncation=True)`` encodes the full text before it truncates, and counting what truncation
cuts needs that encoding too), so the memory it takes grows with the row until the kernel kills the process,
with nothing printed. Two checks stop such a row with a message instead:

- :func:`check_line_sizes`: the lines of a JSON Lines or CSV file, before ``datasets`` reads it. The file is
  read in chunks of :data:`CHUNK` bytes, so the check never holds a whole line; a file no larger than the
  limit cannot hold a longer line and is not read at all.
- :func:`check_row_sizes`: the text of each row of a loaded ``datasets.Dataset`` (every string value, nested
  ones such as chat messages included), measured from the Arrow offsets without reading the text: parquet
  files, JSON arrays, ``save_to_disk`` folders, hub and in-memory datasets.

``None`` as the limit turns both checks off.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from typing import Any

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from hf_lightning.compat import attention_backend, selection_indices
from hf_lightning.core.batch import IGNORE_INDEX
from hf_lightning.core.errors import ConfigError, DataError
from hf_lightning.data.model_facts import forward_parameters

log = logging.getLogger(__name__)


def check_pad_token(tokenizer: Any) -> None:
    """Refuse a tokenizer without a pad token (saying what to set).

    Raises:
        ConfigError: no ``pad_token_id``.
    """
    if getattr(tokenizer, "pad_token_id", None) is not None:
        return
    if getattr(tokenizer, "eos_token", None) is not None:
        hint = "set tokenizer.pad_token (for example to its eos_token)"
    else:
        # nothing to fall back on: the model folder's tokenizer needs a token named for padding
        hint = (
            "it has no eos_token either: set tokenizer.pad_token and tokenizer.eos_token (for example "
            "both to its end-of-text token, such as '<|endoftext|>' for GPT-2)"
        )
    raise ConfigError(f"the tokenizer has no pad token; {hint} and save it into the model folder")


def check_fits_one_batch(n_per_rank: int, batch_size: int, drop_last: bool, split: str = "train") -> None:
    """A ``DataLoader`` with ``drop_last`` and fewer examples than one batch yields nothing: Lightning then
    "trains" for zero steps and reports success. Refuse instead.

    Raises:
        DataError: ``drop_last`` and ``n_per_rank < batch_size``.
    """
    if drop_last and n_per_rank < batch_size:
        raise DataError(
            f"the {split} split gives each rank {n_per_rank} example{'s' if n_per_rank != 1 else ''}, fewer "
            f"than one batch of data.per_device_train_batch_size={batch_size}, and data.drop_last=true drops "
            "that partial batch: no training step would run. Lower the batch size or set "
            "data.drop_last=false"
        )


def _flat_values(arr: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    while pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type):
        arr = pc.list_flatten(arr)
    return arr


def _column_max(ds: datasets.Dataset, column: str, skip: int | None = None) -> int | None:
    """Largest value of a (nested) integer list column, ``skip`` values excluded; ``None`` if the column is
    empty or not numeric (a ``Json`` column of mixed values is checked row by row by the collator instead)."""
    best = None
    for table in ds.select_columns([column]).with_format("arrow").iter(batch_size=10_000):
        values = _flat_values(table.column(column))
        if not (pa.types.is_integer(values.type) or pa.types.is_floating(values.type)):
            return None
        if skip is not None:
            values = pc.filter(values, pc.not_equal(values, skip))
        value = pc.max(values).as_py()
        if value is not None:
            best = value if best is None else max(best, value)
    return None if best is None else int(best)


def _first_row_above(
    ds: datasets.Dataset, column: str, limit: int, skip: int | None = None
) -> tuple[int, int]:
    """``(row, value)`` of the first row of ``column`` holding a value ``>= limit`` (error path only)."""
    for i, row in enumerate(ds[column]):
        values = torch.as_tensor(row).reshape(-1)
        if skip is not None:
            values = values[values != skip]
        if values.numel() and int(values.max()) >= limit:
            return i, int(values.max())
    raise AssertionError("no such row")  # only called after _column_max found one


def _embedding_rows(model: Any) -> int | None:
    get = getattr(model, "get_input_embeddings", None)
    emb = get() if callable(get) else None
    return getattr(emb, "num_embeddings", None)


def _output_classes(model: Any) -> int | None:
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    return getattr(head, "out_features", None)


def check_token_ids(ds: Any, model: Any, pad_token_id: int | None, path: Any, split: str) -> None:
    """Every ``input_ids`` value (and the pad id) must have a row in the model's input embedding, and every
    token label a column in its output layer.

    Checked for a ``datasets.Dataset`` (one vectorised pass over Arrow); streams and plain torch datasets are
    not scanned.

    Raises:
        DataError: a token id ``>=`` the embedding size (names the split row and the id); a pad id too large.
    """
    rows = _embedding_rows(model)
    if rows is None or not isinstance(ds, datasets.Dataset):
        return
    name = type(model).__name__
    if pad_token_id is not None and pad_token_id >= rows:
        raise DataError(
            f"the tokenizer's pad_token_id={pad_token_id} is outside {name}'s input embedding ({rows} rows); "
            "the tokenizer does not belong to this model (or call "
            "model.resize_token_embeddings(len(tokenizer)))"
        )
    limits = [("input_ids", rows, None, "input embedding")]
    classes = _output_classes(model)
    if classes is not None and "labels" in ds.column_names:
        limits.append(("labels", classes, IGNORE_INDEX, "output layer"))
    for column, limit, skip, what in limits:
        if column not in ds.column_names:
            continue
        top = _column_max(ds, column, skip)
        if top is not None and top >= limit:
            row, value = _first_row_above(ds, column, limit, skip)
            raise DataError(
                f"data.path={path} ({split} row {row}): {column} holds token id {value}, but {name}'s {what} "
                f"has only {limit} entries (ids 0..{limit - 1}); the data was tokenized with a larger "
                "vocabulary than the model's. Use the model's own tokenizer, or resize the model "
                "(model.resize_token_embeddings)"
            )


def check_label_range(ds: Any, model: Any, path: Any, split: str) -> None:
    """Integer class labels must lie in ``[0, model.config.num_labels)`` (``-100`` is allowed: ignored).

    Raises:
        DataError: a label outside that range (names the split row, the value, and ``num_labels``).
    """
    num_labels = getattr(getattr(model, "config", None), "num_labels", None)
    if not num_labels or not isinstance(ds, datasets.Dataset):
        return
    column = next((c for c in ("label", "labels", "label_ids") if c in ds.column_names), None)
    if column is None:
        return
    values = ds[column]
    for i, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, int) or value == IGNORE_INDEX:
            continue
        if not 0 <= value < num_labels:
            raise DataError(
                f"data.path={path} ({split} row {i}): class label {value} is outside the model's "
                f"{num_labels} classes (config.num_labels={num_labels}, labels 0..{num_labels - 1}); "
                "build the model with num_labels set to the number of classes in the data"
            )


def _probe_ids(vocab: int | None, n: int, offset: int) -> list[int]:
    top = vocab if vocab else 100
    return [(offset + 7 * k) % max(top - 1, 1) + 1 for k in range(n)]


def packed_sequences_isolated(model: Any, atol: float = 1e-4) -> bool | None:
    """Whether ``model`` keeps packed sequences apart, measured: two one-row batches that pack a different
    first sequence before the same second one (``position_ids`` restarting at 0, no ``attention_mask``, no KV
    cache), and the second sequence's logits compared. An attention backend that honours the boundaries gives
    the same logits (up to ``atol`` relative to their scale); one that does not lets the first sequence leak
    in.

    Returns:
        ``True``/``False``, or ``None`` when the model cannot be probed here (parameters not materialised,
        e.g. on the meta device or partitioned by DeepSpeed ZeRO-3).
    """
    params = list(model.parameters())
    if not params or any(p.is_meta or p.numel() == 0 for p in params):
        return None
    device = params[0].device
    vocab = _embedding_rows(model)
    second = _probe_ids(vocab, 3, 11)
    rows = [_probe_ids(vocab, 6, offset) + second for offset in (1, 4)]
    position_ids = torch.tensor([list(range(6)) + list(range(3))], device=device)
    # through PEFT / torch.compile wrappers, whose own forward does not name use_cache
    extra = {"use_cache": False} if "use_cache" in forward_parameters(model) else {}
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            logits = [
                model(input_ids=torch.tensor([r], device=device), position_ids=position_ids, **extra)
                .logits[0, 6:]
                .float()
                for r in rows
            ]
    finally:
        model.train(was_training)
    scale = max(float(logits[0].abs().max()), 1.0)
    return bool((logits[0] - logits[1]).abs().max() <= atol * scale)


def check_sequence_isolation(model: Any, option: str) -> None:
    """Refuse packing / padding-free batches for a model whose attention lets packed sequences see each other.

    Raises:
        ConfigError: the probe of :func:`packed_sequences_isolated` shows a leak (names the attention
        backend).
    """
    isolated = packed_sequences_isolated(model)
    if isolated is None:
        log.info(
            "%s: the model's parameters are not materialised here; sequence isolation was not probed", option
        )
        return
    if not isolated:
        backend = attention_backend(model)
        raise ConfigError(
            f"{option}: {type(model).__name__} with attention backend {backend!r} lets packed sequences "
            "attend to each other (probed: the second sequence's logits change with the first one). "
            "transformers separates packed sequences by position_ids only for the backends it builds masks "
            "for (sdpa, eager, flash_attention_*, flex_attention). Use one of those "
            "(model.attn_implementation=sdpa), or set data.packing=false and data.padding_free=false"
        )


def check_rows_fit_model(
    splits: Mapping[str, tuple[Any, Any]], model: Any, pad_token_id: int | None, classes: bool
) -> None:
    """:func:`check_token_ids` (and :func:`check_label_range` when ``classes``) on each ``{split: (rows,
    path)}``: ids and classes the model has no row for fail here, not inside its forward.

    Raises:
        DataError: see the two checks.
    """
    for split, (ds, path) in splits.items():
        check_token_ids(ds, model, pad_token_id, path, split)
        if classes:
            check_label_range(ds, model, path, split)


def check_label_key(collator: Any, example: Mapping[str, Any] | None, label_names: list[str]) -> None:
    """With metrics configured, an evaluation batch (``collator([example])``) must carry a key of
    ``label_names`` (HF ``label_names``).

    Raises:
        ConfigError: no key of ``label_names`` in the batch (names the keys it has).
    """
    keys = set(collator([example])) if example is not None else set()
    if not any(name in keys for name in label_names):
        raise ConfigError(
            "metrics are configured but no label key resolves: "
            f"data.label_names={label_names} and an evaluation batch has the keys "
            f"{sorted(keys)}. Set data.label_names to the key(s) holding the labels, or remove the "
            "metrics"
        )


def check_given_label_names(
    label_names: list[str],
    batch_keys: Iterable[str],
    source_columns: Iterable[str],
    path: Any,
    fmt: str,
    renamed: bool = False,
) -> None:
    """Every key of a ``data.label_names`` the user gave must be a key of the batches: HF ``Trainer`` treats
    a batch as labelled only when it holds all of them (``prediction_step``'s ``has_labels``), and the
    columns they name are kept through pruning.

    ``renamed``: the source columns are those after ``data.rename_columns``.

    Raises:
        ConfigError: a name that is no batch key (names it, the batch keys and the source's columns).
    """
    keys = sorted(batch_keys)
    columns = sorted(source_columns)
    missing = [name for name in label_names if name not in keys]
    if not missing:
        return
    names = ", ".join(repr(m) for m in missing)
    path = path if isinstance(path, (str, os.PathLike)) else "<in-memory dataset>"
    if all(m in columns for m in missing):
        what = f"{names} is a column of data.path={path} but no key of its batches ({keys})"
    else:
        what = f"{names} is neither a key of the batches ({keys}) nor a column of data.path={path} "
        what += f"(columns{' after data.rename_columns' if renamed else ''}: {columns})"
    source = (
        "the classification format reads its labels from the 'label' column"
        if fmt == "classification"
        else f"the {fmt} format makes its targets"
    )
    raise ConfigError(
        f"data.label_names={label_names}: {what}. data.label_names names the batch keys that hold the labels "
        f"(HF label_names); {source} and batches them as 'labels': leave data.label_names unset, or name "
        "keys the batches have"
    )


# ------------------------------------------------------------------- the size of one row (data.max_row_bytes)
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
