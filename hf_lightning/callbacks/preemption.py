"""SIGTERM / SIGINT: finish the optimizer step in flight, save ``last.ckpt``, stop cleanly."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint

from hf_lightning.compat import last_saved_step, save_last_checkpoint

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGTERM, signal.SIGINT)


def last_checkpoint_path(trainer: L.Trainer) -> str:
    """``<ModelCheckpoint dirpath>/last.ckpt`` (the run folder's ``checkpoints/``)."""
    cb = next((c for c in trainer.callbacks if isinstance(c, ModelCheckpoint) and c.dirpath), None)
    folder = cb.dirpath if cb is not None else os.path.join(trainer.default_root_dir, "checkpoints")
    return os.path.join(folder, "last.ckpt")


def save_last(trainer: L.Trainer) -> str:
    """Write ``last.ckpt`` now; returns its path.

    Through the ``save_last`` ModelCheckpoint(s) when there are any, so that their bookkeeping knows the file:
    a ``trainer.save_checkpoint`` behind their back made Lightning (>= 2.6, whose ModelCheckpoint also saves
    ``last`` at train end when it has not saved yet) find an unknown ``last.ckpt`` and write ``last-v1.ckpt``
    beside it. Without one, ``trainer.save_checkpoint`` to :func:`last_checkpoint_path`.
    """
    owners = [c for c in trainer.checkpoint_callbacks if isinstance(c, ModelCheckpoint) and c.save_last]
    for callback in owners:
        # Lightning's own "save last now" (the path its on_train_end and on_validation_end take)
        save_last_checkpoint(callback, trainer)
    if owners:
        return owners[0].last_model_path
    path = last_checkpoint_path(trainer)
    trainer.save_checkpoint(path, weights_only=False)  # explicit: Lightning logs its default otherwise
    return path


class Preemption(L.Callback):
    """Turn a cluster preemption (SIGTERM) or Ctrl-C (SIGINT) into a checkpoint at the next step boundary.

    Lightning's own SIGTERM handling raises at the end of the current micro-batch, which can be in the middle
    of a gradient-accumulation window; a checkpoint there cannot resume exactly. This callback replaces the
    handlers while training runs, waits for the optimizer step that closes the window, writes
    ``last.ckpt``, and stops: after that step's own validation, if one is scheduled, and before the next
    training batch, which a module with ``skips_training_when_preempted = True`` (``HFLightningModule``) skips
    from ``on_train_batch_start``. Any other module stops at once through ``trainer.should_stop``, after which
    Lightning validates once more. ``python -m hf_lightning.train`` then exits with status
    128 + the signal number (130 for Ctrl-C, 143 for SIGTERM: a script can tell a stopped run from a finished
    one) after a log line that says how to resume. A second
    signal of the same kind restores the default behaviour (kill at once).

    It also writes ``last.ckpt`` at the end of training when the final optimizer step came after the last
    save (Lightning saves on validation end only, when validation runs inside the epoch).
    """

    def __init__(self) -> None:
        self.received: int | None = None
        self._previous: dict[int, Any] = {}
        self._steps_seen = 0
        self._stop_at_next_batch = False

    def _handler(self, signum: int, frame: Any) -> None:
        if self.received is not None:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self.received = signum
        log.warning(
            "received %s: saving a checkpoint at the end of the current optimizer step, then stopping",
            signal.Signals(signum).name,
        )

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._steps_seen = trainer.global_step
        self._stop_at_next_batch = False
        for sig in SIGNALS:
            # outside the main thread (a spawned worker) signal() raises: Lightning's handlers stay
            with contextlib.suppress(ValueError):
                self._previous[sig] = signal.signal(sig, self._handler)

    def _restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if self._stop_at_next_batch:
            trainer.should_stop = True

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if trainer.global_step == self._steps_seen:
            return  # inside an accumulation window
        self._steps_seen = trainer.global_step
        received = self.received is not None
        if trainer.world_size > 1:  # every rank stops at the same step, even if only one got the signal
            received = bool(trainer.strategy.reduce_boolean_decision(received, all=False))
        if not received:
            return
        step = trainer.global_step
        for callback in trainer.checkpoint_callbacks:
            # their own saves of this step first (Lightning runs them after every other callback): the save
            # below marks the step as saved, and they would skip a periodic checkpoint the run that never
            # stopped has
            callback.on_train_batch_end(trainer, pl_module, *args)
        saved = [c for c in trainer.checkpoint_callbacks if last_saved_step(c) == step]
        path = next(
            (c.last_model_path for c in saved if getattr(c, "last_model_path", None)), None
        ) or save_last(trainer)
        if getattr(pl_module, "skips_training_when_preempted", False):
            # stop at the next batch's start, skipping it (the module's on_train_batch_start returns -1): this
            # step's own validation, if scheduled, runs first; a stop requested now would make Lightning
            # validate at this step too, a row the run that never stopped does not have
            self._stop_at_next_batch = True
        else:
            trainer.should_stop = True  # Lightning validates once more at a stop
        # the signal number (truthy): the command exits with 128 + it, as a shell reports a killed command
        pl_module.preempted = self.received or signal.SIGTERM  # a rank that only heard of it from another
        log.warning(
            "saved %s at step %d after a stop signal; resume with ckpt_path=last in the same run folder",
            path,
            trainer.global_step,
        )

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._restore()
        if getattr(pl_module, "preempted", False):
            return
        saved = max(
            (last_saved_step(c) for c in trainer.callbacks if isinstance(c, ModelCheckpoint)),
            default=-1,
        )
        if trainer.global_step > 0 and saved != trainer.global_step:
            save_last(trainer)

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        self._restore()
