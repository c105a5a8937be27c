"""The non-finite guard under FSDP2 (``strategy=fsdp``, two gloo processes), whose weights and gradients are
``DTensor`` shards (``fsdp2_guard_worker.py``): the guard sees the global state, not its rank's shard.

- An inf written into rank 1's shard of one weight after step 2 (rank 0's shard of it finite): both ranks stop
  with the same ``TrainingError``, naming that tensor.
- A LightningModule of one's own (the guard computes the gradient norm itself): the norm it reads is the norm
  of the whole gradients (gathered, summed in float64), not a shard's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

WORKER = Path(__file__).resolve().parent / "fsdp2_guard_worker.py"
REPO = WORKER.parents[2]


def run_worker(outdir: Path, kind: str) -> list[dict]:
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "NODE_RANK")},
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
    }
    proc = subprocess.run(
        [sys.executable, str(WORKER), str(outdir), kind],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=outdir,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads((outdir / f"rank{r}.json").read_text()) for r in (0, 1)]


def test_an_inf_in_one_ranks_shard_stops_every_rank_naming_the_tensor(tmp_path):
    ranks = run_worker(tmp_path, "weights")
    for rank in ranks:
        assert rank["step"] == 2
        assert rank["error"].startswith(
            "optimizer step 2 (epoch 0): the update made 1 of 21 weight tensors, e.g. "
            "['model.model.layers.1.mlp.down_proj.weight'] non-finite (NaN/inf)"
        ), rank["error"]


def test_the_guards_gradient_norm_is_the_whole_gradients_norm(tmp_path):
    ranks = run_worker(tmp_path, "own")
    for rank in ranks:
        assert rank["error"] is None and rank["step"] == 3
        assert len(rank["guard"]) == len(rank["whole"]) == 3
        assert rank["guard"] == pytest.approx(rank["whole"], rel=1e-6)
