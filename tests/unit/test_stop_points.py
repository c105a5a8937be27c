"""Where an epoch ends and where a preempted run stops, read from Lightning's public API only; a checkpoint of
a run stopped mid-epoch reopened (the fit loop's counters in the checkpoint).

``ends_epoch`` is checked against the batches Lightning really trains (a loader that runs out, a
``limit_train_batches`` cut, a loader without a length). ``Preemption`` is checked with a real SIGTERM sent
to this process in the middle of a fit: the run stops at the step that saved ``last.ckpt``; a module that
skips the next batch (``skips_training_when_preempted``) gets no validation the uninterrupted run does not
have, any other module gets Lightning's one validation at a stop.
"""

from __future__ import annotations

import os
import signal

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, IterableDataset

from hf_lightning.callbacks.preemption import Preemption
from hf_lightning.checkpointing.loop_state import ends_epoch, epoch_progress, reopen_stopped_epoch


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.validated_at: list[int] = []

    def training_step(self, batch, batch_idx):
        return self.layer(batch).sum()

    def validation_step(self, batch, batch_idx):
        return None

    def on_validation_end(self):
        if not self.trainer.sanity_checking:
            self.validated_at.append(self.global_step)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Skipping(Tiny):
    skips_training_when_preempted = True

    def on_train_batch_start(self, batch, batch_idx):
        return -1 if getattr(self, "preempted", None) else None


class Ends(L.Callback):
    def __init__(self) -> None:
        self.seen: list[bool] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.seen.append(ends_epoch(trainer, batch_idx))


class SignalAt(L.Callback):
    """Sends SIGTERM to this process at the start of optimizer step ``step`` (1-based)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step + 1 == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


class Stream(IterableDataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        return iter(torch.randn(self.n, 2))


def _trainer(tmp_path, callbacks, **kwargs) -> L.Trainer:
    return L.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=str(tmp_path),
        callbacks=callbacks,
        **kwargs,
    )


def test_ends_epoch_where_the_loader_runs_out_or_the_limit_cuts(tmp_path):
    ran_out, cut, stream = Ends(), Ends(), Ends()
    data = DataLoader(torch.randn(4, 2), batch_size=1)
    _trainer(tmp_path / "a", [ran_out], max_epochs=2, enable_checkpointing=False).fit(Tiny(), data)
    _trainer(tmp_path / "b", [cut], max_epochs=2, limit_train_batches=3, enable_checkpointing=False).fit(
        Tiny(), data
    )
    _trainer(tmp_path / "c", [stream], max_epochs=1, enable_checkpointing=False).fit(
        Tiny(), DataLoader(Stream(3), batch_size=1)
    )
    assert ran_out.seen == [False, False, False, True] * 2
    assert cut.seen == [False, False, True] * 2
    assert stream.seen == [False, False, True]


def _preempted_fit(tmp_path, module):
    checkpoints = ModelCheckpoint(dirpath=str(tmp_path / "checkpoints"), save_last=True, save_top_k=0)
    trainer = _trainer(
        tmp_path,
        [Preemption(), SignalAt(3), checkpoints],
        max_steps=8,
        val_check_interval=2,
        check_val_every_n_epoch=None,
        limit_val_batches=1,
    )
    data = DataLoader(torch.randn(8, 2), batch_size=1)
    trainer.fit(module, data, DataLoader(torch.randn(2, 2), batch_size=1))
    saved = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)
    return trainer, saved


def test_a_preempted_run_stops_at_the_saved_step_without_an_extra_validation(tmp_path):
    module = Skipping()
    trainer, saved = _preempted_fit(tmp_path, module)
    assert module.preempted == signal.SIGTERM
    assert trainer.global_step == saved["global_step"] == 3
    assert module.validated_at == [2]  # val_check_interval=2: not at the stop step 3


def test_a_module_that_does_not_skip_stops_at_once_and_lightning_validates(tmp_path):
    module = Tiny()
    trainer, saved = _preempted_fit(tmp_path, module)
    assert trainer.global_step == saved["global_step"] == 3
    assert module.validated_at == [2, 3]


class EpochsSeen(L.Callback):
    def __init__(self) -> None:
        self.seen: list[tuple[int, int]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.seen.append((trainer.current_epoch, batch_idx))


def test_a_checkpoint_of_a_run_stopped_mid_epoch_is_reopened_and_resumes_inside_it(tmp_path):
    """``max_steps=3`` stops epoch 0 (5 batches) after its third batch: Lightning's checkpoint counts the
    epoch as processed and completed; :func:`reopen_stopped_epoch` sets it back to running, so the resumed fit
    trains the epoch's last 2 batches (indices 3, 4) before epoch 1, as the uninterrupted run does."""
    data = DataLoader(torch.randn(5, 2), batch_size=1)
    trainer = _trainer(tmp_path, [], max_steps=3, enable_checkpointing=False, limit_val_batches=0)
    trainer.fit(Tiny(), data)
    path = tmp_path / "stopped.ckpt"
    trainer.save_checkpoint(path)
    checkpoint = torch.load(path, weights_only=False)
    progress = epoch_progress(checkpoint)
    total = progress["total"]
    assert total["started"] == total["processed"] == total["completed"] == 1
    assert set(progress["current"]) >= {"ready", "started", "processed", "completed"}
    assert epoch_progress({}) is None
    assert not reopen_stopped_epoch(checkpoint, ended_early=False)
    assert reopen_stopped_epoch(checkpoint, ended_early=True)
    assert epoch_progress(checkpoint)["total"] == {"ready": 1, "started": 1, "processed": 0, "completed": 0}
    torch.save(checkpoint, path)
    seen = EpochsSeen()
    _trainer(tmp_path, [seen], max_steps=5, enable_checkpointing=False, limit_val_batches=0).fit(
        Tiny(), data, ckpt_path=path
    )
    assert seen.seen == [(0, 3), (0, 4)]
