"""CSV and TensorBoard both write their files during a run, with the same values at the same steps."""

from __future__ import annotations

import csv

import pytest

pytestmark = pytest.mark.slow


def test_csv_and_tensorboard_write_the_same_metrics(compose_cfg, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from hf_lightning.train import train

    train(
        compose_cfg(
            "+experiment=sft",
            "logger=many",
            "trainer.max_steps=3",
            "trainer.val_check_interval=3",
            "callbacks=none",
        )
    )

    with open(tmp_path / "metrics.csv") as fh:
        rows = list(csv.DictReader(fh))
    csv_loss = {int(r["step"]): float(r["train/loss"]) for r in rows if r.get("train/loss")}
    csv_val = {int(r["step"]): float(r["val/loss"]) for r in rows if r.get("val/loss")}
    assert sorted(csv_loss) == [1, 2, 3] and sorted(csv_val) == [3]

    events = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert len(events) == 1
    acc = EventAccumulator(str(events[0].parent))
    acc.Reload()
    assert {"train/loss", "val/loss", "lr", "grad_norm"} <= set(acc.Tags()["scalars"])
    tb_loss = {e.step: e.value for e in acc.Scalars("train/loss")}
    assert tb_loss.keys() == csv_loss.keys()
    for step, value in csv_loss.items():
        assert tb_loss[step] == pytest.approx(value, rel=1e-6)  # TensorBoard stores float32
    assert {e.step: e.value for e in acc.Scalars("val/loss")}[3] == pytest.approx(csv_val[3], rel=1e-6)
