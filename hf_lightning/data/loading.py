"""Load a data source into ``datasets`` objects, with errors that name the path.

Sources: a json/jsonl/csv/parquet file, a folder written by ``save_to_disk``, an in-memory
``datasets.Dataset`` / ``DatasetDict``, or ``None`` for the embedded chatterbot-corpus default.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import datasets

from hf_lightning.errors import DataError

log = logging.getLogger(__name__)

BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}
VALIDATION_SPLITS = ("validation", "valid", "val", "test")


def _load_file(path: str) -> datasets.Dataset:
    p = Path(path)
    builder = BUILDERS.get(p.suffix.lower())
    if builder is None:
        raise DataError(
            f"data.path={path}: unsupported file type {p.suffix!r}; expected one of "
            f"{sorted(BUILDERS)} or a folder written by Dataset.save_to_disk"
        )
    if not os.access(p, os.R_OK):
        raise DataError(f"data.path={path}: the file exists but cannot be read (permissions)")
    try:
        return datasets.load_dataset(builder, data_files=str(p), split="train")
    except Exception as err:  # datasets wraps parser errors in several types; name the file in all of them
        raise DataError(f"data.path={path}: could not be read as {builder}: {err}") from err


def _load_folder(path: str) -> datasets.Dataset | datasets.DatasetDict:
    try:
        return datasets.load_from_disk(path)
    except Exception as err:
        raise DataError(
            f"data.path={path}: a folder, but not one written by Dataset.save_to_disk / "
            f"DatasetDict.save_to_disk ({err})"
        ) from err


def load_source(source: Any) -> datasets.Dataset | datasets.DatasetDict:
    """Load one source.

    Args:
        source: a path (file or ``save_to_disk`` folder) or a ``datasets.Dataset`` / ``DatasetDict``.

    Raises:
        DataError: the path does not exist, cannot be read, or has an unsupported type.
    """
    if isinstance(source, (datasets.Dataset, datasets.DatasetDict)):
        return source
    path = os.fspath(source)
    if not os.path.exists(path):
        raise DataError(f"data.path={path}: no such file or folder")
    if os.path.isdir(path):
        return _load_folder(path)
    return _load_file(path)


def split_train_validation(
    loaded: datasets.Dataset | datasets.DatasetDict, validation_split: float, seed: int, path: Any
) -> tuple[datasets.Dataset, datasets.Dataset | None]:
    """Pick or make the train and validation splits.

    A ``DatasetDict`` uses its ``train`` split and its first split named validation/valid/val/test. A single
    ``Dataset`` holds out ``validation_split`` of its rows (``Dataset.train_test_split`` with ``seed``:
    deterministic); ``validation_split=0`` means no validation.

    Raises:
        DataError: no ``train`` split, or an empty dataset.
    """
    if isinstance(loaded, datasets.DatasetDict):
        if "train" not in loaded:
            raise DataError(f"data.path={path}: no 'train' split (splits: {list(loaded)})")
        val = next((loaded[s] for s in VALIDATION_SPLITS if s in loaded), None)
        train = loaded["train"]
    else:
        train, val = loaded, None
    if len(train) == 0:
        raise DataError(f"data.path={path}: the dataset is empty")
    if val is None and validation_split > 0:
        if len(train) < 2:
            raise DataError(f"data.path={path}: {len(train)} row, too few to hold out a validation split")
        parts = train.train_test_split(test_size=validation_split, seed=seed, shuffle=True)
        train, val = parts["train"], parts["test"]
        log.info("held out %d of %d rows for validation (seed %d)", len(val), len(train) + len(val), seed)
    return train, val
