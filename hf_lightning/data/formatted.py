"""A ``datasets.Dataset`` judged on what its rows return, not on its stored columns.

``set_transform`` / ``with_transform`` (e.g. tokenizing on access), ``set_format(columns=[...])`` and
``set_format("torch")`` change what ``ds[i]`` returns without changing ``ds.column_names``; ``Dataset.map``
hands the transformed rows to its function. Reading formats and pruning off the stored columns while mapping the
transformed ones broke both ways (``KeyError: 'text'`` when the transform tokenized the text away; the stored
``input_ids`` used when the format showed only ``text``). HF ``Trainer`` trains on what ``ds[i]`` returns, and so
does hf_lightning: :func:`as_returned` turns such a dataset into a plain one holding exactly those rows.
"""

from __future__ import annotations

import logging
from typing import Any

import datasets

from hf_lightning.errors import DataError

log = logging.getLogger(__name__)


def _same(batch: dict[str, Any]) -> dict[str, Any]:
    return batch


def as_returned(ds: datasets.Dataset, name: Any) -> datasets.Dataset:
    """``ds`` as plain Arrow rows equal to what ``ds[i]`` returns (``ds`` itself when it has no format).

    - a format transform (``set_transform`` / ``with_transform``): the rows are read through it once, in memory
      (``Dataset.map`` without a cache file, so a changed transform is never served from a cache), and only the
      columns it returns are kept;
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
            "data.path=%s: the dataset's format returns the columns %s only; the stored columns %s are not used",
            name,
            list(columns),
            hidden,
        )
    return ds.with_format(None) if ds.format["type"] is not None else ds
