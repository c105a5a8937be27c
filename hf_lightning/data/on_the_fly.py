"""Tokenize on the fly: streams and plain torch datasets, one example at a time, as :mod:`tokenize` would.

:class:`ExampleProcessor` runs a format function of :mod:`~hf_lightning.data.formats` on one example (inside
``DataLoader`` workers for a stream, see :mod:`~hf_lightning.data.streams`); :func:`scan_torch_dataset` reads
a torch map-style dataset once to count truncations, drop rows without a target and measure lengths.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch.utils.data import Dataset

from hf_lightning.core.errors import DataError
from hf_lightning.data.formats import ALL_PADDING, EMPTY, REPORT_COLUMNS, TOKENIZERS, RowReport, check_columns
from hf_lightning.data.packing import UNPACKED, RowPlan
from hf_lightning.data.sampling import mask_example

__all__ = ["ExampleProcessor", "ProcessedDataset", "scan_torch_dataset"]


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
    :func:`~hf_lightning.data.tokenize.tokenize_dataset` would.

    Args:
        fmt: a format name of :mod:`~hf_lightning.data.formats`.
        tokenizer / max_length / label2id / plan: as for :func:`~hf_lightning.data.tokenize.tokenize_dataset`.

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
    :func:`~hf_lightning.data.tokenize.tokenize_dataset` does.

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
            f"data.path={path}: the {split} split is empty after tokenization: {n} rows were read and none "
            f"has a trained-on token [{report.describe_causes()}]: "
            f"{report.empty_remedy(processor.kwargs['max_length'])}"
        )
    return ProcessedDataset(base, processor, keep), lengths


def _flat_ids(value: Any) -> list:
    if hasattr(value, "reshape"):
        return value.reshape(-1).tolist()
    return list(value)
