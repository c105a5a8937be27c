"""``final_metrics.json`` holds the newest value of every logged metric, including the final flush of
``train/loss`` after the last log step (which never reaches Lightning's ``callback_metrics``), and its
``val/*`` describe the final (exported) weights: a run whose last validation came before its last step is
validated once more at that step. (A run whose last step is a validation step gets no extra one:
tests/integration/test_cli.py.)"""

from __future__ import annotations

import csv
import json

import pytest


def test_final_metrics_are_the_last_rows_written(compose_cfg, tmp_path):
    from hf_lightning.train import train

    # an epoch of 3 steps, a log every 2: train/loss rows at step 2 and at step 3, the flush when the epoch
    # (and the run, by max_epochs as a full run ends) is over
    cfg = compose_cfg(
        "+experiment=sft",
        "trainer.max_steps=-1",
        "trainer.max_epochs=1",
        "trainer.limit_train_batches=3",
        "trainer.log_every_n_steps=2",
    )
    metrics, objects = train(cfg)

    with open(tmp_path / "metrics.csv") as fh:
        rows = list(csv.DictReader(fh))
    last = {}
    for row in rows:  # the newest non-empty value of each column, as a reader of metrics.csv finds it
        last.update({k: float(v) for k, v in row.items() if v not in ("", None) and k != "step"})
    train_rows = {int(r["step"]): float(r["train/loss"]) for r in rows if r.get("train/loss")}
    assert sorted(train_rows) == [2, 3] and train_rows[3] != train_rows[2]
    # HF's state.epoch, the fraction of epochs done: 2 of the epoch's 3 steps, then the whole epoch (also the
    # flush after Lightning has counted it as done)
    assert [float(r["epoch"]) for r in rows if r.get("train/loss")] == pytest.approx([2 / 3, 1.0])
    # validation every 2 steps (tests' SHRINK): at step 2, then the final weights at step 3
    val_rows = {int(r["step"]): float(r["val/loss"]) for r in rows if r.get("val/loss")}
    assert sorted(val_rows) == [2, 3] and val_rows[3] != val_rows[2]

    saved = json.loads((tmp_path / "final_metrics.json").read_text())
    assert saved["train/loss"] == pytest.approx(train_rows[3], rel=1e-6)
    assert saved["val/loss"] == pytest.approx(val_rows[3], rel=1e-6)
    assert saved["epoch"] == 1.0
    for key in ("train/loss", "val/loss", "lr", "grad_norm"):
        assert saved[key] == pytest.approx(last[key], rel=1e-6), key
        assert metrics[key] == saved[key]
    assert saved["global_step"] == 3
    # the counts are integers in the file (a float, 3.0, reads as a measurement), the parameters counted here
    assert type(saved["global_step"]) is int and type(saved["parameters"]) is int
    assert saved["parameters"] == sum(p.numel() for p in objects["module"].model.parameters())

    # hf_model/README.md, HF's model card: the run's settings and the final metrics of final_metrics.json
    from huggingface_hub import ModelCard

    card = ModelCard.load(tmp_path / "hf_model" / "README.md")
    assert card.data.library_name == "transformers" and "generated_from_trainer" in card.data.tags
    assert f"- learning_rate: {cfg.optim.lr}\n" in card.text
    assert f"- train_batch_size: {cfg.data.per_device_train_batch_size}\n" in card.text
    assert f"- num_epochs: {cfg.trainer.max_epochs}\n" in card.text  # max_steps=-1: HF names the epochs
    assert f"- Loss: {saved['val/loss']:.4f}\n" in card.text  # HF rounds to 4 decimals


def test_resuming_a_finished_run_says_so_and_adds_nothing(compose_cfg, tmp_path, caplog):
    import logging

    from hf_lightning.train import train

    overrides = ("+experiment=sft", "trainer.max_steps=3")
    first, _ = train(compose_cfg(*overrides))
    before = {name: (tmp_path / name).read_text() for name in ("metrics.csv", "final_metrics.json")}
    with caplog.at_level(logging.WARNING, logger="hf_lightning.train"):
        again, _ = train(compose_cfg(*overrides, "ckpt_path=last"))
    assert (
        "nothing was trained: " in caplog.text
        and "is at optimizer step 3, where this run's limits" in caplog.text
    )
    # no second final validation, no rows, and the finished run's final metrics kept (and returned, for
    # sweeps)
    assert {name: (tmp_path / name).read_text() for name in before} == before
    assert again["val/loss"] == first["val/loss"] and again["train/loss"] == first["train/loss"]
