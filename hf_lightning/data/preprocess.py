"""Tokenize a dataset in a chosen format, counting what is truncated and dropped.

Two paths share the format functions of :mod:`hf_lightning.data.formatting`:

- :func:`tokenize_dataset` for a ``datasets.Dataset``: ``Dataset.map`` (cached by ``datasets`` under the
  fingerprint of the data, the function and the tokenizer), then rows with no target are dropped; both
  counts are logged at WARNING.
- :class:`ExampleProcessor` for streams and plain torch datasets: one example at a time, on the fly.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

import datasets
from torch.utils.data import Dataset

from hf_lightning.data.file_errors import is_json_lines, jsonl_line_of_row, naming_non_utf8
from hf_lightning.data.formatting import CAUSAL_FORMATS, TOKENIZERS, check_columns
from hf_lightning.errors import DataError
from hf_lightning.module.loss import IGNORE_INDEX

log = logging.getLogger(__name__)


def has_target(labels: Any, causal: bool) -> bool:
    """Whether a label row holds at least one position that gets a loss term.

    A causal LM never trains on position 0 (it has no preceding token), so it is skipped when ``causal``.
    """
    if labels is None:
        return True
    if isinstance(labels, (int, float)):
        return labels != IGNORE_INDEX
    start = 1 if causal else 0
    return any(t != IGNORE_INDEX for t in list(labels)[start:])


def _has_targets_batched(labels: list, causal: bool) -> list[bool]:
    return [has_target(x, causal) for x in labels]


class RowError(DataError):
    """A :class:`DataError` raised by one row of a batch; ``row`` is its index in the dataset being mapped."""

    def __init__(self, row: int, message: str) -> None:
        super().__init__(row, message)  # both in args, so the error pickles across map(num_proc=...) workers
        self.row = row
        self.message = message

    def __str__(self) -> str:
        return f"row {self.row}: {self.message}"


def tokenize_rows(batch: dict[str, list], indices: list[int], fmt: str, **kwargs: Any) -> dict[str, list]:
    """``TOKENIZERS[fmt]`` for ``Dataset.map(batched=True, with_indices=True)``; a bad row is named.

    The batch is tokenized in one call; only when that raises is it tokenized again row by row, to find the
    first row that fails (no cost on the good path).

    Raises:
        RowError: the first failing row, by its index in the mapped dataset.
    """
    fn = TOKENIZERS[fmt]
    try:
        return fn(batch, **kwargs)
    except DataError as err:
        for k, index in enumerate(indices):
            try:
                fn({c: v[k : k + 1] for c, v in batch.items()}, **kwargs)
            except DataError as row_err:
                raise RowError(index, str(row_err)) from row_err
        raise err


def source_row(ds: Any, row: int) -> int:
    """Row ``row`` of ``ds`` as a row of the table it was selected from (``train_test_split``/``select`` keep an
    indices mapping over the loaded file's table); ``row`` itself when there is no mapping."""
    indices = getattr(ds, "_indices", None)  # datasets' selection mapping; absent on an unselected dataset
    if indices is None:
        return row
    try:
        return int(indices.column(0)[row].as_py())
    except Exception:  # a datasets version that stores the mapping differently: the split row is still right
        return row


def describe_row(ds: Any, row: int, path: Any, split: str) -> str:
    """``data.path=FILE line 57 (train row 12)`` for a JSON Lines file we loaded, else ``... (train row 12)``."""
    where = f"{split} row {row}"
    if isinstance(path, (str, os.PathLike)) and os.path.isfile(path):
        path = os.fspath(path)
        src = source_row(ds, row)
        if is_json_lines(path):
            line = jsonl_line_of_row(path, src)
            if line is not None:
                return f"data.path={path} line {line} ({where})"
        return f"data.path={path} row {src} of the file ({where})"
    return f"data.path={path} ({where})"


def fn_kwargs_for(fmt: str, tokenizer: Any, max_length: int, label2id: Mapping[str, int] | None) -> dict:
    kwargs: dict[str, Any] = {"tokenizer": tokenizer, "max_length": max_length}
    if fmt == "classification":
        kwargs["label2id"] = dict(label2id) if label2id else None
    return kwargs


def tokenize_dataset(
    ds: datasets.Dataset,
    fmt: str,
    tokenizer: Any,
    max_length: int,
    split: str,
    path: Any = None,
    label2id: Mapping[str, int] | None = None,
    num_proc: int | None = None,
) -> datasets.Dataset:
    """Tokenize ``ds`` in format ``fmt`` with ``Dataset.map`` (cached) and drop rows with no target.

    Columns the format does not read are kept (pruning against the model's ``forward`` is a separate step).

    Returns:
        the tokenized dataset: ``input_ids`` (and ``attention_mask``, ``labels`` or ``label`` per format).

    Raises:
        DataError: a missing field, a bad value (the message names the path and split), or an empty result.
    """
    check_columns(ds.column_names, fmt, path, split)
    feature = ds.features.get("label")
    if fmt == "classification" and label2id and getattr(feature, "dtype", None) in ("string", "large_string"):
        # class names -> ids with the training mapping, kept in the schema (ClassLabel) for later reference
        names = sorted(label2id, key=label2id.__getitem__)
        try:
            ds = ds.cast_column("label", datasets.ClassLabel(names=names))
        except ValueError as err:
            row, value = next((i, v) for i, v in enumerate(ds["label"]) if v not in label2id)
            raise DataError(
                f"{describe_row(ds, row, path, split)}: label {value!r} is not one of the {len(names)} training "
                f"labels {names[:20]}{' ...' if len(names) > 20 else ''}"
            ) from err
    with naming_non_utf8(path, split):
        try:
            out = _map_rows(ds, fmt, tokenizer, max_length, split, label2id, num_proc)
        except RowError as err:
            raise DataError(f"{describe_row(ds, err.row, path, split)}: {err.message}") from err
        except DataError as err:
            raise DataError(f"data.path={path} ({split}): {err}") from err
    n_trunc = sum(out["truncated"])
    if n_trunc:
        log.warning(
            "%s: %d of %d rows were longer than data.max_length=%d and were truncated",
            split, n_trunc, len(out), max_length,
        )
    out = out.remove_columns("truncated")
    if "labels" in out.column_names:
        before = len(out)
        out = out.filter(
            _has_targets_batched, batched=True, input_columns="labels",
            fn_kwargs={"causal": fmt in CAUSAL_FORMATS}, desc=f"dropping {split} rows without targets",
        )
        if len(out) < before:
            log.warning(
                "%s: dropped %d of %d rows with no trained-on token (all labels -100 after truncation)",
                split, before - len(out), before,
            )
    if len(out) == 0:
        raise DataError(
            f"data.path={path}: the {split} split is empty after tokenization: {len(ds)} rows were read and "
            f"every one lost all its targets (labels all -100), {n_trunc} of them by truncation to "
            f"data.max_length={max_length}; raise data.max_length or check which fields hold the targets"
        )
    log.info("%s: %d examples (%s format)", split, len(out), fmt)
    return out


def _map_rows(
    ds: datasets.Dataset, fmt: str, tokenizer: Any, max_length: int, split: str,
    label2id: Mapping[str, int] | None, num_proc: int | None,
) -> datasets.Dataset:
    return ds.map(
        tokenize_rows,
        batched=True,
        with_indices=True,
        fn_kwargs={"fmt": fmt, **fn_kwargs_for(fmt, tokenizer, max_length, label2id)},
        num_proc=num_proc,
        desc=f"tokenizing {split} ({fmt})",
    )


def label_mapping(ds: Any, path: Any) -> dict[str, int] | None:
    """``label2id`` of a classification source: its ``ClassLabel`` names, or the sorted distinct string labels.

    Integer or float labels need no mapping (``None``). Sorting the distinct names is what HF's
    ``run_glue.py`` does, so ids do not depend on row order.

    Raises:
        DataError: string labels in a source whose rows cannot be scanned (a stream or torch dataset).
    """
    features = getattr(ds, "features", None)
    feature = features.get("label") if features else None
    if isinstance(feature, datasets.ClassLabel):
        return {name: i for i, name in enumerate(feature.names)}
    if feature is not None and getattr(feature, "dtype", None) not in ("string", "large_string"):
        return None
    if not isinstance(ds, datasets.Dataset):
        if feature is None:
            return None  # no schema: labels are checked row by row (a string label raises there)
        raise DataError(
            f"data.path={path}: string class labels in a stream cannot be mapped to ids without a scan; "
            "cast the column to datasets.ClassLabel (names in order) or use integer labels"
        )
    with naming_non_utf8(path, "train"):
        names = sorted(set(ds["label"]))
    return {name: i for i, name in enumerate(names)}


class ExampleProcessor:
    """Tokenizes one example on the fly (streams, plain torch datasets), as :func:`tokenize_dataset` would.

    Args:
        fmt: a format name of :mod:`~hf_lightning.data.formatting`.
        tokenizer / max_length / label2id: as for :func:`tokenize_dataset`.

    Calling it with one example mapping returns ``(example, truncated, has_target)``; the example keeps the
    columns the format does not read. Picklable, so it runs inside ``DataLoader`` workers.

    Raises:
        DataError: a missing field or a bad value (from the format function).
        TypeError: an example that is not a mapping.
    """

    def __init__(
        self, fmt: str, tokenizer: Any, max_length: int, label2id: Mapping[str, int] | None = None
    ) -> None:
        self.fmt = fmt
        self.fn = TOKENIZERS[fmt]
        self.kwargs = fn_kwargs_for(fmt, tokenizer, max_length, label2id)
        self.causal = fmt in CAUSAL_FORMATS

    def __call__(self, example: Mapping[str, Any]) -> tuple[dict[str, Any], bool, bool]:
        if not isinstance(example, Mapping):
            raise TypeError(f"examples must be mappings of column -> value, got {type(example).__name__}")
        check_columns(list(example), self.fmt, "<stream>", "streamed")
        out = self.fn({k: [v] for k, v in example.items()}, **self.kwargs)
        row = {k: v[0] for k, v in out.items()}
        row = {**{k: v for k, v in example.items() if k not in row}, **row}
        truncated = bool(row.pop("truncated"))
        return row, truncated, has_target(row.get("labels"), self.causal)


class ProcessedDataset(Dataset):
    """A plain torch map-style dataset, tokenized on the fly; rows without a target are left out.

    Built by :func:`scan_torch_dataset`, which reads every row once to count truncations, find the rows
    without a target and measure lengths (for ``group_by_length``); rows are tokenized again when read.
    """

    def __init__(self, base: Any, processor: ExampleProcessor, indices: list[int]) -> None:
        self.base = base
        self.processor = processor
        self.indices = indices

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.processor(self.base[self.indices[index]])[0]


def scan_torch_dataset(
    base: Any, processor: ExampleProcessor, split: str, path: Any = None
) -> tuple[ProcessedDataset, list[int]]:
    """One pass over a torch map-style dataset: ``(view without target-less rows, token length of each kept row)``.

    Truncated and dropped rows are counted and logged at WARNING, as :func:`tokenize_dataset` does.

    Raises:
        DataError: a bad row (named by index) or nothing left.
    """
    keep: list[int] = []
    lengths: list[int] = []
    truncated = 0
    n = len(base)
    for i in range(n):
        try:
            row, cut, target = processor(base[i])
        except (DataError, TypeError) as err:
            raise DataError(f"data.path={path} ({split}), row {i}: {err}") from err
        truncated += cut
        if target:
            keep.append(i)
            lengths.append(len(_flat_ids(row["input_ids"])))
    if truncated:
        log.warning("%s: %d of %d rows were longer than data.max_length and were truncated", split, truncated, n)
    if len(keep) < n:
        log.warning(
            "%s: dropped %d of %d rows with no trained-on token (all labels -100 after truncation)",
            split, n - len(keep), n,
        )
    if not keep:
        raise DataError(
            f"data.path={path}: the {split} split is empty after tokenization: {n} rows were read and every one "
            f"lost all its targets (labels all -100), {truncated} of them by truncation; raise data.max_length "
            "or check which fields hold the targets"
        )
    return ProcessedDataset(base, processor, keep), lengths


def _flat_ids(value: Any) -> list:
    if hasattr(value, "reshape"):
        return value.reshape(-1).tolist()
    return list(value)
