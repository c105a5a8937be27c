"""Class labels of the ``classification`` format: what the training split's ``label`` column holds, the
``label2id`` made from it, and every split's labels checked against it before tokenization.

What a label column may hold, as HF's text-classification examples (``run_glue.py``,
``run_classification.py``) read it:

=========  ==========================================  ==============================  =====================
kind       values                                      ids                             the model's head
=========  ==========================================  ==============================  =====================
names      strings, or a ``datasets.ClassLabel``       the sorted names (a ClassLabel  one class per name
                                                       keeps its own order)
ids        integers                                    as given                        ``model.num_labels``
targets    floats (regression)                         float32 values                  ``model.num_labels=1``
multi      lists (multi-label)                         as given                        ``model.num_labels``
=========  ==========================================  ==============================  =====================

Refused, naming the column (as the file names it, before ``data.rename_columns``), the value and its file
line: an empty label (a missing CSV cell, ``null``, ``NaN``, ``""``); names and numbers in one column; a
value of another kind than the training labels' (a name where the training labels are ids, a float among
ids); a name the training split does not have. A validation ``ClassLabel`` is mapped by its names, not by
its ids. Streams and torch datasets are checked row by row as they are tokenized
(:func:`~hf_lightning.data.formats.tokenize_classification`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import datasets

from hf_lightning.core.errors import DataError
from hf_lightning.data.sources import describe_row, file_place, non_utf8_error

__all__ = ["ClassLabels", "check_head", "encode_labels", "label_column_name", "read_labels"]

NAMES, IDS, TARGETS, MULTI = "names", "ids", "targets", "multi"
_SHOWN = 20  # training names listed in a message


@dataclass(frozen=True)
class ClassLabels:
    """The training split's labels.

    Attributes:
        kind: ``names``, ``ids``, ``targets``, ``multi``, or ``None`` where the rows are not read ahead (a
            stream or a torch dataset).
        label2id: ``{name: id}`` for ``names``, else ``None``.
        column: the label column as the source names it (``category`` when ``data.rename_columns`` renames
            it to ``label``).
        example: where a training label of this kind is and what it holds, for messages (``data.path=F line
            2 (train row 0): column 'category' holds 0.5``).
        largest: the largest class id (``ids``), with :attr:`largest_at` saying where it is.
    """

    kind: str | None
    label2id: dict[str, int] | None = None
    column: str = "label"
    example: str | None = None
    largest: int | None = None
    largest_at: str | None = None


def label_column_name(rename_columns: Mapping[str, str] | None) -> str:
    """The source column that becomes ``label`` under ``data.rename_columns`` (``label`` without one)."""
    for source, target in (rename_columns or {}).items():
        if target == "label":
            return source
    return "label"


def _kind(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "empty"
    if isinstance(value, str):
        return NAMES if value.strip() else "empty"
    if isinstance(value, bool):
        return "other"
    if isinstance(value, int):
        return IDS
    if isinstance(value, float):
        return TARGETS
    if isinstance(value, (list, tuple)):
        return MULTI
    return "other"


def _where(ds: Any, row: int, path: Any, split: str) -> tuple[str, str]:
    """``(data.path=F line 57 (train row 12), line 57)``: the row for a message, and its short name."""
    return describe_row(ds, row, path, split), file_place(ds, row, path) or f"{split} row {row}"


def _values(ds: datasets.Dataset, path: Any, split: str) -> list[Any]:
    try:
        return ds.select_columns(["label"]).to_dict()["label"]
    except UnicodeDecodeError as err:
        raise non_utf8_error(path, split, err) from err


def _first_of_kinds(values: list[Any]) -> dict[str, int]:
    """The first row of each kind, in the order the kinds first appear."""
    first: dict[str, int] = {}
    for i, value in enumerate(values):
        kind = _kind(value)
        if kind not in first:
            first[kind] = i
            if kind == "empty":
                break
    return first


def _describe_kind(kind: str) -> str:
    return {
        NAMES: "a class name",
        IDS: "an integer class id",
        TARGETS: "a float (a regression target)",
        MULTI: "a list (multi-label)",
    }[kind]


def _refuse_empty_or_other(
    ds: Any, values: list[Any], first: dict[str, int], path: Any, split: str, column: str
) -> None:
    if "empty" in first:
        row = first["empty"]
        where, _ = _where(ds, row, path, split)
        raise DataError(
            f"{where}: column {column!r} is empty on this row ({values[row]!r}); every row needs a class "
            "label: fill it in, or remove the row"
        )
    if "other" in first:
        row = first["other"]
        value = values[row]
        where, _ = _where(ds, row, path, split)
        raise DataError(
            f"{where}: column {column!r} holds {value!r:.60} ({type(value).__name__}); a class label is a "
            "class name, an integer class id, or a float regression target"
        )


def read_labels(ds: Any, path: Any, column: str = "label") -> ClassLabels:
    """The training split's :class:`ClassLabels`, every row read once (map-style ``datasets.Dataset``).

    ``names``: ``label2id`` is the ClassLabel's names, else the sorted distinct names (HF ``run_glue.py``, so
    the ids do not depend on row order). A column of integers and floats is ``targets`` (as ``pyarrow``
    reads such a JSON column).

    Raises:
        DataError: an empty label, a label of no kind, names mixed with numbers (the column, the value, its
            line and the line of a label of the other kind), or string labels in a stream (no scan).
    """
    features = getattr(ds, "features", None)
    feature = features.get("label") if features else None
    if not isinstance(ds, datasets.Dataset):
        if feature is not None and getattr(feature, "dtype", None) in ("string", "large_string"):
            raise DataError(
                f"data.path={path}: string class labels in a stream cannot be mapped to ids without a scan; "
                "cast the column to datasets.ClassLabel (names in order) or use integer labels"
            )
        if isinstance(feature, datasets.ClassLabel):
            return ClassLabels(NAMES, {name: i for i, name in enumerate(feature.names)}, column)
        return ClassLabels(None, column=column)  # checked row by row as it is tokenized
    values = _values(ds, path, "train")
    first = _first_of_kinds(values)
    _refuse_empty_or_other(ds, values, first, path, "train", column)
    if NAMES in first and len(first) > 1:
        counts = {kind: sum(1 for v in values if _kind(v) == kind) for kind in first}
        odd = min(first, key=lambda k: (counts[k], first[k]))  # the rarer kind is the likelier mistake
        other = next(k for k in first if k != odd)
        where, _ = _where(ds, first[odd], path, "train")
        _, other_line = _where(ds, first[other], path, "train")
        raise DataError(
            f"{where}: column {column!r} holds {values[first[odd]]!r:.60}, {_describe_kind(odd)}, while "
            f"{other_line} holds {values[first[other]]!r:.60}, {_describe_kind(other)} "
            f"({counts[other]} of the {len(values)} labels are of that kind): write every label of the "
            "column the same way, as class names or as integer class ids"
        )
    kind = next(iter(first), None)
    if kind is None:
        return ClassLabels(None, column=column)
    if IDS in first and TARGETS in first:
        kind = TARGETS
    example_row = first[kind]
    if kind == TARGETS:  # a fractional value shows best that these are not class ids
        example_row = next((i for i, v in enumerate(values) if not float(v).is_integer()), example_row)
    where, _ = _where(ds, example_row, path, "train")
    example = f"{where}: column {column!r} holds {values[example_row]!r:.60}"
    if kind == NAMES:
        if isinstance(feature, datasets.ClassLabel):
            label2id = {name: i for i, name in enumerate(feature.names)}
        else:
            label2id = {name: i for i, name in enumerate(sorted(set(values)))}
        return ClassLabels(NAMES, label2id, column, example)
    if kind == IDS:
        if isinstance(feature, datasets.ClassLabel):  # ClassLabel ids: the kind is names
            return ClassLabels(NAMES, {name: i for i, name in enumerate(feature.names)}, column, example)
        row = max(range(len(values)), key=values.__getitem__)
        _, at = _where(ds, row, path, "train")
        return ClassLabels(IDS, None, column, example, int(values[row]), at)
    return ClassLabels(kind, None, column, example)


def _names_of(feature: Any, values: list[Any]) -> list[Any]:
    """A ClassLabel column's values as its names (``None`` stays ``None``)."""
    return [feature.int2str(v) if isinstance(v, int) and v >= 0 else v for v in values]


def encode_labels(ds: Any, labels: ClassLabels, path: Any, split: str) -> Any:
    """``ds`` with its labels checked against the training ones and encoded as the model reads them.

    ``names``: a ``ClassLabel`` column with the training names (strings cast, another ClassLabel mapped by its
    names); ``targets``: float64; ``ids`` and ``multi``: as given. Sources other than a ``datasets.Dataset``
    are returned as they are (checked row by row later).

    Raises:
        DataError: an empty label, a value of another kind than the training labels', or a class name the
            training split does not have; the message names the column, the value and its line.
    """
    if not isinstance(ds, datasets.Dataset) or labels.kind is None or "label" not in ds.column_names:
        return ds
    column = labels.column
    feature = ds.features["label"]
    values = _values(ds, path, split)
    if isinstance(feature, datasets.ClassLabel):
        values = _names_of(feature, values)
    first = _first_of_kinds(values)
    _refuse_empty_or_other(ds, values, first, path, split, column)
    allowed = {NAMES: {NAMES}, IDS: {IDS}, TARGETS: {IDS, TARGETS}, MULTI: {MULTI}}[labels.kind]
    wrong = next((k for k in first if k not in allowed), None)
    if wrong is not None:
        row = first[wrong]
        where, _ = _where(ds, row, path, split)
        raise DataError(
            f"{where}: column {column!r} holds {values[row]!r:.60}, {_describe_kind(wrong)}, but the "
            f"training labels are {_training_kind(labels)}; write this split's labels the same way"
        )
    if labels.kind == TARGETS:
        return ds.cast_column("label", datasets.Value("float64")) if first.get(IDS) is not None else ds
    if labels.kind != NAMES:
        return ds
    label2id = labels.label2id or {}
    unknown = next((i for i, v in enumerate(values) if v not in label2id), None)
    names = sorted(label2id, key=label2id.__getitem__)
    if unknown is not None:
        where, _ = _where(ds, unknown, path, split)
        shown = f"{names[:_SHOWN]}{' ...' if len(names) > _SHOWN else ''}"
        raise DataError(
            f"{where}: column {column!r} holds {values[unknown]!r:.60}, which is not one of the "
            f"{len(names)} training labels {shown}"
        )
    target = datasets.ClassLabel(names=names)
    if isinstance(feature, datasets.ClassLabel):
        if list(feature.names) == names:
            return ds
        # another ClassLabel: mapped by name, as run_glue's label_to_id
        ids = {i: label2id[name] for i, name in enumerate(feature.names) if name in label2id}
        return ds.map(
            _relabel,
            batched=True,
            input_columns="label",
            fn_kwargs={"ids": ids},
            features=datasets.Features({**ds.features, "label": target}),
            desc=f"mapping the {split} class names to the training ids",
        )
    return ds.cast_column("label", target)


def _relabel(batch: list[int], ids: Mapping[int, int]) -> dict[str, list[int]]:
    return {"label": [ids[v] for v in batch]}


def _training_kind(labels: ClassLabels) -> str:
    if labels.kind == NAMES:
        names = sorted(labels.label2id or {}, key=(labels.label2id or {}).__getitem__)
        return f"the class names {names[:_SHOWN]}{' ...' if len(names) > _SHOWN else ''}"
    detail = f" ({labels.example})" if labels.example else ""
    return {
        IDS: "integer class ids",
        TARGETS: "float regression targets",
        MULTI: "lists (multi-label)",
    }[labels.kind] + detail


def check_head(labels: ClassLabels | None, num_labels: int | None, regression: bool = True) -> None:
    """The classifier's size against the training labels: float targets need one output (a regression head,
    as HF's text-classification examples build for a float label column); integer ids need
    ``model.num_labels`` (the data does not say how many classes there are).

    Args:
        regression: whether what trains the model can use float targets. ``False`` for the command line,
            whose module trains and evaluates over classes (cross-entropy, accuracy, F1).

    Raises:
        DataError: float labels where ``regression`` is false or ``num_labels`` is not 1, or integer ids with
            no ``num_labels``; the message names the column, a value and its line, and what to set.
    """
    if labels is None or labels.example is None:
        return
    if labels.kind == TARGETS and not regression:
        raise DataError(
            f"{labels.example}, a float: float labels are regression targets, not classes, and the command "
            "line trains and evaluates classifiers (cross-entropy, accuracy and F1 over classes). Write the "
            "classes as class names or integer class ids (HFDataModule batches float labels as float32 for a "
            "LightningModule of your own that does regression)"
        )
    if labels.kind == TARGETS and num_labels != 1:
        raise DataError(
            f"{labels.example}, a float: float labels are regression targets, not classes, so the model "
            f"needs one output (config.num_labels=1; it has {num_labels}); build it with num_labels=1, or "
            "write the classes as class names or integer class ids"
        )
    if labels.kind == IDS and num_labels is None:
        raise DataError(
            f"{labels.example}, an integer class id: integer labels do not say how many classes there are; "
            f"set model.num_labels={labels.largest + 1} or more (the largest id, {labels.largest}, is on "
            f"{labels.largest_at})"
        )
