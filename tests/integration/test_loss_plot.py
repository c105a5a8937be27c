"""``loss.png``: the curves come from ``metrics.csv`` as logged, including the steps flushed at the end of
training."""

from __future__ import annotations

import csv
import logging
import struct
import sys

import datasets
import lightning as L
import pytest
from lightning.pytorch.loggers import CSVLogger

from hf_lightning import HFDataModule, HFLightningModule
from hf_lightning.callbacks import LossPlot
from hf_lightning.callbacks.loss_plot import plot_losses, read_curves
from tests.data_support import tiny_llama

TEXTS = [" ".join("abcdefghijklmnopqrstuvwxyz"[i % 9 : i % 9 + i % 6 + 3]) for i in range(24)]


def png_size(path) -> tuple[int, int]:
    """Width and height from the PNG header (IHDR), read without any imaging library."""
    with open(path, "rb") as fh:
        head = fh.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])


def test_read_curves_of_a_lightning_style_csv(tmp_path):
    # one row per logging call, empty cells for what that call did not log (as CSVLogger writes them)
    path = tmp_path / "metrics.csv"
    path.write_text(
        "epoch,grad_norm,lr,step,train/loss,val/loss,val/perplexity\n"
        "0,1.5,0.001,2,4.25,,\n"
        "0,1.2,0.001,4,3.5,,\n"
        ",,,4,,3.75,42.5\n"
        "1,1.0,0.001,5,3.0,,\n"
    )
    assert read_curves(path) == {"train/loss": ([2, 4, 5], [4.25, 3.5, 3.0]), "val/loss": ([4], [3.75])}
    assert read_curves(path, keys=("val/perplexity", "absent")) == {"val/perplexity": ([4], [42.5])}


def test_plot_losses_without_loss_rows_writes_nothing(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "metrics.csv"
    path.write_text("epoch,step,lr\n0,1,0.1\n")
    assert plot_losses(path, tmp_path / "loss.png") == {}
    assert not (tmp_path / "loss.png").exists()


def fit(tmp_path, word_tokenizer, callbacks, max_epochs=1):
    data = HFDataModule(
        word_tokenizer,
        path=datasets.Dataset.from_dict({"text": TEXTS}),
        validation_split=0.25,
        per_device_train_batch_size=4,
        per_device_eval_batch_size=6,
        max_length=16,
        seed=0,
        shuffle=False,
    )
    module = HFLightningModule(
        tiny_llama(), word_tokenizer, optim={"name": "adamw", "lr": 1e-2}, scheduler={"name": "constant"}
    )
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=max_epochs,
        log_every_n_steps=2,
        val_check_interval=2,
        logger=CSVLogger(tmp_path, name="", version=""),
        callbacks=callbacks,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        use_distributed_sampler=False,
    )
    trainer.fit(module, datamodule=data)
    return trainer


def test_callback_plots_every_logged_step(tmp_path, word_tokenizer):
    pytest.importorskip("matplotlib")
    plot = LossPlot(str(tmp_path / "loss.png"))
    fit(tmp_path, word_tokenizer, [plot])
    # 18 training rows / 4 = 5 steps (the last one of 2 rows); logged at 2 and 4, step 5 by the
    # end-of-training flush, which runs after the callbacks' on_train_end: the plot must still contain it
    with open(tmp_path / "metrics.csv") as fh:
        rows = list(csv.DictReader(fh))
    train_steps = [int(r["step"]) for r in rows if r["train/loss"]]
    val_steps = [int(r["step"]) for r in rows if r["val/loss"]]
    assert train_steps == [2, 4, 5] and val_steps == [2, 4]
    assert set(plot.curves) == {"train/loss", "val/loss"}
    assert plot.curves["train/loss"][0] == [2, 4, 5] and plot.curves["val/loss"][0] == [2, 4]
    assert plot.curves["train/loss"][1] == [float(r["train/loss"]) for r in rows if r["train/loss"]]
    assert plot.curves["val/loss"][1] == [float(r["val/loss"]) for r in rows if r["val/loss"]]
    assert png_size(tmp_path / "loss.png") == (700, 400)  # figsize 7 x 4 inches at 100 dpi


def test_without_matplotlib_the_run_finishes_with_a_note(tmp_path, word_tokenizer, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` raise ImportError
    with caplog.at_level(logging.INFO, logger="hf_lightning.callbacks.loss_plot"):
        trainer = fit(tmp_path, word_tokenizer, [LossPlot(str(tmp_path / "loss.png"))])
    assert trainer.global_step == 5
    assert not (tmp_path / "loss.png").exists()
    assert (
        "matplotlib is not installed, so this run writes no loss.png (pip install matplotlib" in caplog.text
    )


def test_without_a_csv_logger_the_plot_is_skipped_with_a_note(tmp_path, word_tokenizer, caplog):
    pytest.importorskip("matplotlib")
    data = HFDataModule(
        word_tokenizer,
        path=datasets.Dataset.from_dict({"text": TEXTS}),
        validation_split=0.0,
        per_device_train_batch_size=8,
        max_length=16,
    )
    module = HFLightningModule(tiny_llama(), word_tokenizer, optim={"name": "sgd", "lr": 0.1})
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=1,
        logger=False,
        callbacks=[LossPlot(str(tmp_path / "loss.png"))],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=False,
    )
    with caplog.at_level(logging.INFO, logger="hf_lightning.callbacks.loss_plot"):
        trainer.fit(module, datamodule=data)
    assert not (tmp_path / "loss.png").exists()
    assert "no metrics.csv to plot" in caplog.text
