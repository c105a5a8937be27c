"""Two gloo ranks through the CLI: the decisions the ranks share are rank 0's, and a rank that vanishes leaves
the survivor with one line of ours.

The job is ``test_resume.py``'s (40 text rows, micro-batches of 2, a 2-layer model), on 2 CPU ranks with
Lightning's DDP launcher, which re-runs the command line for rank 1 after rank 0 has rewritten
``.hydra/config.yaml``. Every command has a time bound: a deadlock fails the test instead of hanging it.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.integration.test_resume import SMALL_MODEL, text_file, train_rows, weights  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

REPO = str(Path(__file__).resolve().parents[2])
TIMEOUT = 240  # seconds per command; a rank waiting for one that left would wait for ever

TWO_RANKS = ("trainer.accelerator=cpu", "trainer.devices=2", "strategy=ddp")


def train(run_dir, data, *overrides) -> subprocess.CompletedProcess:
    """``python -m hf_lightning.train`` on the test job; the process group (both ranks) is killed when it
    outlives :data:`TIMEOUT`."""
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    for key in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "NODE_RANK", "HF_LIGHTNING_RUN_DECISION"):
        env.pop(key, None)
    args = [
        "+experiment=clm",
        f"data.path={data}",
        f"hydra.run.dir={run_dir}",
        "trainer.log_every_n_steps=1",
        "trainer.limit_val_batches=0",
        "trainer.enable_progress_bar=false",
        "callbacks.model_checkpoint.every_n_train_steps=null",
        "data.per_device_train_batch_size=2",
        "data.max_length=32",
        "data.validation_split=0",
        *SMALL_MODEL,
        *TWO_RANKS,
        *overrides,
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "hf_lightning.train", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"no end within {TIMEOUT} s (a rank waits for another): {err[-3000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def folder_hashes(run_dir: Path) -> dict[str, str]:
    """SHA-256 of every file under ``run_dir`` but the owner locks (whose record is the PID of the process
    that holds the folder, whatever it writes)."""
    return {
        str(p.relative_to(run_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(run_dir.rglob("*"))
        if p.is_file() and p.name != ".hf_lightning.lock"
    }


@pytest.fixture(scope="module")
def straight4(text_file, tmp_path_factory):  # noqa: F811
    """4 optimizer steps on 2 ranks without a stop."""
    folder = tmp_path_factory.mktemp("straight4") / "run"
    proc = train(folder, text_file, "trainer.max_steps=4")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return folder


def test_a_finished_two_rank_run_continues_with_a_larger_max_steps(text_file, straight4, tmp_path):  # noqa: F811
    """The run ends at step 2 (finished: hf_model/, final_metrics.json), is continued to step 4 with
    ``ckpt_path=last``, and ends where the run that never stopped ends; then ``trainer.max_steps=1``, below
    the checkpoint's step, is refused in one line and leaves the folder byte for byte as it was."""
    folder = tmp_path / "run"
    first = train(folder, text_file, "trainer.max_steps=2")
    assert first.returncode == 0, first.stderr[-3000:]
    assert (folder / "final_metrics.json").is_file()

    proc = train(folder, text_file, "trainer.max_steps=4", "ckpt_path=last")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert torch.load(folder / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 4
    a, b = weights(straight4), weights(folder)
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key  # bit-identical to the straight run
    assert sorted(step for step, _ in train_rows(folder)) == [1, 2, 3, 4]
    # rank 1 took rank 0's decision: it says nothing of its own about the resume
    assert proc.stderr.count("resuming from") == 1, proc.stderr[-3000:]

    before = folder_hashes(folder)
    below = train(folder, text_file, "trainer.max_steps=1", "ckpt_path=last")
    assert below.returncode == 2, below.stderr[-3000:]
    assert "Traceback" not in below.stderr
    last = below.stderr.strip().splitlines()[-1]
    ckpt = folder / "checkpoints" / "last.ckpt"
    assert last == (
        f"hf_lightning: error: trainer.max_steps=1 is below optimizer step 4 of {ckpt}, "
        "where this resume would start: there is nothing to train below the checkpoint's step. Give "
        "trainer.max_steps=5 or more to continue the run (the run folder is unchanged)"
    )
    assert folder_hashes(folder) == before


def test_a_rank_that_vanishes_leaves_the_survivor_with_one_line(text_file, tmp_path):  # noqa: F811
    """Rank 1 ends at once after step 2 (``os._exit``); rank 0's next collective fails in gloo. Its last line
    names rank 1, says the folder is intact and gives the command that resumes; exit status 2."""
    folder = tmp_path / "run"
    proc = train(
        folder,
        text_file,
        "trainer.max_steps=6",
        "callbacks.model_checkpoint.every_n_train_steps=1",
        "+callbacks.vanish._target_=tests.resume_support.ExitAtStep",
        "+callbacks.vanish.step=2",
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("hf_lightning: error: rank 1 stopped during training at optimizer step "), last
    assert f"the run folder {folder} is intact" in last
    assert last.endswith(f"ckpt_path=last hydra.run.dir={folder}"), last
    assert "python -m hf_lightning.train +experiment=clm" in last
    assert "Traceback" not in proc.stderr and "GLHF" not in proc.stderr, proc.stderr[-3000:]
    step1 = torch.load(folder / "checkpoints" / "step000001.ckpt", weights_only=False)
    assert step1["global_step"] == 1  # written before the rank stopped, and whole
