"""The DataModule's loaders: :class:`EpochDataLoader` (epoch-aware worker seeds, stream epochs) and
:class:`AccumulationWindowLoader` (HF's ``get_batch_samples`` look-ahead on Lightning), and :func:`batches_per_epoch`
(their length without building them).

Ours, not a plain ``DataLoader``: HF ``Trainer`` seeds workers and counts ``num_items_in_batch`` over a whole
accumulation window inside its own loop; Lightning has no hook for either, so both live in the loader.

Worker seeding. PyTorch seeds each worker's ``torch``, ``random`` and ``numpy`` from a base seed drawn from the
loader's ``generator`` plus the worker id. Here that generator is re-seeded at the start of every epoch from
``(seed, rank, epoch)``, so random draws inside workers differ across workers, epochs and ranks, and repeat
with the same seed, including after a resume at an epoch boundary. (Lightning's ``seed_everything(workers=True)``
worker init derives its seeds from the same base seed, so it composes.) With persistent workers the seeds are
set once, when the workers start.

Epoch. Lightning calls ``set_epoch`` on the sampler of a map-style loader; the epoch is read from there. A
stream has no sampler, so the epoch comes from ``epoch_fn`` (the trainer's epoch) or, alone, from a count of
passes, and is handed to the dataset's ``set_epoch`` before each pass.

Gradient-accumulation windows. HF `Trainer` pulls the next ``gradient_accumulation_steps`` batches from the
iterator, counts their label targets, then runs the micro-steps (``Trainer.get_batch_samples``). Lightning's loop
pulls one batch at a time, so :class:`AccumulationWindowLoader` does the look-ahead on the data side: it reads a whole window
from the wrapped loader, counts it on the host (no device sync), and yields its batches with the count
attached under ``num_items_in_batch``.

Windows are aligned with Lightning's optimizer steps: Lightning steps after batch index ``i`` when
``(i + 1) % accumulate_grad_batches == 0`` or ``i`` is the last batch of the epoch (or of
``limit_train_batches``). So a window never spans two epochs, and the last one of an epoch may be shorter; it
is counted over the batches it really holds.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch
from torch.utils.data import DataLoader

from hf_lightning.batch import MICRO_ITEMS_KEY, NUM_ITEMS_KEY, WINDOW_LENGTH_KEY
from hf_lightning.data.checks import check_fits_one_batch
from hf_lightning.data.samplers import ExactDistributedSampler, TopUpDataset
from hf_lightning.data.streams import ShardedStream, stream_batches

log = logging.getLogger(__name__)


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


def map_loader(
    ds: Any,
    *,
    train: bool,
    world: int,
    rank: int,
    batch_size: int,
    shuffle: bool,
    seed: int,
    drop_last: bool,
    lengths: list[int] | None,
    group_batch_size: int,
    collate_fn: Callable,
    **loader_kwargs: Any,
) -> EpochDataLoader:
    """This rank's loader of a map-style split: :class:`~hf_lightning.data.samplers.ExactDistributedSampler`
    (training: seeded order or length groups, masked top-up; evaluation: dataset order, no padding).

    Raises:
        ConfigError: a training share smaller than one batch with ``drop_last`` (no step at all).
    """
    drop_last = drop_last if train else False
    sampler = ExactDistributedSampler(
        ds,
        num_replicas=world,
        rank=rank,
        shuffle=train and shuffle,
        seed=seed,
        drop_last=drop_last,
        lengths=lengths,
        group_batch_size=group_batch_size,
        top_up=train,
    )
    if train:
        check_fits_one_batch(len(sampler), batch_size, drop_last)
    return EpochDataLoader(
        TopUpDataset(ds, placeholder=not train) if sampler.needs_top_up else ds,
        seed=seed,
        rank=rank,
        sampler=sampler,
        batch_size=batch_size,
        collate_fn=collate_fn,
        drop_last=drop_last,
        **loader_kwargs,
    )


def stream_loader(
    source: Any,
    processor: Any,
    *,
    train: bool,
    world: int,
    rank: int,
    batch_size: int,
    shuffle: bool,
    seed: int,
    buffer_size: int,
    length_buffer: int | None,
    holdout: tuple[float, bool] | None,
    length: int | None,
    name: Any,
    drop_last: bool,
    epoch_fn: Callable[[], int] | None,
    collate_fn: Callable,
    **loader_kwargs: Any,
) -> EpochDataLoader:
    """This rank's loader of a stream: a :class:`~hf_lightning.data.streams.ShardedStream` (exact per-reader
    split; training: shuffle buffer, length buffers of ``length_buffer``, masked top-up).

    Raises:
        ConfigError: a training share smaller than one batch with ``drop_last`` (no step at all).
    """
    if length_buffer:
        log.info(
            "group_by_length on a stream: sorting by length within buffers of %d examples per reader "
            "(the whole stream cannot be sorted)",
            length_buffer,
        )
    stream = ShardedStream(
        source,
        processor,
        rank=rank,
        world_size=world,
        shuffle=train and shuffle,
        seed=seed,
        buffer_size=buffer_size,
        length_buffer=length_buffer,
        holdout=holdout,
        length=length,
        top_up=train,
        split="train" if train else "validation",
        name=name,
    )
    if train and stream.length is not None:
        check_fits_one_batch(stream.per_reader(loader_kwargs.get("num_workers", 0)), batch_size, drop_last)
    return EpochDataLoader(
        stream,
        seed=seed,
        rank=rank,
        epoch_fn=epoch_fn,
        batch_size=batch_size,
        collate_fn=collate_fn,
        drop_last=drop_last if train else False,
        **loader_kwargs,
    )


def batches_per_epoch(
    n: int | None, *, stream: bool, world: int, batch_size: int, num_workers: int, drop_last: bool
) -> int | None:
    """``len()`` of the training loader, without building it: ``n`` rows (``None``: a stream of unknown length,
    then ``None``) split over ``world`` ranks as :class:`~hf_lightning.data.samplers.ExactDistributedSampler`
    (map-style: ``ceil(n / world)`` with the masked top-up, ``n // world`` with ``drop_last``) or
    :class:`~hf_lightning.data.streams.ShardedStream` (per reader, ``world x workers`` readers) does, then batched.
    """
    if stream:
        return stream_batches(n, world, batch_size, num_workers, drop_last)
    per_rank = n // world if drop_last else math.ceil(n / world)
    return per_rank // batch_size if drop_last else math.ceil(per_rank / batch_size)


class AccumulationWindowLoader:
    """Wraps a train dataloader and attaches the window's label count to each batch.

    Args:
        loader: any iterable of dict batches (usually a ``torch.utils.data.DataLoader``).
        accumulate_grad_batches: the window length (Lightning's ``accumulate_grad_batches``, HF's
            ``gradient_accumulation_steps``); must be >= 1.
        count_fn: ``batch -> int``, the number of label positions of one micro-batch that get a loss term
            (e.g. :func:`hf_lightning.module.loss.count_loss_items`).
        max_batches: optional ``() -> int | float``, read at the start of each epoch: how many batches the
            training loop will consume (``trainer.num_training_batches``); windows are cut there so that
            ``limit_train_batches`` cannot leak unseen batches into the count.
        progress: optional ``() -> (epoch, batches consumed in that epoch)``, read when a checkpoint is saved
            (Lightning calls :meth:`state_dict`); on resume the epoch continues after those batches.

    Each yielded batch is a shallow copy of the original mapping with three extra keys, all Python ``int``:
    ``num_items_in_batch``, the count summed over the micro-batches of its window on this process (the model
    module sums it across ranks); ``num_items_in_micro_batch``, this micro-batch's own count; and
    ``num_batches_in_window``, the number of micro-batches in its window (``accumulate_grad_batches``, or
    fewer for the last window of an epoch).

    Raises:
        ValueError: ``accumulate_grad_batches < 1``.
        TypeError: a batch is not a mapping.
    """

    def __init__(
        self,
        loader: Iterable[Mapping[str, Any]],
        accumulate_grad_batches: int,
        count_fn: Callable[[Mapping[str, Any]], int],
        max_batches: Callable[[], int | float] | None = None,
        progress: Callable[[], tuple[int, int]] | None = None,
    ) -> None:
        if accumulate_grad_batches < 1:
            raise ValueError(f"accumulate_grad_batches must be >= 1, got {accumulate_grad_batches}")
        self.loader = loader
        self.accumulate_grad_batches = accumulate_grad_batches
        self.count_fn = count_fn
        self.max_batches = max_batches
        self.progress = progress
        self._resume: dict[str, int] | None = None

    # Lightning calls ``set_epoch`` on ``.sampler``/``.batch_sampler`` and reads ``.dataset``.
    @property
    def sampler(self) -> Any:
        return getattr(self.loader, "sampler", None)

    @property
    def batch_sampler(self) -> Any:
        return getattr(self.loader, "batch_sampler", None)

    @property
    def dataset(self) -> Any:
        return getattr(self.loader, "dataset", None)

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    # Lightning saves and restores the state of a train loader that has both methods (``_Stateful``)
    def state_dict(self) -> dict[str, int]:
        if self.progress is None:
            return {}
        epoch, consumed = self.progress()
        return {"epoch": int(epoch), "batches_consumed": int(consumed)}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self._resume = dict(state) if state else None

    def _epoch(self) -> int | None:
        current = getattr(self.loader, "current_epoch", None)
        if callable(current):
            return int(current())
        epoch = getattr(self.sampler, "epoch", None)
        return None if epoch is None else int(epoch)

    def _start(self) -> int:
        """Batches of this epoch already consumed before a resume (0 on a fresh epoch)."""
        resume, self._resume = self._resume, None
        if not resume or resume.get("epoch") != self._epoch():
            return 0
        return int(resume.get("batches_consumed", 0))

    def __iter__(self) -> Iterator[dict[str, Any]]:
        # a generator: the body runs at the first next(), after Lightning has called set_epoch
        start = self._start()
        limit = self.max_batches() if self.max_batches is not None else float("inf")
        if start:
            iter_from = getattr(self.loader, "iter_from", None)
            if iter_from is not None:
                iterator = iter_from(start)
            else:
                iterator = iter(self.loader)
                for _ in range(start):
                    next(iterator, None)
        else:
            iterator = iter(self.loader)
        remaining = limit - start
        # after a resume inside a window (a checkpoint not taken at a step boundary) the first window is the
        # rest of the interrupted one; its count then misses the micro-batches consumed before the stop
        first = self.accumulate_grad_batches - start % self.accumulate_grad_batches
        while remaining > 0:
            size = int(min(first, remaining))
            first = self.accumulate_grad_batches
            window = list(itertools.islice(iterator, size))
            if not window:
                return
            remaining -= len(window)
            for batch in window:
                if not isinstance(batch, Mapping):
                    raise TypeError(
                        f"AccumulationWindowLoader needs dict batches (got {type(batch).__name__}); "
                        "the collator must return a mapping of tensors"
                    )
            counts = [self.count_fn(batch) for batch in window]
            total = sum(counts)
            for batch, count in zip(window, counts):
                yield {**batch, NUM_ITEMS_KEY: total, MICRO_ITEMS_KEY: count, WINDOW_LENGTH_KEY: len(window)}
