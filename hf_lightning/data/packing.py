"""Packing: several tokenized documents per ``max_length`` row, so that almost no slot is padding.

``bfd`` (best-fit decreasing, TRL's ``packing_strategy="bfd"``): documents sorted longest first, each put
into the open row with the least room that still fits it (ties: the row that came to have that room first, as
TRL), else a new row.
Documents stay whole and isolated: each restarts its ``position_ids`` at 0 and its first token is not a
target. So a document longer than ``max_length`` cannot be packed whole: it is truncated at tokenization, like
an unpacked row, and the rows and tokens cut are counted in the log. TRL's ``bfd`` cuts the same overflow
without a word (its ``bfd_split`` spreads it over rows as separate documents, which breaks a conversation
apart); to keep every token of long documents use ``wrapped``. A row of three documents of lengths 3, 2 and 2
with ``max_length`` 8::

    input_ids     a0   a1   a2 | b0   b1 | c0   c1 | pad
    labels      -100   a1   a2 |-100  b1 |-100  c1 |-100
    seq_lengths    3            2         2                (stored: one length per document)
    position_ids   0    1    2 |  0    1 |  0    1 |   0    (the collator's, from seq_lengths)

A packed row stores its documents' lengths (``seq_lengths``, TRL's column), not a position per token; the
collators (:mod:`~hf_lightning.data.collators`) expand them into ``position_ids``.

    attention (1 = may attend), block-diagonal causal:
        a0 1
        a1 1 1
        a2 1 1 1
        b0       1
        b1       1 1
        c0           1
        c1           1 1

``wrapped`` (TRL's ``"wrapped"``, HF ``run_clm``'s ``group_texts``): all documents, tokenized whole (no
truncation), concatenated and cut every ``max_length`` tokens: every token is kept, the last row may be
shorter (``group_texts`` drops that remainder). Documents in a row attend to each other, as in classic
pre-training.

Where one document ends is marked by the documents themselves, never after a cut: ``text`` documents end with
EOS when packed (TRL appends ``eos_token`` to each text; ``group_texts`` adds nothing), prompt/completion rows
always end with EOS, chat rows with the template's end of turn, and pre-tokenized rows are packed as given.

The packing efficiency, real tokens / (rows x ``max_length``), is logged at INFO.

A stream is packed as its rows come (:class:`StreamPacker`, driven by
:class:`~hf_lightning.data.streams.ShardedStream`): ``bfd`` within consecutive buffers of ``data.pack_buffer``
documents (each buffer's rows are :func:`best_fit_decreasing`'s rows of that buffer, row for row), ``wrapped``
over the whole stream (the last, short row of a buffer is carried into the next one, so the rows are
:func:`pack_wrapped`'s rows of the whole stream). Every reader packs the whole stream the same way and keeps
packed row ``j`` when ``j mod S`` is its index (``S`` readers), so every document is in exactly one row per
epoch and the readers' row counts differ by one at most (the tail is topped up with a masked copy). Beyond
``trl.pack_dataset``, which packs a ``datasets.Dataset`` (map batches of 1,000) and not a stream: the same
rows from a stream, bounded memory, the exact split over ranks x workers and the resume.

The rows are computed on Arrow offsets and lengths, never per token in Python. Per document, Python touches
one length (the best-fit choice, a ``bisect`` over the distinct rooms left: O(n log max_length)); every token
moves in Arrow or numpy (``pyarrow.compute.take`` on the list column, index arithmetic for the labels).
Where the rows go: a file-backed dataset (one with ``cache_files``: a data file, a hub dataset, a tokenized
split) is packed as ``Dataset.map`` writes its results, into an Arrow file in the ``datasets`` cache
(:func:`packed_cache_file`, keyed on the input's fingerprint, the strategy, ``max_length`` and this module's
code, so a second run reads it instead of packing again), one record batch of whole rows
(:data:`BLOCK_TOKENS`) at a time, then memory-mapped. The input is read where it lies (memory-mapped record
batches, chunk by chunk). Memory: 8 bytes per document (the lengths and the bin plan) and one batch's scratch,
not the packed table. An in-memory dataset is packed in memory: two int32 token columns, 8 bytes per packed
token, and 4 bytes per document (``seq_lengths``); ``wrapped`` reuses the input's token buffers there.

Why ours rather than ``trl.pack_dataset`` (``trl/data_utils.py``), whose rows ``bfd`` and
``wrapped`` reproduce: TRL packs inside ``Dataset.map(batched=True)``, so each map batch (1,000 documents by
default, what ``SFTTrainer`` uses) is packed on its own: ``bfd`` bins documents only against the others of its
batch, and ``wrapped`` leaves a short row at the end of every batch. Its ``bfd`` cuts documents longer than
``seq_length`` and drops empty ones without a word (we count the cut at tokenization, see
:mod:`~hf_lightning.data.formats`), gives no label masking of each document's first token, and its best-fit
search walks a segment tree in Python per document.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import logging
import os
import tempfile
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from datasets.fingerprint import Hasher, generate_random_fingerprint, get_temporary_cache_files_directory
from datasets.table import MemoryMappedTable

from hf_lightning.compat import dataset_fingerprint, selection_indices
from hf_lightning.core.arguments import Allowed, shown
from hf_lightning.core.batch import IGNORE_INDEX
from hf_lightning.core.errors import ConfigError
from hf_lightning.data.checks import check_sequence_isolation, forward_parameters
from hf_lightning.data.formats import CAUSAL_FORMATS

log = logging.getLogger(__name__)

STRATEGIES = ("bfd", "wrapped")
#: the value rule of ``data.packing`` (read from :class:`~hf_lightning.HFDataModule`'s signature)
PACKING = Allowed(
    lambda v: v is True or v is False or v is None or v in STRATEGIES, "false, true (= bfd), bfd, wrapped"
)
#: the values ``data.packing`` takes (``HFDataModule``'s annotation says the same)
Packing = bool | Literal["bfd", "wrapped"]


def packing_strategy(packing: Any) -> str | None:
    """``data.packing`` as a strategy: ``True`` is ``"bfd"``, ``False``/``None`` no packing.

    Raises:
        ConfigError: a value that is none of ``false, true, "bfd", "wrapped"``.
    """
    if packing is True:
        return "bfd"
    if packing is False or packing is None:
        return None
    if packing not in STRATEGIES:
        raise ConfigError(f"data.packing={shown(packing)}: allowed values: {PACKING.text}")
    return packing


@dataclass(frozen=True)
class RowPlan:
    """What ``data.packing`` and ``data.padding_free`` mean for the rows, resolved once (:func:`row_plan`).

    The tokenizers (:func:`~hf_lightning.data.tokenize.fn_kwargs_for`), the split preparation
    (:func:`~hf_lightning.data.tokenize.prepare_split`) and the collators
    (:func:`~hf_lightning.data.layout.collator_for`) read these facts, never the two options.

    Attributes:
        truncate: each document is cut at ``max_length`` (``False`` for ``wrapped``, which cuts the
            concatenation instead, so that no token is lost).
        add_eos: packed ``text`` documents end with the EOS token (TRL's ``SFTTrainer`` appends it too).
        drop_padding: pre-tokenized rows lose their padding (their rows go side by side).
        padding_free: each batch is one flat row
            (:class:`~hf_lightning.data.collators.PaddingFreeCollator`).
        pack: ``(dataset, split) -> dataset``: :func:`pack_dataset`, strategy and ``max_length`` bound;
            ``None``: rows are not packed.
    """

    truncate: bool = True
    add_eos: bool = False
    drop_padding: bool = False
    padding_free: bool = False
    pack: Callable[[datasets.Dataset, str], datasets.Dataset] | None = None


#: rows as given: truncated, unpacked, padded per batch
UNPACKED = RowPlan()


def row_plan(strategy: str | None, padding_free: bool, max_length: int) -> RowPlan:
    """The :class:`RowPlan` of a strategy (:func:`packing_strategy`'s value) and ``data.padding_free``."""
    return RowPlan(
        truncate=strategy != "wrapped",
        add_eos=strategy is not None,
        drop_padding=strategy is not None or bool(padding_free),
        padding_free=bool(padding_free),
        pack=functools.partial(pack_dataset, strategy=strategy, max_length=max_length) if strategy else None,
    )


def check_packing(
    packing: Any,
    padding_free: bool = False,
    *,
    fmt: str | None = None,
    task: str | None = None,
    encoder_decoder: bool | None = None,
    model: Any = None,
    forward_kwargs: Mapping[str, Any] | None = None,
) -> str | None:
    """Every rule of ``data.packing`` (and of ``data.padding_free``, which shares the model's part), in one
    place.

    A rule runs when its facts are given (``None``: not known yet), so the config schema calls it before
    anything is built (``packing``, ``task``, ``encoder_decoder``) and ``HFDataModule.setup`` once with the
    data and the model (``fmt``, ``model``, ``forward_kwargs``).

    Args:
        packing / padding_free: the two options as given.
        fmt: the data format (:mod:`~hf_lightning.data.formats`); only causal formats can be packed or
            flattened (a stream is packed as it is read, :class:`StreamPacker`).
        task / encoder_decoder: the model's task (``model.task``) and whether it is an encoder-decoder.
        model: the ``nn.Module``; its ``forward`` must take ``position_ids`` and its attention must keep
            packed sequences apart (:func:`~hf_lightning.data.checks.check_sequence_isolation`, a probe
            forward).
        forward_kwargs: what the LightningModule passes to every forward (``use_cache=False`` keeps the
            sequences apart; without it one WARNING, else no line).

    Returns:
        the strategy (``"bfd"``, ``"wrapped"``) or ``None`` (no packing).

    Raises:
        ConfigError: one line naming the option, the value and what to change.
    """
    strategy = packing_strategy(packing)
    if strategy and encoder_decoder:
        raise ConfigError(
            f"data.packing={strategy!r} with an encoder-decoder model (model.task={task}): packing "
            "concatenates examples into one causal sequence, which an encoder-decoder cannot attend "
            "correctly; allowed values: false"
        )
    if strategy and task == "sequence_classification":
        raise ConfigError(
            f"data.packing={strategy!r} with model.task=sequence_classification; allowed values: false"
        )
    if strategy and fmt is not None and fmt not in CAUSAL_FORMATS:
        raise ConfigError(
            f"data.packing={strategy!r} packs causal-LM rows; the {fmt!r} format cannot be packed"
        )
    if padding_free and fmt is not None and fmt not in CAUSAL_FORMATS:
        raise ConfigError(
            f"data.padding_free=true flattens causal-LM rows; the {fmt!r} format cannot be flattened"
        )
    if (strategy or padding_free) and model is not None:
        _check_model_separates_sequences(
            model, "data.packing" if strategy else "data.padding_free", forward_kwargs
        )
    return strategy


def packing_config_errors(data: Mapping[str, Any], model: Mapping[str, Any]) -> list[str]:
    """The rules of :func:`check_packing` that a composed config decides alone (the schema's last pass).

    Args:
        data / model: the config's ``data`` and ``model`` nodes (``data.packing``, ``model.task``,
            ``model.name_or_path``).

    Returns:
        one line per problem (none or one).
    """
    if not data.get("packing"):
        return []
    from hf_lightning.core.errors import HFLightningError
    from hf_lightning.models.loading import is_encoder_decoder

    task = model.get("task", "causal_lm")
    try:
        encdec = is_encoder_decoder(task, model.get("name_or_path"))
    except HFLightningError:  # the model's own error comes when it is built
        encdec = task == "seq2seq_lm"
    try:
        check_packing(data.get("packing"), task=task, encoder_decoder=encdec)
    except ConfigError as err:
        return [str(err)]
    return []


def _check_model_separates_sequences(
    model: Any, option: str, forward_kwargs: Mapping[str, Any] | None
) -> None:
    if "position_ids" not in forward_parameters(model):
        raise ConfigError(
            f"{type(model).__name__}.forward takes no position_ids, so packed or padding-free batches "
            "cannot mark where sequences start; set data.packing=false and data.padding_free=false"
        )
    check_sequence_isolation(model, option)
    # HFLightningModule turns the cache off itself: nothing for its user to do (no line); any other
    # LightningModule must do it, or packed sequences attend to each other (WARNING)
    cache_on = getattr(getattr(model, "config", None), "use_cache", False)
    if cache_on and (forward_kwargs or {}).get("use_cache") is not False:
        log.warning(
            "packed/padding-free batches: transformers only separates sequences by position_ids when "
            "no KV cache is built; %s.config.use_cache is true, so the LightningModule must call the "
            "model with use_cache=False (HFLightningModule does) or sequences will attend to each other",
            type(model).__name__,
        )


# ------------------------------------------------------------------ the engine: rows on Arrow offsets
#: the type of every packed column: token ids, labels and document lengths all fit in int32
PACKED_TYPE = pa.int32()
#: a packed row's column of its documents' lengths, in order (TRL's name); the collators turn it into
#: ``position_ids`` restarting at 0 at each document
SEQ_LENGTHS = "seq_lengths"
#: the columns of packed rows, in order
PACKED_SCHEMA = pa.schema([(name, pa.list_(PACKED_TYPE)) for name in ("input_ids", "labels", SEQ_LENGTHS)])
#: tokens of one record batch of packed rows (whole rows, at least one): the scratch of one batch is about 20
#: bytes per token of it, whatever the corpus size
BLOCK_TOKENS = 1 << 18
#: document lengths the best-fit loop turns into Python ints at a time
_LOOP_SLICE = 1 << 16
#: the pool of a batch's transient buffers: the system allocator hands them back to the OS when freed, where
#: Arrow's default pool (mimalloc or jemalloc) keeps them, so that the scratch of every batch stays resident
_POOL = pa.system_memory_pool()


def best_fit_rows(lengths: np.ndarray, capacity: int) -> tuple[np.ndarray, np.ndarray]:
    """Best-fit decreasing over document lengths, as ``(order, docs_per_row)``.

    Documents go longest first (ties in dataset order), each into the row with the least room that still fits
    it; among rows with that room, the one that came to have it first (TRL's ``_pack_bfd`` rule); else a new
    row. Empty documents are left out (as TRL does).

    Args:
        lengths: int array ``(n,)``, tokens per document.
        capacity: tokens per row (``max_length``).

    Returns:
        ``order``: int64 ``(m,)``, the non-empty documents' indices, row after row (rows in the order they
        were opened, documents in each row in the order they were placed); ``docs_per_row``: int64
        ``(rows,)``.

    Raises:
        ValueError: a document longer than ``capacity`` (the longest, first in dataset order, is named).
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.size and lengths.max() > capacity:
        i = int(np.argmax(lengths))
        raise ValueError(f"example {i} has {int(lengths[i])} tokens, more than the bin capacity {capacity}")
    order = np.argsort(-lengths, kind="stable")
    order = order[: int(np.count_nonzero(lengths))]  # zeros sort last
    row_of = np.empty(order.size, dtype=np.int64)
    rooms: list[int] = []  # the distinct rooms (> 0) some row has left, ascending
    waiting: dict[int, deque[int]] = {}  # room -> rows with that room, in the order they came to have it
    rows = 0
    for k, n in enumerate(_ints(lengths, order)):
        j = bisect.bisect_left(rooms, n)
        if j < len(rooms):
            room = rooms[j]
            queue = waiting[room]
            row = queue.popleft()
            if not queue:
                del waiting[room]
                del rooms[j]
        else:
            room, row = capacity, rows
            rows += 1
        row_of[k] = row
        left = room - n
        if left:
            queue = waiting.get(left)
            if queue is None:
                bisect.insort(rooms, left)
                waiting[left] = deque((row,))
            else:
                queue.append(row)
    by_row = np.argsort(row_of, kind="stable")  # rows in opening order; placement order inside each
    return order[by_row], np.bincount(row_of, minlength=rows)


def _ints(lengths: np.ndarray, order: np.ndarray) -> Iterator[int]:
    """``lengths[order]`` as Python ints, a slice at a time (never one list of them all)."""
    for start in range(0, order.size, _LOOP_SLICE):
        yield from lengths[order[start : start + _LOOP_SLICE]].tolist()


def list_column(table: pa.Table, name: str) -> pa.Array:
    """One list column of ``table`` as a single Arrow array (chunks joined only when there are several)."""
    column = table.column(name)
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def _values(column: pa.Array) -> pa.Array:
    """The tokens of a list array, one after the other (``flatten`` honours a sliced array's own offset)."""
    return column.flatten().cast(PACKED_TYPE, memory_pool=_POOL)


def _rows(offsets: np.ndarray, values: pa.Array) -> pa.Array:
    if len(values) < 2**31:
        return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values)
    return pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()), values)


class _Rows:
    """A list column's rows taken by row number, chunk by chunk.

    ``column``: an Arrow list array, or a chunked one (a ``datasets`` table's record batches, memory-mapped
    from its cache file): each chunk is read where it lies, no chunk is joined to another or copied whole.
    """

    def __init__(self, column: pa.Array | pa.ChunkedArray) -> None:
        chunks = list(column.chunks) if isinstance(column, pa.ChunkedArray) else [column]
        self.chunks = [c for c in chunks if len(c)]
        self.firsts = np.cumsum([0] + [len(c) for c in self.chunks[:-1]], dtype=np.int64)

    def take(self, rows: np.ndarray) -> pa.Array:
        """The rows ``rows`` (row numbers of the column, in the order given) as one list array: one
        ``pyarrow.compute.take`` per chunk they lie in, then one to put them back in order."""
        index = pa.array(rows, pa.int64())
        if len(self.chunks) == 1:
            return pc.take(self.chunks[0], index, memory_pool=_POOL)
        chunk = np.searchsorted(self.firsts, rows, side="right") - 1
        by_chunk = np.argsort(chunk, kind="stable")
        sorted_chunks = chunk[by_chunk]
        cuts = (np.flatnonzero(np.diff(sorted_chunks)) + 1).tolist()
        parts = []
        for a, b in zip([0, *cuts], [*cuts, rows.size]):
            c = int(sorted_chunks[a])
            local = pa.array(rows[by_chunk[a:b]] - self.firsts[c], pa.int64())
            parts.append(pc.take(self.chunks[c], local, memory_pool=_POOL))
        back = np.empty_like(by_chunk)
        back[by_chunk] = np.arange(by_chunk.size)
        grouped = pa.concat_arrays(parts, memory_pool=_POOL)
        return pc.take(grouped, pa.array(back, pa.int64()), memory_pool=_POOL)


@dataclass(frozen=True)
class PackInput:
    """The documents of a ``datasets.Dataset`` as packing reads them, without copying a token.

    Attributes:
        ids / labels: the ``input_ids`` and ``labels`` columns (``labels`` ``None`` when absent: a copy of
            ``input_ids``), read by row number (memory-mapped record batches stay where they lie).
        rows: the table row of each document (a ``select``/``filter`` index mapping), ``None``: row ``i``.
        lengths: tokens per document, int64 ``(documents,)``.
    """

    ids: _Rows
    labels: _Rows | None
    rows: np.ndarray | None
    lengths: np.ndarray

    @classmethod
    def of(cls, ds: datasets.Dataset) -> PackInput:
        """The documents of ``ds`` (its table and index mapping as they are)."""
        table = ds.data
        if not len(ds) or pa.types.is_null(table.column("input_ids").type):
            return cls(_Rows(pa.array([], pa.list_(PACKED_TYPE))), None, None, np.zeros(0, np.int64))
        ids = table.column("input_ids")
        lengths = pc.list_value_length(ids).to_numpy(zero_copy_only=False).astype(np.int64)
        indices = selection_indices(ds)
        rows = None
        if indices is not None:
            rows = indices.column(0).to_numpy(zero_copy_only=False).astype(np.int64)
            lengths = lengths[rows]
        labels = _Rows(table.column("labels")) if "labels" in ds.column_names else None
        return cls(_Rows(ids), labels, rows, lengths)

    def take(self, docs: np.ndarray) -> tuple[pa.Array, pa.Array | None]:
        """The tokens and labels (``None`` when there is no ``labels`` column) of documents ``docs``, one
        after the other, as int32 arrays.

        Raises:
            pyarrow.ArrowInvalid: a token id or label outside int32.
        """
        rows = docs if self.rows is None else self.rows[docs]
        labels = None if self.labels is None else _values(self.labels.take(rows))
        return _values(self.ids.take(rows)), labels


def bfd_batches(source: PackInput, capacity: int) -> Iterator[pa.RecordBatch]:
    """:func:`best_fit_rows`'s rows of ``source`` as record batches of :data:`PACKED_SCHEMA`, each about
    :data:`BLOCK_TOKENS` tokens of whole rows; each document's first label -100.

    Only the lengths are read up front (8 bytes per document); the tokens of one batch are gathered when it
    is made.

    Raises:
        ValueError: a document longer than ``capacity``.
        pyarrow.ArrowInvalid: a token id or label outside int32.
    """
    order, per_row = best_fit_rows(source.lengths, capacity)
    doc_lengths = source.lengths[order]
    doc_ends = np.cumsum(doc_lengths)
    row_docs = np.cumsum(per_row)  # documents up to the end of each row
    row_ends = doc_ends[row_docs - 1] if per_row.size else np.zeros(0, np.int64)
    first = 0
    while first < per_row.size:
        d0 = int(row_docs[first - 1]) if first else 0
        t0 = int(doc_ends[d0 - 1]) if d0 else 0
        last = max(int(np.searchsorted(row_ends, t0 + BLOCK_TOKENS, side="right")), first + 1)
        d1 = int(row_docs[last - 1])
        ids, labels = source.take(order[d0:d1])
        lengths = doc_lengths[d0:d1]
        ends = np.cumsum(lengths)
        label_values = np.array((ids if labels is None else labels).to_numpy(zero_copy_only=False))
        label_values[ends - lengths] = IGNORE_INDEX  # each document's first token has nothing before it
        doc_offsets = np.concatenate(([0], np.cumsum(per_row[first:last])))
        offsets = np.concatenate(([0], ends[doc_offsets[1:] - 1]))
        yield pa.record_batch(
            [
                _rows(offsets, ids),
                _rows(offsets, pa.array(label_values, PACKED_TYPE)),
                _rows(doc_offsets, pa.array(lengths.astype(np.int32), PACKED_TYPE)),
            ],
            schema=PACKED_SCHEMA,
        )
        first = last


def wrapped_batches(source: PackInput, capacity: int) -> Iterator[pa.RecordBatch]:
    """:func:`pack_wrapped_table`'s rows of ``source`` as record batches of :data:`PACKED_SCHEMA`, each about
    :data:`BLOCK_TOKENS` tokens of whole rows, gathered when it is made."""
    ends = np.cumsum(source.lengths)
    total = int(ends[-1]) if ends.size else 0
    step = max(BLOCK_TOKENS // capacity, 1) * capacity
    for a in range(0, total, step):
        b = min(a + step, total)
        d0 = int(np.searchsorted(ends, a, side="right"))  # the document holding token a
        d1 = int(np.searchsorted(ends, b - 1, side="right")) + 1  # ... and token b - 1
        ids, labels = source.take(np.arange(d0, d1, dtype=np.int64))
        skip = a - int(ends[d0] - source.lengths[d0])
        ids = ids.slice(skip, b - a)
        labels = ids if labels is None else labels.slice(skip, b - a)
        offsets = np.append(np.arange(0, b - a, capacity, dtype=np.int64), b - a)
        row_lengths = np.diff(offsets).astype(np.int32)
        yield pa.record_batch(
            [
                _rows(offsets, ids),
                _rows(offsets, labels),
                _rows(np.arange(row_lengths.size + 1), pa.array(row_lengths, PACKED_TYPE)),
            ],
            schema=PACKED_SCHEMA,
        )


def pack_bfd_table(ids: pa.Array, labels: pa.Array | None, capacity: int) -> pa.Table:
    """Rows of whole documents (:func:`best_fit_rows`), each document's first label -100, in memory.

    Args:
        ids / labels: list arrays ``(n,)`` of the same row lengths; ``labels`` ``None``: a copy of ``ids``.
        capacity: ``max_length``.

    Returns:
        the packed table: ``input_ids``, ``labels`` (int32 lists of the row's tokens) and ``seq_lengths``
        (int32 lists of its documents' lengths); one chunk per :func:`bfd_batches` batch.

    Raises:
        pyarrow.ArrowInvalid: a token id or label outside int32.
    """
    lengths = pc.list_value_length(ids).to_numpy(zero_copy_only=False).astype(np.int64)
    source = PackInput(_Rows(ids), None if labels is None else _Rows(labels), None, lengths)
    return pa.Table.from_batches(list(bfd_batches(source, capacity)), schema=PACKED_SCHEMA)


def pack_wrapped_table(ids: pa.Array, labels: pa.Array | None, capacity: int) -> pa.Table:
    """Every token of every document, concatenated as given and cut every ``capacity`` tokens.

    Returns:
        ``input_ids``, ``labels`` (as given, or ``input_ids``) and ``seq_lengths`` (``[n]``: the row is one
        sequence, positions ``0..n-1``): int32 lists; the last row may be shorter.
    """
    values = _values(ids)
    total = len(values)
    offsets = (
        np.append(np.arange(0, total, capacity, dtype=np.int64), total) if total else np.zeros(1, np.int64)
    )
    label_values = values if labels is None else _values(labels)
    row_lengths = np.diff(offsets).astype(np.int32)
    return pa.table(
        {
            "input_ids": _rows(offsets, values),
            "labels": _rows(offsets, label_values),
            SEQ_LENGTHS: _rows(np.arange(row_lengths.size + 1), pa.array(row_lengths, PACKED_TYPE)),
        }
    )


def token_columns(ds: datasets.Dataset) -> tuple[pa.Array, pa.Array | None]:
    """``input_ids`` and ``labels`` (``None`` when absent) of a ``datasets.Dataset`` as Arrow list arrays.

    Reads the Arrow table (``select``/``filter`` index mappings applied), not Python lists.
    """
    names = ["input_ids"] + (["labels"] if "labels" in ds.column_names else [])
    table = ds.select_columns(names).with_format("arrow")[:]
    ids = _list_or_empty(table, "input_ids")
    return ids, (_list_or_empty(table, "labels") if "labels" in names else None)


def _list_or_empty(table: pa.Table, name: str) -> pa.Array:
    column = list_column(table, name)
    if pa.types.is_null(column.type):  # an empty dataset: from_dict({"input_ids": []}) stores nulls
        return pa.array([], pa.list_(PACKED_TYPE))
    return column


def to_dataset(table: pa.Table) -> datasets.Dataset:
    """An in-memory ``datasets.Dataset`` over ``table`` (no copy).

    With a random fingerprint, as ``datasets`` gives in-memory tables it cannot hash: left to compute one, it
    would pickle the whole table (about 30 bytes of Python memory per token).
    """
    return datasets.Dataset(table, fingerprint=generate_random_fingerprint())


def documents_across(lengths: Any, capacity: int) -> int:
    """How many documents of ``lengths``, concatenated and cut every ``capacity`` tokens, span two rows or
    more."""
    lengths = np.asarray(lengths, dtype=np.int64)
    starts = np.cumsum(lengths) - lengths
    ends = starts + lengths - 1
    return int(np.count_nonzero((lengths > 0) & (starts // capacity != ends // capacity)))


def best_fit_decreasing(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Bins of example indices, each summing to at most ``capacity`` (best-fit decreasing).

    Examples go longest first (ties in dataset order), each into the bin with the least room that still fits
    it; among bins with that room, the one that came to have it first (TRL's ``_pack_bfd`` rule, so the rows
    are TRL's row for row). Empty examples are in no bin (TRL leaves them out too). Example: lengths ``[3, 7,
    2, 5, 1]`` with capacity 8 give ``[[1, 4], [3, 0], [2]]`` (7+1, 5+3, 2). Computed by
    :func:`best_fit_rows` (O(n log capacity)).

    Raises:
        ValueError: an example longer than ``capacity``.
    """
    order, per_row = best_fit_rows(np.asarray(lengths, dtype=np.int64), capacity)
    bounds = np.cumsum(per_row).tolist()
    flat = order.tolist()
    return [flat[a:b] for a, b in zip([0] + bounds, bounds)]


def pack_bfd(ds: datasets.Dataset, max_length: int) -> datasets.Dataset:
    """Pack documents whole with :func:`best_fit_decreasing`; documents' lengths kept, first tokens masked.

    Computed on Arrow offsets (:func:`bfd_batches`): no token goes through Python. A file-backed ``ds`` gives
    a file-backed result (:func:`packed_cache_file`), an in-memory one an in-memory result.

    Returns:
        a dataset with ``input_ids`` and ``labels`` columns (int32 lists, one row per bin, the same length)
        and ``seq_lengths`` (int32 lists: the row's documents' lengths, in order).

    Raises:
        ValueError: a document longer than ``max_length`` (tokenization truncates them first).
    """
    return _pack(ds, "bfd", max_length, PackInput.of(ds))[0]


def pack_wrapped(ds: datasets.Dataset, max_length: int) -> datasets.Dataset:
    """Concatenate every document as it is (no separator added) and cut into ``max_length`` rows.

    Example: documents ``[1, 2, 3]``, ``[4, 5, 2]``, ``[6]`` with ``max_length`` 4 give rows ``[1, 2, 3, 4]``
    and ``[5, 2, 6]``. File-backed or in memory as ``ds`` is (see :func:`pack_bfd`).

    Returns:
        a dataset with ``input_ids``, ``labels`` and ``seq_lengths`` (``[n]``) columns (int32 lists).
    """
    return _pack(ds, "wrapped", max_length, PackInput.of(ds))[0]


@functools.cache
def _engine_code() -> str:
    """A sha256 of this module's source: packed rows cached by an earlier version are not reused."""
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()


def packed_cache_file(ds: datasets.Dataset, strategy: str, max_length: int) -> tuple[str, str] | None:
    """Where the packed rows of a file-backed ``ds`` are kept, and their fingerprint; ``None`` when ``ds`` is
    in memory (no cache file).

    As ``Dataset.map`` names its cache files: ``cache-<fingerprint>.arrow`` beside ``ds``'s own cache files
    (``Dataset.cleanup_cache_files`` counts it as one of them), the fingerprint a hash of ``ds``'s, the
    strategy, ``max_length`` and this module's code; in ``datasets``' temporary folder when its caching is
    off (``datasets.disable_caching()``).
    """
    if not ds.cache_files:
        return None
    fingerprint = Hasher.hash(["packed", dataset_fingerprint(ds), strategy, max_length, _engine_code()])
    folder = os.path.dirname(ds.cache_files[0]["filename"])
    if not datasets.is_caching_enabled():
        folder = get_temporary_cache_files_directory()
    return os.path.join(folder, f"cache-{fingerprint}.arrow"), fingerprint


def write_batches(path: str, batches: Iterable[pa.RecordBatch]) -> None:
    """Write ``batches`` to the Arrow stream file ``path`` (the format of ``datasets``' cache files) one at a
    time, through a temporary file in the same folder renamed into place at the end: a file at ``path`` is
    always whole, and an error leaves none."""
    with tempfile.NamedTemporaryFile(dir=os.path.dirname(path), prefix="tmp-packed-", delete=False) as tmp:
        try:
            with pa.ipc.new_stream(tmp, PACKED_SCHEMA) as writer:
                for batch in batches:
                    writer.write_batch(batch)
        except BaseException:
            tmp.close()
            os.remove(tmp.name)
            raise
    os.replace(tmp.name, path)


def _pack(
    ds: datasets.Dataset, strategy: str, max_length: int, source: PackInput
) -> tuple[datasets.Dataset, str | None]:
    """``ds`` packed with ``strategy``, and the cache file it was read from when an earlier call wrote it.

    In memory when ``ds`` is; else written to :func:`packed_cache_file` a record batch at a time (memory
    bounded by :data:`BLOCK_TOKENS` and 8 bytes per document, not by the corpus) and memory-mapped from
    there, or read from it when it is already there.
    """
    cache = packed_cache_file(ds, strategy, max_length)
    if cache is None:
        if strategy == "wrapped":  # the input's own token buffers under new offsets: nothing copied
            return to_dataset(pack_wrapped_table(*token_columns(ds), max_length)), None
        return to_dataset(pa.Table.from_batches(list(bfd_batches(source, max_length)), PACKED_SCHEMA)), None
    path, fingerprint = cache
    reused = datasets.is_caching_enabled() and os.path.exists(path)
    if not reused:
        write_batches(path, (bfd_batches if strategy == "bfd" else wrapped_batches)(source, max_length))
    out = datasets.Dataset(MemoryMappedTable.from_file(path), fingerprint=fingerprint)
    return out, path if reused else None


def announce_document_ends(tokenizer: Any, fmt: str, packing: str | None) -> None:
    """Say once (at INFO) that packed ``text`` documents end with EOS, or warn when the tokenizer has none."""
    if fmt != "text" or not packing:
        return
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        log.warning(
            "data.packing=%s: the tokenizer has no EOS token, so packed text documents have no end marker",
            packing,
        )
        return
    log.info(
        "data.packing=%s: each text document ends with the EOS token %r (id %d) unless the tokenizer ended "
        "it with one, as TRL does; unpacked and padding-free rows stay exactly tokenizer(text, "
        "truncation=True, max_length=...)",
        packing,
        tokenizer.eos_token,
        eos,
    )


def pack_dataset(
    ds: datasets.Dataset, strategy: str, max_length: int, split: str = "train"
) -> datasets.Dataset:
    """Pack a tokenized dataset with ``strategy`` (``"bfd"`` or ``"wrapped"``) and log the efficiency.

    Columns other than ``input_ids``, ``attention_mask``, ``labels`` cannot follow documents into shared rows;
    they are named in the log.

    Raises:
        KeyError: a strategy not in :data:`STRATEGIES` (:func:`check_packing` refuses it first).
    """
    if strategy not in STRATEGIES:
        raise KeyError(strategy)
    left = [c for c in ds.column_names if c not in ("input_ids", "attention_mask", "labels")]
    if left:
        log.warning(
            "%s: packing leaves the columns %s out (they cannot follow documents into shared rows)",
            split,
            left,
        )
    source = PackInput.of(ds)
    out, reused = _pack(ds, strategy, max_length, source)
    lengths = source.lengths
    if reused:
        log.info("%s: packed rows read from the datasets cache (%s; packed by an earlier run)", split, reused)
    tokens = int(lengths.sum())
    empty = int(np.count_nonzero(lengths == 0))
    across = documents_across(lengths, max_length) if strategy == "wrapped" else None
    log_packed(split, strategy, max_length, len(lengths), len(out), tokens, empty, across)
    return out


def log_packed(
    split: str,
    how: str,
    max_length: int,
    documents: int,
    rows: int,
    tokens: int,
    empty: int = 0,
    across: int | None = None,
) -> None:
    """The packing lines of a split: the efficiency (INFO), the empty documents left out (WARNING), and for
    ``wrapped`` (``across`` given) the documents that continue into the next row (INFO).

    Args:
        how: the strategy as the line names it (``bfd``, ``bfd within buffers of 4096 documents``).
        documents / rows / tokens: documents packed, rows made, real tokens in them.
    """
    slots = rows * max_length
    log.info(
        "%s: packed %s into %s of %d (%s): efficiency %.1f%% (%d real tokens / %d slots)",
        split,
        _counted(documents, "document"),
        _counted(rows, "row"),
        max_length,
        how,
        100.0 * tokens / slots if slots else 0.0,
        tokens,
        slots,
    )
    if empty:
        log.warning(
            "%s: %s in no packed row",
            split,
            _counted(empty, "empty document (no token) is", "empty documents (no token) are"),
        )
    if across is not None:
        log.info(
            "%s: %s from one row into the next (nothing is cut off)",
            split,
            _counted(across, "document continues", "documents continue"),
        )


def _counted(n: int, one: str, many: str | None = None) -> str:
    """``"1 row"``, ``"2 rows"`` (``many``: the plural when it is not ``one + "s"``)."""
    return f"{n} {one if n == 1 else (many or one + 's')}"


# ------------------------------------------------------------------ a stream, packed as it is read
#: documents a stream is packed within by ``bfd`` (``data.pack_buffer``'s default; TRL's ``SFTTrainer`` packs
#: ``Dataset.map`` batches of 1,000)
PACK_BUFFER = 4096


@dataclass(frozen=True)
class StreamPacking:
    """How a stream is packed (:class:`StreamPacker`): ``strategy`` (``bfd`` or ``wrapped``), rows of
    ``max_length`` tokens, ``bfd`` within consecutive buffers of ``buffer`` documents."""

    strategy: str
    max_length: int
    buffer: int = PACK_BUFFER

    @property
    def how(self) -> str:
        """The strategy as the log names it."""
        if self.strategy == "bfd":
            return f"bfd within buffers of {self.buffer} documents"
        return "wrapped, the whole stream"


def _list_array(rows: Sequence[Any]) -> pa.Array:
    """Token rows (lists, numpy arrays or tensors of ints) as one Arrow list array."""
    parts = [np.asarray(r, dtype=np.int64).reshape(-1) for r in rows]
    offsets = np.zeros(len(parts) + 1, np.int64)
    np.cumsum([p.size for p in parts], out=offsets[1:])
    values = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    return _rows(offsets, pa.array(values))


def _row_dicts(table: pa.Table, order: np.ndarray | None = None) -> list[dict[str, list[int]]]:
    """The rows of a packed table as ``{column: list of int}`` (in ``order`` when given)."""
    columns = {}
    for name in table.column_names:
        column = list_column(table, name)
        ends = np.cumsum(pc.list_value_length(column).to_numpy(zero_copy_only=False).astype(np.int64))
        columns[name] = (ends, _values(column).to_numpy(zero_copy_only=False))
    rows = range(table.num_rows) if order is None else order.tolist()
    out = []
    for r in rows:
        row = {}
        for name, (ends, values) in columns.items():
            start = int(ends[r - 1]) if r else 0
            row[name] = values[start : int(ends[r])].tolist()
        out.append(row)
    return out


class StreamPacker:
    """Packs tokenized documents as they come into the rows of :func:`pack_bfd_table` /
    :func:`pack_wrapped_table`, in bounded memory.

    ``bfd``: each consecutive buffer of ``packing.buffer`` documents is packed on its own, so its rows are
    :func:`best_fit_decreasing`'s rows of that buffer (with ``seq_lengths``, each document's first
    label -100). ``wrapped``: the buffers' concatenation is cut every ``max_length`` tokens and the short last
    row of a buffer is carried into the next one, so the rows are :func:`pack_wrapped`'s rows of the whole
    stream (only the stream's last row may be short).

    Args:
        packing: strategy, row length and buffer (:class:`StreamPacking`).
        order_seed: ``None``: each buffer's rows in the order the packer makes them; else in a random order
            drawn from ``(*order_seed, buffer index)``, the same in every process (a shuffled stream's
            rows are not grouped longest first).

    :meth:`pack` takes documents (mappings with ``input_ids`` and optionally ``labels``: lists, numpy arrays
    or tensors of ints; other keys are left out and named in :attr:`left_out`) and yields rows
    ``{"input_ids", "labels", "seq_lengths"}`` (lists of int; ``input_ids`` and ``labels`` the same length,
    at most ``max_length``, which ``seq_lengths`` sums to).
    After a pass, :attr:`documents`, :attr:`empty` (documents without a token, in no row), :attr:`rows`,
    :attr:`tokens` and, for ``wrapped``, :attr:`across` (documents continued into the next row) describe it
    (:meth:`log`).

    Raises:
        ValueError: a ``bfd`` document longer than ``max_length`` (tokenization truncates them first).
        pyarrow.ArrowInvalid: a token id or label outside int32.
    """

    def __init__(self, packing: StreamPacking, order_seed: Sequence[int] | None = None) -> None:
        if packing.strategy not in STRATEGIES:
            raise KeyError(packing.strategy)
        self.packing = packing
        self.order_seed = None if order_seed is None else [int(v) for v in order_seed]
        self.documents = self.empty = self.rows = self.tokens = self.across = 0
        self.left_out: list[str] = []
        self._buffers = 0
        self._carry: tuple[list[int], list[int]] | None = None  # wrapped: the short last row so far
        self._offset = 0  # wrapped: tokens of the stream before the current buffer (for `across`)

    def pack(self, documents: Iterable[Mapping[str, Any]]) -> Iterator[dict[str, list[int]]]:
        buffer: list[Mapping[str, Any]] = []
        for doc in documents:
            buffer.append(doc)
            if len(buffer) >= self.packing.buffer:
                yield from self._pack(buffer, last=False)
                buffer = []
        yield from self._pack(buffer, last=True)

    def _pack(self, docs: list[Mapping[str, Any]], last: bool) -> list[dict[str, list[int]]]:
        capacity = self.packing.max_length
        for doc in docs[:1]:
            extra = [k for k in doc if k not in ("input_ids", "attention_mask", "labels", *self.left_out)]
            self.left_out += extra
        ids = _list_array([d["input_ids"] for d in docs])
        labels = None
        if any("labels" in d for d in docs):
            labels = _list_array([d.get("labels", d["input_ids"]) for d in docs])
        lengths = pc.list_value_length(ids).to_numpy(zero_copy_only=False).astype(np.int64)
        self.documents += len(docs)
        self.empty += int(np.count_nonzero(lengths == 0))
        self.tokens += int(lengths.sum())
        if self.packing.strategy == "bfd":
            table = pack_bfd_table(ids, labels, capacity)
        else:
            table = self._wrap(ids, labels, lengths, last)
        order = None
        if self.order_seed is not None and table.num_rows > 1:
            order = np.random.default_rng([*self.order_seed, self._buffers]).permutation(table.num_rows)
        self._buffers += 1
        self.rows += table.num_rows
        return _row_dicts(table, order)

    def _wrap(self, ids: pa.Array, labels: pa.Array | None, lengths: np.ndarray, last: bool) -> pa.Table:
        """Wrapped rows of the carried row and ``ids``; the short last row is carried unless ``last``."""
        capacity = self.packing.max_length
        starts = self._offset + np.cumsum(lengths) - lengths
        ends = starts + lengths - 1
        self.across += int(np.count_nonzero((lengths > 0) & (starts // capacity != ends // capacity)))
        self._offset += int(lengths.sum())
        if labels is None:
            labels = ids
        if self._carry is not None:
            carried_ids, carried_labels = self._carry
            ids = pa.concat_arrays([_list_array([carried_ids]), ids])
            labels = pa.concat_arrays([_list_array([carried_labels]), labels])
        table = pack_wrapped_table(ids, labels, capacity)
        self._carry = None
        if not last and table.num_rows:
            tail = _row_dicts(table.slice(table.num_rows - 1))[0]
            if len(tail["input_ids"]) < capacity:
                self._carry = (tail["input_ids"], tail["labels"])
                table = table.slice(0, table.num_rows - 1)
        return table

    def log(self, split: str) -> None:
        """The packing lines of this pass (:func:`log_packed`)."""
        p = self.packing
        across = self.across if p.strategy == "wrapped" else None
        log_packed(split, p.how, p.max_length, self.documents, self.rows, self.tokens, self.empty, across)
