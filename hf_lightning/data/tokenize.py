"""Tokenize each split in its format, counting what is truncated and dropped, and prune the columns the model
does not take.

- :func:`tokenize_dataset`: a ``datasets.Dataset``, through ``Dataset.map`` with the format functions of
  :mod:`~hf_lightning.data.formats` (cached by ``datasets`` under the fingerprint of the data, the tokenizer
  and :func:`tokenizing_code`); rows with no target are dropped, truncations and drops (per cause,
  :class:`~hf_lightning.data.formats.RowReport`) logged at WARNING.
- :class:`ExampleProcessor`: streams and plain torch datasets, one example at a time, as
  :func:`tokenize_dataset` would (inside ``DataLoader`` workers for a stream, see
  :mod:`~hf_lightning.data.streams`); :func:`scan_torch_dataset` reads a torch map-style dataset once to count
  truncations, drop rows without a target and measure lengths.
- Column pruning (HF ``remove_unused_columns``): the model's ``forward`` parameters plus ``label``,
  ``label_ids``, ``label_names`` and the layout's columns (``seq_lengths``, ``position_ids``) are kept
  (:func:`resolve_columns`), the rest dropped: from a
  ``datasets.Dataset`` once, up front (:func:`prune_dataset`), from each example of a dataset that keeps its
  columns, a stream or a torch dataset, in the collator (:class:`PruneColumnsCollator`). HF ``Trainer`` logs
  the dropped columns at INFO (so most users never see it); here the drop is logged once at WARNING, and a
  dataset left with no model input is an error that lists what was found (:func:`check_inputs_survive`),
  instead of an empty batch deep inside the model. Example: ``forward(input_ids, attention_mask,
  position_ids, labels)`` with columns ``input_ids, attention_mask, labels, label, text, id`` keeps
  ``input_ids, attention_mask, labels, label`` and drops ``text, id``.
- :func:`prepare_split`: one split from source rows to model rows (tokenized, pruned, packed).

Both ways tokenize whole documents for ``wrapped`` packing (it cuts the concatenation, so nothing is
truncated), end packed ``text`` documents with EOS, and take padding out of pre-tokenized rows bound for
packed or padding-free batches (:func:`fn_kwargs_for`).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import pyarrow as pa
import pyarrow.compute as pc
from torch.utils.data import Dataset

from hf_lightning.compat import selection_indices
from hf_lightning.core.errors import DataError
from hf_lightning.data.checks import forward_parameters, unwrap_model
from hf_lightning.data.formats import (
    ALL_PADDING,
    DOCUMENT_COLUMNS,
    EMPTY,
    REPORT_COLUMNS,
    SOURCE_COLUMNS,
    TOKENIZERS,
    RowReport,
    check_columns,
)
from hf_lightning.data.packing import UNPACKED, RowPlan
from hf_lightning.data.sampling import mask_example, token_count
from hf_lightning.data.sources import describe_row, is_stream, non_utf8_error, row_names, source_place

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


def check_labels_on_every_row(ds: datasets.Dataset, path: Any, split: str) -> None:
    """Pre-tokenized rows hold ``labels`` on every row or on none: refuse a mix, naming the first row without
    them in the file's order (a split's rows are shuffled; the loaded table is not), and the first with them.

    Raises:
        DataError: ``data.path=F line 1: field 'labels' is missing on this row while line 34 has it ...``.
    """
    if "labels" not in ds.column_names:
        return
    column = ds.data.table.column("labels")  # the loaded table: every row of the file, in its order
    missing = column.null_count
    if missing in (0, len(column)):
        return
    nulls = pc.is_null(column).to_pylist()
    first_missing, first_given = nulls.index(True), nulls.index(False)

    def place(row: int) -> str:
        return source_place(row, path) or f"row {row} of the data"

    indices = selection_indices(ds)  # a split's rows, as rows of the loaded table
    if indices is None:
        in_split = first_missing
    else:
        mapping = indices.column(0)
        in_split = pc.index(mapping, pa.scalar(first_missing, mapping.type)).as_py()
    own = f"{split} row {in_split}" if in_split is not None and in_split >= 0 else ""
    if source_place(0, path) is None:  # not a file: the split's row is the only name it has
        where = f"data.path ({own or place(first_missing)})"
    else:
        where = f"data.path={path} {place(first_missing)}" + (f" ({own})" if own else "")
    raise DataError(
        f"{where}: field 'labels' is missing on this row while {place(first_given)} has it ({missing} of "
        f"{len(column)} rows have none); give every row its labels (-100 where nothing is trained on), or "
        "drop the field from every row (then every token is a target)"
    )


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
    :func:`fn_kwargs_for`). ``num_proc``: processes of ``Dataset.map``
    (``datasets``' own argument; ``None``: this process). The result, its row order and the row report are the
    same for any value (``map`` concatenates the shards in order, the report columns come back with the rows);
    one INFO line gives the rows, tokens and rates of the tokenization.

    Returns:
        the tokenized dataset: ``input_ids`` (and ``attention_mask``, ``labels`` or ``label`` per format).

    Raises:
        DataError: a missing field, a bad value (the message names the path and split), or an empty result.
    """
    check_columns(ds.column_names, fmt, path, split)
    if fmt == "tokenized":
        check_labels_on_every_row(ds, path, split)
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
        raise report.empty_error(path, max_length)
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


# ---------------------------------------------------------------- one example at a time (streams, torch data)
def fn_kwargs_for(
    fmt: str,
    tokenizer: Any,
    max_length: int,
    label2id: Mapping[str, int] | None,
    plan: RowPlan = UNPACKED,
) -> dict:
    """The keyword arguments of format ``fmt``'s function for rows bound for ``plan``.

    ``wrapped`` packing tokenizes whole documents (``max_length=None``: the concatenation is cut, no document
    is truncated; HF ``run_clm``'s ``group_texts`` and TRL's ``wrapped`` keep every token too); packed
    ``text`` ends each document with EOS; packed and padding-free pre-tokenized rows lose their padding.
    """
    kwargs: dict[str, Any] = {"tokenizer": tokenizer, "max_length": max_length if plan.truncate else None}
    if fmt == "classification":
        kwargs["label2id"] = dict(label2id) if label2id else None
    if fmt == "text":
        kwargs["add_eos"] = plan.add_eos
    if fmt == "tokenized":
        kwargs["drop_padding"] = plan.drop_padding
    return kwargs


class ExampleProcessor:
    """Tokenizes one example on the fly (streams, plain torch datasets), as
    :func:`tokenize_dataset` would.

    Args:
        fmt: a format name of :mod:`~hf_lightning.data.formats`.
        tokenizer / max_length / label2id / plan: as for :func:`tokenize_dataset`.

    Calling it with one example mapping returns ``(example, report)``: the example keeps the columns the
    format does not read; ``report`` holds its report columns (:mod:`~hf_lightning.data.formats`). A row
    without a target comes back as a zero-weight stand-in (labels all -100; one pad token when it has no real
    token, so that no ``(B, 0)`` batch can reach a model), for streams that cannot drop it. Picklable (runs
    inside ``DataLoader`` workers).

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
        plan: RowPlan = UNPACKED,
    ) -> None:
        self.fmt = fmt
        self.fn = TOKENIZERS[fmt]
        self.kwargs = fn_kwargs_for(fmt, tokenizer, max_length, label2id, plan)
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
        """``row`` with no loss term; a row with no real token becomes one pad token (attended, label
        -100)."""
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
    """One pass over a torch map-style dataset: ``(view without target-less rows, token length of each kept
    row)``.

    Truncated and dropped rows are counted and logged at WARNING (per cause), as
    :func:`tokenize_dataset` does.

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
            lengths.append(token_count(row["input_ids"]))
    report.log(processor.kwargs["max_length"])
    if not keep:
        raise report.empty_error(path, processor.kwargs["max_length"])
    return ProcessedDataset(base, processor, keep), lengths


# ------------------------------------------------------------------------------ column pruning
# HF's default collator accepts labels under these names too (``Trainer._set_signature_columns_if_needed``)
LABEL_COLUMNS = ("label", "label_ids")
# inputs that only qualify another input: a batch of these alone (an image model's ``attention_mask`` kept
# from text data) gives the model nothing to read
AUXILIARY_INPUTS = ("attention_mask", "token_type_ids", "position_ids", "decoder_attention_mask", "head_mask")


def find_label_names(model: Any) -> list[str]:
    """HF's ``transformers.utils.find_labels`` of the (unwrapped) model's class: ``forward`` parameters with
    ``label`` in their name, plus ``start_positions``/``end_positions`` for question answering; ``["labels"]``
    if none."""
    from transformers.utils import find_labels

    return find_labels(type(unwrap_model(model))) or ["labels"]


def signature_columns(model_input_names: Iterable[str], label_names: Iterable[str]) -> list[str]:
    """The columns pruning keeps: model inputs, then ``label``, ``label_ids`` and ``label_names``, then the
    layout's own columns (``seq_lengths``, ``position_ids``: where a row's documents start, which the
    collators turn into per-document positions; TRL's ``SFTTrainer`` keeps ``seq_lengths`` the same way)."""
    keep = list(dict.fromkeys(model_input_names))
    keep += [c for c in (*LABEL_COLUMNS, *label_names, *DOCUMENT_COLUMNS) if c not in keep]
    return keep


def check_inputs_survive(
    columns: Sequence[str],
    keep: Sequence[str],
    model_input_names: Sequence[str],
    where: str,
    inputs_from: str,
) -> None:
    inputs = [
        c
        for c in model_input_names
        if c in columns and c not in LABEL_COLUMNS and "label" not in c and c not in AUXILIARY_INPUTS
    ]
    if not inputs:
        raise DataError(
            f"{where}: no model input survives column pruning. Columns found: {sorted(columns)}; "
            f"model inputs ({inputs_from}): {list(model_input_names)}. Tokenize into one of those "
            "(usually input_ids), pass data.model_input_names, or set data.remove_unused_columns=false"
        )


@dataclass(frozen=True)
class Columns:
    """What column pruning keeps: ``keep`` (model inputs, then the label columns), ``inputs`` (the model's
    input names) and ``inputs_from`` (where those came from, for messages)."""

    keep: list[str]
    inputs: list[str]
    inputs_from: str


def resolve_columns(
    model: Any, model_input_names: Sequence[str] | None, label_names: Sequence[str], tokenizer: Any
) -> Columns:
    """:class:`Columns` of a model (or of ``model_input_names``, else the tokenizer's names) and
    ``label_names``."""
    inputs, inputs_from = resolve_model_inputs(model, model_input_names, tokenizer)
    return Columns(signature_columns(inputs, label_names), inputs, inputs_from)


def resolve_model_inputs(
    model: Any, model_input_names: Sequence[str] | None, tokenizer: Any
) -> tuple[list[str], str]:
    """``(model input names, where they came from)`` for pruning.

    In order: the explicit ``model_input_names``; the ``forward`` signature of ``model`` (the bound model);
    the tokenizer's ``model_input_names`` (what it produces; logged at
    WARNING because the model's real signature is unknown then).
    """
    if model_input_names is not None:
        return list(model_input_names), "data.model_input_names"
    if model is not None:
        return forward_parameters(model), f"{type(unwrap_model(model)).__name__}.forward"
    names = list(getattr(tokenizer, "model_input_names", None) or ["input_ids", "attention_mask"])
    log.warning(
        "no model to read forward() from (none bound: HFDataModule.bind(model), or a LightningModule with "
        "data_binding(); and data.model_input_names is not set): pruning columns to the tokenizer's "
        "model_input_names %s plus the label columns",
        names,
    )
    return names, "tokenizer.model_input_names"


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


class PruneColumnsCollator:
    """Collator wrapper that filters each example mapping to ``keep`` (HF's ``RemoveColumnsCollator``).

    For datasets whose columns cannot be removed up front (streams, plain torch datasets). The first batch
    that loses a key logs the dropped keys once at WARNING; :attr:`dropped` records them.

    Raises:
        DataError: an example with no model input left (lists keys and ``forward`` parameters).
    """

    def __init__(
        self,
        collator: Callable[[list[Mapping[str, Any]]], Any],
        keep: Sequence[str],
        model_input_names: Sequence[str],
        split: str = "train",
        inputs_from: str = "the model inputs",
    ) -> None:
        self.collator = collator
        self.keep = list(keep)
        self.model_input_names = list(model_input_names)
        self.split = split
        self.inputs_from = inputs_from
        self.dropped: list[str] = []
        self._checked = False

    def inspect(self, example: Mapping[str, Any]) -> None:
        """Check one example: raise if no model input survives, log keys dropped for the first time."""
        if not self._checked:
            check_inputs_survive(
                list(example), self.keep, self.model_input_names, f"{self.split} examples", self.inputs_from
            )
            self._checked = True
        extra = [k for k in example if k not in self.keep and k not in self.dropped]
        if extra:
            self.dropped += extra
            log.warning(
                "%s: keys %s are not in %s and are dropped from every example (remove_unused_columns=true)",
                self.split,
                extra,
                self.inputs_from,
            )

    def __call__(self, examples: Sequence[Mapping[str, Any]]) -> Any:
        for ex in examples:
            self.inspect(ex)
        return self.collator([{k: v for k, v in ex.items() if k in self.keep} for ex in examples])


def prune_per_example(
    base: Callable[[list[Mapping[str, Any]]], Any],
    columns: Any,
    example: Mapping[str, Any] | None,
    split: str,
) -> PruneColumnsCollator:
    """``base`` behind a :class:`PruneColumnsCollator` of ``columns`` (a
    :class:`Columns`), for datasets that keep their columns (streams, torch
    datasets).

    ``example``, the split's first, is checked at once, in the main process: the drop is logged once (not once
    per worker) and a dataset without model inputs fails at setup rather than in the first batch.

    Raises:
        DataError: ``example`` has no model input left.
    """
    collator = PruneColumnsCollator(base, columns.keep, columns.inputs, split, columns.inputs_from)
    if example is not None:
        collator.inspect(example)
    return collator


# ------------------------------------------------------------------------------ one split
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
    a torch map-style dataset is scanned once (:func:`scan_torch_dataset`, which
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
