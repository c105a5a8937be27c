"""Test-only callbacks injected through the config (``+callbacks.NAME._target_=tests.resume_support...``)."""

from __future__ import annotations

import os
import signal as signals

import lightning as L


class SignalAtStep(L.Callback):
    """Send ``signal`` to this process right after optimizer step ``step`` (SIGKILL: no chance to clean
    up)."""

    def __init__(self, step: int, signal: str = "SIGKILL") -> None:
        self.step = step
        self.signal = getattr(signals, signal)
        self.sent = False

    def on_train_batch_end(self, trainer, pl_module, *args) -> None:
        if trainer.global_step == self.step and not self.sent:
            self.sent = True
            os.kill(os.getpid(), self.signal)


class KillDuringSave(L.Callback):
    """SIGKILL in the middle of writing the checkpoint of optimizer step ``step`` (half the bytes written)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        if trainer.global_step != self.step:
            return
        import torch

        real_save = torch.save

        def half_then_die(obj, f, *args, **kwargs):
            import io

            buf = io.BytesIO()
            real_save(obj, buf, *args, **kwargs)
            data = buf.getvalue()
            f.write(data[: len(data) // 2])
            f.flush()
            os.kill(os.getpid(), signals.SIGKILL)

        torch.save = half_then_die


class ExitAtStep(L.Callback):
    """End the process of rank ``rank`` at once (``os._exit``, no clean-up, no exception) right after
    optimizer step ``step``: a rank that vanishes in the middle of a run. Status 0 by default, so that
    Lightning's observer of the ranks it launched (which kills rank 0 when a child ends with another status)
    leaves rank 0 to find the lost connection itself, as the survivor of a rank on another machine does."""

    def __init__(self, step: int, rank: int = 1, code: int = 0) -> None:
        self.step, self.rank, self.code = step, rank, code

    def on_train_batch_end(self, trainer, pl_module, *args) -> None:
        if trainer.global_step == self.step and trainer.global_rank == self.rank:
            os._exit(self.code)
