"""Whether the LightningModule uses the window count the training batches carry, said in one WARNING when
the loss it back-propagates cannot be HF's exact token mean.

HF ``Trainer`` divides the summed token loss of an optimizer step by ``num_items_in_batch``, the targets of
the whole accumulation window on every rank. A LightningModule of one's own that returns ``outputs.loss`` (a
mean over its micro-batch) gets HF's fallback instead: each micro-batch's targets weigh by the inverse of its
own count. The two agree only when a window is one micro-batch on one process, so nothing is said then.

- No ``count_loss_items`` bound (:meth:`HFDataModule.bind`): the batches carry no count, which
  :func:`warn_no_count` says once when the window spans micro-batches or processes.
- A count bound: each training batch is a :class:`WindowBatch`, a ``dict`` that counts the reads of its
  ``num_items_in_batch`` (``batch["num_items_in_batch"]``, ``.get``, ``.pop``). :class:`CountUse` looks, when
  the next batch is handed to the module (or at the end of ``fit``), whether the module's first
  ``training_step`` read it; if not, one WARNING (:data:`UNREAD`). ``HFLightningModule`` reads it at the start
  of every window.
"""

from __future__ import annotations

import logging
from typing import Any

from hf_lightning.batch import NUM_ITEMS_KEY

log = logging.getLogger(__name__)

#: the fix, in the README section that shows it
FIX = (
    "for the exact token mean divide the summed token loss by batch['num_items_in_batch'] (summed across "
    "ranks) and multiply by accumulate_grad_batches x world size (README: Use from your own code)"
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
