"""Tokenize a dataset in a chosen format, counting what is truncated and dropped.

Two paths share the format functions of :mod:`hf_lightning.data.formatting`:

- :func:`tokenize_dataset` for a ``datasets.Dataset``: ``Dataset.map`` (cached by ``datasets`` under the
  fingerprint of the data, the function and the tokenizer), then rows with no target are dropped; truncations
  and drops (per cause, see :mod:`~hf_lightning.data.row_report`) are logged at WARNING.
- :class:`ExampleProcessor` for streams and plain torch datasets: one example at a time, on the fly.

Both tokenize whole documents for ``wrapped`` packing (it cuts the concatenation, so nothing is truncated), end
packed ``text`` documents with EOS, and take padding out of pre-tokenized rows bound for packed or padding-free
batches (:func:`fn_kwargs_for`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

import datasets
from torch.utils.data import Dataset

from hf_lightning.compat import selection_indices
from hf_lightning.data.file_errors import is_json_lines, jsonl_line_of_row, naming_non_utf8
from hf_lightning.data.formatting import TOKENIZERS, check_columns
from hf_lightning.data.row_report import ALL_PADDING, EMPTY, REPORT_COLUMNS, RowReport, has_target, row_names
from hf_lightning.data.samplers import mask_example
from hf_lightning.errors import DataError

__all__ = ["ExampleProcessor", "has_target", "scan_torch_dataset", "tokenize_dataset"]

log = logging.getLogger(__name__)


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
    indices = selection_indices(ds)  # datasets' selection mapping; None on an unselected dataset
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


def fn_kwargs_for(
    fmt: str,
    tokenizer: Any,
    max_length: int,
    label2id: Mapping[str, int] | None,
    packing: str | None = None,
    padding_free: bool = False,
) -> dict:
    """The keyword arguments of format ``fmt``'s function.

    ``wrapped`` packing tokenizes whole documents (``max_length=None``: the concatenation is cut, no document is
    truncated; HF ``run_clm``'s ``group_texts`` and TRL's ``wrapped`` keep every token too); packed ``text`` ends
    each document with EOS; packed and padding-free pre-tokenized rows lose their padding.
    """
    kwargs: dict[str, Any] = {
        "tokenizer": tokenizer,
        "max_length": None if packing == "wrapped" else max_length,
    }
    if fmt == "classification":
        kwargs["label2id"] = dict(label2id) if label2id else None
    if fmt == "text":
        kwargs["add_eos"] = bool(packing)
    if fmt == "tokenized":
        kwargs["drop_padding"] = bool(packing or padding_free)
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
    packing: str | None = None,
    padding_free: bool = False,
) -> datasets.Dataset:
    """Tokenize ``ds`` in format ``fmt`` with ``Dataset.map`` (cached) and drop rows with no target.

    Columns the format does not read are kept (pruning against the model's ``forward`` is a separate step).
    ``packing`` / ``padding_free``: what the rows are for (see :func:`fn_kwargs_for`).

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
            out = _map_rows(
                ds,
                fmt,
                fn_kwargs_for(fmt, tokenizer, max_length, label2id, packing, padding_free),
                split,
                num_proc,
            )
        except RowError as err:
            raise DataError(f"{describe_row(ds, err.row, path, split)}: {err.message}") from err
        except DataError as err:
            raise DataError(f"data.path={path} ({split}): {err}") from err
    report = RowReport(split, row_names(ds, path, split))
    columns = [c for c in REPORT_COLUMNS if c in out.column_names]
    keep = report.add_columns(out.select_columns(columns).to_dict())
    report.log(max_length)
    out = out.remove_columns(columns)
    if not keep:
        raise DataError(
            f"data.path={path}: the {split} split is empty after tokenization: {len(ds)} rows were read and none has "
            f"a trained-on token [{report.describe_causes()}]; raise data.max_length (now {max_length}) or check "
            "which fields hold the targets"
        )
    if len(keep) < len(out):
        out = out.select(keep)
    log.info("%s: %d examples (%s format)", split, len(out), fmt)
    return out


def _map_rows(
    ds: datasets.Dataset, fmt: str, kwargs: dict, split: str, num_proc: int | None
) -> datasets.Dataset:
    return ds.map(
        tokenize_rows,
        batched=True,
        with_indices=True,
        fn_kwargs={"fmt": fmt, **kwargs},
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
        tokenizer / max_length / label2id / packing / padding_free: as for :func:`tokenize_dataset`.

    Calling it with one example mapping returns ``(example, report)``: the example keeps the columns the format does
    not read; ``report`` holds its report columns (:mod:`~hf_lightning.data.row_report`). A row without a target
    comes back as a zero-weight stand-in (labels all -100; one pad token when it has no real token, so that no
    ``(B, 0)`` batch can reach a model), for streams that cannot drop it. Picklable (runs inside ``DataLoader``
    workers).

    Raises:
        DataError: a missing field or a bad value (from the format function).
        TypeError: an example that is not a mapping.
    """

    def __init__(
        self,
        fmt: str,
        tokenizer: Any,
        max_length: int,
        label2id: Mapping[str, int] | None = None,
        packing: str | None = None,
        padding_free: bool = False,
    ) -> None:
        self.fmt = fmt
        self.fn = TOKENIZERS[fmt]
        self.kwargs = fn_kwargs_for(fmt, tokenizer, max_length, label2id, packing, padding_free)
        self.pad_token_id = getattr(tokenizer, "pad_token_id", None) or 0

    def __call__(self, example: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        if not isinstance(example, Mapping):
            raise TypeError(f"examples must be mappings of column -> value, got {type(example).__name__}")
        check_columns(list(example), self.fmt, "<stream>", "streamed")
        out = self.fn({k: [v] for k, v in example.items()}, **self.kwargs)
        row = {k: v[0] for k, v in out.items()}
        report = {k: row.pop(k) for k in REPORT_COLUMNS if k in row}
        row = {**{k: v for k, v in example.items() if k not in row}, **row}
        if report.get("untrainable"):
            row = self.stand_in(row, report["untrainable"])
        return row, report

    def stand_in(self, row: dict[str, Any], cause: str) -> dict[str, Any]:
        """``row`` with no loss term; a row with no real token becomes one pad token (attended, label -100)."""
        if cause in (EMPTY, ALL_PADDING):
            token = {"input_ids": [self.pad_token_id], "attention_mask": [1], "position_ids": [0]}
            row = {**row, **{k: v for k, v in token.items() if k == "input_ids" or k in row}}
        return mask_example(row)


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

    Truncated and dropped rows are counted and logged at WARNING (per cause), as :func:`tokenize_dataset` does.

    Raises:
        DataError: a bad row (named by index) or nothing left.
    """
    keep: list[int] = []
    lengths: list[int] = []
    report = RowReport(split)
    n = len(base)
    for i in range(n):
        try:
            row, info = processor(base[i])
        except (DataError, TypeError) as err:
            raise DataError(f"data.path={path} ({split}), row {i}: {err}") from err
        if not report.add(i, info):
            keep.append(i)
            lengths.append(len(_flat_ids(row["input_ids"])))
    report.log(processor.kwargs["max_length"])
    if not keep:
        raise DataError(
            f"data.path={path}: the {split} split is empty after tokenization: {n} rows were read and none has a "
            f"trained-on token [{report.describe_causes()}]; raise data.max_length (now "
            f"{processor.kwargs['max_length']}) or check which fields hold the targets"
        )
    return ProcessedDataset(base, processor, keep), lengths


def _flat_ids(value: Any) -> list:
    if hasattr(value, "reshape"):
        return value.reshape(-1).tolist()
    return list(value)
