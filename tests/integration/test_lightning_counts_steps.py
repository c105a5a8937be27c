"""Under someone else's plain ``lightning.Trainer``, with our module and DataModule, every Lightning counter
counts optimizer steps: each training batch is one accumulation window.

20 rows in micro-batches of 2, accumulation 2: 10 micro-batches, 5 windows (optimizer steps) per epoch, by
hand. Lightning's own ``ModelCheckpoint(every_n_train_steps=3)`` and ``val_check_interval=2`` (with
``check_val_every_n_epoch=None``, counted across epochs) over 6 steps: checkpoints after steps 3 and 6,
validations after steps 2, 4 and 6; a resume from either checkpoint ends with the straight run's weights, bit
for bit.
"""

from __future__ import annotations

import datasets
import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from hf_lightning import HFDataModule, HFLightningModule
from tests.data_support import tiny_llama

TEXTS = [" ".join("abcdefghijklmnopqrstuvwxyz"[i % 9 : i % 9 + 2 + i % 5]) for i in range(20)]


class Seen(L.Callback):
    def __init__(self) -> None:
        self.validated_at: list[int] = []
        self.windows: list[int] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.windows.append(len(batch))

    def on_validation_end(self, trainer, pl_module):
        if not trainer.sanity_checking:
            self.validated_at.append(trainer.global_step)


def fit(word_tokenizer, root, ckpt_path=None):
    torch.manual_seed(0)
    module = HFLightningModule(
        tiny_llama(len(word_tokenizer)),
        optim={"name": "adamw", "lr": 1e-2},
        scheduler={"name": "linear", "warmup_steps": 0},
    )
    data = HFDataModule(
        word_tokenizer,
        path=datasets.Dataset.from_dict({"text": TEXTS}),
        validation_path=datasets.Dataset.from_dict({"text": TEXTS[:4]}),
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        max_length=16,
        seed=3,
    )
    seen = Seen()
    checkpoints = ModelCheckpoint(dirpath=root, every_n_train_steps=3, save_top_k=-1, filename="{step}")
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=6,
        val_check_interval=2,
        check_val_every_n_epoch=None,
        num_sanity_val_steps=0,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[checkpoints, seen],
        default_root_dir=root,
    )
    trainer.fit(module, datamodule=data, ckpt_path=ckpt_path)
    return trainer, module, seen


def test_lightnings_own_counters_count_optimizer_steps_and_resume_exactly(word_tokenizer, tmp_path):
    trainer, straight, seen = fit(word_tokenizer, tmp_path / "straight")
    assert trainer.global_step == 6
    assert seen.windows == [2] * 6  # 5 windows of 2 per epoch (by hand), then the next epoch's first
    assert seen.validated_at == [2, 4, 6]
    assert sorted(p.name for p in (tmp_path / "straight").glob("*.ckpt")) == ["step=3.ckpt", "step=6.ckpt"]
    for step, epoch, consumed in ((3, 0, 3), (6, 1, 1)):
        position = {"epoch": epoch, "batches_consumed": consumed}
        saved = torch.load(tmp_path / "straight" / f"step={step}.ckpt", weights_only=False)
        assert saved["global_step"] == step
        # the train loader's own position: the windows trained in the epoch (not the one fetched ahead)
        assert saved["loops"]["fit_loop"]["state_dict"]["combined_loader"] == [position]

    expected = straight.model.state_dict()
    for step in (3, 6):
        ckpt = tmp_path / "straight" / f"step={step}.ckpt"
        resumed_trainer, resumed, resumed_seen = fit(word_tokenizer, tmp_path / f"from{step}", ckpt_path=ckpt)
        assert resumed_trainer.global_step == 6
        assert len(resumed_seen.windows) == 6 - step
        for name, value in resumed.model.state_dict().items():
            assert torch.equal(value, expected[name]), (step, name)


def as_micro_batch_checkpoint(checkpoint: dict, accumulation: int) -> dict:
    """The checkpoint as the micro-batch loop wrote it (Lightning's automatic optimization with
    ``accumulate_grad_batches``), the layout read from one written by hf_lightning before windows: the
    optimizer steps in the automatic loop's counter (the manual one at 0), batches and the loader's
    ``batches_consumed`` in micro-batches."""
    fit = checkpoint["loops"]["fit_loop"]
    manual = fit["epoch_loop.manual_optimization.optim_step_progress"]
    fit["epoch_loop.automatic_optimization.optim_progress"]["optimizer"]["step"] = manual
    fit["epoch_loop.manual_optimization.optim_step_progress"] = {
        part: {"ready": 0, "completed": 0} for part in ("total", "current")
    }
    for part in ("total", "current"):
        for name in ("ready", "started", "processed", "completed"):
            fit["epoch_loop.batch_progress"][part][name] *= accumulation
    for state in fit["state_dict"]["combined_loader"]:
        state["batches_consumed"] *= accumulation
    return checkpoint


def test_a_checkpoint_of_the_micro_batch_loop_resumes_exactly(word_tokenizer, tmp_path, caplog):
    _, straight, _ = fit(word_tokenizer, tmp_path / "straight")
    new = torch.load(tmp_path / "straight" / "step=3.ckpt", weights_only=False)
    old = tmp_path / "old.ckpt"
    torch.save(as_micro_batch_checkpoint(new, 2), old)
    with caplog.at_level("INFO", logger="hf_lightning"):
        trainer, resumed, seen = fit(word_tokenizer, tmp_path / "resumed", ckpt_path=old)
    assert "the checkpoint counts micro-batches (accumulation 2)" in caplog.text
    assert "resuming with settings that changed" not in caplog.text
    assert trainer.global_step == 6 and seen.windows == [2, 2, 2] and seen.validated_at == [4, 6]
    expected = straight.model.state_dict()
    for name, value in resumed.model.state_dict().items():
        assert torch.equal(value, expected[name]), name
