"""A test-only callback that stops the CLI process at one chosen point of a run (``+callbacks.kill=...``).

The kill harness (``tests/integration/test_kill_harness.py``) picks the points with a seeded RNG. Each point
is a place where a real process can die: between two micro-batches, between the update and the checkpoint,
halfway through a checkpoint or an export file, just after ``last.ckpt`` is committed, while the log row or
``final_metrics.json`` is written. The writes themselves are the real ones; only the moment of death is
chosen.
"""

from __future__ import annotations

import io
import os
import signal as signals
from typing import Any

import lightning as L

POINTS = (
    "setup",  # start-up: before the first step
    "micro_batch",  # after the first micro-batch of the window of optimizer step `step` (needs accumulation)
    "before_update",  # after the backward of step `step`, before its optimizer update
    "step_end",  # after the update of step `step`, before its log row and checkpoint
    "row",  # just after the metrics.csv row of step `step` was written
    "in_save",  # halfway through the first checkpoint file written at step `step`
    "in_last_save",  # halfway through last.ckpt at step `step`
    "after_topk_save",  # just after the periodic checkpoint of step `step`, before last.ckpt
    "after_save",  # just after last.ckpt of step `step` was committed
    "epoch_start",  # at the first batch of epoch `step` (after an epoch boundary)
    "validation",  # during the validation at step `step`
    "export_weights",  # halfway through hf_model/model.safetensors
    "export_tokenizer",  # after the model files of hf_model/, before the tokenizer files
    "train_end",  # after the export, before final_metrics.json
    "final_metrics",  # halfway through final_metrics.json
)


def _die(signal: int) -> None:
    os.kill(os.getpid(), signal)
    if signal != signals.SIGKILL:
        return
    os._exit(137)  # not reached: SIGKILL cannot be caught


def _half_then_die(real_save: Any, signal: int) -> Any:
    """A ``torch.save`` / ``safe_save_file`` stand-in: the real bytes, half of them written, then death."""

    def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        buf = io.BytesIO()
        if real_save.__module__.startswith("safetensors"):
            from safetensors.torch import save

            data = save(obj, metadata=kwargs.get("metadata"))
        else:
            real_save(obj, buf, *args, **kwargs)
            data = buf.getvalue()
        if isinstance(f, (str, os.PathLike)):
            with open(f, "wb") as fh:
                fh.write(data[: len(data) // 2])
        else:
            f.write(data[: len(data) // 2])
            f.flush()
        _die(signal)

    return save


class KillAt(L.Callback):
    """Send ``signal`` (default SIGKILL) to this process at ``point`` (one of :data:`POINTS`) of step
    ``step``."""

    def __init__(self, point: str, step: int = 0, signal: str = "SIGKILL") -> None:
        if point not in POINTS:
            raise ValueError(f"unknown kill point {point!r}; expected one of {POINTS}")
        self.point, self.step, self.signal = point, int(step), getattr(signals, signal)
        self.sent = False

    def _fire(self) -> None:
        if not self.sent:
            self.sent = True
            _die(self.signal)

    # ------------------------------------------------------------------------------------------ start
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.point == "setup":
            self._fire()
        if self.point in ("in_save", "in_last_save", "after_save", "after_topk_save"):
            self._wrap_checkpoint_io(trainer)
        if self.point == "export_weights":
            import transformers.modeling_utils as mu

            mu.safe_save_file = _half_then_die(mu.safe_save_file, self.signal)
        if self.point == "final_metrics":
            import json

            real_dump = json.dump

            def dump(obj: Any, fh: Any, *args: Any, **kwargs: Any) -> None:
                if "final_metrics" not in str(getattr(fh, "name", "")):
                    return real_dump(obj, fh, *args, **kwargs)
                text = json.dumps(obj, *args, **kwargs)
                fh.write(text[: len(text) // 2])
                fh.flush()
                _die(self.signal)

            json.dump = dump

    def _wrap_checkpoint_io(self, trainer: L.Trainer) -> None:
        from hf_lightning.checkpointing.sharded import AtomicShardedCheckpoints

        if isinstance(trainer.strategy, AtomicShardedCheckpoints):
            self._wrap_sharded_save(trainer)
            return
        io_plugin = trainer.strategy.checkpoint_io
        real = io_plugin.save_checkpoint
        me = self

        def save_checkpoint(checkpoint: dict, path: Any, storage_options: Any = None) -> None:
            last = os.path.basename(os.fspath(path)).startswith("last")
            at_step = trainer.global_step == me.step and not me.sent
            if at_step and (me.point == "in_save" or (me.point == "in_last_save" and last)):
                import torch

                torch.save = _half_then_die(torch.save, me.signal)
            real(checkpoint, path, storage_options)
            if at_step and (
                (me.point == "after_save" and last) or (me.point == "after_topk_save" and not last)
            ):
                me._fire()

        io_plugin.save_checkpoint = save_checkpoint

    def _wrap_sharded_save(self, trainer: L.Trainer) -> None:
        """A sharded run's checkpoint folder (FSDP2's or DeepSpeed's, the strategy's own
        ``save_checkpoint``; no ``CheckpointIO``): ``in_save`` / ``in_last_save`` die once every rank's part
        is in the temporary folder, before rank 0's ``meta.pt``, manifest and rename."""
        strategy, me = trainer.strategy, self
        real_save, real_parts = strategy.save_checkpoint, strategy._write_parts
        current: dict[str, bool] = {}

        def write_parts(checkpoint: dict, folder: str) -> dict:
            rest = real_parts(checkpoint, folder)
            if current.get("die"):
                me._fire()
            return rest

        def save_checkpoint(checkpoint: dict, path: Any, storage_options: Any = None) -> None:
            last = os.path.basename(os.fspath(path)).startswith("last")
            at_step = trainer.global_step == me.step and not me.sent
            current["die"] = at_step and (me.point == "in_save" or (me.point == "in_last_save" and last))
            real_save(checkpoint, path, storage_options)
            if at_step and (
                (me.point == "after_save" and last) or (me.point == "after_topk_save" and not last)
            ):
                me._fire()

        strategy._write_parts = write_parts
        strategy.save_checkpoint = save_checkpoint

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.point == "export_tokenizer":
            tokenizer = pl_module.tokenizer
            tokenizer.save_pretrained = lambda *a, **k: self._fire()
        if self.point == "row":
            for logger in trainer.loggers:
                self._wrap_logger(trainer, logger)

    def _wrap_logger(self, trainer: L.Trainer, logger: Any) -> None:
        real_log, real_save, me = logger.log_metrics, logger.save, self
        logged: list[int] = []

        def log_metrics(metrics: dict, step: int | None = None) -> None:
            real_log(metrics, step)
            if step == me.step and "train/loss" in metrics:
                logged.append(step)

        def save() -> None:
            real_save()
            if logged:
                me._fire()

        logger.log_metrics, logger.save = log_metrics, save

    # ------------------------------------------------------------------------------------------ steps
    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any
    ) -> None:
        if self.point == "before_update" and trainer.global_step + 1 == self.step:
            self._fire()

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        self._backwards = 0  # a training batch is one window

    def on_after_backward(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._backwards = getattr(self, "_backwards", 0) + 1
        # the window's first micro-batch is done, its others are not (needs accumulation)
        if self.point == "micro_batch" and trainer.global_step + 1 == self.step and self._backwards == 1:
            self._fire()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if self.point == "step_end" and trainer.global_step == self.step:
            self._fire()

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.point == "epoch_start" and trainer.current_epoch == self.step:
            self._fire()

    def on_validation_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if self.point == "validation" and trainer.global_step == self.step:
            self._fire()

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.point == "train_end":
            self._fire()


class WaitForFile(L.Callback):
    """Write this process's PID to ``PATH.pid``, then wait at the start of training until ``path`` exists (the
    test's signal that a competing process has ended)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        import time

        with open(self.path + ".pid", "w") as fh:
            fh.write(str(os.getpid()))
        while not os.path.exists(self.path):
            time.sleep(0.2)
