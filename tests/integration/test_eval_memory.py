"""Evaluation memory is flat in the evaluation-set size on the default path (peak RSS in a fresh process).

The probe lives in ``scripts/bench_eval_memory.py`` (benchmark 4); each measurement runs it as a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_eval_memory.py"


def peak_rss(n: int, mode: str) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--probe", str(n), mode],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_peak_rss_is_flat_when_the_eval_set_grows_10x():
    small, large = peak_rss(40, "default"), peak_rss(400, "default")
    assert large["peak_kib"] < 1.05 * small["peak_kib"], (small, large)
    # control: an HF-style compute_metrics without preprocessing keeps every logit (400x64x8000x4 B = 819 MB)
    keep = peak_rss(400, "keep")
    assert keep["peak_kib"] - large["peak_kib"] > 500 * 1024, (large, keep)
