"""scripts/gpu_smoke.py and scripts/gpu_bench.py: they run on a CUDA machine, and fail loudly anywhere
else."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
NEEDS_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def run_script(name, *args, cwd):
    return subprocess.run(
        [sys.executable, str(SCRIPTS / f"{name}.py"), *args],
        capture_output=True,
        text=True,
        timeout=1800,
        cwd=cwd,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without CUDA")
@pytest.mark.parametrize("name", ["gpu_smoke", "gpu_bench"])
def test_fails_loudly_without_cuda(name, tmp_path):
    proc = run_script(name, cwd=tmp_path)
    assert proc.returncode == 1
    assert f"{name}: FAILED: no CUDA device" in proc.stderr


def test_gpu_smoke_runs_compose_here(compose_cfg):
    """Each run of gpu_smoke.py composes (the GPU-only ones are refused by the schema on this CPU, not
    here)."""
    import runpy

    smoke = runpy.run_path(str(SCRIPTS / "gpu_smoke.py"))
    assert set(smoke["NEEDS"]) <= set(smoke["RUNS"])
    for name, overrides in smoke["RUNS"].items():
        # {base}: the folder the script's cpu_fp32 run exports, filled in by the script
        overrides = [o.replace("{base}", "/tmp/cpu_fp32/hf_model") for o in overrides]
        cfg = compose_cfg(*smoke["COMMON"], *overrides, shrink=False)
        assert cfg.trainer.accelerator == ("cpu" if name.endswith("cpu_fp32") else "gpu"), name
    assert compose_cfg(*smoke["RUNS"]["gpu_adamw_8bit"], shrink=False).optim.name == "adamw_8bit"


@pytest.mark.gpu
@pytest.mark.slow
@NEEDS_CUDA
def test_gpu_smoke(tmp_path):
    import importlib.util

    skip = [] if _has_deepspeed() else ["deepspeed_zero2"]
    skip += [] if importlib.util.find_spec("bitsandbytes") else ["gpu_adamw_8bit"]
    proc = run_script("gpu_smoke", "--out", str(tmp_path), *(["--skip", *skip] if skip else []), cwd=tmp_path)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "gpu_smoke: OK" in proc.stdout


@pytest.mark.gpu
@pytest.mark.slow
@NEEDS_CUDA
def test_gpu_bench_reports_mfu(tmp_path):
    out = tmp_path / "gpu_bench.json"
    proc = run_script(
        "gpu_bench",
        "--steps",
        "8",
        "--batch-size",
        "4",
        "--max-length",
        "512",
        "--json",
        str(out),
        cwd=SCRIPTS.parent,
    )
    print(proc.stdout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(out.read_text())
    assert set(results) == {"padded eager", "padded compiled", "packed eager", "packed compiled"}
    for r in results.values():
        assert 0 < r["throughput/mfu"] < 1
    # packing removes the padding a padded batch carries
    assert (
        results["packed eager"]["throughput/padding_share"]
        < results["padded eager"]["throughput/padding_share"]
    )


def _has_deepspeed() -> bool:
    from lightning.fabric.strategies.deepspeed import _DEEPSPEED_AVAILABLE

    return bool(_DEEPSPEED_AVAILABLE)
