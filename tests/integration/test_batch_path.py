"""The files a batch passes through from ``data.path`` to ``backward``
(``scripts/trace_batch_path.py``, which runs a real one-step training under the profiler) stay at most 12,
8 of them in ``data/``, for the default layout (packed per batch) and the padded one. The trace must see the
loss files (the lean loss of a 50,257-token head included) and a collator, so an empty or broken trace cannot
pass."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("layout", ["auto", "null"])
def test_a_batch_passes_through_at_most_twelve_files(shared_data, tmp_path, layout):
    out = tmp_path / "trace.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "trace_batch_path.py"),
            "--json",
            str(out),
            "+experiment=clm",
            f"data.path={Path(shared_data) / 'c4-demo' / 'c4_demo.jsonl'}",
            "data.max_length=128",
            f"data.layout={layout}",
            "trainer.max_steps=1",
            "trainer.limit_val_batches=0",
            "trainer.enable_progress_bar=false",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    trace = json.loads(out.read_text())
    files = trace["files"]
    assert trace["reached_backward"]
    loss = {"module/loss.py", "module/lean_loss.py", "module/linear_cross_entropy.py"}
    assert {"data/collators.py", "data/sampling.py", *loss} <= set(files), sorted(files)
    assert len(files) <= 12, sorted(files)
    assert len([f for f in files if f.startswith("data/")]) <= 8, sorted(files)
