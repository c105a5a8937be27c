"""Streams (``datasets.IterableDataset``, ``streaming=true`` files, plain torch ``IterableDataset``): sharded.

:class:`ShardedStream` is what the ``DataLoader`` iterates, once per reader (``S = world_size x workers``
readers: every ``DataLoader`` worker of every rank). Two exact splits, each example seen exactly once per
epoch across ranks x workers, every reader yielding the same number of examples (DDP hangs on unequal step
counts):

- by shards, where a training ``datasets.IterableDataset`` has at least ``S`` shards (files): each reader
  reads only its own shards, so every row is decoded once; the rows per shard are counted once when the loader
  is built, and shorter readers end with masked copies (:func:`plan_shards`; below, why it splits this way
  rather than with ``datasets.distributed.split_dataset_by_node``);
- by rows, otherwise (one INFO line says so): every reader reads the whole source in the same order and keeps
  one example in ``S``: stream position ``j`` goes to rank ``(j mod S) // workers``, worker ``(j mod S) mod
  workers``. The price: each of the ``S`` readers decodes every row (tokenization runs only on the rows it
  keeps).

The tail: when the stream ends, readers that got fewer examples than the others yield *masked copies* (all
labels ``-100``; one at most when split by rows) so that all readers, hence all ranks, produce the same number
of batches; it adds nothing to the loss or to ``num_items_in_batch``. For the same reason a row without a
target (empty, no assistant turn, all labels -100 after truncation, ...) is not dropped (that would unbalance
the ranks): it is counted per cause, logged, and kept with zero weight (a row with no real token as one pad
token, so no batch is empty).

Order: with ``shuffle``, a ``datasets`` stream uses its own shuffle buffer (``IterableDataset.shuffle(seed,
buffer_size)``; ``set_epoch`` shifts the seed and the file order), a torch stream a buffer of the same kind
seeded by ``seed + epoch`` (and its own ``set_epoch`` if it has one). ``group_by_length`` sorts, longest
first, within consecutive bounded buffers (``length_buffer`` examples) per reader (HF ignores
``group_by_length`` for streams). A validation hold-out picks rows by a stable hash of their content: the same
rows in every epoch and reader.

Packing (``data.packing``, ``packing=`` a :class:`~hf_lightning.data.packing.StreamPacking`): the split is by
packed rows. Every reader reads and tokenizes every row, drops the rows without a target (counted, as
map-style packing drops them), packs the whole stream the same way
(:class:`~hf_lightning.data.packing.StreamPacker`: ``bfd`` within consecutive buffers of ``pack_buffer``
documents, ``wrapped`` over the whole stream) and keeps packed row ``j`` when ``j mod S`` is its index; the
tail is topped up as above (one masked copy at most), so every document is in exactly one row per epoch and
all readers yield the same number of rows. The price: each of the ``S`` readers tokenizes every row (one INFO
line says so with ``S``). The split by shards is not used: each reader packing its own shards would make a
number of rows known only at its end, different per reader. The number of packed rows is not known before a
pass, so an epoch has no known length (``trainer.max_steps``). With ``shuffle`` each buffer's rows go out in
an order drawn from ``(seed, epoch, buffer)``, the same in every reader. The pass is deterministic, so a
resume that skips the batches already trained continues with exactly the rows not yet trained on.

Split by shards (:func:`plan_shards`): reader ``r`` reads the shards ``i`` with ``i mod S == r``, through
``IterableDataset.shard(S, r, contiguous=False)`` (the call ``datasets.distributed.split_dataset_by_node`` and
``datasets``' own worker split make; they are not called themselves: the first reshuffles which shards a node
gets every epoch and neither evens out the row counts, and DDP hangs when ranks run different numbers of
steps). The rows of each shard are counted once, when the training loader is built (in Arrow, without making
Python rows; through the hold-out filter when there is one), so every reader knows the largest reader's share
and ends its own with masked copies up to it. Uneven shards would make that share, hence the steps of an
epoch, larger than the split by rows gives (``ceil(rows / S)``): the split by shards is taken only while it
adds at most :data:`MAX_EXTRA_BATCHES` of the batches per epoch (none for fewer than 100 batches). Otherwise
(a plain torch stream, a single file, fewer shards than readers, a reader left without rows, uneven shards,
evaluation) the split is by rows, and one INFO line says so with the shard and reader counts.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import random
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import datasets
import torch
from torch.utils.data import IterableDataset, get_worker_info

from hf_lightning.core.errors import DataError
from hf_lightning.data.formats import SOURCE_COLUMNS, RowReport, row_numbers
from hf_lightning.data.packing import StreamPacker, StreamPacking
from hf_lightning.data.sampling import PlaceholderRow, mask_example, token_count
from hf_lightning.data.sources import is_json_lines, jsonl_lines, read_error

log = logging.getLogger(__name__)


def _jsonable(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    return repr(value)


def row_hash(example: Mapping[str, Any]) -> int:
    """A stable 64-bit hash of a row's content (independent of the process, the order and
    ``PYTHONHASHSEED``)."""
    text = json.dumps(example, sort_keys=True, default=_jsonable, ensure_ascii=False)
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def in_holdout(example: Mapping[str, Any], fraction: float) -> bool:
    """Whether a row belongs to the validation hold-out of a stream (about ``fraction`` of the rows)."""
    return row_hash(example) % 1_000_000 < round(fraction * 1_000_000)


def buffer_shuffle(rows: Iterable[Any], buffer_size: int, rng: random.Random) -> Iterator[Any]:
    """Shuffle through a bounded buffer (the algorithm of ``datasets``'
    ``BufferShuffledExamplesIterable``)."""
    buffer: list[Any] = []
    for row in rows:
        if len(buffer) < buffer_size:
            buffer.append(row)
            continue
        i = rng.randrange(buffer_size)
        yield buffer[i]
        buffer[i] = row
    rng.shuffle(buffer)
    yield from buffer


def _unbatch(batches: Iterable[Mapping[str, list]]) -> Iterator[dict[str, Any]]:
    for batch in batches:
        keys = list(batch)
        n = len(batch[keys[0]]) if keys else 0
        for i in range(n):
            yield {k: batch[k][i] for k in keys}


def _length(example: Mapping[str, Any]) -> int:
    value = example.get("input_ids")
    return 0 if value is None else token_count(value)


def per_reader(length: int | None, world_size: int, num_workers: int) -> int | None:
    """Examples each of the ``world_size x max(num_workers, 1)`` readers yields per epoch (top-ups
    included)."""
    if length is None:
        return None
    return math.ceil(length / (world_size * max(num_workers, 1)))


def reader_batches(rows: int, batch_size: int, drop_last: bool) -> int:
    """Batches one reader makes of ``rows`` examples."""
    return rows // batch_size if drop_last else -(-rows // batch_size)


def stream_batches(
    length: int | None, world_size: int, batch_size: int, num_workers: int, drop_last: bool
) -> int | None:
    """Batches one rank's ``DataLoader`` yields from a stream of ``length`` rows (each worker batches its
    share); ``None`` when the length is unknown."""
    n = per_reader(length, world_size, num_workers)
    return None if n is None else reader_batches(n, batch_size, drop_last) * max(num_workers, 1)


# ------------------------------------------------------------------ which shards each reader reads
MAX_EXTRA_BATCHES = (
    0.01  # share of an epoch's batches the split by shards may add (masked copies of uneven shards)
)


@dataclass(frozen=True)
class ShardPlan:
    """Shards over readers: ``shard_rows[i]`` rows in shard ``i``; ``readers`` readers."""

    shard_rows: tuple[int, ...]
    readers: int

    def rows_of(self, reader: int) -> int:
        """Rows reader ``reader`` reads: the sum over its shards ``i`` (``i mod readers == reader``)."""
        return sum(self.shard_rows[reader :: self.readers])

    @property
    def per_reader(self) -> int:
        """Rows every reader yields per epoch, masked copies included: the largest reader's share."""
        return max(self.rows_of(r) for r in range(self.readers))


def count_shard_rows(source: datasets.IterableDataset, holdout: Any = None) -> tuple[int, ...]:
    """Rows in each shard of ``source`` (one pass; ``holdout``: a row filter ``example -> bool`` applied
    first).

    Without a filter the shards are read as Arrow tables (no Python row is made); with one, row by row.
    """
    counts = []
    for i in range(source.num_shards):
        shard = source.shard(num_shards=source.num_shards, index=i, contiguous=True)
        if holdout is None:
            counts.append(sum(t.num_rows for t in shard.with_format("arrow").iter(batch_size=65_536)))
        else:
            counts.append(sum(1 for ex in shard if holdout(ex)))
    return tuple(counts)


def plan_shards(
    source: Any,
    readers: int,
    split: str,
    holdout: Any = None,
    world_size: int = 1,
    num_workers: int = 0,
    batch_size: int = 1,
    drop_last: bool = False,
) -> ShardPlan | None:
    """The shard split for ``readers`` readers, or ``None`` for the row-skipping fallback (with its INFO
    line).

    Args:
        source: the stream (a ``datasets.IterableDataset`` can be split by shards; anything else cannot).
        readers: ``world_size x max(num_workers, 1)``.
        split: name in the log (``train``).
        holdout: ``example -> bool``, the rows the reader keeps (the validation hold-out's complement).
        world_size / num_workers: for the log line.
        batch_size / drop_last: each reader's batches, to weigh the masked copies of uneven shards.
    """
    if readers <= 1:
        return None
    shards = source.num_shards if isinstance(source, datasets.IterableDataset) else 1
    who = f"{readers} readers ({world_size} ranks x {max(num_workers, 1)} DataLoader workers)"
    why = None
    if not isinstance(source, datasets.IterableDataset):
        why = "a torch IterableDataset has no shards to hand out"
    elif shards < readers:
        why = (
            f"fewer shards than readers; split the source into at least {readers} files to read each row once"
        )
    if why is None:
        plan = ShardPlan(count_shard_rows(source, holdout), readers)
        empty = [r for r in range(readers) if plan.rows_of(r) == 0]
        by_rows = reader_batches(-(-sum(plan.shard_rows) // readers), batch_size, drop_last)
        by_shards = reader_batches(plan.per_reader, batch_size, drop_last)
        if empty:
            why = f"reader {empty[0]}'s shards hold no row"
        elif by_shards - by_rows > int(MAX_EXTRA_BATCHES * by_rows):
            why = (
                f"uneven shards: split by shards the largest reader's {plan.per_reader} rows take "
                f"{by_shards} batches per epoch where the split by rows takes {by_rows}"
            )
        else:
            low = min(plan.rows_of(r) for r in range(readers))
            log.info(
                "%s stream: %d shards over %s: each reader reads only its own shards, every row once per "
                "epoch (%d to %d rows per reader; shorter readers end with %d masked copies in all, so ranks "
                "stay in step)",
                split,
                shards,
                who,
                low,
                plan.per_reader,
                sum(plan.per_reader - plan.rows_of(r) for r in range(readers)),
            )
            return plan
    log.info(
        "%s stream: %d shard%s for %s: every reader reads every row and keeps 1 in %d (%s)",
        split,
        shards,
        "" if shards == 1 else "s",
        who,
        readers,
        why,
    )
    return None


class ShardedStream(IterableDataset):
    """One reader's share of a stream: examples ``j`` with ``j mod S`` equal to this reader's index.

    Args:
        source: a ``datasets.IterableDataset`` or a torch ``IterableDataset`` (yielding mappings). A torch
            stream must yield the full stream in every process: this class does the sharding.
        processor: ``example -> (example, report)`` (an
        :class:`~hf_lightning.data.tokenize.ExampleProcessor`,
            which returns a zero-weight stand-in for a row without a target) or ``None`` to yield rows as they
            are.
        rank / world_size: this process and the number of processes.
        shuffle / seed / buffer_size: buffered shuffling, seeded by ``seed + epoch``.
        length_buffer: group by length: sort within consecutive buffers of this many examples (longest
            first); ``None`` keeps the order.
        holdout: ``(fraction, keep)``: keep only the rows in (``keep=True``) or out of the hash hold-out.
        length: the number of rows of the source when known (``len(source)``), else ``None``.
        top_up: end short readers with a masked copy (training); ``False`` for evaluation, where readers
            may differ by one example (a reader with none yields one placeholder, a masked copy).
        split: name used in the log.
        name: the source's ``data.path`` (for messages: a bad row is named by its file line when it can be).
        packing: pack the tokenized rows as they come (:class:`~hf_lightning.data.packing.StreamPacking`) and
            split the packed rows over the readers (see the module docstring); ``None``: rows as they are.

    ``set_epoch(e)`` is stored in shared memory, so persistent workers see it too. :meth:`plan_readers`,
    called in the main process before the workers copy the object, chooses the split by shards where the
    source allows it.
    """

    def __init__(
        self,
        source: Any,
        processor: Callable[[Mapping[str, Any]], tuple[dict, bool, bool]] | None = None,
        rank: int = 0,
        world_size: int = 1,
        shuffle: bool = False,
        seed: int = 0,
        buffer_size: int = 1000,
        length_buffer: int | None = None,
        holdout: tuple[float, bool] | None = None,
        length: int | None = None,
        top_up: bool = True,
        split: str = "train",
        name: Any = None,
        packing: StreamPacking | None = None,
    ) -> None:
        super().__init__()
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world_size {world_size}")
        self.source = source
        self.processor = processor
        self.rank = rank
        self.world_size = world_size
        self.shuffle = shuffle
        self.seed = seed
        self.buffer_size = buffer_size
        self.length_buffer = length_buffer
        self.holdout = holdout
        self.length = length
        self.top_up = top_up
        self.split = split
        self.name = name
        self.packing = packing
        self._epoch = torch.zeros((), dtype=torch.long).share_memory_()
        self.plan: ShardPlan | None = None  # the split by shards (plan_readers); None: by rows

    def plan_readers(
        self, num_workers: int, batch_size: int = 1, drop_last: bool = False
    ) -> ShardPlan | None:
        """Split a training stream by shards over ``world_size x max(num_workers, 1)`` readers where it has
        enough (:func:`plan_shards`: counts each shard's rows once, logs one
        line); evaluation keeps the split by rows. Returns the plan (``None``: by rows)."""
        holdout = self._kept if self.holdout is not None else None
        readers = self.world_size * max(num_workers, 1)
        if self.packing is not None:
            self.plan = None
            self._announce_packing(readers, num_workers)
        elif self.top_up:
            self.plan = plan_shards(
                self.source, readers, self.split, holdout, self.world_size, num_workers, batch_size, drop_last
            )
        return self.plan

    def _announce_packing(self, readers: int, num_workers: int) -> None:
        """The one INFO line of a packed stream's split: what every reader does, and its cost."""
        shards = self.source.num_shards if isinstance(self.source, datasets.IterableDataset) else 1
        why_not_shards = (
            f"; not split by its {shards} shards: each reader packing its own would make a number of rows "
            "known only at its end, different per reader"
            if readers > 1 and shards >= readers
            else ""
        )
        if readers == 1:
            log.info(
                "%s stream packed as it is read (data.packing=%s, %s), by one reader",
                self.split,
                self.packing.strategy,
                self.packing.how,
            )
            return
        log.info(
            "%s stream packed as it is read (data.packing=%s, %s): each of the %d readers (%s x %d "
            "DataLoader workers) reads and tokenizes every row and packs the whole stream the same way, then "
            "keeps packed row j when j mod %d is its index (every document in one row once per epoch; "
            "readers end with masked copies to the same count)%s",
            self.split,
            self.packing.strategy,
            self.packing.how,
            readers,
            f"{self.world_size} rank" + ("s" if self.world_size != 1 else ""),
            max(num_workers, 1),
            readers,
            why_not_shards,
        )

    # ----------------------------------------------------------------------------------------- epoch
    def set_epoch(self, epoch: int) -> None:
        self._epoch.fill_(int(epoch))

    @property
    def epoch(self) -> int:
        return int(self._epoch)

    # ----------------------------------------------------------------------------------------- sizes
    def per_reader(self, num_workers: int) -> int | None:
        """Examples each reader yields this epoch (top-ups included), when the stream length is known (never
        for a packed stream: its number of rows is known only once it is read)."""
        if self.packing is not None:
            return None
        plan = self.plan
        if plan is not None and plan.readers == self.world_size * max(num_workers, 1):
            return plan.per_reader
        return per_reader(self.length, self.world_size, num_workers)

    def num_batches(self, batch_size: int, num_workers: int, drop_last: bool) -> int | None:
        """Batches one rank's ``DataLoader`` yields: each worker batches its own share."""
        n = self.per_reader(num_workers)
        if n is None or self.length is None:
            return None
        return reader_batches(n, batch_size, drop_last) * max(num_workers, 1)

    def __len__(self) -> int:
        n = self.per_reader(1)  # examples per rank with one reader; DataLoader length comes from num_batches
        if n is None:
            raise TypeError("the length of this stream is unknown")
        return n

    # ------------------------------------------------------------------------------------- iteration
    def _rows(self, epoch: int, shard: tuple[int, int] | None = None) -> Iterator[dict[str, Any]]:
        """The whole source in this epoch's order (identical in every reader); ``shard=(index, count)``: only
        the shards ``i`` with ``i mod count == index`` (``IterableDataset.shard``), in this epoch's order."""
        src = self.source
        holdout = self.holdout
        if isinstance(src, datasets.IterableDataset):
            if shard is not None:
                src = src.shard(num_shards=shard[1], index=shard[0], contiguous=False)
            if holdout is not None:
                src = src.filter(self._kept)
            if self.shuffle:
                # set_epoch only with shuffling: datasets also reorders the files of an epoch > 0
                src = src.shuffle(seed=self.seed, buffer_size=self.buffer_size)
                src.set_epoch(epoch)
            # .iter() instead of iter(): datasets would otherwise split its files across DataLoader workers
            # itself
            yield from _unbatch(src.iter(batch_size=256))
            return
        if self.shuffle and hasattr(src, "set_epoch"):
            src.set_epoch(epoch)
        rows: Iterable[Any] = iter(src)
        if holdout is not None:
            rows = (r for r in rows if self._kept(r))
        if self.shuffle:
            rows = buffer_shuffle(rows, self.buffer_size, random.Random(self.seed + epoch))
        yield from rows

    def _kept(self, example: Mapping[str, Any]) -> bool:
        """Whether ``example`` is on this split's side of the validation hold-out (:attr:`holdout`)."""
        fraction, keep = self.holdout
        return in_holdout(example, fraction) == keep

    def reader(self) -> tuple[int, int]:
        """``(index, count)`` of this reader among all ranks x workers."""
        info = get_worker_info()
        workers, worker = (info.num_workers, info.id) if info is not None else (1, 0)
        return self.rank * workers + worker, self.world_size * workers

    def __iter__(self) -> Iterator[dict[str, Any]]:
        index, count = self.reader()
        kept = self.read_shard(index, count)
        yield from self._grouped(kept, self.length_buffer) if self.length_buffer else kept

    def read_shard(self, index: int, count: int) -> Iterator[dict[str, Any]]:
        """The rows of reader ``index`` of ``count`` for this epoch (tokenized, top-ups included): its own
        shards when :attr:`plan` splits by shards for ``count`` readers, else one row in ``count`` of the
        whole stream."""
        if self.packing is not None:
            yield from self._read_packed(index, count)
            return
        plan = self.plan if self.plan is not None and self.plan.readers == count else None
        total = mine = 0
        first = None
        report = RowReport(f"{self.split} stream", lambda rows: row_numbers(f"{self.split} stream row", rows))
        for j, row in enumerate(self._read(self.epoch, (index, count) if plan else None)):
            total += 1
            if first is None:
                first = row
            if plan is None and j % count != index:
                continue
            mine += 1
            if self.processor is not None:
                try:
                    row, info = self.processor(row)
                except DataError as err:
                    raise DataError(f"{self._where(j, index if plan else None)}: {err}") from err
                report.add(j, info)
            yield row
        share = plan.per_reader if plan else (math.ceil(total / count) if total else 0)
        if plan is not None and mine != plan.rows_of(index):
            raise DataError(
                f"{self._source()}: reader {index} of {count} read {mine} rows from its shards, but "
                f"{plan.rows_of(index)} were counted when the loader was built: the source changed while "
                "training read it"
            )
        if first is not None and ((self.top_up and mine < share) or (not self.top_up and mine == 0)):
            row = mask_example(self.processor(first)[0] if self.processor is not None else first)
            # training: tail top-ups (same step count on every rank, no loss term; one at most when split by
            # rows); evaluation: a reader with no row evaluates one placeholder, so that its rank runs the
            # loop (hf_lightning.data.collators.PlaceholderAwareCollator)
            for _ in range(share - mine if self.top_up else 1):
                yield row if self.top_up else PlaceholderRow(row)
        max_length = getattr(self.processor, "kwargs", {}).get("max_length")
        report.log(
            max_length,
            logging.WARNING if self.epoch == 0 else logging.INFO,
            f"reader {index} of {count}: ",
            kept=True,
        )

    def _read_packed(self, index: int, count: int) -> Iterator[dict[str, Any]]:
        """Packed row ``j`` of the whole stream for ``j mod count == index``, then the top-up (see the module
        docstring); reader 0 logs the row report and the packing lines of the whole stream."""
        epoch = self.epoch
        report = RowReport(f"{self.split} stream", lambda rows: row_numbers(f"{self.split} stream row", rows))

        def documents() -> Iterator[dict[str, Any]]:
            for j, row in enumerate(self._read(epoch)):
                if self.processor is not None:
                    try:
                        row, info = self.processor(row)
                    except DataError as err:
                        raise DataError(f"{self._where(j)}: {err}") from err
                    if report.add(j, info):  # no target: in no row, as map-style packing drops it
                        continue
                yield row

        packer = StreamPacker(self.packing, order_seed=(self.seed, epoch) if self.shuffle else None)
        total = mine = 0
        first = None
        for j, row in enumerate(packer.pack(documents())):
            total += 1
            if first is None:
                first = row
            if j % count == index:
                mine += 1
                yield row
        max_length = getattr(self.processor, "kwargs", {}).get("max_length")
        if total == 0 and report.rows:
            raise report.empty_error(self.name, max_length)
        share = math.ceil(total / count)
        if first is not None and ((self.top_up and mine < share) or (not self.top_up and mine == 0)):
            for _ in range(share - mine if self.top_up else 1):
                yield mask_example(first) if self.top_up else PlaceholderRow(mask_example(first))
        if index == 0:  # every reader saw every row: one reader speaks for the stream
            level = logging.WARNING if epoch == 0 else logging.INFO
            report.log(max_length, level, "")
            consumed = SOURCE_COLUMNS.get(getattr(self.processor, "fmt", None), ())
            left_out = [c for c in packer.left_out if c not in consumed]  # tokenized: expected to go
            if left_out and epoch == 0:
                log.warning(
                    "%s: packing leaves the columns %s out (they cannot follow documents into shared rows)",
                    self.split,
                    left_out,
                )
            packer.log(f"{self.split} stream")

    def _read(self, epoch: int, shard: tuple[int, int] | None = None) -> Iterator[dict[str, Any]]:
        """:meth:`_rows`, with a reader's error (a broken line, a byte that is not UTF-8) as a
        :class:`DataError` that names the file line."""
        rows = self._rows(epoch, shard)
        while True:
            try:
                row = next(rows)
            except StopIteration:
                return
            except DataError:
                raise
            except Exception as err:  # pyarrow, json and codecs each raise their own types
                raise read_error(self.name, self.split, err) from err
            yield row

    def _source(self) -> str:
        return f"data.path={self.name}" if self.name is not None else "the stream"

    def _where(self, j: int, reader: int | None = None) -> str:
        """Where row ``j`` of this epoch's order comes from: the file line when the order is the file's (no
        shuffle, no hold-out, one reader's order is the file's), else the position (in ``reader``'s shards,
        when split)."""
        name = self.name
        if reader is not None:
            order = ", in this epoch's shuffled order" if self.shuffle else ""
            return f"{self._source()} ({self.split} stream row {j} of reader {reader}'s shards{order})"
        if (
            isinstance(name, (str, os.PathLike))
            and os.path.isfile(name)
            and not self.shuffle
            and self.holdout is None
        ):
            path = os.fspath(name)
            line = jsonl_lines(path, [j])[0] if is_json_lines(path) else None
            if line is not None:
                return f"data.path={path} line {line} ({self.split} stream row {j})"
        order = ", in this epoch's shuffled order" if self.shuffle else ""
        return f"{self._source()} ({self.split} stream row {j}{order})"

    @staticmethod
    def _grouped(rows: Iterator[dict[str, Any]], size: int) -> Iterator[dict[str, Any]]:
        buffer: list[dict[str, Any]] = []
        for row in rows:
            buffer.append(row)
            if len(buffer) >= size:
                yield from sorted(buffer, key=_length, reverse=True)
                buffer = []
        yield from sorted(buffer, key=_length, reverse=True)
