"""DDP through the Hydra CLI: two real gloo processes, one run folder, and the same losses as one process with
twice the micro-batch."""

from __future__ import annotations

import csv
import os
import subprocess

import pytest

from tests.fork_server import run_module

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

COMMON = (
    "+experiment=sft",
    "trainer.max_steps=3",
    "trainer.limit_val_batches=0",
    "trainer.log_every_n_steps=1",
    "trainer.enable_progress_bar=false",
    "trainer.enable_model_summary=false",
    "data.shuffle=false",
    "scheduler.warmup_steps=0",
    "optim.lr=1e-3",
)


def run_cli(*args: str, cwd) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("LOCAL_RANK", None)
    return run_module("hf_lightning.train", args, env=env, cwd=cwd, timeout=600)


def logged(run_dir, key):
    with open(run_dir / "metrics.csv") as fh:
        return {int(r["step"]): float(r[key]) for r in csv.DictReader(fh) if r.get(key)}


def test_two_process_ddp_equals_one_process_with_twice_the_micro_batch(tmp_path):
    from tests.data_support import write_chats

    ddp_cwd, single_dir = tmp_path / "ddp", tmp_path / "single"
    ddp_cwd.mkdir()
    write_chats(tmp_path, 5)  # the test stage: 5 conversations, 3 on one rank and 2 on the other
    test_path = f"data.test_path={tmp_path / 'chats.jsonl'}"
    # no hydra.run.dir: the default outputs/<date>/<time> must be resolved once and shared by both ranks
    ddp = run_cli(
        *COMMON,
        "trainer.accelerator=cpu",
        "trainer.devices=2",
        "strategy=ddp",
        "data.per_device_train_batch_size=2",
        test_path,
        cwd=ddp_cwd,
    )
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    single = run_cli(
        *COMMON,
        "data.per_device_train_batch_size=4",
        f"hydra.run.dir={single_dir}",
        test_path,
        cwd=tmp_path,
    )
    assert single.returncode == 0, single.stderr[-3000:]

    runs = [p for p in (ddp_cwd / "outputs").glob("*/*") if p.is_dir()]
    assert len(runs) == 1, runs  # one run folder, not one per rank
    run = runs[0]
    assert (run / ".hydra" / "config.yaml").is_file()
    assert (run / "train_ddp_process_1.log").is_file()  # rank 1 ran, and logged into rank 0's folder
    assert (run / "checkpoints" / "last.ckpt").is_file() and (
        run / "hf_model" / "model.safetensors"
    ).is_file()

    # rank r takes rows r, r+2, ... of the same order: step k of 2 ranks x 2 rows is step k of 1 rank x 4 rows
    ddp_loss, single_loss = logged(run, "train/loss"), logged(single_dir, "train/loss")
    assert sorted(ddp_loss) == sorted(single_loss) == [1, 2, 3]
    for step in (1, 2, 3):
        assert ddp_loss[step] == pytest.approx(single_loss[step], rel=1e-5, abs=0)
    ddp_norm, single_norm = logged(run, "grad_norm"), logged(single_dir, "grad_norm")
    for step in (1, 2, 3):
        assert ddp_norm[step] == pytest.approx(single_norm[step], rel=1e-5)
    # the test stage after training: every test example once over both ranks, reduced once
    (ddp_test,) = logged(run, "test/loss").values()
    (single_test,) = logged(single_dir, "test/loss").values()
    assert ddp_test == pytest.approx(single_test, rel=1e-5)
