"""Sampling: which examples each rank trains on, in which order, and which micro-batches make each optimizer
step, with their target count.

Samplers for map-style data: one global order, identical on every rank, split so each index is seen once.

Ours, not ``DistributedSampler`` / HF's ``LengthGroupedSampler``: those pad a short rank with *real* repeated
examples (trained twice per epoch); here every example is used exactly once per epoch, and short ranks get a
masked top-up copy that adds nothing to the loss. The length-grouped order itself is HF's function.

- Training order: a random permutation seeded by ``seed + epoch`` (``torch.randperm``, as
  ``torch.utils.data.DistributedSampler``), or HF's length grouping (:func:`length_grouped_indices`) with a
  generator seeded the same way. Every rank computes the same order; rank ``r`` takes positions
  ``r, r + W, r + 2W, ...`` (W = world size).
- Evaluation order: the dataset order, split the same way, without any padding (ranks may differ by one). A
  rank whose share is empty (fewer examples than ranks) gets one *placeholder* instead: a masked copy of
  example 0 (:class:`PlaceholderRow`), so that every rank runs the evaluation loop and its collectives
  (Lightning refuses a loader of length zero on one rank, and a rank that skipped the loop would leave the
  others waiting); it adds nothing to any metric and no prediction (see
  :class:`~hf_lightning.data.collators.PlaceholderAwareCollator`).

The tail (``N`` not divisible by ``W``), training only:

- ``drop_last=False`` (default): every index is yielded exactly once. Ranks that would get one index fewer
  are topped up with a *masked copy* of an example (``~i`` in the index stream; :class:`TopUpDataset` turns it
  into example ``i`` with every label ``-100``), so every rank runs the same number of steps (DDP needs it)
  while the extra row adds nothing to the loss or to ``num_items_in_batch``.
- ``drop_last=True``: the last ``N mod W`` positions of the order are left out this epoch (a new order next
  epoch), as ``DistributedSampler(drop_last=True)``; the ``DataLoader`` then drops each rank's partial batch.

Gradient-accumulation windows: count ``num_items_in_batch`` before the first forward of a step. HF
``Trainer`` pulls the next ``gradient_accumulation_steps`` batches from the iterator, counts their label
targets, then runs the micro-steps (``Trainer.get_batch_samples``). :class:`WindowLoader` does the same on the
data side: it yields one :class:`~hf_lightning.core.batch.Window` per optimizer step, the window's
micro-batches counted on the host (no device sync), which ``HFLightningModule.training_step`` steps itself.
For a module of one's own on Lightning's automatic optimization (Lightning pulls one micro-batch at a time),
:class:`AccumulationWindowLoader` flattens those windows: it reads a whole window ahead and yields its
micro-batches one by one with the count attached under ``num_items_in_batch``.

Resume inside an epoch (:class:`ResumableLoader`, the base of both): Lightning saves a train loader's
``state_dict`` with its checkpoints; here it is the epoch and the batches consumed (windows for
:class:`WindowLoader`; micro-batches for :class:`AccumulationWindowLoader`, which may stop inside a window),
and a restored loader continues the epoch after them.

A window never spans two epochs, and the last one of an epoch may be shorter (HF ``Trainer`` cuts them so); it
is counted over the batches it really holds. For :class:`AccumulationWindowLoader` that is Lightning's own
stepping rule: it steps after batch index ``i`` when ``(i + 1) % accumulate_grad_batches == 0`` or ``i`` is
the last batch of the epoch (or of ``limit_train_batches``).

Whether the LightningModule uses the window count (:class:`WindowBatch`, :class:`CountUse`): a module of
one's own that returns ``outputs.loss`` (a mean over its micro-batch) gets HF's fallback instead of the
window's token mean, where each micro-batch's targets weigh by the inverse of its own count. They agree only
when a window is one micro-batch on one process, so nothing is said then; otherwise one WARNING:
:func:`warn_no_count` when no ``count_loss_items`` is bound (the batches carry no count), :data:`UNREAD` when
the module's first ``training_step`` did not read the ``num_items_in_batch`` its batch carried (a
:class:`WindowBatch` counts the reads of that key: ``batch["num_items_in_batch"]``, ``.get``, ``.pop``).
``HFLightningModule`` steps :class:`WindowLoader`'s windows and reads their count itself.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
from torch.utils.data import Dataset, DistributedSampler

from hf_lightning.core.batch import IGNORE_INDEX, MICRO_ITEMS_KEY, NUM_ITEMS_KEY, WINDOW_LENGTH_KEY, Window

log = logging.getLogger(__name__)


def length_grouped_indices(
    lengths: Sequence[int],
    batch_size: int,
    generator: torch.Generator | None = None,
    mega_batch_mult: int | None = None,
) -> list[int]:
    """HF's ``transformers.trainer_pt_utils.get_length_grouped_indices`` (called, not copied), and ``[]`` for
    no rows (HF's ``argmax`` of an empty tensor raises).

    A random permutation (``torch.randperm`` with ``generator``) cut into mega-batches of
    ``mega_batch_mult * batch_size`` indices (default ``min(N // (4 * batch_size), 50)``, at least 1), each
    sorted by length, longest first (stable: ties keep the permutation order); the longest item overall is
    then swapped into the first position, so an out-of-memory error shows in the first batch.

    Returns:
        a permutation of ``range(len(lengths))``.
    """
    if len(lengths) == 0:
        return []
    # here, not at the top: transformers' trainer utilities import accelerate and its DeepSpeed integration,
    # which only group_by_length needs
    from transformers.trainer_pt_utils import get_length_grouped_indices

    return get_length_grouped_indices(
        lengths, batch_size, mega_batch_mult=mega_batch_mult, generator=generator
    )


def _leaf_counts(arr: pa.Array) -> np.ndarray:
    """Per row of a list array, the number of leaf values (so a ``(1, n)`` row counts ``n``)."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    value_type = arr.type.value_type
    if pa.types.is_list(value_type) or pa.types.is_large_list(value_type):
        inner = _leaf_counts(arr.values)
        cums = np.concatenate([[0], np.cumsum(inner)])
        offsets = arr.offsets.to_numpy()
        return cums[offsets[1:]] - cums[offsets[:-1]]
    return pc.fill_null(pc.list_value_length(arr), 0).to_numpy().astype(np.int64)


def token_count(value: Any) -> int:
    """The number of elements of a token row (a list, a nested list, an array or a tensor: ``(1, n)`` counts
    ``n``)."""
    if hasattr(value, "numel"):
        return int(value.numel())
    return int(np.asarray(value).size)


def sequence_lengths(ds: Any, column: str = "input_ids") -> list[int]:
    """Token count of every row, computed once: the number of elements of ``column`` (``(1, n)`` counts
    ``n``).

    A ``datasets.Dataset`` is read column-wise from Arrow (fast, honours ``select``/``filter``); any other
    map-style dataset is read example by example.

    Raises:
        KeyError: rows without ``column``.
    """
    if isinstance(ds, datasets.Dataset):
        if column not in ds.column_names:
            raise KeyError(f"no {column!r} column to measure lengths (columns: {ds.column_names})")
        out: list[int] = []
        for table in ds.select_columns([column]).with_format("arrow").iter(batch_size=10_000):
            out += _leaf_counts(table.column(column)).tolist()
        return out
    return [token_count(ds[i][column]) for i in range(len(ds))]


def mask_example(example: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``example`` that adds no loss term: every label ``-100`` (token labels and class labels)."""
    out = dict(example)
    if "input_ids" in out:
        out["labels"] = [IGNORE_INDEX] * token_count(out["input_ids"])
    for key in ("label", "label_ids"):
        if key in out:
            out[key] = IGNORE_INDEX
    return out


class PlaceholderRow(dict):
    """A masked copy of an example that stands for a rank with no evaluation example (its type marks it)."""


class TopUpDataset(Dataset):
    """Map-style view of ``base`` where index ``~i`` (negative) is a masked copy of example ``i`` (a
    :class:`PlaceholderRow` when ``placeholder``: an evaluation rank's stand-in)."""

    def __init__(self, base: Any, placeholder: bool = False) -> None:
        self.base = base
        self.placeholder = placeholder

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, index: int) -> Any:
        if index >= 0:
            return self.base[index]
        masked = mask_example(self.base[~index])
        return PlaceholderRow(masked) if self.placeholder else masked

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        return [self[i] for i in indices]


def sorted_within_windows(indices: Sequence[int], lengths: Sequence[int], window: int) -> list[int]:
    """``indices`` with each run of ``window`` consecutive ones (the last may be shorter) ordered by
    ``lengths``, longest first; ties keep their order. A masked top-up index ``~i`` has ``i``'s length."""
    out: list[int] = []
    for start in range(0, len(indices), window):
        block = indices[start : start + window]
        out += sorted(block, key=lambda i: -lengths[i if i >= 0 else ~i])
    return out


class ExactDistributedSampler(DistributedSampler):
    """Seeded global order, the same on every rank, split across ranks with each index used once.

    A ``DistributedSampler`` subclass so that Lightning neither replaces it nor wraps it, and calls its
    ``set_epoch`` every epoch.

    Args:
        dataset: the map-style dataset (only its length is read).
        num_replicas / rank: world size and this process's rank (1 and 0 alone).
        shuffle: random order seeded by ``seed + epoch`` (training); ``False`` keeps the dataset order.
        seed: base seed.
        drop_last: see the module docstring (tail handling).
        lengths: per-example lengths; with them, the order is :func:`length_grouped_indices`.
        group_batch_size: ``B`` of the length grouping (per-device batch x accumulation steps).
        top_up: pad short ranks with masked copies (training); ``False`` lets ranks differ by one
            (evaluation), and gives a rank with no example one placeholder (``~0``).
        window_lengths: per-example lengths by which each window of ``window_size`` consecutive indices of
            this rank's share is ordered, longest first (stable); the windows keep their indices, so an
            optimizer step of ``window_size`` = micro-batch x accumulation steps keeps its documents.

    Yields:
        dataset indices, and ``~i`` for a masked top-up copy of ``i`` (read it through :class:`TopUpDataset`).

    Reproduces ``torch.utils.data.DistributedSampler``'s seeding (``seed + epoch``) and, with ``lengths``,
    HF's ``LengthGroupedSampler`` order; unlike both, no rank is padded with a *real* repeated example.

    Raises:
        ValueError: ``lengths`` of another size than the dataset.
    """

    def __init__(
        self,
        dataset: Any,
        num_replicas: int = 1,
        rank: int = 0,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        lengths: Sequence[int] | None = None,
        group_batch_size: int = 1,
        top_up: bool = True,
        window_lengths: Sequence[int] | None = None,
        window_size: int = 1,
    ) -> None:
        super().__init__(
            dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed, drop_last=drop_last
        )
        self.n = len(dataset)
        for given in (lengths, window_lengths):
            if given is not None and len(given) != self.n:
                raise ValueError(f"{len(given)} lengths for a dataset of {self.n} examples")
        self.window_lengths = list(window_lengths) if window_lengths is not None else None
        self.window_size = max(1, int(window_size))
        self.lengths = list(lengths) if lengths is not None else None
        self.group_batch_size = group_batch_size
        self.top_up = top_up
        # resume: the next iteration starts at this position of the rank's share (set for one pass only)
        self.start = 0
        # set_epoch was called (a loop without Lightning reads it once: its next pass is that epoch)
        self.epoch_given = False
        if drop_last:
            self.num_samples = self.n // num_replicas
        elif top_up:
            self.num_samples = math.ceil(self.n / num_replicas)
        else:
            self.num_samples = len(range(rank, self.n, num_replicas))
        # evaluation on a rank whose share is empty: one placeholder, so that it runs the loop like the others
        self.placeholder = not top_up and not drop_last and self.num_samples == 0 and self.n > 0
        if self.placeholder:
            self.num_samples = 1

    def set_epoch(self, epoch: int) -> None:
        """The order of the next pass is epoch ``epoch``'s (``DistributedSampler.set_epoch``)."""
        super().set_epoch(epoch)
        self.epoch_given = True

    def global_order(self) -> list[int]:
        """The order of this epoch, identical on every rank."""
        if self.lengths is not None:
            g = torch.Generator().manual_seed(self.seed + self.epoch)
            return length_grouped_indices(self.lengths, self.group_batch_size, generator=g)
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed + self.epoch)
            return torch.randperm(self.n, generator=g).tolist()
        return list(range(self.n))

    def __iter__(self) -> Iterator[int]:
        order = self.global_order()
        world = self.num_replicas
        if self.drop_last:
            order = order[: self.n - self.n % world]
        mine = order[self.rank :: world]
        if self.top_up and not self.drop_last and len(mine) < self.num_samples:
            mine.append(~order[self.rank % self.n])
        if self.placeholder:
            mine = [~order[0]]
        if self.window_lengths is not None:
            mine = sorted_within_windows(mine, self.window_lengths, self.window_size)
        start, self.start = self.start, 0  # one pass only
        return iter(mine[start:])

    def __len__(self) -> int:
        return self.num_samples

    @property
    def needs_top_up(self) -> bool:
        """Whether some rank receives a masked copy this epoch, or this rank a placeholder (the dataset must
        be a :class:`TopUpDataset`)."""
        return self.placeholder or (self.top_up and not self.drop_last and self.n % self.num_replicas != 0)


class ResumableLoader:
    """Wraps a train dataloader so that Lightning can save and restore where an epoch stopped.

    Args:
        loader: any iterable of batches (usually an :class:`~hf_lightning.data.dataloaders.EpochDataLoader`,
            whose ``iter_from`` jumps to a batch without reading the ones before it).

    Lightning saves and restores the state of a train loader that has ``state_dict`` and ``load_state_dict``
    (its ``_Stateful``); a plain ``DataLoader`` has neither, so a run resumed inside an epoch would read that
    epoch again from its first batch. The batches are the wrapped loader's, unchanged.

    The state is the loader's own position: the epoch of the current pass and its batches handed to the
    training step, counted by :meth:`handed_out` (:class:`~hf_lightning.HFDataModule`'s
    ``transfer_batch_to_device`` calls it for each training batch: Lightning moves a batch once, right before
    its step, so a batch fetched ahead to know ``trainer.is_last_batch`` is not counted). On resume the epoch
    continues after those batches.
    """

    def __init__(self, loader: Iterable[Any]) -> None:
        self.loader = loader
        self._resume: dict[str, int] | None = None
        self._position: list[Any] | None = None  # [epoch of the current pass, batches handed to the step]

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

    def handed_out(self) -> None:
        """One batch of the current pass went to the training step."""
        if self._position is not None:
            self._position[1] += 1

    def state_dict(self) -> dict[str, int]:
        """``{"epoch", "batches_consumed"}``: the current pass's epoch and its batches handed to the training
        step (a restored position not read yet: that one); ``{}`` before the first pass or when the wrapped
        loader has no epoch."""
        if self._resume is not None:
            return dict(self._resume)
        if self._position is None or self._position[0] is None:
            return {}
        epoch, consumed = self._position
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
        """Batches of this epoch already consumed before a resume (0 on a fresh epoch); the pass's position
        starts there."""
        resume, self._resume = self._resume, None
        epoch = self._epoch()
        start = 0
        if resume and resume.get("epoch") == epoch:
            start = int(resume.get("batches_consumed", 0))
        self._position = [epoch, start]
        return start

    def _iterator(self, start: int) -> Iterator[Any]:
        """The wrapped loader's iterator from batch ``start`` of this epoch."""
        if not start:
            return iter(self.loader)
        iter_from = getattr(self.loader, "iter_from", None)
        if iter_from is not None:
            return iter_from(start)
        iterator = iter(self.loader)
        for _ in range(start):
            next(iterator, None)
        return iterator

    def __iter__(self) -> Iterator[Any]:
        # a generator: the body runs at the first next(), after Lightning has called set_epoch
        yield from self._iterator(self._start())


class WindowLoader(ResumableLoader):
    """Wraps a train dataloader of micro-batches and yields one :class:`~hf_lightning.core.batch.Window` per
    optimizer step (and resumes as :class:`ResumableLoader`, in windows).

    Args:
        loader: any iterable of dict batches (usually a ``torch.utils.data.DataLoader``).
        gradient_accumulation_steps: micro-batches per window (HF's name); must be >= 1. The last window of
            an epoch holds the micro-batches left (HF ``Trainer`` cuts its windows per epoch the same way).
        count_fn: ``batch -> int``, the label targets of one micro-batch
            (:func:`hf_lightning.module.loss.count_loss_items`); ``None``: windows carry no count.
        max_windows: optional ``() -> int | float``, read at the start of each epoch: how many windows the
            training loop will consume (``trainer.num_training_batches``, ``limit_train_batches`` included):
            no micro-batch past it is read or counted.

    ``len()`` is the epoch's number of windows, ``ceil(micro-batches / gradient_accumulation_steps)``.

    Raises:
        ValueError: ``gradient_accumulation_steps < 1``.
        TypeError: a micro-batch is not a mapping.
    """

    def __init__(
        self,
        loader: Iterable[Mapping[str, Any]],
        gradient_accumulation_steps: int,
        count_fn: Callable[[Mapping[str, Any]], int] | None = None,
        max_windows: Callable[[], int | float] | None = None,
    ) -> None:
        if gradient_accumulation_steps < 1:
            raise ValueError(f"gradient_accumulation_steps must be >= 1, got {gradient_accumulation_steps}")
        super().__init__(loader)
        self.gradient_accumulation_steps = gradient_accumulation_steps
        self.count_fn = count_fn
        self.max_windows = max_windows

    def __len__(self) -> int:
        return math.ceil(len(self.loader) / self.gradient_accumulation_steps)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Window]:
        # a generator: the body runs at the first next(), after Lightning has called set_epoch
        k = self.gradient_accumulation_steps
        start = self._start()
        limit = self.max_windows() if self.max_windows is not None else float("inf")
        yield from self._windows(start * k, k, (limit - start) * k)

    def _windows(self, skip: int, first: int, limit: int | float) -> Iterator[Window]:
        """This epoch's windows after its first ``skip`` micro-batches: the first holds at most ``first``
        micro-batches, the others ``gradient_accumulation_steps``, and no micro-batch past the first ``limit``
        (counted from ``skip``) is read."""
        iterator = self._iterator(skip)
        size = first
        while limit > 0:
            micro = list(itertools.islice(iterator, int(min(size, limit))))
            if not micro:
                return
            limit -= len(micro)
            size = self.gradient_accumulation_steps
            for batch in micro:
                if not isinstance(batch, Mapping):
                    raise TypeError(
                        f"the training collator must return a mapping of tensors (got {type(batch).__name__})"
                    )
            counts = [self.count_fn(batch) for batch in micro] if self.count_fn is not None else None
            yield Window(micro, counts)


class AccumulationWindowLoader(WindowLoader):
    """The micro-batches of :class:`WindowLoader`'s windows one at a time, each with its window's label count,
    for a module on Lightning's automatic optimization (which pulls one micro-batch at a time and accumulates
    ``accumulate_grad_batches`` of them).

    Args:
        loader: any iterable of dict batches (usually a ``torch.utils.data.DataLoader``).
        accumulate_grad_batches: the window length (Lightning's ``accumulate_grad_batches``, HF's
            ``gradient_accumulation_steps``); must be >= 1.
        count_fn: ``batch -> int``, the number of label positions of one micro-batch that get a loss term
            (e.g. :func:`hf_lightning.module.loss.count_loss_items`).
        max_batches: optional ``() -> int | float``, read at the start of each epoch: how many batches the
            training loop will consume (``trainer.num_training_batches``); windows are cut there so that
            ``limit_train_batches`` cannot leak unseen batches into the count.

    It resumes as :class:`ResumableLoader`, in micro-batches: a position may end inside a window (a checkpoint
    not taken at a step boundary); the first window is then the rest of the interrupted one, and its count
    misses the micro-batches consumed before the stop.

    Each yielded batch is a shallow copy of the original mapping (a
    :class:`WindowBatch`, a ``dict``) with three extra keys, all Python ``int``:
    ``num_items_in_batch``, the count summed over the micro-batches of its window on this process (the model
    module sums it across ranks); ``num_items_in_micro_batch``, this micro-batch's own count; and
    ``num_batches_in_window``, the number of micro-batches in its window (``accumulate_grad_batches``, or
    fewer for the last window of an epoch). ``len()`` is the epoch's number of micro-batches.

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
    ) -> None:
        super().__init__(loader, accumulate_grad_batches, count_fn)
        self.max_batches = max_batches

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[WindowBatch]:
        # a generator: the body runs at the first next(), after Lightning has called set_epoch
        k = self.gradient_accumulation_steps
        start = self._start()  # in micro-batches
        limit = self.max_batches() if self.max_batches is not None else float("inf")
        for window in self._windows(start, k - start % k, limit - start):
            total = sum(window.counts)
            for batch, count in zip(window.micro_batches, window.counts):
                keys = {NUM_ITEMS_KEY: total, MICRO_ITEMS_KEY: count, WINDOW_LENGTH_KEY: len(window)}
                yield WindowBatch(batch, **keys)


# ------------------------------------------------------------------ whether the module uses the count
#: the fix, in the docs page that shows it (docs/python.md)
FIX = (
    "for the exact token mean divide the summed token loss by batch['num_items_in_batch'] (summed across "
    "ranks) and multiply by accumulate_grad_batches x world size (docs/python.md)"
)
#: what a per-micro-batch mean is
BIASED = (
    "a loss averaged per micro-batch (a model's outputs.loss) is HF's biased fallback, which weighs the "
    "targets of a micro-batch by the inverse of its own count"
)
UNREAD = (
    "the training batches carry num_items_in_batch, the target count of each accumulation window "
    "(trainer.accumulate_grad_batches=%d, %d process(es)), but %s.training_step did not read it: "
    + BIASED
    + "; "
    + FIX
)
NO_COUNT = (
    "the training batches carry no num_items_in_batch: nothing bound a count_loss_items "
    "(HFDataModule.bind, or a LightningModule with data_binding()), and a window spans "
    "trainer.accumulate_grad_batches=%d micro-batch(es) on %d process(es): "
    + BIASED
    + "; bind one, then "
    + FIX
)


class WindowBatch(dict):
    """A training micro-batch with the window keys: a plain ``dict`` to every reader, which also counts (in
    :attr:`reads`, process-wide) how often its ``num_items_in_batch`` is read."""

    #: reads of ``num_items_in_batch`` from any WindowBatch of this process
    reads = 0

    def __getitem__(self, key: Any) -> Any:
        if key == NUM_ITEMS_KEY:
            WindowBatch.reads += 1
        return dict.__getitem__(self, key)

    def get(self, key: Any, default: Any = None) -> Any:
        if key == NUM_ITEMS_KEY:
            WindowBatch.reads += 1
        return dict.get(self, key, default)

    def pop(self, key: Any, *default: Any) -> Any:
        if key == NUM_ITEMS_KEY:
            WindowBatch.reads += 1
        return dict.pop(self, key, *default)


def spans_micro_batches(accumulate_grad_batches: int, world_size: int) -> bool:
    """Whether a window holds more than one micro-batch (so a per-micro-batch mean is not the window's)."""
    return accumulate_grad_batches > 1 or world_size > 1


def warn_no_count(accumulate_grad_batches: int, world_size: int) -> None:
    """:data:`NO_COUNT`, when a window spans several micro-batches or processes."""
    if spans_micro_batches(accumulate_grad_batches, world_size):
        log.warning(NO_COUNT, accumulate_grad_batches, world_size)


class CountUse:
    """Watches the first training batch: did the module's ``training_step`` read its ``num_items_in_batch``?

    Args:
        module_name: the LightningModule's class, for the message.
        accumulate_grad_batches / world_size: the window; nothing is watched when it is one micro-batch.
        speaks: whether this process says the WARNING (rank zero).
    """

    def __init__(self, module_name: str, accumulate_grad_batches: int, world_size: int, speaks: bool) -> None:
        self.module_name = module_name
        self.accumulate_grad_batches = accumulate_grad_batches
        self.world_size = world_size
        self.speaks = speaks
        self.done = not spans_micro_batches(accumulate_grad_batches, world_size)
        self._reads_at_handout: int | None = None

    def handed_out(self, batch: Any) -> None:
        """Called as each training batch moves to the device, just before its ``training_step``: the step of
        the batch handed out before has run by now."""
        if self.done or not isinstance(batch, WindowBatch):
            return
        if self._reads_at_handout is None:
            self._reads_at_handout = WindowBatch.reads
            return
        self.finish()

    def finish(self) -> None:
        """The verdict on the first batch (also at the end of ``fit``, when it was the only one)."""
        if self.done or self._reads_at_handout is None:
            return
        self.done = True
        if WindowBatch.reads == self._reads_at_handout and self.speaks:
            log.warning(UNREAD, self.accumulate_grad_batches, self.world_size, self.module_name)
