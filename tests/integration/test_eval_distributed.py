"""2-rank evaluation (real gloo processes): every example counted once, predictions in dataset order."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

SCRIPT = r"""
import json, sys
import datasets, lightning as L, numpy as np
from hf_lightning import HFDataModule, HFLightningModule
from tests.data_support import PadOnly
from tests.unit.test_evaluation import ROWS
from tests.unit.test_loss_exactness import TableLM

def compute_metrics(p):
    # the row index is recoverable from the labels: row i's first target, as a fingerprint of order
    return {"n": float(len(p.predictions)), "order": float(int("".join(str(int(r[r != -100][0])) for r in p.label_ids)))}

if __name__ == "__main__":
    devices, out = int(sys.argv[1]), sys.argv[2]
    ds = datasets.Dataset.from_list(ROWS)
    dm = HFDataModule(PadOnly(), path=ds, validation_path=ds, per_device_eval_batch_size=2)
    module = HFLightningModule(TableLM(), compute_metrics=compute_metrics)
    trainer = L.Trainer(accelerator="cpu", devices=devices, strategy="ddp_spawn" if devices > 1 else "auto",
                        logger=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.validate(module, datamodule=dm, verbose=False)
    if trainer.is_global_zero:
        json.dump({k: float(v) for k, v in trainer.callback_metrics.items()}, open(out, "w"))
"""


def run(devices, tmp_path, root):
    script = tmp_path / "eval_ddp.py"
    script.write_text(SCRIPT)
    out = tmp_path / f"metrics{devices}.json"
    proc = subprocess.run(
        [sys.executable, str(script), str(devices), str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=root,
        env={**__import__("os").environ, "PYTHONPATH": str(root)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_two_ranks_count_each_of_5_examples_once(tmp_path, request):
    root = request.config.rootpath
    single, double = run(1, tmp_path, root), run(2, tmp_path, root)
    assert double["val/n"] == 5.0  # 5 examples on 2 ranks: 5 predictions, not 6
    assert double["val/order"] == single["val/order"]  # dataset order restored
    assert double["val/loss"] == pytest.approx(single["val/loss"], rel=1e-6)
    assert double["val/accuracy"] == pytest.approx(single["val/accuracy"], rel=1e-6)
