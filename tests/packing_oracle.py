"""The pure-Python packing of ``hf_lightning/data/packing.py`` before the Arrow engine (commit 22a61d6), kept
only as the oracle the engine's tests compare with, row for row. Every token is a Python int here: slow on
purpose. One change since: a row holds its documents' lengths (``seq_lengths``) where it held a position per
token (``position_ids``), as the engine's rows do."""

from __future__ import annotations

import bisect
from collections import deque

IGNORE_INDEX = -100


def best_fit_decreasing(lengths, capacity):
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])  # stable: ties keep dataset order
    bins, rooms, waiting = [], [], {}
    for i in order:
        n = lengths[i]
        if n > capacity:
            raise ValueError(f"example {i} has {n} tokens, more than the bin capacity {capacity}")
        k = bisect.bisect_left(rooms, n)
        if k < len(rooms):
            room = rooms[k]
            b = waiting[room].popleft()
            if not waiting[room]:
                del waiting[room]
                rooms.pop(k)
        else:
            room, b = capacity, len(bins)
            bins.append([])
        bins[b].append(i)
        left = room - n
        if left > 0:
            if left not in waiting:
                bisect.insort(rooms, left)
                waiting[left] = deque()
            waiting[left].append(b)
    return bins


def _columns(rows):
    ids = [list(r["input_ids"]) for r in rows]
    labels = [list(r["labels"]) if "labels" in r else list(r["input_ids"]) for r in rows]
    return ids, labels


def pack_bfd(rows, max_length):
    """``rows``: dicts with ``input_ids`` (and ``labels``); returns the packed rows as dicts."""
    ids, labels = _columns(rows)
    out = []
    for b in best_fit_decreasing([len(x) for x in ids], max_length):
        row_ids, row_labels, row_docs = [], [], []
        for i in b:
            row_ids += ids[i]
            row_labels += [IGNORE_INDEX] * min(len(ids[i]), 1) + labels[i][1:]
            row_docs.append(len(ids[i]))
        out.append({"input_ids": row_ids, "labels": row_labels, "seq_lengths": row_docs})
    return out


def pack_wrapped(rows, max_length):
    ids, labels = _columns(rows)
    flat_ids = [t for row in ids for t in row]
    flat_labels = [t for row in labels for t in row]
    out = []
    for start in range(0, len(flat_ids), max_length):
        chunk = flat_ids[start : start + max_length]
        out.append(
            {
                "input_ids": chunk,
                "labels": flat_labels[start : start + max_length],
                "seq_lengths": [len(chunk)],
            }
        )
    return out
