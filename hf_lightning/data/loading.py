"""Load a data source, with errors that name the path.

Sources: a json/jsonl/csv/parquet file, a folder written by ``save_to_disk`` (read as a stream with
``streaming=True``), a hub dataset id (``load_dataset(path, name, revision=..., streaming=...)`` through the
``datasets`` cache; ``HF_HUB_OFFLINE=1`` reads the cache only), an in-memory ``datasets.Dataset`` / ``DatasetDict`` / ``IterableDataset`` /
``IterableDatasetDict``, a plain torch ``Dataset`` or ``IterableDataset`` of example mappings, or ``None`` for
the embedded chatterbot-corpus default.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import datasets
import torch

from hf_lightning.data.file_errors import explain_load_error
from hf_lightning.data.formatted import as_returned
from hf_lightning.errors import DataError

log = logging.getLogger(__name__)

BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}
VALIDATION_SPLITS = ("validation", "valid", "val", "test")


def _load_file(path: str, streaming: bool = False) -> datasets.Dataset | datasets.IterableDataset:
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
        return datasets.load_dataset(builder, data_files=str(p), split="train", streaming=streaming)
    except Exception as err:  # datasets wraps parser errors in several types; name the file and the line
        raise DataError(f"data.path={path}: {explain_load_error(str(p), builder, err)}") from err


def _load_folder(path: str) -> datasets.Dataset | datasets.DatasetDict:
    try:
        return datasets.load_from_disk(path)
    except Exception as err:
        raise DataError(
            f"data.path={path}: a folder, but not one written by Dataset.save_to_disk / "
            f"DatasetDict.save_to_disk ({err})"
        ) from err


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
    from hf_lightning.hub import hub_error_message
    from hf_lightning.models import is_hub_failure

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
    source: Any, streaming: bool = False, name: str | None = None, revision: str | None = None
) -> Any:
    """Load one source.

    Args:
        source: a path (file or ``save_to_disk`` folder) or an in-memory dataset (returned as it is; a
            ``datasets.Dataset`` with a format or a transform as the rows it returns, see
            :func:`~hf_lightning.data.formatted.as_returned`).
        streaming: read a file lazily (``load_dataset(..., streaming=True)``) or a ``save_to_disk`` folder
            as ``Dataset.to_iterable_dataset()``; the result is a ``datasets.IterableDataset``.
        name / revision: a hub dataset's config name and revision (``load_dataset``'s ``name`` and
            ``revision``), when ``source`` is a hub id (:func:`hf_lightning.hub.looks_like_hub_id`).

    Raises:
        DataError: the path does not exist, cannot be read, or has an unsupported type; a hub id that is
            neither cached nor reachable.
    """
    if isinstance(source, (datasets.Dataset, datasets.DatasetDict)):
        return _as_returned(source, "<in-memory dataset>")
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
        from hf_lightning.hub import looks_like_hub_id

        if looks_like_hub_id(path):
            return (
                _as_returned(_load_hub(path, name, revision, streaming), path)
                if not streaming
                else (_load_hub(path, name, revision, streaming))
            )
        raise DataError(f"data.path={path}: no such file or folder")
    if os.path.isdir(path):
        loaded = _as_returned(_load_folder(path), path)  # save_to_disk keeps a format's type and columns
        return _as_stream(loaded) if streaming else loaded
    return _load_file(path, streaming=streaming)


def is_stream(ds: Any) -> bool:
    """Whether ``ds`` is read by iteration only (``datasets.IterableDataset`` or torch ``IterableDataset``)."""
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

    A ``DatasetDict`` / ``IterableDatasetDict`` uses its ``split`` split (``data.split``, default ``train``) and
    its ``validation_split_name`` split, or by default its first split named validation/valid/val/test. Otherwise ``validation_split`` of the rows is held out (``0`` means no
    validation): a ``datasets.Dataset`` with ``Dataset.train_test_split(seed=seed)``, a torch map-style dataset
    with a permutation seeded by ``seed``, and a stream by a stable hash of each row's content (the third
    value is then the fraction, and train and validation are the same stream read with opposite filters).

    Raises:
        DataError: no ``split`` (or no ``validation_split_name``) split, or an empty dataset.
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
        if len(train) < 2:
            raise DataError(f"data.path={path}: {len(train)} row, too few to hold out a validation split")
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
