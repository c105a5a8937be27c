"""Evaluation memory is flat in the evaluation-set size on the default path (peak RSS in a subprocess)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

SCRIPT = r"""
import json, resource, sys
import datasets, lightning as L, torch
from hf_lightning import HFDataModule, HFLightningModule
from tests.data_support import PadOnly, tiny_llama
n, keep = int(sys.argv[1]), sys.argv[2] == "keep"
torch.manual_seed(0)
rows = [{"input_ids": x, "labels": x} for x in torch.randint(1, 8000, (n, 64)).tolist()]
ds = datasets.Dataset.from_list(rows)
dm = HFDataModule(PadOnly(), path=ds, validation_path=ds, per_device_eval_batch_size=8)
dm.setup("validate")
kw = {"compute_metrics": lambda p: {"n": float(len(p.predictions))}} if keep else {}
module = HFLightningModule(tiny_llama(vocab_size=8000), **kw)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False).validate(module, datamodule=dm, verbose=False)
print(json.dumps({"peak_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "before_kib": before}))
"""


def peak_rss(n: int, mode: str, cwd) -> dict:
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(n), mode], capture_output=True, text=True, cwd=cwd, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_peak_rss_is_flat_when_the_eval_set_grows_10x(request):
    root = request.config.rootpath
    small, large = peak_rss(40, "default", root), peak_rss(400, "default", root)
    assert large["peak_kib"] < 1.05 * small["peak_kib"], (small, large)
    # control: an HF-style compute_metrics without preprocessing keeps every logit (400x64x8000x4 B = 819 MB)
    keep = peak_rss(400, "keep", root)
    assert keep["peak_kib"] - large["peak_kib"] > 500 * 1024, (large, keep)
