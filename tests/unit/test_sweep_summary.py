"""The multirun summary table is built from each job folder's overrides and final metrics."""

from __future__ import annotations

import csv
import json

from hf_lightning.config.sweep import write_summary


def make_job(root, num, overrides, metrics=None):
    job = root / str(num)
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    if metrics is not None:
        (job / "final_metrics.json").write_text(json.dumps(metrics))


def test_summary_rows_in_job_order_with_failed_jobs(tmp_path):
    for num in (0, 1, 2, 10):
        lr = ["1e-4", "3e-4", "1e-3", "3e-3"][[0, 1, 2, 10].index(num)]
        metrics = None if num == 2 else {"val/loss": 1.0 + num, "train/loss": 2.0}
        make_job(tmp_path, num, ["+experiment=sft", f"optim.lr={lr}"], metrics)
    (tmp_path / "multirun.yaml").write_text("{}")
    path, table = write_summary(tmp_path)
    with open(path) as fh:
        rows = list(csv.DictReader(fh))
    assert [r["job"] for r in rows] == ["0", "1", "2", "10"]  # numeric order, not "10" < "2"
    assert [r["optim.lr"] for r in rows] == ["1e-4", "3e-4", "1e-3", "3e-3"]
    assert [r["status"] for r in rows] == ["completed", "completed", "failed", "completed"]
    assert [r["val/loss"] for r in rows] == ["1.0", "2.0", "", "11.0"]
    lines = table.splitlines()
    assert lines[0].split() == ["job", "+experiment", "optim.lr", "status", "val/loss", "train/loss"]
    assert lines[3].split() == ["2", "sft", "1e-3", "failed"]
