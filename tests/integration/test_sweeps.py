"""Multirun through the CLI: a 2-value sweep with its summary table, an Optuna sweep, and multirun x DDP
refused."""

from __future__ import annotations

import csv
import os
import subprocess

import pytest
import yaml

from tests.fork_server import run_module

pytestmark = pytest.mark.slow

TINY = (
    "trainer.max_steps=1",
    "trainer.limit_val_batches=1",
    "trainer.val_check_interval=1",
    "trainer.enable_progress_bar=false",
    "trainer.enable_model_summary=false",
    "callbacks=none",
    "data.per_device_train_batch_size=4",
    "data.per_device_eval_batch_size=4",
)


def run_cli(*args: str, cwd, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return run_module("hf_lightning.train", args, env=env, cwd=cwd, timeout=timeout)


def val_loss_of(job_dir) -> float:
    """The job's validation loss as its own metrics.csv recorded it (independent of the summary)."""
    with open(job_dir / "metrics.csv") as fh:
        return [float(r["val/loss"]) for r in csv.DictReader(fh) if r.get("val/loss")][-1]


def test_two_value_multirun_writes_the_summary(tmp_path):
    sweep = tmp_path / "sweep"
    proc = run_cli(
        "-m",
        "+experiment=sft",
        "optim.lr=1e-4,3e-3",
        f"hydra.sweep.dir={sweep}",
        *TINY,
        "scheduler.warmup_steps=0",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]

    with open(sweep / "summary.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["job"] for r in rows] == ["0", "1"]
    assert [float(r["optim.lr"]) for r in rows] == [1e-4, 3e-3]  # Hydra writes the parsed float
    assert all(r["status"] == "completed" and r["+experiment"] == "sft" for r in rows)
    for row in rows:
        assert float(row["val/loss"]) == pytest.approx(val_loss_of(sweep / row["job"]), rel=1e-6)
        assert float(row["global_step"]) == 1
    # a larger learning rate moved the weights further: the two jobs really ran with their own settings
    assert float(rows[0]["val/loss"]) != float(rows[1]["val/loss"])
    assert "sweep summary (" in proc.stdout and "optim.lr" in proc.stdout and "0.003" in proc.stdout


def test_optuna_sweep_minimizes_the_returned_metric(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper", reason="the sweep extra is not installed")
    sweep = tmp_path / "sweep"
    proc = run_cli(
        "+experiment=sft",
        "hparams_search=sft_optuna",
        "hydra.sweeper.n_trials=2",
        "hydra.sweeper.sampler.n_startup_trials=2",
        f"hydra.sweep.dir={sweep}",
        *TINY,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(sweep / "summary.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 2 and all(r["status"] == "completed" for r in rows)
    best = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    losses = [val_loss_of(sweep / r["job"]) for r in rows]
    # the sweeper received train's optimized_metric (val/loss) from every trial and kept the smallest
    assert best["best_value"] == pytest.approx(min(losses), rel=1e-6)
    assert set(best["best_params"]) == {"optim.lr", "optim.weight_decay", "scheduler.warmup_steps"}


def test_multirun_with_ddp_is_refused_with_the_launcher_to_use(tmp_path):
    sweep = tmp_path / "sweep"
    proc = run_cli(
        "-m",
        "+experiment=sft",
        "optim.lr=1e-4,3e-4",
        "trainer.devices=2",
        "strategy=ddp",
        f"hydra.sweep.dir={sweep}",
        *TINY,
        cwd=tmp_path,
        timeout=300,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    err = proc.stderr
    assert "hf_lightning: error: multirun (-m) with a 2-process strategy (DDPStrategy)" in err
    assert "hydra/launcher=slurm" in err
    assert not (sweep / "0" / "metrics.csv").exists() and not (sweep / "1").exists()
