"""``EpochDataLoader``: a ``DataLoader`` that knows its epoch, for worker seeding and stream reshuffling.

Worker seeding. PyTorch seeds each worker's ``torch``, ``random`` and ``numpy`` from a base seed drawn from the
loader's ``generator`` plus the worker id. Here that generator is re-seeded at the start of every epoch from
``(seed, rank, epoch)``, so random draws inside workers differ across workers, epochs and ranks, and repeat
with the same seed, including after a resume at an epoch boundary. (Lightning's ``seed_everything(workers=True)``
worker init derives its seeds from the same base seed, so it composes.) With persistent workers the seeds are
set once, when the workers start.

Epoch. Lightning calls ``set_epoch`` on the sampler of a map-style loader; the epoch is read from there. A
stream has no sampler, so the epoch comes from ``epoch_fn`` (the trainer's epoch) or, alone, from a count of
passes, and is handed to the dataset's ``set_epoch`` before each pass.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import DataLoader

from hf_lightning.data.iterable import ShardedStream


def worker_base_seed(seed: int, rank: int, epoch: int) -> int:
    """A 63-bit seed that mixes ``seed``, ``rank`` and ``epoch`` (no two nearby triples collide in practice)."""
    digest = hashlib.blake2b(f"{seed}:{rank}:{epoch}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class EpochDataLoader(DataLoader):
    """``torch.utils.data.DataLoader`` with per-epoch worker seeds and stream epochs.

    Args:
        dataset: any dataset ``DataLoader`` takes.
        seed / rank: mixed with the epoch into the worker base seed.
        epoch_fn: ``() -> int``, the current epoch for a stream (e.g. the trainer's); ``None`` counts passes.
        **kwargs: ``DataLoader`` arguments (``batch_size``, ``sampler``, ``collate_fn``, ``num_workers``...).

    ``len()`` of a :class:`~hf_lightning.data.iterable.ShardedStream` loader is exact when the stream length is
    known (each worker batches its own share); otherwise it raises ``TypeError`` like any unsized loader.
    """

    def __init__(
        self,
        dataset: Any,
        seed: int = 0,
        rank: int = 0,
        epoch_fn: Callable[[], int] | None = None,
        generator: torch.Generator | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            dataset, generator=generator if generator is not None else torch.Generator(), **kwargs
        )
        self.seed = seed
        self.rank = rank
        self.epoch_fn = epoch_fn
        self._passes = 0

    def current_epoch(self) -> int:
        sampler_epoch = getattr(self.sampler, "epoch", None)
        if sampler_epoch is not None:
            return int(sampler_epoch)
        if self.epoch_fn is not None:
            return int(self.epoch_fn())
        return self._passes

    def __iter__(self) -> Any:
        epoch = self.current_epoch()
        self._passes += 1
        self.generator.manual_seed(worker_base_seed(self.seed, self.rank, epoch))
        if isinstance(self.dataset, ShardedStream):
            self.dataset.set_epoch(epoch)
        return super().__iter__()

    def iter_from(self, start_batch: int) -> Any:
        """An iterator that begins at batch ``start_batch`` of this epoch (resume).

        A map-style sampler with a ``start`` position jumps there: the skipped examples are neither read nor
        collated. A stream has no index to jump to, so its first ``start_batch`` batches are read and dropped.
        """
        sampler = self.sampler
        if start_batch and hasattr(sampler, "start") and self.batch_size:
            sampler.start = start_batch * self.batch_size  # consumed by the sampler's next pass
            return iter(self)
        iterator = iter(self)
        for _ in range(start_batch):
            next(iterator, None)
        return iterator

    def __len__(self) -> int:
        if isinstance(self.dataset, ShardedStream):
            n = self.dataset.num_batches(self.batch_size or 1, self.num_workers, self.drop_last)
            if n is None:
                raise TypeError("the length of this stream is unknown")
            return n
        return super().__len__()
