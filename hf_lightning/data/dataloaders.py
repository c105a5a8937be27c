"""The loaders the DataModule hands out: :class:`EpochDataLoader` (epoch-aware worker seeds, stream epochs),
the position of a loop without a Lightning trainer (:class:`LoaderPosition`), :func:`batches_per_epoch` (a
train loader's length without building it) and the settings a resume compares (:func:`data_signature`). The
``HFDataModule`` loader hooks that build them, and wrap the training loader in accumulation windows
(:mod:`~hf_lightning.data.sampling`), are its own methods.

Ours, not a plain ``DataLoader``: HF ``Trainer`` seeds workers per epoch inside its own loop; Lightning has no
hook for it, so it lives in the loader.

Worker seeding. PyTorch seeds each worker's ``torch``, ``random`` and ``numpy`` from a base seed drawn from
the loader's ``generator`` plus the worker id. Here that generator is re-seeded at the start of every epoch
from ``(seed, rank, epoch)``, so random draws inside workers differ across workers, epochs and ranks, and
repeat with the same seed, including after a resume at an epoch boundary. (Lightning's
``seed_everything(workers=True)`` worker init derives its seeds from the same base seed, so it composes.) With
persistent workers the seeds are set once, when the workers start.

Epoch. Lightning calls ``set_epoch`` on the sampler of a map-style loader; the epoch is read from there. A
stream has no sampler, so the epoch comes from ``epoch_fn`` (the trainer's epoch) or, alone, from a count of
passes, and is handed to the dataset's ``set_epoch`` before each pass.

Without a Lightning trainer (a plain PyTorch loop, HF ``Trainer``) nobody calls ``set_epoch`` on the sampler
unless told to, and a ``DistributedSampler`` then repeats its first order every epoch. So the DataModule's
train loaders share one :class:`LoaderPosition`: every pass (``iter()``) is the next epoch, as a shuffling
``DataLoader`` draws a new order per pass; ``loader.set_epoch(e)`` (HF ``Trainer`` calls it) or
``loader.sampler.set_epoch(e)`` makes the next pass epoch ``e``. The position also counts the batches handed
out, so ``HFDataModule.state_dict()`` is a resume point a plain loop can save. The world size and rank come
from ``torch.distributed`` when a process group is initialized.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader

from hf_lightning.compat import (
    dataset_fingerprint,
)
from hf_lightning.data.streams import ShardedStream, reader_batches, stream_batches

if TYPE_CHECKING:
    from collections.abc import Iterator

log = logging.getLogger(__name__)


def worker_base_seed(seed: int, rank: int, epoch: int) -> int:
    """A 63-bit seed that mixes ``seed``, ``rank`` and ``epoch`` (no two nearby triples collide in
    practice)."""
    digest = hashlib.blake2b(f"{seed}:{rank}:{epoch}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class LoaderPosition:
    """Where a training loop without a Lightning trainer stands in the data: the epoch of the current (or
    last) pass and the batches handed out in it.

    Every pass (``iter()`` of a train loader that holds it) is the next epoch, whether the previous one ran
    out or was left early; :meth:`set_epoch` picks the epoch of the next pass instead. After
    :meth:`load_state_dict` the next pass is the rest of the saved epoch (empty when it had been read to its
    end), and the passes after it continue from the next epoch.

    Under a Lightning trainer the train loader wrapper keeps the same two numbers itself
    (:meth:`~hf_lightning.data.sampling.ResumableLoader.state_dict`, the same keys).
    """

    def __init__(self) -> None:
        self.epoch = 0
        self.batches_consumed = 0
        self._open = False  # a pass of ``epoch`` has begun (and not run out)

    def set_epoch(self, epoch: int) -> None:
        """The next pass is epoch ``epoch``, from its first batch."""
        self.epoch, self.batches_consumed, self._open = int(epoch), 0, False

    def begin(self) -> tuple[int, int]:
        """``(epoch, batches to skip)`` of the pass that starts now."""
        if self._open:  # the previous pass was left before its end
            self.set_epoch(self.epoch + 1)
        self._open = True
        return self.epoch, self.batches_consumed

    def track(self, iterator: Iterator[Any]) -> Iterator[Any]:
        """``iterator``'s batches, each counted as it is handed out; running out ends the epoch."""
        for batch in iterator:
            self.batches_consumed += 1
            yield batch
        self.set_epoch(self.epoch + 1)

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "batches_consumed": self.batches_consumed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.set_epoch(state["epoch"])
        self.batches_consumed = int(state["batches_consumed"])


class EpochDataLoader(DataLoader):
    """``torch.utils.data.DataLoader`` with per-epoch worker seeds and stream epochs.

    Args:
        dataset: any dataset ``DataLoader`` takes.
        seed / rank: mixed with the epoch into the worker base seed.
        epoch_fn: ``() -> int``, the current epoch for a stream (e.g. the trainer's); ``None`` counts passes.
        position: a :class:`LoaderPosition` that decides the epoch of each pass and counts its batches (a loop
            without a Lightning trainer); ``None``: the epoch is the sampler's (Lightning sets it), else
            ``epoch_fn``'s, else the count of passes.
        **kwargs: ``DataLoader`` arguments (``batch_size``, ``sampler``, ``collate_fn``, ``num_workers``...).

    ``len()`` of a :class:`~hf_lightning.data.streams.ShardedStream` loader is exact when the stream length is
    known (each worker batches its own share); otherwise it raises ``TypeError`` like any unsized loader.
    """

    def __init__(
        self,
        dataset: Any,
        seed: int = 0,
        rank: int = 0,
        epoch_fn: Callable[[], int] | None = None,
        generator: torch.Generator | None = None,
        position: LoaderPosition | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            dataset, generator=generator if generator is not None else torch.Generator(), **kwargs
        )
        self.seed = seed
        self.rank = rank
        self.epoch_fn = epoch_fn
        self.position = position
        self._passes = 0

    def current_epoch(self) -> int:
        if self.position is not None:
            return self.position.epoch
        sampler_epoch = getattr(self.sampler, "epoch", None)
        if sampler_epoch is not None:
            return int(sampler_epoch)
        if self.epoch_fn is not None:
            return int(self.epoch_fn())
        return self._passes

    def set_epoch(self, epoch: int) -> None:
        """The next pass is epoch ``epoch`` (``DistributedSampler.set_epoch``, for the whole loader; HF
        ``Trainer`` calls it before each epoch)."""
        if self.position is not None:
            self.position.set_epoch(epoch)
        elif callable(getattr(self.sampler, "set_epoch", None)):
            self.sampler.set_epoch(epoch)
        else:
            self._passes = int(epoch)

    def __iter__(self) -> Any:
        if self.position is None:
            return self._pass(self.current_epoch(), 0)
        if getattr(self.sampler, "epoch_given", False):  # the user called sampler.set_epoch
            self.sampler.epoch_given = False
            self.position.set_epoch(self.sampler.epoch)
        epoch, start = self.position.begin()
        if hasattr(self.sampler, "epoch"):
            self.sampler.epoch = epoch
        return self.position.track(self._pass(epoch, start))

    def _pass(self, epoch: int, start_batch: int) -> Any:
        self._passes += 1
        self.generator.manual_seed(worker_base_seed(self.seed, self.rank, epoch))
        if isinstance(self.dataset, ShardedStream):
            self.dataset.set_epoch(epoch)
        sampler = self.sampler
        if start_batch and hasattr(sampler, "start") and self.batch_size:
            sampler.start = start_batch * self.batch_size  # consumed by the sampler's next pass
            return super().__iter__()
        iterator = super().__iter__()
        for _ in range(start_batch):
            next(iterator, None)
        return iterator

    def iter_from(self, start_batch: int) -> Any:
        """An iterator that begins at batch ``start_batch`` of this epoch (resume).

        A map-style sampler with a ``start`` position jumps there: the skipped examples are neither read nor
        collated. A stream has no index to jump to, so its first ``start_batch`` batches are read and dropped.
        """
        return self._pass(self.current_epoch(), start_batch)

    def __len__(self) -> int:
        if isinstance(self.dataset, ShardedStream):
            n = self.dataset.num_batches(self.batch_size or 1, self.num_workers, self.drop_last)
            if n is None:
                raise TypeError("the length of this stream is unknown")
            return n
        return super().__len__()


def data_signature(datamodule: Any, world_size: int) -> dict[str, Any]:
    """The settings the training data's order and batches depend on (a resume warns when one changed)."""
    return {
        "world_size": world_size,
        "per_device_train_batch_size": getattr(datamodule, "per_device_train_batch_size", None),
        "max_length": getattr(datamodule, "max_length", None),
        "seed": getattr(datamodule, "seed", None),
        "dataset_fingerprint": dataset_fingerprint(getattr(datamodule, "train_dataset", None)),
        # which rows there are and in which order
        "packing": getattr(datamodule, "packing", None),
        "pack_buffer": getattr(datamodule, "pack_buffer", None),
        "group_by_length": getattr(datamodule, "group_by_length", None),
    }


def describe_differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """``"key: saved -> current"`` for every setting that differs (used to warn before an inexact resume); a
    setting the saved signature does not hold (written before it was recorded) is not compared."""
    return [
        f"{k}: {saved[k]!r} -> {current.get(k)!r}"
        for k in sorted(saved)
        if k in current and saved[k] != current[k]
    ]


def batches_per_epoch(
    n: int | None, *, stream: bool, world: int, batch_size: int, num_workers: int, drop_last: bool
) -> int | None:
    """``len()`` of the training loader, without building it: ``n`` rows (``None``: a stream of unknown
    length, then ``None``) split over ``world`` ranks as
    :class:`~hf_lightning.data.sampling.ExactDistributedSampler` (map-style: ``ceil(n / world)`` with the
    masked top-up, ``n // world`` with ``drop_last``) or :class:`~hf_lightning.data.streams.ShardedStream`
    (per reader, ``world x workers`` readers) does, then batched.
    """
    if stream:
        return stream_batches(n, world, batch_size, num_workers, drop_last)
    per_rank = n // world if drop_last else math.ceil(n / world)
    return reader_batches(per_rank, batch_size, drop_last)
