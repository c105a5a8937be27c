"""scripts/gpu_bench.py: measures on a CUDA machine, and fails loudly anywhere else."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_bench.py"


def run_script(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=1800,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without CUDA")
def test_fails_loudly_without_cuda():
    proc = run_script()
    assert proc.returncode == 1
    assert "gpu_bench: FAILED: no CUDA device" in proc.stderr


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_bench_reports_mfu(tmp_path):
    out = tmp_path / "gpu_bench.json"
    proc = run_script("--steps", "8", "--batch-size", "4", "--max-length", "512", "--json", str(out))
    print(proc.stdout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    import json

    results = json.loads(out.read_text())
    assert set(results) == {"padded eager", "padded compiled", "packed eager", "packed compiled"}
    for r in results.values():
        assert 0 < r["throughput/mfu"] < 1
    # packing removes the padding a padded batch carries
    assert results["packed eager"]["throughput/padding_share"] < results["padded eager"]["throughput/padding_share"]
