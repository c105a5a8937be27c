"""Which shards of a stream each reader reads: every row decoded once per epoch, where the source has enough
shards.

A reader is one ``DataLoader`` worker of one rank (``S = world_size x max(num_workers, 1)`` readers). A
``datasets.IterableDataset`` with ``num_shards >= S`` (several data files,
``to_iterable_dataset(num_shards=...)``) is split by shards: reader ``r`` reads the shards ``i`` with ``i mod
S == r``, through ``IterableDataset.shard(S, r, contiguous=False)`` (the call
``datasets.distributed.split_dataset_by_node`` and ``datasets``' own worker split make; they are not called
themselves: the first reshuffles which shards a node gets every epoch and neither evens out the row counts,
and DDP hangs when ranks run different numbers of steps).

Even counts: the rows of each shard are counted once, when the training loader is built (in Arrow, without
making Python rows; through the hold-out filter when there is one), so every reader knows the largest reader's
share and ends its own with masked copies (labels all -100: no loss term, nothing in ``num_items_in_batch``)
up to it. Every rank then runs the same number of steps. Uneven shards would make that share, hence the steps
of an epoch, larger than the split by rows gives (``ceil(rows / S)``): the split by shards is taken only while
it adds at most :data:`MAX_EXTRA_BATCHES` of the batches per epoch (none for fewer than 100 batches).

Otherwise (a plain torch stream, a single file, fewer shards than readers, a reader left without rows, uneven
shards, evaluation),
every reader reads the whole stream and keeps one row in ``S``
(:class:`~hf_lightning.data.streams.ShardedStream`), and one INFO line says so with the shard and reader
counts.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import datasets

log = logging.getLogger(__name__)

MAX_EXTRA_BATCHES = (
    0.01  # share of an epoch's batches the split by shards may add (masked copies of uneven shards)
)


def reader_batches(rows: int, batch_size: int, drop_last: bool) -> int:
    """Batches one reader makes of ``rows`` examples."""
    return rows // batch_size if drop_last else -(-rows // batch_size)


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
