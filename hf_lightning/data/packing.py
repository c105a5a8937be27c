"""Packing: several tokenized documents per ``max_length`` row, so that almost no slot is padding.

``bfd`` (best-fit decreasing, TRL's ``packing_strategy="bfd"``): documents sorted longest first, each put
into the open row with the least room that still fits it (ties: the row opened first), else a new row.
Documents stay whole and isolated: each restarts its ``position_ids`` at 0 and its first token is not a
target. A row of three documents of lengths 3, 2 and 2 with ``max_length`` 8::

    input_ids     a0   a1   a2 | b0   b1 | c0   c1 | pad
    position_ids   0    1    2 |  0    1 |  0    1 |   0
    labels      -100   a1   a2 |-100  b1 |-100  c1 |-100

    attention (1 = may attend), block-diagonal causal:
        a0 1
        a1 1 1
        a2 1 1 1
        b0       1
        b1       1 1
        c0           1
        c1           1 1

``wrapped`` (TRL's ``"wrapped"``, HF ``run_clm``'s ``group_texts``): all documents concatenated, each ended
with EOS if the tokenizer did not end it with one, then cut every ``max_length`` tokens (the last row may be
shorter). Documents in a row attend to each other, as in classic pre-training.

The packing efficiency, real tokens / (rows x ``max_length``), is logged at INFO.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import datasets
import torch

from hf_lightning.data.collators import flatten_rows, pad_flat, round_up, row_mask
from hf_lightning.errors import ConfigError
from hf_lightning.module.loss import IGNORE_INDEX

log = logging.getLogger(__name__)

STRATEGIES = ("bfd", "wrapped")


def best_fit_decreasing(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Bins of example indices, each summing to at most ``capacity`` (best-fit decreasing).

    Example: lengths ``[3, 7, 2, 5, 1]`` with capacity 8 give ``[[1, 4], [3, 0], [2]]`` (7+1, 5+3, 2).

    Raises:
        ValueError: an example longer than ``capacity``.
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])  # stable: ties keep dataset order
    bins: list[list[int]] = []
    free: list[tuple[int, int]] = []  # sorted (room left, bin id) of bins that can still take a token
    for i in order:
        n = lengths[i]
        if n > capacity:
            raise ValueError(f"example {i} has {n} tokens, more than the bin capacity {capacity}")
        k = bisect.bisect_left(free, (n, -1))
        if k < len(free):
            room, b = free.pop(k)
        else:
            room, b = capacity, len(bins)
            bins.append([])
        bins[b].append(i)
        if room - n > 0:
            bisect.insort(free, (room - n, b))
    return bins


def _columns(ds: datasets.Dataset) -> tuple[list[list[int]], list[list[int]]]:
    ids = [list(x) for x in ds["input_ids"]]
    labels = [list(x) for x in ds["labels"]] if "labels" in ds.column_names else [list(x) for x in ids]
    return ids, labels


def pack_bfd(ds: datasets.Dataset, max_length: int) -> datasets.Dataset:
    """Pack documents whole with :func:`best_fit_decreasing`; per-document positions, first tokens masked.

    Returns:
        a dataset with ``input_ids``, ``labels`` and ``position_ids`` columns (one row per bin).
    """
    ids, labels = _columns(ds)
    rows: dict[str, list] = {"input_ids": [], "labels": [], "position_ids": []}
    for b in best_fit_decreasing([len(x) for x in ids], max_length):
        row_ids, row_labels, row_pos = [], [], []
        for i in b:
            row_ids += ids[i]
            row_labels += [IGNORE_INDEX] + labels[i][1:]
            row_pos += list(range(len(ids[i])))
        rows["input_ids"].append(row_ids)
        rows["labels"].append(row_labels)
        rows["position_ids"].append(row_pos)
    return datasets.Dataset.from_dict(rows)


def pack_wrapped(ds: datasets.Dataset, max_length: int, eos_token_id: int | None) -> datasets.Dataset:
    """Concatenate every document (EOS-terminated) and cut into ``max_length`` rows.

    Returns:
        a dataset with ``input_ids``, ``labels`` and ``position_ids`` (``0..n-1``) columns.
    """
    ids, labels = _columns(ds)
    flat_ids: list[int] = []
    flat_labels: list[int] = []
    for row_ids, row_labels in zip(ids, labels):
        flat_ids += row_ids
        flat_labels += row_labels
        if eos_token_id is not None and (not row_ids or row_ids[-1] != eos_token_id):
            flat_ids.append(eos_token_id)
            flat_labels.append(eos_token_id)
    rows: dict[str, list] = {"input_ids": [], "labels": [], "position_ids": []}
    for start in range(0, len(flat_ids), max_length):
        chunk = flat_ids[start : start + max_length]
        rows["input_ids"].append(chunk)
        rows["labels"].append(flat_labels[start : start + max_length])
        rows["position_ids"].append(list(range(len(chunk))))
    return datasets.Dataset.from_dict(rows)


def pack_dataset(
    ds: datasets.Dataset, strategy: str, max_length: int, eos_token_id: int | None = None, split: str = "train"
) -> datasets.Dataset:
    """Pack a tokenized dataset with ``strategy`` (``"bfd"`` or ``"wrapped"``) and log the efficiency.

    Columns other than ``input_ids``, ``attention_mask``, ``labels`` cannot follow documents into shared rows;
    they are named in the log.

    Raises:
        ConfigError: an unknown strategy.
    """
    if strategy not in STRATEGIES:
        raise ConfigError(f"data.packing={strategy!r}; expected false or one of {list(STRATEGIES)}")
    left = [c for c in ds.column_names if c not in ("input_ids", "attention_mask", "labels")]
    if left:
        log.warning("%s: packing leaves the columns %s out (they cannot follow documents into shared rows)", split, left)
    n_docs = len(ds)
    packed = pack_bfd(ds, max_length) if strategy == "bfd" else pack_wrapped(ds, max_length, eos_token_id)
    tokens = sum(len(x) for x in packed["input_ids"])
    slots = len(packed) * max_length
    log.info(
        "%s: packed %d documents into %d rows of %d (%s): efficiency %.1f%% (%d real tokens / %d slots)",
        split, n_docs, len(packed), max_length, strategy, 100.0 * tokens / slots, tokens, slots,
    )
    return packed


class PackedCollator:
    """Pads packed rows into ``(B, L)`` without an ``attention_mask``: ``position_ids`` isolate documents.

    The padding tail of a row gets ``position_ids`` ``0, 1, ...`` (a segment of its own, which nothing real
    attends to) and labels -100. With no ``attention_mask`` and no KV cache, ``transformers`` builds the
    block-diagonal causal mask from ``position_ids`` (see :mod:`~hf_lightning.data.flattening`). Unlike
    flattening the whole batch into one row, attention stays per row: ``B * L**2`` instead of ``(B * L)**2``.

    Returns:
        ``{"input_ids", "labels", "position_ids"}``, int64 ``(B, L)``.
    """

    def __init__(self, pad_token_id: int, pad_to_multiple_of: int | None = None) -> None:
        self.pad_token_id = int(pad_token_id)
        self.pad_to_multiple_of = pad_to_multiple_of

    def __call__(self, examples: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        ids, lengths = flatten_rows([ex["input_ids"] for ex in examples])
        labels, _ = flatten_rows([ex["labels"] for ex in examples])
        positions, _ = flatten_rows([ex["position_ids"] for ex in examples])
        length = round_up(max(lengths), self.pad_to_multiple_of)
        mask = row_mask(lengths, length)
        # the padding tail counts 0, 1, ... from the end of each row's documents
        tail = torch.arange(length) - torch.tensor(lengths, dtype=torch.long).unsqueeze(1)
        position_ids = torch.where(mask, pad_flat(positions, mask, 0), tail)
        return {
            "input_ids": pad_flat(ids, mask, self.pad_token_id),
            "labels": pad_flat(labels, mask, IGNORE_INDEX),
            "position_ids": position_ids,
        }
