"""Sources: load the training, validation and test data, rename columns, tell the format from the schema, and
say where in a file a row, or what ``datasets`` could not read, is.

Sources: a json/jsonl/csv/parquet file, a folder written by ``save_to_disk`` (read as a stream with
``streaming=True``), an in-memory ``datasets.Dataset`` / ``DatasetDict`` / ``IterableDataset`` /
``IterableDatasetDict``, a plain torch ``Dataset`` or ``IterableDataset`` of example mappings, or ``None`` for
the embedded chatterbot-corpus default.

A ``datasets.Dataset`` with a format or a transform is judged on what its rows return, not on its stored
columns: ``set_transform`` / ``with_transform`` (e.g. tokenizing on access), ``set_format(columns=[...])`` and
``set_format("torch")`` change what ``ds[i]`` returns without changing ``ds.column_names``; ``Dataset.map``
hands the transformed rows to its function. Reading formats and pruning off the stored columns while mapping
the transformed ones broke both ways (``KeyError: 'text'`` when the transform tokenized the text away; the
stored ``input_ids`` used when the format showed only ``text``). HF ``Trainer`` trains on what ``ds[i]``
returns, and so does hf_lightning: :func:`as_returned` turns such a dataset into a plain one holding exactly
those rows.

Where in the file: errors name the path and, where they can, the line. ``datasets.load_dataset`` reports a
broken file as ``DatasetGenerationError: An error occurred while generating the dataset`` with the parser's
error as its cause (``pyarrow``'s ``JSON parse error ... in row 56`` counts rows of one read block, not lines
of the file), a non-UTF-8 byte as a ``UnicodeDecodeError`` at an offset of an internal buffer, and an empty
file as a bare ``StopIteration``. On that error path only, the file is read again line by line to find the
culprit, so the message can say ``line 57`` and show the line.

Rows and lines: the ``json`` builder skips blank lines of a JSON Lines file, so source row ``r`` (0-based) is
the ``r + 1``-th non-blank line (:func:`jsonl_lines`).

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

import csv
import json
import logging
import math
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from hf_lightning.compat import selection_indices
from hf_lightning.core.errors import ConfigError, DataError
from hf_lightning.data.formats import (
    DETECTION_ORDER,
    SOURCE_COLUMNS,
    fitting_formats,
    guess_source,
    rename_hint,
    row_numbers,
    spare_columns,
)

log = logging.getLogger(__name__)

BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}
VALIDATION_SPLITS = ("validation", "valid", "val", "test")
#: bytes read at a time by the line scan
CHUNK = 8 << 20
#: the default of ``data.max_row_bytes`` (16 MiB)
DEFAULT_MAX_ROW_BYTES = 16 << 20
EXCERPT = 80


def _read_by_lines(p: Path, builder: str) -> bool:
    """Whether ``datasets`` reads ``p`` line by line (JSON Lines, CSV); not a JSON array document."""
    if builder == "csv" or p.suffix.lower() == ".jsonl":
        return True
    if builder != "json":
        return False
    with open(p, "rb") as fh:
        return not fh.read(4096).lstrip().startswith(b"[")


def _load_file(
    path: str, streaming: bool = False, max_row_bytes: int | None = DEFAULT_MAX_ROW_BYTES
) -> datasets.Dataset | datasets.IterableDataset:
    p = Path(path)
    builder = BUILDERS.get(p.suffix.lower())
    if builder is None:
        raise DataError(
            f"data.path={path}: unsupported file type {p.suffix!r}; expected one of "
            f"{sorted(BUILDERS)} or a folder written by Dataset.save_to_disk"
        )
    if not os.access(p, os.R_OK):
        raise DataError(f"data.path={path}: the file exists but cannot be read (permissions)")
    if _read_by_lines(p, builder):
        check_line_sizes(str(p), max_row_bytes)  # before datasets reads a line whole
    drop_reader_error_logs()  # the DataError below says what the reader's ERROR record said, and the line
    try:
        loaded = datasets.load_dataset(builder, data_files=str(p), split="train", streaming=streaming)
    except Exception as err:  # datasets wraps parser errors in several types; name the file and the line
        raise DataError(f"data.path={path}: {explain_load_error(str(p), builder, err)}") from err
    check_row_sizes(loaded, max_row_bytes, path)
    return loaded


def _load_folder(path: str) -> datasets.Dataset | datasets.DatasetDict:
    try:
        return datasets.load_from_disk(path)
    except Exception as err:
        raise DataError(
            f"data.path={path}: a folder, but not one written by Dataset.save_to_disk / "
            f"DatasetDict.save_to_disk ({err})"
        ) from err


def _same(batch: dict[str, Any]) -> dict[str, Any]:
    return batch


def as_returned(ds: datasets.Dataset, name: Any) -> datasets.Dataset:
    """``ds`` as plain Arrow rows equal to what ``ds[i]`` returns (``ds`` itself when it has no format).

    - a format transform (``set_transform`` / ``with_transform``): the rows are read through it once, in
      memory (``Dataset.map`` without a cache file, so a changed transform is never served from a cache), and
      only the columns it returns are kept;
    - ``set_format(columns=...)`` without ``output_all_columns``: only those columns;
    - a tensor format (``torch``, ``numpy``, ...): the same values as Python lists.

    One INFO line says what was done.

    Raises:
        DataError: the transform fails on the dataset's rows (the message names ``data.path`` and the error).
    """
    fmt = ds.format
    stored = list(ds.column_names)
    if fmt["type"] == "custom":
        from datasets.fingerprint import generate_random_fingerprint

        try:
            out = ds.map(
                _same,
                batched=True,
                remove_columns=stored,
                keep_in_memory=True,
                load_from_cache_file=False,
                new_fingerprint=generate_random_fingerprint(),
                desc="reading rows through the dataset's transform",
            )
        except Exception as err:  # the user's transform: any exception type
            raise DataError(
                f"data.path={name}: reading its rows through the dataset's transform (set_transform / "
                f"with_transform) failed: {type(err).__name__}: {err}. Fix the transform, or apply it with "
                "Dataset.map and pass the result"
            ) from err
        out = out.with_format(None)
        log.info(
            "data.path=%s: a dataset with a format transform; training on what it returns: %d rows with the "
            "columns %s (read through the transform once; its stored columns %s are not used)",
            name,
            len(out),
            out.column_names,
            stored,
        )
        return out
    columns = fmt["columns"]
    if columns is not None and not fmt["output_all_columns"] and set(columns) != set(stored):
        ds = ds.select_columns(list(columns))
        hidden = [c for c in stored if c not in columns]
        log.info(
            "data.path=%s: the dataset's format returns the columns %s only; the stored columns %s are not "
            "used",
            name,
            list(columns),
            hidden,
        )
    return ds.with_format(None) if ds.format["type"] is not None else ds


IN_MEMORY = (
    datasets.Dataset,
    datasets.DatasetDict,
    datasets.IterableDataset,
    datasets.IterableDatasetDict,
    torch.utils.data.Dataset,
)


def _as_stream(loaded: Any) -> Any:
    if isinstance(loaded, datasets.Dataset):
        return loaded.to_iterable_dataset()
    if isinstance(loaded, datasets.DatasetDict):
        return datasets.IterableDatasetDict({k: v.to_iterable_dataset() for k, v in loaded.items()})
    return loaded


def _as_returned(loaded: Any, name: Any) -> Any:
    """Each ``datasets.Dataset`` as the rows it returns (its format or transform applied)."""
    if isinstance(loaded, datasets.DatasetDict):
        return datasets.DatasetDict({k: as_returned(v, f"{name} split {k!r}") for k, v in loaded.items()})
    return as_returned(loaded, name)


def _load_hub(repo_id: str, name: str | None, revision: str | None, streaming: bool) -> Any:
    """``datasets.load_dataset(repo_id, name, revision=revision, streaming=streaming)`` (every split).

    Raises:
        DataError: the id is neither cached nor reachable, or the config ``name`` does not exist (one line).
    """
    from hf_lightning.models.files import is_hub_failure
    from hf_lightning.models.hub import hub_error_message

    try:
        return datasets.load_dataset(repo_id, name, revision=revision, streaming=streaming)
    except ValueError as err:  # an unknown config name: datasets lists the available ones
        text = " ".join(str(err).split())
        if "config" in text.lower() and name is not None:
            raise DataError(
                f"data.name={name}: not a config of the hub dataset {repo_id} ({text[:300]})"
            ) from None
        raise DataError(f"data.path={repo_id}: the hub dataset could not be loaded ({text[:300]})") from None
    except Exception as err:  # connection, cache and repository errors come in many types
        if is_hub_failure(err) or isinstance(err, (ConnectionError, FileNotFoundError)):
            raise DataError(hub_error_message("data.path", repo_id, "dataset", revision, err, name)) from None
        raise


def load_source(
    source: Any,
    streaming: bool = False,
    name: str | None = None,
    revision: str | None = None,
    max_row_bytes: int | None = DEFAULT_MAX_ROW_BYTES,
) -> Any:
    """Load one source.

    Args:
        source: a path (file or ``save_to_disk`` folder) or an in-memory dataset (returned as it is; a
            ``datasets.Dataset`` with a format or a transform as the rows it returns, see
            :func:`as_returned`).
        streaming: read a file lazily (``load_dataset(..., streaming=True)``) or a ``save_to_disk`` folder
            as ``Dataset.to_iterable_dataset()``; the result is a ``datasets.IterableDataset``.
        name / revision: a hub dataset's config name and revision (``load_dataset``'s ``name`` and
            ``revision``), when ``source`` is a hub id (:func:`hf_lightning.models.hub.looks_like_hub_id`).
        max_row_bytes: the most bytes one row may hold (``data.max_row_bytes``; ``None``: no bound), checked
            on the lines of a JSON Lines or CSV file before it is read and on the text of each row of a
            ``datasets.Dataset`` (below).

    Raises:
        DataError: the path does not exist, cannot be read, or has an unsupported type; a hub id that is
            neither cached nor reachable; a line or row longer than ``max_row_bytes``.
    """
    if isinstance(source, (datasets.Dataset, datasets.DatasetDict)):
        return _sized(_as_returned(source, "<in-memory dataset>"), max_row_bytes, "<in-memory dataset>")
    if isinstance(source, IN_MEMORY):
        return source
    try:
        path = os.fspath(source)
    except TypeError as err:
        raise DataError(
            f"data.path: unsupported source of type {type(source).__name__}; expected a file or folder path, "
            "a datasets.Dataset/IterableDataset (or a dict of them) or a torch Dataset/IterableDataset"
        ) from err
    if not os.path.exists(path):
        from hf_lightning.models.hub import looks_like_hub_id

        if looks_like_hub_id(path):
            loaded = _load_hub(path, name, revision, streaming)
            return loaded if streaming else _sized(_as_returned(loaded, path), max_row_bytes, path)
        raise DataError(f"data.path={path}: no such file or folder")
    if os.path.isdir(path):
        loaded = _as_returned(_load_folder(path), path)  # save_to_disk keeps a format's type and columns
        loaded = _sized(loaded, max_row_bytes, path)  # before a stream hides its rows
        return _as_stream(loaded) if streaming else loaded
    return _load_file(path, streaming=streaming, max_row_bytes=max_row_bytes)


def _sized(loaded: Any, max_row_bytes: int | None, name: Any) -> Any:
    """``loaded`` after :func:`check_row_sizes` on each of its splits."""
    for ds in loaded.values() if isinstance(loaded, datasets.DatasetDict) else [loaded]:
        check_row_sizes(ds, max_row_bytes, name)
    return loaded


def is_stream(ds: Any) -> bool:
    """Whether ``ds`` is read by iteration only (``datasets.IterableDataset`` or torch
    ``IterableDataset``)."""
    return isinstance(ds, (datasets.IterableDataset, torch.utils.data.IterableDataset))


def split_train_validation(
    loaded: Any,
    validation_split: float,
    seed: int,
    path: Any,
    split: str = "train",
    validation_split_name: str | None = None,
) -> tuple[Any, Any, float | None]:
    """Pick or make the train and validation splits: ``(train, validation or None, stream hold-out or None)``.

    A ``DatasetDict`` / ``IterableDatasetDict`` uses its ``split`` split (``data.split``, default ``train``)
    and its ``validation_split_name`` split, or by default its first split named validation/valid/val/test.
    Otherwise ``validation_split`` of the rows is held out (``0`` means no validation): a ``datasets.Dataset``
    with ``Dataset.train_test_split(seed=seed)``, a torch map-style dataset with a permutation seeded by
    ``seed``, and a stream by a stable hash of each row's content (the third value is then the fraction, and
    train and validation are the same stream read with opposite filters).

    Raises:
        DataError: no ``split`` (or no ``validation_split_name``) split, an empty dataset, or a hold-out that
            leaves no row to train on (:func:`check_holdout`).
    """
    if isinstance(loaded, (datasets.DatasetDict, datasets.IterableDatasetDict)):
        if split not in loaded:
            if split == "train":
                raise DataError(f"data.path={path}: no 'train' split (splits: {list(loaded)})")
            raise DataError(f"data.split={split}: no such split in {path} (splits: {list(loaded)})")
        if validation_split_name is not None and validation_split_name not in loaded:
            raise DataError(
                f"data.validation_split_name={validation_split_name}: no such split in {path} (splits: "
                f"{list(loaded)})"
            )
        names = (
            [validation_split_name] if validation_split_name else [s for s in VALIDATION_SPLITS if s != split]
        )
        val = next((loaded[s] for s in names if s in loaded), None)
        train = loaded[split]
    else:
        train, val = loaded, None
    if is_stream(train):
        if val is None and validation_split > 0:
            log.info(
                "stream: holding out about %.1f%% of the rows for validation (by content hash)",
                100 * validation_split,
            )
            return train, train, validation_split
        return train, val, None
    if len(train) == 0:
        raise DataError(f"data.path={path}: the dataset is empty")
    if val is None and validation_split > 0:
        check_holdout(len(train), validation_split, path, isinstance(train, datasets.Dataset))
        if isinstance(train, datasets.Dataset):
            parts = train.train_test_split(test_size=validation_split, seed=seed, shuffle=True)
            train, val = parts["train"], parts["test"]
        else:
            perm = torch.randperm(len(train), generator=torch.Generator().manual_seed(seed)).tolist()
            n_val = max(1, round(validation_split * len(train)))
            train, val = (
                torch.utils.data.Subset(train, perm[n_val:]),
                torch.utils.data.Subset(train, perm[:n_val]),
            )
        log.info("held out %d of %d rows for validation (seed %d)", len(val), len(train) + len(val), seed)
    return train, val, None


def held_out_rows(n: int, validation_split: float, is_datasets: bool) -> int:
    """Rows that ``validation_split`` holds out of ``n``: ``ceil(validation_split * n)`` as
    ``Dataset.train_test_split(test_size=...)`` counts them, ``max(1, round(...))`` for a torch dataset."""
    if is_datasets:
        return math.ceil(validation_split * n)
    return max(1, round(validation_split * n))


def check_holdout(n: int, validation_split: float, path: Any, is_datasets: bool = True) -> None:
    """Refuse a hold-out that leaves no row to train on (one row, or ``validation_split`` near 1 on a few).

    Raises:
        DataError: names ``data.validation_split`` and what to set instead.
    """
    held = held_out_rows(n, validation_split, is_datasets)
    if held < n:
        return
    name = path if isinstance(path, (str, os.PathLike)) else "<in-memory dataset>"
    rows = f"{n} row{'s' if n != 1 else ''}"
    raise DataError(
        f"data.path={name}: {rows}, too few to hold out a validation split: data.validation_split="
        f"{validation_split:g} holds out {held} (at least one row) and leaves none to train on. Set "
        "data.validation_split=0 to train on every row without validation, or give the validation rows in "
        "their own file with data.validation_path=FILE"
    )


def load_splits(
    path: Any,
    validation_path: Any,
    validation_split: float,
    seed: int,
    streaming: bool,
    rename_columns: Mapping[str, str] | None,
    *,
    name: str | None = None,
    revision: str | None = None,
    split: str = "train",
    validation_split_name: str | None = None,
    max_row_bytes: int | None = DEFAULT_MAX_ROW_BYTES,
) -> tuple[Any, Any, Any, float | None]:
    """``(path, train, validation or None, stream hold-out or None)`` of the DataModule's arguments.

    ``path=None`` is the embedded chatterbot-corpus data (its train and validation files);
    ``validation_path`` overrides any split of ``path``; ``rename_columns`` is applied to both splits;
    ``name``, ``revision``, ``split``, ``validation_split_name``, ``max_row_bytes``: see :func:`load_source`
    and :func:`split_train_validation`.

    Raises:
        ConfigError: ``rename_columns`` with a source that is not a ``datasets`` one.
        DataError: see :func:`load_source`, :func:`split_train_validation`; a renamed column not in the
        source.
    """
    if path is None:
        from hf_lightning.defaults import prepare_chatterbot

        files = prepare_chatterbot()
        path, validation_path = files["train"], files["validation"]
    loaded = load_source(path, streaming=streaming, name=name, revision=revision, max_row_bytes=max_row_bytes)
    fraction = 0.0 if validation_path is not None else validation_split
    train, val, holdout = split_train_validation(loaded, fraction, seed, path, split, validation_split_name)
    if validation_path is not None:
        val = load_source(validation_path, streaming=streaming, max_row_bytes=max_row_bytes)
        if isinstance(val, (datasets.DatasetDict, datasets.IterableDatasetDict)):
            val = next(iter(val.values()))
    if rename_columns:
        train = _renamed(train, path, rename_columns)
        val = _renamed(val, validation_path or path, rename_columns) if val is not None else None
    return path, train, val, holdout


def load_validation(
    validation_path: Any,
    streaming: bool,
    rename_columns: Mapping[str, str] | None,
    max_row_bytes: int | None = DEFAULT_MAX_ROW_BYTES,
) -> Any:
    """The validation file alone, renamed as :func:`load_splits` renames it (an evaluation reads no train
    split).

    Raises:
        ConfigError, DataError: as :func:`load_splits`.
    """
    val = load_source(validation_path, streaming=streaming, max_row_bytes=max_row_bytes)
    if isinstance(val, (datasets.DatasetDict, datasets.IterableDatasetDict)):
        val = next(iter(val.values()))
    return _renamed(val, validation_path, rename_columns) if rename_columns else val


def load_test(
    path: Any,
    test_path: Any,
    test_split_name: str | None,
    streaming: bool,
    rename_columns: Mapping[str, str] | None,
    *,
    name: str | None = None,
    revision: str | None = None,
    max_row_bytes: int | None = DEFAULT_MAX_ROW_BYTES,
) -> tuple[Any, Any]:
    """The test split of the DataModule's arguments: ``(rows, where they come from)``, or ``(None, why there
    is none)``.

    ``test_path`` (a file, folder, hub id or in-memory dataset, as ``path``; a dataset with splits gives its
    first) wins; otherwise the ``test_split_name`` split (default ``test``) of ``path`` when ``path`` has
    splits (a hub dataset, a ``DatasetDict``, a ``save_to_disk`` folder of one). ``rename_columns`` is applied
    as to the other splits, and ``max_row_bytes`` bounds its rows as theirs. A split that is also the
    validation split (a source with only ``train`` and ``test``) is read for both.

    Raises:
        DataError: ``test_split_name`` naming a split ``path`` does not have; see :func:`load_source`.
    """
    if test_path is not None:
        return load_validation(test_path, streaming, rename_columns, max_row_bytes), test_path
    split = test_split_name or "test"
    if path is None:
        if test_split_name is not None:
            raise DataError(
                f"data.test_split_name={test_split_name}: data.path=null (the embedded chatterbot-corpus "
                "data) has no splits to choose from; set data.test_path"
            )
        return None, "data.path=null (the embedded chatterbot-corpus data) has no test split"
    loaded = load_source(path, streaming=streaming, name=name, revision=revision, max_row_bytes=max_row_bytes)
    where = path if isinstance(path, (str, os.PathLike)) else "<in-memory dataset>"
    if not isinstance(loaded, (datasets.DatasetDict, datasets.IterableDatasetDict)):
        if test_split_name is not None:
            raise DataError(f"data.test_split_name={test_split_name}: data.path={where} has no splits")
        return None, f"data.path={where} has no splits"
    if split not in loaded:
        if test_split_name is not None:
            raise DataError(
                f"data.test_split_name={test_split_name}: no such split in {where} (splits: {list(loaded)})"
            )
        return None, f"data.path={where} has no 'test' split (splits: {list(loaded)})"
    test = loaded[split]
    return (_renamed(test, path, rename_columns) if rename_columns else test), path


def _renamed(ds: Any, path: Any, rename_columns: Mapping[str, str]) -> Any:
    """``ds`` with ``data.rename_columns`` applied (datasets sources only)."""
    if not hasattr(ds, "rename_columns"):
        raise ConfigError(
            f"data.rename_columns needs a datasets source; data.path={path} is {type(ds).__name__}"
        )
    columns = column_names(ds, path)
    missing = [c for c in rename_columns if c not in columns]
    if missing:
        raise DataError(_missing_rename_message(missing, rename_columns, columns, path))
    return ds.rename_columns(dict(rename_columns))


def _missing_rename_message(
    missing: Sequence[str], rename_columns: Mapping[str, str], columns: Sequence[str], path: Any
) -> str:
    """The refusal of renames whose source column the file lacks, with the overrides that fix them: drop a
    rename when the file already has its new name, else rename the file's own column (``+experiment=
    classification`` renames ``category`` to ``label``; a file that calls it ``intent`` gets
    ``'~data.rename_columns.category' data.rename_columns.intent=label``)."""
    renames = ", ".join(f"{source!r} to {rename_columns[source]!r}" for source in missing)
    targets = [rename_columns[source] for source in missing]
    readers: dict[str, list[str]] = {}
    for target in targets:
        if target != "text":  # every text format reads it: no help
            for fmt in (f for f in DETECTION_ORDER if target in SOURCE_COLUMNS[f]):
                readers.setdefault(fmt, []).append(repr(target))
    why = "".join(f"; the {fmt} format reads {' and '.join(names)}" for fmt, names in readers.items())
    spare = spare_columns([c for c in columns if c not in rename_columns])
    fixes = []
    for source, target in zip(missing, targets):
        fixes.append(f"'~data.rename_columns.{source}'")
        if target not in columns:
            own = guess_source(target, spare)
            if own is not None:
                spare.remove(own)
            fixes.append(f"data.rename_columns.{own or 'COLUMN'}={target}")
    present = [repr(t) for t in targets if t in columns]
    how = (
        f"drop the rename (the file has {', '.join(present)} already):"
        if len(present) == len(targets)
        else "drop the rename and rename the file's own column, e.g."
    )
    absent = " or ".join(map(repr, missing))
    return (
        f"data.rename_columns renames {renames}, but data.path={path} has no {absent} column (its columns: "
        f"{list(columns)}{why}): {how} {' '.join(fixes)}"
    )


def column_names(ds: Any, path: Any) -> list[str]:
    """The schema's column names; a source without a schema (torch data, some streams) shows its first row."""
    names = getattr(ds, "column_names", None)
    if names:
        return list(names)
    try:
        first = next(iter(ds)) if is_stream(ds) else ds[0]
    except (DataError, StopIteration):
        raise
    except Exception as err:  # a stream reads its file only now: a broken line shows here first
        raise read_error(path, "train", err) from err
    if not isinstance(first, dict):
        raise DataError(
            f"data.path={path}: examples must be mappings of column -> value, got {type(first).__name__}"
        )
    log.info("the source has no schema; reading the column names from its first row: %s", sorted(first))
    return list(first)


def detect_format(columns: Sequence[str], path: Any = None) -> str:
    """The format of a dataset with these column names (see the module table).

    Raises:
        DataError: no known layout; the message lists the columns found, the layouts expected, and the
            ``+data.rename_columns`` / ``data.format`` overrides that fix it.
    """
    fits = fitting_formats(columns)
    if fits:
        return fits[0]
    layouts = ", ".join(f"{fmt}: {'+'.join(SOURCE_COLUMNS[fmt])}" for fmt in DETECTION_ORDER)
    raise DataError(
        f"data.path={path}: cannot tell the data format from the columns {list(columns)}: no format fits "
        f"them (formats and their columns: {layouts}). Rename the columns to a format's, e.g. "
        f"{rename_hint(columns)}, or set data.format=NAME"
    )


def _chain(err: BaseException) -> Iterator[BaseException]:
    """``err``, then its ``raise ... from`` / implicit-context chain, down to the innermost exception."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _excerpt(text: str) -> str:
    text = text.rstrip("\r\n")
    return repr(text if len(text) <= EXCERPT else text[:EXCERPT] + "...")


def first_non_utf8_line(path: str) -> tuple[int, int, int, bytes] | None:
    """``(line number, column, offending byte, raw line)`` of the first line that is not UTF-8, else ``None``.

    Line and column are 1-based; the column counts bytes.
    """
    with open(path, "rb") as fh:
        for number, raw in enumerate(fh, start=1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as err:
                return number, err.start + 1, raw[err.start], raw
    return None


def first_bad_json_line(path: str) -> tuple[int, str, str] | None:
    """``(line number, parser message, line excerpt)`` of the first non-blank line of a JSON Lines file that
    is not one JSON object, else ``None``."""
    with open(path, encoding="utf-8", errors="replace") as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                value = json.loads(line.rstrip("\r\n"))
            except json.JSONDecodeError as err:
                return number, f"{err.msg}: column {err.colno}", _excerpt(line)
            if not isinstance(value, dict):
                return number, f"a JSON {type(value).__name__}, not an object", _excerpt(line)
    return None


def csv_line_of_row(path: str, row: int) -> int | None:
    """The 1-based line of a CSV file where data row ``row`` (0-based, the header not counted) starts.

    Read as ``pandas.read_csv`` reads by default (the ``datasets`` csv builder): comma-separated, double
    quotes (a quoted field may span lines), blank lines skipped.
    """
    with open(path, encoding="utf-8", errors="replace", newline="") as fh:
        reader = csv.reader(fh)
        seen, start = -2, 1  # -2: the header is not a data row
        for record in reader:
            if record:
                seen += 1
                if seen == row:
                    return start
            start = reader.line_num + 1
    return None


def is_json_lines(path: str) -> bool:
    """Whether ``path`` is read line by line by the ``json`` builder (``.jsonl``, or ``.json`` not starting
    with ``[``/``{`` spanning lines). A ``.json`` file holding one array or object is not."""
    if path.lower().endswith(".jsonl"):
        return True
    with open(path, "rb") as fh:
        head = fh.read(4096).lstrip()
    if head.startswith(b"["):
        return False
    first = head.split(b"\n", 1)[0]
    try:
        json.loads(first)
    except ValueError:
        return False
    return True


def non_utf8_message(path: str) -> str | None:
    """``line N is not UTF-8 text (byte 0x.. at column C: ...); re-encode ...`` for a file, else ``None``."""
    bad = first_non_utf8_line(path)
    if bad is None:
        return None
    line, column, byte, raw = bad
    return (
        f"line {line} is not UTF-8 text (byte 0x{byte:02x} at column {column}: "
        f"{_excerpt(raw.decode('utf-8', errors='replace'))}); re-encode the file as UTF-8, e.g. "
        f"iconv -f latin1 -t utf-8 {os.path.basename(path)}"
    )


def non_utf8_error(path: Any, split: str, err: UnicodeDecodeError) -> DataError:
    """A :class:`DataError` naming the file line for a ``UnicodeDecodeError`` raised while reading rows
    (pyarrow may load bad bytes and fail only when they are decoded)."""
    detail = None
    if isinstance(path, (str, os.PathLike)) and os.path.isfile(path):
        detail = non_utf8_message(os.fspath(path))
    return DataError(f"data.path={path} ({split}): {detail or f'text that is not UTF-8 ({err})'}")


def explain_load_error(path: str, builder: str, err: BaseException) -> str:
    """One sentence (after ``data.path=PATH:``) saying why ``datasets`` could not read ``path``.

    In order: an empty file; no rows at all; a non-UTF-8 byte (line, column, byte, and the fix); for JSON
    Lines, the first line that is not a JSON object; otherwise the parser's own message (``pandas`` names the
    CSV line).
    """
    if os.path.getsize(path) == 0:
        return "the file is empty (0 bytes): no rows to train on"
    causes = list(_chain(err))
    if any(isinstance(e, UnicodeDecodeError) for e in causes) or any(
        "Invalid encoding" in str(e) for e in causes
    ):
        message = non_utf8_message(path)
        if message is not None:
            return message
    if builder == "json" and is_json_lines(path):
        bad_json = first_bad_json_line(path)
        if bad_json is not None:
            line, message, excerpt = bad_json
            return f"could not be read as json: line {line} is not a JSON object ({message}): {excerpt}"
    root = causes[-1]
    message = str(root) or type(root).__name__
    if "corresponds to no data" in message or isinstance(root, StopIteration):
        return "the file holds no rows (only a header, an empty list, or blank lines)"
    return f"could not be read as {builder}: {message.strip()}"


#: the ``datasets`` file readers that log a parse failure at ERROR before they raise it
READER_LOGGERS = (
    "datasets.packaged_modules.json.json",
    "datasets.packaged_modules.csv.csv",
    "datasets.packaged_modules.parquet.parquet",
)


class _DropReadFailures(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno >= logging.ERROR and record.getMessage().startswith("Failed to "))


_DROP = _DropReadFailures()


def drop_reader_error_logs() -> None:
    """Drop the ``Failed to load JSON from file ...`` / ``Failed to read file ...`` ERROR records of
    ``datasets``' readers (:data:`READER_LOGGERS`; idempotent).

    Each is logged just before the reader raises the same exception, which :func:`explain_load_error` turns
    into one message naming the line; the records printed the parser's wording (``in row 56`` of a read
    block) twice before that message.
    """
    for name in READER_LOGGERS:
        logger = logging.getLogger(name)
        if _DROP not in logger.filters:
            logger.addFilter(_DROP)


def read_error(name: Any, split: str, err: BaseException) -> DataError:
    """The :class:`DataError` for an exception raised while a stream reads its source ``name``
    (``data.path``)."""
    if isinstance(name, (str, os.PathLike)) and os.path.isfile(name):
        path = os.fspath(name)
        builder = {".csv": "csv", ".parquet": "parquet"}.get(os.path.splitext(path)[1].lower(), "json")
        return DataError(f"data.path={path}: {explain_load_error(path, builder, err)}")
    where = f"data.path={name}" if name is not None else "the stream"
    return DataError(f"{where} ({split} stream): could not be read ({type(err).__name__}: {err})")


def jsonl_lines(path: str, rows: Sequence[int]) -> list[int | None]:
    """The 1-based lines of source rows ``rows`` of a JSON Lines file (blank lines are not rows), in one
    pass."""
    wanted = set(rows)
    found: dict[int, int] = {}
    seen = -1
    with open(path, "rb") as fh:
        for number, raw in enumerate(fh, start=1):
            if raw.strip():
                seen += 1
                if seen in wanted:
                    found[seen] = number
                    if len(found) == len(wanted):
                        break
    return [found.get(r) for r in rows]


def source_row(ds: Any, row: int) -> int:
    """Row ``row`` of ``ds`` as a row of the table it was selected from (``train_test_split``/``select`` keep
    an indices mapping over the loaded file's table); ``row`` itself when there is no mapping."""
    indices = selection_indices(ds)  # datasets' selection mapping; None on an unselected dataset
    if indices is None:
        return row
    try:
        return int(indices.column(0)[row].as_py())
    except Exception:  # a datasets version that stores the mapping differently: the split row is still right
        return row


def file_place(ds: Any, row: int, path: Any) -> str | None:
    """Where row ``row`` of ``ds`` is in the file ``path`` it was loaded from: ``line 57`` for a JSON Lines or
    CSV file (a CSV's header is line 1), ``row 56 of the file`` for another file; ``None`` when ``path`` is
    not a file."""
    return source_place(source_row(ds, row), path)


def source_place(src: int, path: Any) -> str | None:
    """Where row ``src`` (0-based, in the order the file was loaded) is in the file ``path``: ``line 57`` or
    ``row 56 of the file`` (see :func:`file_place`); ``None`` when ``path`` is not a file."""
    if not (isinstance(path, (str, os.PathLike)) and os.path.isfile(path)):
        return None
    path = os.fspath(path)
    line = None
    if path.lower().endswith(".csv"):
        line = csv_line_of_row(path, src)
    elif not path.lower().endswith(".parquet") and is_json_lines(path):
        line = jsonl_lines(path, [src])[0]
    return f"line {line}" if line is not None else f"row {src} of the file"


def describe_row(ds: Any, row: int, path: Any, split: str) -> str:
    """``data.path=FILE line 57 (train row 12)`` (see :func:`file_place`), else ``data.path=... (train row
    12)``."""
    place = file_place(ds, row, path)
    if place is None:
        return f"data.path={path} ({split} row {row})"
    return f"data.path={os.fspath(path)} {place} ({split} row {row})"


def row_names(ds: Any, path: Any, split: str) -> Callable[[list[int]], str]:
    """A function naming rows of ``ds`` for the log: ``data.path=F.jsonl lines 3, 8`` for a JSON Lines file we
    loaded (one pass over the file for all rows named), ``data.path=F.csv rows 2, 7 of the file`` for another
    file, else ``train rows 2, 7``."""
    if not (isinstance(path, (str, os.PathLike)) and os.path.isfile(path)):
        return lambda rows: row_numbers(f"{split} row", rows)
    path = os.fspath(path)

    def name(rows: list[int]) -> str:
        src = [source_row(ds, r) for r in rows]
        if is_json_lines(path):
            lines = jsonl_lines(path, src)
            if all(line is not None for line in lines):
                return f"data.path={path} " + row_numbers("line", lines)
        return f"data.path={path} " + row_numbers("row", src) + " of the file"

    return name


# ------------------------------------------------------------------- the size of one row (data.max_row_bytes)
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
