"""scripts/gpu_smoke.py: runs on a CUDA machine, and fails loudly anywhere else."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_smoke.py"


def run_script(*args, cwd):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=1800,
                          cwd=cwd, env={**os.environ, "HF_HUB_OFFLINE": "1"})


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without CUDA")
def test_fails_loudly_without_cuda(tmp_path):
    proc = run_script(cwd=tmp_path)
    assert proc.returncode == 1
    assert "gpu_smoke: FAILED: no CUDA device" in proc.stderr


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_smoke(tmp_path):
    skip = [] if _has_deepspeed() else ["--skip", "deepspeed_zero2"]
    proc = run_script("--out", str(tmp_path), *skip, cwd=tmp_path)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "gpu_smoke: OK" in proc.stdout


def _has_deepspeed() -> bool:
    from lightning.fabric.strategies.deepspeed import _DEEPSPEED_AVAILABLE

    return bool(_DEEPSPEED_AVAILABLE)
