"""Proof 5, through the command line: micro-batch 2 x accumulation 4 and micro-batch 8 x accumulation 1 log
the same ``train/loss`` (and ``grad_norm``, ``lr``) at every optimizer step on the same data without shuffle.

The data is real instruction text (``shared/data/alpaca-tiny``, its rendered ``text`` field) under
``+experiment=clm``; rows are 77 to 160 tokens long (56 of 100 truncated), so micro-batches hold different
numbers of targets.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path

import pytest

from tests.errors.support import run_train_cli

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("HF_LIGHTNING_SHARED_DATA", REPO / ".." / "shared" / "data"))
DATA = SHARED / "alpaca-tiny" / "alpaca_tiny.json"


def run(run_dir: Path, micro_batch: int, accumulation: int) -> list[dict]:
    proc = run_train_cli(
        "+experiment=clm",
        f"data.path={DATA}",
        f"hydra.run.dir={run_dir}",
        "data.shuffle=false",
        "data.max_length=160",
        f"data.per_device_train_batch_size={micro_batch}",
        f"data.gradient_accumulation_steps={accumulation}",
        "trainer.max_steps=4",
        "scheduler=constant",
        "optim.lr=1e-3",
        "trainer.log_every_n_steps=1",
        "trainer.limit_val_batches=0",
        "trainer.enable_progress_bar=false",
        "callbacks.hf_export=null",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(run_dir / "metrics.csv") as fh:
        return [r for r in csv.DictReader(fh) if r.get("train/loss")]


@pytest.mark.skipif(
    not DATA.is_file(), reason=f"shared data not found at {DATA} (set HF_LIGHTNING_SHARED_DATA)"
)
def test_accumulation_and_micro_batch_split_log_the_same_loss(tmp_path):
    split = run(tmp_path / "mb2_acc4", 2, 4)
    whole = run(tmp_path / "mb8_acc1", 8, 1)
    assert [int(r["step"]) for r in split] == [int(r["step"]) for r in whole] == [1, 2, 3, 4]
    for column in ("train/loss", "grad_norm", "lr"):
        a, b = [float(r[column]) for r in split], [float(r[column]) for r in whole]
        print(column, a, b, max(abs(x - y) / abs(y) for x, y in zip(a, b) if y))
        assert a == pytest.approx(b, rel=1e-5), column
    losses = [float(r["train/loss"]) for r in whole]
    assert len(set(losses)) == 4  # the model trains: four different steps, not one value four times
