"""DeepSpeed ZeRO-2 and ZeRO-3 for real on 2 gloo CPU ranks (DeepSpeed's CPU accelerator), against 1 process.

- Through the command line (``strategy=deepspeed_zero2`` / ``deepspeed_zero3``, 2 ranks x 2 rows) and one
  process without DeepSpeed (4 rows), the same global batch, accumulation 2, SGD: every per-step
  ``train/loss`` and ``grad_norm`` (the engine's, before its clipping) equal to float32 rounding, and the
  exported ``hf_model/`` weights within 1e-5 of the largest weight. The checkpoint folder holds one
  optimizer-state shard per rank (ZeRO-3: one parameter shard per rank too), so the engine did partition.
- Through Lightning (``tests/parity/deepspeed_worker.py``): 2 ranks killed (SIGKILL on each) after step 3 and
  resumed from the DeepSpeed checkpoint of step 2 end with the weights of the run that never stopped, bit for
  bit.

Needs the ``deepspeed`` package (``pip install 'hf_lightning[deepspeed]'``). Its first process group on a
machine compiles DeepSpeed's shared-memory op (``deepspeed_shm_comm``, C++, about 2 minutes on 2 cores) into
``~/.cache/torch_extensions``; later runs load it.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("deepspeed")

pytestmark = [pytest.mark.slow, pytest.mark.distributed, pytest.mark.heavy]

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "parity" / "deepspeed_worker.py"
COMMON = (
    "+experiment=sft",
    "trainer.accelerator=cpu",
    "trainer.max_steps=3",
    "trainer.limit_val_batches=0",
    "trainer.log_every_n_steps=1",
    "trainer.enable_progress_bar=false",
    "trainer.enable_model_summary=false",
    "data.shuffle=false",
    "data.gradient_accumulation_steps=2",
    "scheduler.warmup_steps=0",
    # SGD: AdamW's first update is the sign of the gradient, which float32 rounding flips where a gradient is
    # near zero; SGD's update is proportional to the gradient
    "optim.name=sgd",
    "optim.lr=0.5",
)


def env() -> dict[str, str]:
    out = {**os.environ, "HF_HUB_OFFLINE": "1", "DS_ACCELERATOR": "cpu"}
    out["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    for key in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        out.pop(key, None)
    return out


def train(run_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hf_lightning.train", *COMMON, f"hydra.run.dir={run_dir}", *overrides],
        capture_output=True,
        text=True,
        timeout=900,
        env=env(),
        cwd=run_dir.parent,
    )


def losses(run_dir: Path) -> dict[int, float]:
    with open(run_dir / "metrics.csv") as fh:
        return {int(r["step"]): float(r["train/loss"]) for r in csv.DictReader(fh) if r.get("train/loss")}


def grad_norms(run_dir: Path) -> dict[int, float]:
    with open(run_dir / "metrics.csv") as fh:
        return {int(r["step"]): float(r["grad_norm"]) for r in csv.DictReader(fh) if r.get("grad_norm")}


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(run_dir / "hf_model" / "model.safetensors")


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("one") / "run"
    proc = train(run, "data.per_device_train_batch_size=4")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run


@pytest.mark.parametrize("stage", [2, 3])
def test_two_ranks_of_zero_equal_one_process(stage, one_process, tmp_path):
    run = tmp_path / "run"
    proc = train(
        run, f"strategy=deepspeed_zero{stage}", "trainer.devices=2", "data.per_device_train_batch_size=2"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]

    ours, reference = losses(run), losses(one_process)
    assert sorted(ours) == sorted(reference) == [1, 2, 3]
    assert reference[3] < reference[1] - 0.1  # the updates moved the weights: equal losses say something
    assert ours == pytest.approx(reference, rel=1e-6, abs=0)
    # the engine's gradient norm (before its clipping) is the one process's torch norm of the same gradients,
    # to float32 rounding of DeepSpeed's own sum of squares over its flat, rank-averaged gradient buffers
    # (3e-5 relative seen; the steps' norms differ by far more)
    norms = grad_norms(one_process)
    assert sorted(norms) == [1, 2, 3]
    assert grad_norms(run) == pytest.approx(norms, rel=1e-4, abs=0)
    a, b = weights(run), weights(one_process)
    assert a.keys() == b.keys()
    largest = max(float(t.abs().max()) for t in b.values())
    diff = max(float((a[k].float() - b[k].float()).abs().max()) for k in b)
    assert diff <= 1e-5 * largest, (diff, largest)

    shards = sorted(p.name for p in (run / "checkpoints" / "last.ckpt" / "checkpoint").iterdir())
    assert [s for s in shards if s.endswith("optim_states.pt")] == [
        "zero_pp_rank_0_mp_rank_00_optim_states.pt",
        "zero_pp_rank_1_mp_rank_00_optim_states.pt",
    ]
    if stage == 3:  # no whole copy of the parameters anywhere: one shard per rank
        assert [s for s in shards if s.endswith("model_states.pt")] == [
            "zero_pp_rank_0_mp_rank_00_model_states.pt",
            "zero_pp_rank_1_mp_rank_00_model_states.pt",
        ]


def worker(out: Path, stage: int, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(WORKER), str(out), str(stage), "2", "4", *args],
        capture_output=True,
        text=True,
        timeout=900,
        env=env(),
        cwd=out.parent,
    )


@pytest.mark.parametrize("stage", [2, 3])
def test_killed_and_resumed_zero_run_equals_the_straight_run(stage, tmp_path):
    straight = worker(tmp_path / "straight.pt", stage)
    assert straight.returncode == 0, straight.stderr[-3000:]

    checkpoints = tmp_path / "checkpoints"
    killed = worker(
        tmp_path / "killed.pt", stage, "--save-every", "2", "--dirpath", str(checkpoints), "--kill-after", "3"
    )
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert not (tmp_path / "killed.pt").exists()
    assert sorted(os.listdir(checkpoints)) == ["step=2.ckpt"]

    resumed = worker(tmp_path / "resumed.pt", stage, "--resume", str(checkpoints / "step=2.ckpt"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    a, b = torch.load(tmp_path / "straight.pt"), torch.load(tmp_path / "resumed.pt")
    assert a["global_step"] == b["global_step"] == 4
    assert a["weights"].keys() == b["weights"].keys()
    for name, tensor in a["weights"].items():
        assert torch.equal(tensor, b["weights"][name]), name
