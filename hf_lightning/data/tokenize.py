"""Tokenize a ``datasets.Dataset`` in a chosen format, counting what is truncated and dropped, and prune its
columns.

- :func:`tokenize_dataset`: the format functions of :mod:`hf_lightning.data.formats` through ``Dataset.map``
  (cached by ``datasets`` under the fingerprint of the data, the tokenizer and :func:`tokenizing_code`), then
  rows with no target are dropped; truncations and drops (per cause, see :mod:`~hf_lightning.data.formats`)
  are logged at WARNING. Streams and plain torch datasets take the same functions one example at a time
  (:mod:`~hf_lightning.data.on_the_fly`).
- :func:`prune_dataset`: HF ``remove_unused_columns``, the columns the model's ``forward`` does not take
  dropped.

Both tokenize whole documents for ``wrapped`` packing (it cuts the concatenation, so nothing is truncated),
end packed ``text`` documents with EOS, and take padding out of pre-tokenized rows bound for packed or
padding-free batches (:func:`~hf_lightning.data.on_the_fly.fn_kwargs_for`).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import datasets
import pyarrow.compute as pc

from hf_lightning.core.errors import DataError
from hf_lightning.data.formats import (
    REPORT_COLUMNS,
    SOURCE_COLUMNS,
    TOKENIZERS,
    RowReport,
    check_columns,
)
from hf_lightning.data.model_facts import Columns, check_inputs_survive
from hf_lightning.data.on_the_fly import ExampleProcessor, fn_kwargs_for, scan_torch_dataset
from hf_lightning.data.packing import UNPACKED, RowPlan
from hf_lightning.data.sources import describe_row, is_stream, non_utf8_error, row_names

__all__ = ["prepare_split", "prune_dataset", "tokenize_dataset"]

log = logging.getLogger(__name__)

PACKAGE = Path(__file__).resolve().parents[1]


class RowError(DataError):
    """A :class:`DataError` raised by one row of a batch; ``row`` is its index in the dataset being mapped."""

    def __init__(self, row: int, message: str) -> None:
        super().__init__(row, message)  # both in args, so the error pickles across map(num_proc=...) workers
        self.row = row
        self.message = message

    def __str__(self) -> str:
        return f"row {self.row}: {self.message}"


@functools.cache
def tokenizing_code(package: Path = PACKAGE) -> str:
    """A sha256 of the code that turns rows into tokens: the sources of ``package``'s ``data/*.py`` and
    ``core/batch.py``, and the ``transformers`` and ``tokenizers`` versions (chat templates, offsets).

    ``Dataset.map`` keys its cache on the data, the arguments and the map function, which ``datasets`` hashes
    by its module and name, not its code; passed as an argument of the map function, this digest makes rows
    tokenized by other code (another hf_lightning, an edited checkout) be tokenized again, never reused.
    """
    import tokenizers
    import transformers

    digest = hashlib.sha256(f"{transformers.__version__} {tokenizers.__version__}".encode())
    for path in [*sorted((package / "data").glob("*.py")), package / "core" / "batch.py"]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def tokenize_rows(
    batch: dict[str, list], indices: list[int], fmt: str, code: str = "", **kwargs: Any
) -> dict[str, list]:
    """``TOKENIZERS[fmt]`` for ``Dataset.map(batched=True, with_indices=True)``; a bad row is named.

    ``code``: :func:`tokenizing_code`, read by ``datasets``' cache fingerprint only.

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


def tokenize_dataset(
    ds: datasets.Dataset,
    fmt: str,
    tokenizer: Any,
    max_length: int,
    split: str,
    path: Any = None,
    label2id: Mapping[str, int] | None = None,
    num_proc: int | None = None,
    plan: RowPlan = UNPACKED,
) -> datasets.Dataset:
    """Tokenize ``ds`` in format ``fmt`` with ``Dataset.map`` (cached) and drop rows with no target.

    Columns the format does not read are kept (pruning against the model's ``forward`` is a separate step).
    ``plan``: what the rows are for (:class:`~hf_lightning.data.packing.RowPlan`, read by
    :func:`~hf_lightning.data.on_the_fly.fn_kwargs_for`). ``num_proc``: processes of ``Dataset.map``
    (``datasets``' own argument; ``None``: this process). The result, its row order and the row report are the
    same for any value (``map`` concatenates the shards in order, the report columns come back with the rows);
    one INFO line gives the rows, tokens and rates of the tokenization.

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
                f"{describe_row(ds, row, path, split)}: label {value!r} is not one of the {len(names)} "
                f"training labels {names[:20]}{' ...' if len(names) > 20 else ''}"
            ) from err
    start = time.perf_counter()
    try:
        out = _map_rows(
            ds,
            fmt,
            fn_kwargs_for(fmt, tokenizer, max_length, label2id, plan),
            split,
            num_proc,
        )
    except RowError as err:
        raise DataError(f"{describe_row(ds, err.row, path, split)}: {err.message}") from err
    except DataError as err:
        raise DataError(f"data.path={path} ({split}): {err}") from err
    except UnicodeDecodeError as err:  # pyarrow may load bad bytes and fail only when they are decoded
        raise non_utf8_error(path, split, err) from err
    log_rate(out, split, time.perf_counter() - start, num_proc)
    report = RowReport(split, row_names(ds, path, split))
    columns = [c for c in REPORT_COLUMNS if c in out.column_names]
    keep = report.add_columns(out.select_columns(columns).to_dict())
    # plain text (wrapped packing cuts none): HF run_clm's group_texts and TRL's wrapped packing keep the rest
    remedy = "; data.packing=wrapped keeps every token" if fmt == "text" else ""
    report.log(max_length, remedy=remedy)
    out = out.remove_columns(columns)
    if not keep:
        raise DataError(
            f"data.path={path}: the {split} split is empty after tokenization: {len(ds)} rows were read and "
            f"none has a trained-on token [{report.describe_causes()}]: {report.empty_remedy(max_length)}"
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
        fn_kwargs={"fmt": fmt, "code": tokenizing_code(), **kwargs},
        num_proc=num_proc,
        desc=f"tokenizing {split} ({fmt})",
    )


def _amount(n: float) -> str:
    """``7,473``; ``1.2 M``; ``390 k`` (three significant figures above 10,000)."""
    if n >= 1e6:
        return f"{n / 1e6:.3g} M"
    if n >= 1e4:
        return f"{n / 1e3:.3g} k"
    return f"{n:,.0f}"


def from_cache(out: datasets.Dataset, start: float) -> bool:
    """Whether ``Dataset.map`` served ``out`` from the ``datasets`` cache: every cache file is older than the
    call."""
    files = [f["filename"] for f in out.cache_files]
    wall_start = time.time() - (time.perf_counter() - start)
    return bool(files) and all(os.path.getmtime(f) < wall_start for f in files if os.path.exists(f))


def log_rate(out: datasets.Dataset, split: str, seconds: float, num_proc: int | None) -> None:
    """One INFO line: ``tokenized train: 7,473 rows, 1.2 M tokens in 3.1 s (2,410 rows/s, 390 k tokens/s),
    num_proc=2`` (tokens: the ``input_ids`` of every tokenized row, before rows without a target are
    dropped)."""
    rows = len(out)
    tokens = int(pc.sum(pc.list_value_length(out.data.column("input_ids"))).as_py() or 0)
    if from_cache(out, time.perf_counter() - seconds):
        log.info(
            "tokenized %s: %s rows, %s tokens read from the datasets cache in %.2f s (tokenized by an "
            "earlier run)",
            split,
            _amount(rows),
            _amount(tokens),
            seconds,
        )
        return
    log.info(
        "tokenized %s: %s rows, %s tokens in %.2f s (%s rows/s, %s tokens/s), num_proc=%s",
        split,
        _amount(rows),
        _amount(tokens),
        seconds,
        _amount(rows / max(seconds, 1e-9)),
        _amount(tokens / max(seconds, 1e-9)),
        num_proc or 1,
    )


def prune_dataset(
    ds: datasets.Dataset,
    keep: Sequence[str],
    model_input_names: Sequence[str],
    split: str,
    inputs_from: str = "the model inputs",
    consumed: Sequence[str] = (),
) -> tuple[datasets.Dataset, list[str]]:
    """Drop the columns of ``ds`` not in ``keep``; log them once at WARNING.

    ``consumed``: the source columns the data format has just tokenized (``text``, ``messages``, ...). Their
    drop is expected, so it is logged at INFO; any other dropped column is a WARNING (HF drops both silently).

    Returns:
        ``(pruned dataset, dropped column names)``.

    Raises:
        DataError: no column left that the model takes as input (lists columns and ``forward`` parameters).
    """
    dropped = [c for c in ds.column_names if c not in keep]
    check_inputs_survive(ds.column_names, keep, model_input_names, f"{split} split", inputs_from)
    if dropped:
        tokenized = [c for c in dropped if c in consumed]
        others = [c for c in dropped if c not in consumed]
        if tokenized:
            log.info("%s: source columns %s were tokenized and are dropped", split, tokenized)
        if others:
            log.warning(
                "%s: columns %s are not in %s and are dropped (remove_unused_columns=true)",
                split,
                others,
                inputs_from,
            )
        ds = ds.remove_columns(dropped)
    return ds, dropped


def prepare_split(
    ds: Any,
    fmt: str,
    split: str,
    path: Any,
    *,
    tokenizer: Any,
    max_length: int,
    processor: ExampleProcessor,
    columns: Columns | None,
    plan: RowPlan = UNPACKED,
    label2id: Mapping[str, int] | None = None,
    num_proc: int | None = None,
) -> tuple[Any, list[str] | None, list[int] | None]:
    """One split from source rows to model rows: ``(rows, dropped columns or None, token lengths or None)``.

    A stream is returned as it is (tokenized on the fly by :class:`~hf_lightning.data.streams.ShardedStream`);
    a torch map-style dataset is scanned once (:func:`~hf_lightning.data.on_the_fly.scan_torch_dataset`, which
    measures the lengths); a ``datasets.Dataset`` is tokenized (:func:`tokenize_dataset`) and pruned to
    ``columns`` (``None``: ``remove_unused_columns=false``). Rows bound for packing are then packed
    (``plan.pack``, :func:`~hf_lightning.data.packing.pack_dataset`). ``num_proc`` (``data.num_proc``) reaches
    ``Dataset.map``; a stream or a torch dataset is tokenized row by row (inside the ``DataLoader`` readers
    for a stream), so one INFO line says that it does not apply there.

    Raises:
        DataError: see :func:`tokenize_dataset`, :func:`prune_dataset`.
    """
    if num_proc is not None and not isinstance(ds, datasets.Dataset):
        log.info(
            "data.num_proc=%d does not apply to the %s split: %s is tokenized row by row, not with "
            "Dataset.map%s",
            num_proc,
            split,
            "a stream" if is_stream(ds) else "a torch dataset",
            " (data.num_workers spreads a stream's tokenization over DataLoader workers)"
            if is_stream(ds)
            else "",
        )
    if is_stream(ds):
        return ds, None, None
    dropped: list[str] | None = None  # None: not pruned here
    if not isinstance(ds, datasets.Dataset):
        view, lengths = scan_torch_dataset(ds, processor, split, path)
        if plan.pack is None:
            return view, dropped, lengths
        # packing needs the token rows side by side: the only columns it keeps, as a datasets.Dataset
        rows = [view[i] for i in range(len(view))]
        out = datasets.Dataset.from_dict(
            {
                "input_ids": [list(r["input_ids"]) for r in rows],
                "labels": [list(r.get("labels") or r["input_ids"]) for r in rows],
            }
        )
    else:
        out = tokenize_dataset(
            ds,
            fmt,
            tokenizer,
            max_length,
            split,
            path,
            label2id,
            num_proc=num_proc,
            plan=plan,
        )
        if columns is not None:
            consumed = SOURCE_COLUMNS.get(fmt, ())
            out, dropped = prune_dataset(
                out, columns.keep, columns.inputs, split, columns.inputs_from, consumed
            )
    if plan.pack is not None:
        out = plan.pack(out, split=split)
    return out, dropped, None
