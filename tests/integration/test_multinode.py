"""Several machines, simulated on 127.0.0.1: 2 "nodes" x 1 process give what 1 node x 2 processes gives.

Each "node" is its own ``python -m hf_lightning.train`` process, started by the test as a cluster launcher
would start it, with ``trainer.num_nodes=2 trainer.devices=1 strategy=ddp`` and one shared ``hydra.run.dir``:

- Lightning's own environment variables (``MASTER_ADDR``, ``MASTER_PORT``, ``NODE_RANK``): what a user sets by
  hand on each machine (Lightning's ``LightningEnvironment``);
- a SLURM allocation (``SLURM_NTASKS``, ``SLURM_PROCID``, ``SLURM_NODEID``, ``SLURM_LOCALID``,
  ``SLURM_NTASKS_PER_NODE``, ``SLURM_NNODES``, ``SLURM_JOB_ID``, ``SLURM_JOB_NAME``, ``SLURM_NODELIST``): what
  ``srun`` sets in each task (Lightning's ``SLURMEnvironment``, which then launches nothing itself);
- ``torchrun --nnodes 2 --node-rank 0|1`` with a c10d rendezvous on 127.0.0.1 (``TorchElasticEnvironment``).

The reference is the same command with ``trainer.devices=2`` on one node (Lightning starts the second
process). Both are gloo DDP with world size 2, so rank r reads the same rows and every logged loss and final
weight must be equal up to the last bits of fp32 (relative 1e-6; a wrong rank or world size changes the data
each rank sees).
"""

from __future__ import annotations

import csv
import os
import socket
import subprocess
import sys

import pytest
import torch

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

COMMON = (
    "+experiment=sft",
    "trainer.accelerator=cpu",
    "strategy=ddp",
    "trainer.max_steps=3",
    "trainer.limit_val_batches=1",
    "trainer.val_check_interval=3",
    "trainer.log_every_n_steps=1",
    "trainer.enable_progress_bar=false",
    "trainer.enable_model_summary=false",
    "data.per_device_train_batch_size=2",
    "data.shuffle=false",
    "scheduler.warmup_steps=0",
    "optim.lr=1e-3",
)
#: launcher variables of the test's own environment (a test run under SLURM or torchrun) are not inherited
LAUNCH_VARS = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "LOCAL_RANK", "RANK", "WORLD_SIZE", "GROUP_RANK")


def clean_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in LAUNCH_VARS and not k.startswith(("SLURM_", "TORCHELASTIC_", "PET_"))
    }
    # one thread per process everywhere: Lightning divides the cores among the processes it finds on a node
    # (2 on one node: 1 thread each; 1 per "node": every core each), and a different thread count sums a
    # matmul in another order, which is not what these tests compare
    return {**env, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", **extra}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train_cmd(*overrides: str) -> list[str]:
    return [sys.executable, "-m", "hf_lightning.train", *COMMON, *overrides]


def run_all(commands: list[tuple[list[str], dict[str, str]]], cwd) -> list[subprocess.CompletedProcess]:
    """Start every command at once (the nodes wait for each other at the rendezvous), then wait for all."""
    procs = [
        subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for cmd, env in commands
    ]
    out = []
    for proc in procs:
        try:
            stdout, stderr = proc.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
        out.append(subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr))
    return out


def logged(run_dir, key: str) -> dict[int, float]:
    with open(run_dir / "metrics.csv") as fh:
        return {int(r["step"]): float(r[key]) for r in csv.DictReader(fh) if r.get(key)}


def final_weights(run_dir) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(run_dir / "hf_model" / "model.safetensors"))


@pytest.fixture(scope="module")
def one_node_two_processes(tmp_path_factory):
    run = tmp_path_factory.mktemp("one_node") / "run"
    (done,) = run_all(
        [(train_cmd("trainer.devices=2", "trainer.num_nodes=1", f"hydra.run.dir={run}"), clean_env())],
        cwd=run.parent,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return run


def assert_same_run(run, reference, other_log: str) -> None:
    assert (run / "checkpoints" / "last.ckpt").is_file()
    # each process logs to its own file, as Lightning's own DDP children do (train_ddp_process_1.log)
    assert (run / "train.log").read_text().count(" - done: ") == 1  # before: both processes wrote here
    assert (run / other_log).read_text().count(" - done: ") == 1
    loss, ref_loss = logged(run, "train/loss"), logged(reference, "train/loss")
    assert sorted(loss) == sorted(ref_loss) == [1, 2, 3]
    for step in ref_loss:
        assert loss[step] == pytest.approx(ref_loss[step], rel=1e-6, abs=0), step
    assert logged(run, "val/loss")[3] == pytest.approx(logged(reference, "val/loss")[3], rel=1e-6)
    weights, ref_weights = final_weights(run), final_weights(reference)
    assert weights.keys() == ref_weights.keys()
    for name, ref in ref_weights.items():
        # last-bit differences only (measured 4e-8 of a tensor's norm: gloo's reduction order between two
        # processes on one node and on two "nodes"); a wrong rank or world size moves the weights by ~1e-2
        assert float((weights[name] - ref).norm() / ref.norm()) < 1e-6, name


def test_two_nodes_by_lightning_environment_variables(one_node_two_processes, tmp_path):
    run, port = tmp_path / "run", str(free_port())
    cmd = train_cmd("trainer.devices=1", "trainer.num_nodes=2", f"hydra.run.dir={run}")
    nodes = run_all(
        [(cmd, clean_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, NODE_RANK=str(r))) for r in (0, 1)],
        cwd=tmp_path,
    )
    for node in nodes:
        assert node.returncode == 0, node.stderr[-3000:]
    assert_same_run(run, one_node_two_processes, "train_node_1.log")


def test_two_nodes_in_a_simulated_slurm_allocation(one_node_two_processes, tmp_path):
    run, port = tmp_path / "run", str(free_port())
    cmd = train_cmd("trainer.devices=1", "trainer.num_nodes=2", f"hydra.run.dir={run}")
    slurm = {
        "SLURM_NTASKS": "2",
        "SLURM_NTASKS_PER_NODE": "1",
        "SLURM_NNODES": "2",
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NAME": "hf_lightning_multinode",
        "SLURM_NODELIST": "127.0.0.1",
        "MASTER_PORT": port,  # SLURMEnvironment derives one from SLURM_JOB_ID otherwise (a fixed port here)
    }
    tasks = [
        (cmd, clean_env(**slurm, SLURM_PROCID=str(r), SLURM_NODEID=str(r), SLURM_LOCALID="0")) for r in (0, 1)
    ]
    nodes = run_all(tasks, cwd=tmp_path)
    for node in nodes:
        assert node.returncode == 0, node.stderr[-3000:]
    # without the SLURM variables both tasks would be node 0, rank 0 and never meet: finishing proves they
    # were read
    assert_same_run(run, one_node_two_processes, "train_rank_1.log")


def test_two_nodes_by_torchrun(one_node_two_processes, tmp_path):
    run, port = tmp_path / "run", free_port()
    nodes = run_all(
        [
            (
                [
                    sys.executable,
                    "-m",
                    "torch.distributed.run",
                    "--nnodes=2",
                    "--nproc-per-node=1",
                    f"--node-rank={r}",
                    "--rdzv-backend=c10d",
                    f"--rdzv-endpoint=127.0.0.1:{port}",
                    "--rdzv-id=hf_lightning_multinode",
                    "-m",
                    "hf_lightning.train",
                    *COMMON,
                    "trainer.devices=1",
                    "trainer.num_nodes=2",
                    f"hydra.run.dir={run}",
                ],
                clean_env(),
            )
            for r in (0, 1)
        ],
        cwd=tmp_path,
    )
    for node in nodes:
        assert node.returncode == 0, node.stderr[-3000:]
    assert_same_run(run, one_node_two_processes, "train_rank_1.log")
