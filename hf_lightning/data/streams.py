"""Streams (``datasets.IterableDataset``, ``streaming=true`` files, plain torch ``IterableDataset``): sharded.

Ours, not ``datasets.distributed.split_dataset_by_node``: that splits by files when it can (unequal counts per
rank) and never tops up, so ranks could run different numbers of steps; here the split is exact per reader.

:class:`ShardedStream` is what the ``DataLoader`` iterates. Inside every process and every ``DataLoader``
worker it reads the whole source in the same order and keeps one example in ``S = world_size x workers``:
stream position ``j`` goes to rank ``(j mod S) // workers``, worker ``(j mod S) mod workers``. So every
example is seen exactly once per epoch across ranks x workers, without relying on the number of files
(``datasets``' shard-level split would give ranks unequal counts, and DDP hangs on unequal step counts).
The price: each of the ``S`` readers decodes every row (tokenization runs only on the rows it keeps).

The tail: when the stream ends, readers that got one example fewer than the others yield a *masked copy*
(all labels ``-100``) so that all readers, hence all ranks, produce the same number of batches; it adds
nothing to the loss or to ``num_items_in_batch``. For the same reason a row without a target (empty, no assistant
turn, all labels -100 after truncation, ...) is not dropped (that would unbalance the ranks): it is counted per
cause, logged, and kept with zero weight (a row with no real token as one pad token, so no batch is empty).

Order: with ``shuffle``, a ``datasets`` stream uses its own shuffle buffer (``IterableDataset.shuffle(seed,
buffer_size)``; ``set_epoch`` shifts the seed and the file order), a torch stream a buffer of the same kind
seeded by ``seed + epoch`` (and its own ``set_epoch`` if it has one). ``group_by_length`` sorts, longest first,
within consecutive bounded buffers (``length_buffer`` examples) per reader (HF ignores ``group_by_length`` for streams).
A validation hold-out picks rows by a stable hash of their content: the same rows in every epoch and reader.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import random
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import datasets
import torch
from torch.utils.data import IterableDataset, get_worker_info

from hf_lightning.data.file_errors import is_json_lines, jsonl_line_of_row, read_error
from hf_lightning.data.row_report import RowReport, row_numbers
from hf_lightning.data.samplers import PlaceholderRow, mask_example
from hf_lightning.errors import DataError

log = logging.getLogger(__name__)


def _jsonable(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    return repr(value)


def row_hash(example: Mapping[str, Any]) -> int:
    """A stable 64-bit hash of a row's content (independent of the process, the order and ``PYTHONHASHSEED``)."""
    text = json.dumps(example, sort_keys=True, default=_jsonable, ensure_ascii=False)
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def in_holdout(example: Mapping[str, Any], fraction: float) -> bool:
    """Whether a row belongs to the validation hold-out of a stream (about ``fraction`` of the rows)."""
    return row_hash(example) % 1_000_000 < round(fraction * 1_000_000)


def buffer_shuffle(rows: Iterable[Any], buffer_size: int, rng: random.Random) -> Iterator[Any]:
    """Shuffle through a bounded buffer (the algorithm of ``datasets``' ``BufferShuffledExamplesIterable``)."""
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
    if value is None:
        return 0
    return int(value.numel()) if hasattr(value, "numel") else len(torch.as_tensor(value).reshape(-1))


def per_reader(length: int | None, world_size: int, num_workers: int) -> int | None:
    """Examples each of the ``world_size x max(num_workers, 1)`` readers yields per epoch (top-ups included)."""
    if length is None:
        return None
    return math.ceil(length / (world_size * max(num_workers, 1)))


def stream_batches(
    length: int | None, world_size: int, batch_size: int, num_workers: int, drop_last: bool
) -> int | None:
    """Batches one rank's ``DataLoader`` yields from a stream of ``length`` rows (each worker batches its share);
    ``None`` when the length is unknown."""
    n = per_reader(length, world_size, num_workers)
    if n is None:
        return None
    per_worker = n // batch_size if drop_last else math.ceil(n / batch_size)
    return per_worker * max(num_workers, 1)


class ShardedStream(IterableDataset):
    """One reader's share of a stream: examples ``j`` with ``j mod S`` equal to this reader's index.

    Args:
        source: a ``datasets.IterableDataset`` or a torch ``IterableDataset`` (yielding mappings). A torch
            stream must yield the full stream in every process: this class does the sharding.
        processor: ``example -> (example, report)`` (an :class:`~hf_lightning.data.on_the_fly.ExampleProcessor`,
            which returns a zero-weight stand-in for a row without a target) or ``None`` to yield rows as they are.
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

    ``set_epoch(e)`` is stored in shared memory, so persistent workers see it too.
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
        self._epoch = torch.zeros((), dtype=torch.long).share_memory_()

    # ----------------------------------------------------------------------------------------- epoch
    def set_epoch(self, epoch: int) -> None:
        self._epoch.fill_(int(epoch))

    @property
    def epoch(self) -> int:
        return int(self._epoch)

    # ----------------------------------------------------------------------------------------- sizes
    def per_reader(self, num_workers: int) -> int | None:
        """Examples each reader yields this epoch (top-ups included), when the stream length is known."""
        return per_reader(self.length, self.world_size, num_workers)

    def num_batches(self, batch_size: int, num_workers: int, drop_last: bool) -> int | None:
        """Batches one rank's ``DataLoader`` yields: each worker batches its own share."""
        return stream_batches(self.length, self.world_size, batch_size, num_workers, drop_last)

    def __len__(self) -> int:
        n = self.per_reader(1)  # examples per rank with one reader; DataLoader length comes from num_batches
        if n is None:
            raise TypeError("the length of this stream is unknown")
        return n

    # ------------------------------------------------------------------------------------- iteration
    def _rows(self, epoch: int) -> Iterator[dict[str, Any]]:
        """The whole source in this epoch's order (identical in every reader)."""
        src = self.source
        holdout = self.holdout
        if isinstance(src, datasets.IterableDataset):
            if holdout is not None:
                fraction, keep = holdout
                src = src.filter(lambda ex: in_holdout(ex, fraction) == keep)
            if self.shuffle:
                # set_epoch only with shuffling: datasets also reorders the files of an epoch > 0
                src = src.shuffle(seed=self.seed, buffer_size=self.buffer_size)
                src.set_epoch(epoch)
            # .iter() instead of iter(): datasets would otherwise split its files across DataLoader workers itself
            yield from _unbatch(src.iter(batch_size=256))
            return
        if self.shuffle and hasattr(src, "set_epoch"):
            src.set_epoch(epoch)
        rows: Iterable[Any] = iter(src)
        if holdout is not None:
            fraction, keep = holdout
            rows = (r for r in rows if in_holdout(r, fraction) == keep)
        if self.shuffle:
            rows = buffer_shuffle(rows, self.buffer_size, random.Random(self.seed + epoch))
        yield from rows

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
        """The rows of reader ``index`` of ``count`` for this epoch (tokenized, top-up included)."""
        total = mine = 0
        first = None
        report = RowReport(f"{self.split} stream", lambda rows: row_numbers(f"{self.split} stream row", rows))
        for j, row in enumerate(self._read(self.epoch)):
            total += 1
            if first is None:
                first = row
            if j % count != index:
                continue
            mine += 1
            if self.processor is not None:
                try:
                    row, info = self.processor(row)
                except DataError as err:
                    raise DataError(f"{self._where(j)}: {err}") from err
                report.add(j, info)
            yield row
        share = math.ceil(total / count) if total else 0
        if first is not None and ((self.top_up and mine < share) or (not self.top_up and mine == 0)):
            row = mask_example(self.processor(first)[0] if self.processor is not None else first)
            # training: a tail top-up (same step count on every rank, no loss term); evaluation: a reader with no
            # row evaluates one placeholder, so that its rank runs the loop (hf_lightning.data.placeholder)
            yield row if self.top_up else PlaceholderRow(row)
        max_length = getattr(self.processor, "kwargs", {}).get("max_length")
        report.log(
            max_length,
            logging.WARNING if self.epoch == 0 else logging.INFO,
            f"reader {index} of {count}: ",
            kept=True,
        )

    def _read(self, epoch: int) -> Iterator[dict[str, Any]]:
        """:meth:`_rows`, with a reader's error (a broken line, a byte that is not UTF-8) as a :class:`DataError`
        that names the file line."""
        rows = self._rows(epoch)
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

    def _where(self, j: int) -> str:
        """Where row ``j`` of this epoch's order comes from: the file line when the order is the file's (no shuffle,
        no hold-out), else the position."""
        name = self.name
        if (
            isinstance(name, (str, os.PathLike))
            and os.path.isfile(name)
            and not self.shuffle
            and self.holdout is None
        ):
            path = os.fspath(name)
            line = jsonl_line_of_row(path, j) if is_json_lines(path) else None
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
