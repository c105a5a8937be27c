"""A test-only callback that fills the run folder's filesystem, or remounts it read-only, just before one kind
of write (``+callbacks.disk=...``): the write itself is the real one, on a real tmpfs
(``tests/errors/test_disk_full.py``).
"""

from __future__ import annotations

import errno
import os
import subprocess
from typing import Any

import lightning as L

WRITES = (
    "checkpoint",  # the first checkpoint file of step `step`
    "metrics_row",  # the first validation row of metrics.csv at step `step` (new columns: file rewritten;
    # an appended row may fit in the file's last page even on a full disk, and then rightly succeeds)
    "export_weights",  # hf_model/model.safetensors
    "export_tokenizer",  # the tokenizer files of hf_model/
    "final_metrics",  # final_metrics.json (after the final validation)
)


def fill(folder: str) -> None:
    """Write zeros into ``folder`` until its filesystem is full."""
    with open(os.path.join(folder, "filler"), "wb", buffering=0) as fh:  # unbuffered: nothing left to flush
        try:
            while True:
                fh.write(b"\0" * (1 << 16))
        except OSError as err:
            if err.errno != errno.ENOSPC:
                raise


class DiskFault(L.Callback):
    """``mode``: ``full`` (fill ``mount``) or ``read_only`` (``mount -o remount,ro mount``), before
    ``write``."""

    def __init__(self, write: str, mount: str, mode: str = "full", step: int = 1) -> None:
        if write not in WRITES:
            raise ValueError(f"unknown write {write!r}; expected one of {WRITES}")
        self.write, self.mount, self.mode, self.step = write, mount, mode, int(step)
        self.done = False

    def fault(self) -> None:
        if self.done:
            return
        self.done = True
        if self.mode == "full":
            fill(self.mount)
            return
        import logging

        # a remount waits for files open for writing: the log file (Hydra's train.log) is closed first; its
        # next line reopens it, and fails as a real read-only filesystem makes it fail
        for handler in logging.getLogger().handlers:
            if isinstance(handler, logging.FileHandler):
                handler.close()
        subprocess.run(["mount", "-o", "remount,ro", self.mount], check=True, capture_output=True)

    def _before(self, real: Any, when: Any = lambda *a, **k: True) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            if when(*args, **kwargs):
                self.fault()
            return real(*args, **kwargs)

        return call

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.write == "checkpoint":
            io = trainer.strategy.checkpoint_io
            io.save_checkpoint = self._before(
                io.save_checkpoint, lambda *a, **k: trainer.global_step == self.step
            )
        if self.write == "final_metrics":  # after the final validation and the export, as the last write
            import hf_lightning.run.end as run_end

            run_end.write_json = self._before(
                run_end.write_json, lambda path, *a, **k: str(path).endswith("final_metrics.json")
            )
        if self.write == "export_weights":
            import transformers.modeling_utils as mu

            mu.safe_save_file = self._before(mu.safe_save_file)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.write == "export_tokenizer":
            tok = pl_module.tokenizer
            tok.save_pretrained = self._before(tok.save_pretrained)
        if self.write == "metrics_row":
            for logger in trainer.loggers:
                writer = logger.experiment
                writer.save = self._before(
                    writer.save,
                    lambda *a, w=writer, **k: any(
                        m.get("step") == self.step and "val/loss" in m for m in w.metrics
                    ),
                )
