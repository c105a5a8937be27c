"""Gradient-accumulation windows: count ``num_items_in_batch`` before the first forward of a step.

Ours, because Lightning's loop has no hook for it: HF ``Trainer`` pulls the next
``gradient_accumulation_steps`` batches from the iterator, counts their label targets, then runs the
micro-steps (``Trainer.get_batch_samples``). Lightning's loop pulls one batch at a time, so
:class:`AccumulationWindowLoader` does the look-ahead on the data side: it reads a whole window from the
wrapped loader, counts it on the host (no device sync), and yields its batches with the count attached under
``num_items_in_batch``.

Windows are aligned with Lightning's optimizer steps: Lightning steps after batch index ``i`` when
``(i + 1) % accumulate_grad_batches == 0`` or ``i`` is the last batch of the epoch (or of
``limit_train_batches``). So a window never spans two epochs, and the last one of an epoch may be shorter; it
is counted over the batches it really holds.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from hf_lightning.batch import MICRO_ITEMS_KEY, NUM_ITEMS_KEY, WINDOW_LENGTH_KEY


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
