"""Faults at save time and stop signals: a full disk, a read-only remount or a lost write permission never
costs a checkpoint already written; Ctrl-C ends the run at a step boundary with one ``last.ckpt``.

Faults are planted in real runs (a real ``Trainer``, a real Llama, real data): a real tmpfs fills up or turns
read-only, a real signal is sent to the process. Where a real fault cannot be staged (a full disk without a
mountable tmpfs) the OS error is raised by a monkeypatched ``torch.save``.
"""

from __future__ import annotations

import errno
import logging
import os
import signal

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

import hf_lightning.checkpointing.io as ckpt_io
from hf_lightning import TrainingError
from hf_lightning.callbacks.preemption import Preemption
from hf_lightning.checkpointing import AtomicCheckpointIO
from tests.errors.support import ROWS, remount_read_only, run, tiny_filesystem


# ------------------------------------------------------------------------------------------ saving
def checkpointing_run(tmp_path, word_tokenizer, callbacks, max_steps=3):
    ckpt = ModelCheckpoint(
        dirpath=tmp_path / "run" / "checkpoints", every_n_train_steps=1, save_last=True, save_top_k=1
    )
    return run(
        tmp_path,
        word_tokenizer,
        [ckpt, *callbacks],
        max_steps=max_steps,
        rows=ROWS[:4] * 3,
        plugins=[AtomicCheckpointIO()],
        enable_checkpointing=True,
    )


def checkpoint_files(folder):
    """The checkpoints in ``folder`` (each also has its ``.sha256`` sidecar, checked in
    test_checkpoint_integrity)."""
    return sorted(name for name in os.listdir(folder) if name.endswith(".ckpt"))


def assert_step_1_kept(folder):
    assert checkpoint_files(folder) in (["last.ckpt", "step=1.ckpt"], ["epoch=0-step=1.ckpt", "last.ckpt"])
    assert not [
        name for name in os.listdir(folder) if name.startswith(".tmp-")
    ]  # a failed write leaves no temp
    last = torch.load(folder / "last.ckpt", weights_only=False)
    assert last["global_step"] == 1 and "optimizer_states" in last


class AfterStep(L.Callback):
    """Run ``action`` once, after the checkpoint of step ``step`` was written (at the start of the next batch:
    Lightning runs checkpoint callbacks after all others at a batch end)."""

    def __init__(self, step, action) -> None:
        self.step, self.action, self.done = step, action, False

    def on_train_batch_start(self, trainer, *args):
        if trainer.global_step == self.step and not self.done:
            self.done = True
            self.action()


def fill(folder):
    """Write zeros into ``folder`` until the filesystem reports it is full."""
    with open(folder / "filler", "wb") as fh:
        try:
            while True:
                fh.write(b"\0" * 65536)
                fh.flush()
        except OSError as err:
            assert err.errno == errno.ENOSPC


def test_disk_full_at_save_time_keeps_the_previous_checkpoint(tmp_path, word_tokenizer):
    """A real full disk: a tmpfs filled up after the first checkpoint."""
    with tiny_filesystem(tmp_path / "run", "4m") as run_dir:
        t, module, dm = checkpointing_run(tmp_path, word_tokenizer, [AfterStep(1, lambda: fill(run_dir))])
        with pytest.raises(TrainingError) as err:
            t.fit(module, datamodule=dm)
        message = str(err.value)
        assert message.startswith(f"could not write checkpoint {run_dir}/checkpoints/")
        assert ": No space left on device (ENOSPC); " in message
        assert (
            "every other checkpoint already written is kept; free space there: 0.0 MiB. free space on that "
            "disk" in message
        )
        os.remove(run_dir / "filler")
        assert_step_1_kept(run_dir / "checkpoints")


def test_disk_full_simulated_where_no_tmpfs_can_be_mounted(tmp_path, word_tokenizer, monkeypatch):
    real_save = torch.save

    def full_disk():
        def save(*args, **kwargs):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(ckpt_io.torch, "save", save)

    t, module, dm = checkpointing_run(tmp_path, word_tokenizer, [AfterStep(1, full_disk)])
    with pytest.raises(
        TrainingError,
        match=r"No space left on device \(ENOSPC\); nothing was overwritten and every other checkpoint",
    ):
        t.fit(module, datamodule=dm)
    monkeypatch.setattr(ckpt_io.torch, "save", real_save)
    assert_step_1_kept(tmp_path / "run" / "checkpoints")


def test_output_folder_turns_read_only_at_save_time(tmp_path, word_tokenizer):
    """A real read-only filesystem (root cannot write there either)."""
    with tiny_filesystem(tmp_path / "run", "16m") as run_dir:
        t, module, dm = checkpointing_run(
            tmp_path, word_tokenizer, [AfterStep(1, lambda: remount_read_only(run_dir))]
        )
        with pytest.raises(TrainingError) as err:
            t.fit(module, datamodule=dm)
        assert "Read-only file system (EROFS)" in str(err.value)
        assert str(err.value).endswith(
            "the filesystem is read-only: make it writable again, or choose another hydra.run.dir"
        )
        assert_step_1_kept(run_dir / "checkpoints")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into folders whatever their permissions")
def test_output_folder_loses_write_permission_at_save_time(tmp_path, word_tokenizer):
    folder = tmp_path / "run" / "checkpoints"
    t, module, dm = checkpointing_run(tmp_path, word_tokenizer, [AfterStep(1, lambda: folder.chmod(0o555))])
    with pytest.raises(
        TrainingError, match=r"Permission denied \(EACCES\).*the folder is not writable by this user"
    ):
        t.fit(module, datamodule=dm)
    folder.chmod(0o755)
    assert_step_1_kept(folder)


# ------------------------------------------------------------------------------------------ signals
class SendSignal(L.Callback):
    """Send ``signum`` to this process at backward number ``backward`` (0-based, counted over the run: inside
    an accumulation window)."""

    def __init__(self, signum, backward) -> None:
        self.signum, self.backward, self.seen = signum, backward, 0

    def on_before_backward(self, trainer, module, loss):
        if self.seen == self.backward:
            os.kill(os.getpid(), self.signum)
        self.seen += 1


def test_ctrl_c_saves_at_the_step_boundary_then_stops(tmp_path, word_tokenizer, caplog):
    """SIGINT (Ctrl-C) sent at the first backward of window 2 (accumulation 2): the window finishes, step 2
    is saved, the run stops cleanly, and the previous handler is back. (SIGTERM through the
    command line, with an exact resume afterwards, is
    tests/integration/test_resume.py::test_sigterm_saves_at_the_next_step_and_resumes.)"""
    signum = signal.SIGINT
    before = signal.getsignal(signum)
    ckpt = ModelCheckpoint(dirpath=tmp_path / "run" / "checkpoints", save_last=True, save_top_k=0)
    t, module, dm = run(
        tmp_path,
        word_tokenizer,
        [ckpt, Preemption(), SendSignal(signum, 2)],
        max_steps=6,
        accumulate=2,
        rows=ROWS[:4] * 6,
        plugins=[AtomicCheckpointIO()],
        enable_checkpointing=True,
    )
    with caplog.at_level(logging.WARNING):
        t.fit(module, datamodule=dm)
    assert t.global_step == 2 and module.preempted
    last = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=False)
    assert last["global_step"] == 2
    assert checkpoint_files(tmp_path / "run" / "checkpoints") == ["last.ckpt"]  # no second "last-v1.ckpt"
    assert (
        f"received {signal.Signals(signum).name}: saving a checkpoint at the end of the current optimizer "
        "step" in caplog.text
    )
    assert "resume with ckpt_path=last in the same run folder" in caplog.text
    assert signal.getsignal(signum) == before


def test_a_run_ending_before_any_checkpoint_leaves_one_last_ckpt(tmp_path, word_tokenizer):
    """3 steps, no validation, so ModelCheckpoint has saved nothing when training ends: ``Preemption`` writes
    ``last.ckpt`` at the final step, and Lightning's ModelCheckpoint (which also saves ``last`` at train end
    when it has not saved yet) must not add a ``last-v1.ckpt`` copy beside it."""
    folder = tmp_path / "run" / "checkpoints"
    ckpt = ModelCheckpoint(dirpath=folder, save_last=True, save_top_k=0)
    t, module, dm = run(
        tmp_path,
        word_tokenizer,
        [ckpt, Preemption()],
        max_steps=3,
        rows=ROWS[:4] * 3,
        plugins=[AtomicCheckpointIO()],
        enable_checkpointing=True,
    )
    t.fit(module, datamodule=dm)
    assert checkpoint_files(folder) == ["last.ckpt"]
    assert torch.load(folder / "last.ckpt", weights_only=False)["global_step"] == 3
