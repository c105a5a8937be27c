"""``strategy=fsdp`` (FSDP2) through the Hydra CLI on 2 real gloo CPU ranks: the same run as one process.

Rank r of 2 reads rows r, r+2, ... of the one global order, so 2 ranks x micro-batch 2 see at each step the
rows that 1 process x micro-batch 4 sees. Accumulation 2, so the windows' first backward runs without gradient
sync. SGD (AdamW's first step divides by a near-zero second moment: its sign flips on last-bit differences)
and one thread per process (a thread count sums a matmul in another order).

What is compared with the 1-process run, from one run each:

- every logged ``train/loss`` and the ``val/loss`` at step 3 (relative 1e-6), and ``grad_norm`` (relative
  5e-5: the fp32 norm over 3.7M gradient entries sums them in another order over two shards; a float64 sum of
  the same gradients put both runs within 2e-5 of it, while a norm of one rank's shard only would be ~30%
  off);
- the final weights of the HF export (max abs difference <= 1e-5 of the largest weight);
- the same with LoRA (``peft=lora``, the adapter's weights in the export), and its merged export
  (``export.merge_adapters=true``, run with HF's ``shard_grad_op``: ``reshard_after_forward=false``, and
  without activation checkpointing) against the 1-process adapter merged here;
- 2 simulated nodes x 1 rank (``NODE_RANK`` / ``MASTER_ADDR``, see ``test_multinode.py``) against 1 node x 2
  ranks: the same losses and weights.
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
    "trainer.max_steps=3",
    "trainer.limit_val_batches=1",
    "trainer.val_check_interval=3",
    "trainer.log_every_n_steps=1",
    "trainer.enable_progress_bar=false",
    "trainer.enable_model_summary=false",
    "data.shuffle=false",
    "data.gradient_accumulation_steps=2",
    "scheduler.warmup_steps=0",
    "optim=sgd",
    "optim.lr=0.1",
)
# one validation batch at step 3: the same 4 rows on 2 ranks x 2 as on 1 process x 4
FSDP = ("strategy=fsdp", "data.per_device_train_batch_size=2", "data.per_device_eval_batch_size=2")
SINGLE = ("trainer.devices=1", "data.per_device_train_batch_size=4", "data.per_device_eval_batch_size=4")
LORA = ("peft=lora", "peft.lora_dropout=0")
LAUNCH_VARS = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "LOCAL_RANK", "RANK", "WORLD_SIZE", "GROUP_RANK")


def clean_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in LAUNCH_VARS and not k.startswith(("SLURM_", "TORCHELASTIC_", "PET_"))
    }
    return {**env, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", **extra}


def start(run, *overrides: str, **env: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "hf_lightning.train", *COMMON, *overrides, f"hydra.run.dir={run}"]
    return subprocess.Popen(
        cmd, env=clean_env(**env), cwd=run.parent, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def finish(*procs: subprocess.Popen) -> list[str]:
    logs = []
    for proc in procs:
        try:
            _, stderr = proc.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
        assert proc.returncode == 0, stderr[-3000:]
        logs.append(stderr)
    return logs


def logged(run, key: str) -> dict[int, float]:
    with open(run / "metrics.csv") as fh:
        return {int(r["step"]): float(r[key]) for r in csv.DictReader(fh) if r.get(key)}


def exported(run) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    name = "adapter_model.safetensors" if (run / "hf_model" / "adapter_model.safetensors").is_file() else None
    return load_file(str(run / "hf_model" / (name or "model.safetensors")))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every run of this file, two at a time (2 cores)."""
    root = tmp_path_factory.mktemp("fsdp2")
    names = ("fsdp", "single", "lora_fsdp", "lora_single", "nodes", "lora_merged")
    dirs = {n: root / n for n in names}
    logs = {}
    logs["fsdp"], logs["single"] = finish(
        start(dirs["fsdp"], *FSDP, "trainer.devices=2"), start(dirs["single"], *SINGLE)
    )
    logs["lora_fsdp"], logs["lora_single"] = finish(
        start(dirs["lora_fsdp"], *FSDP, *LORA, "trainer.devices=2"),
        start(dirs["lora_single"], *SINGLE, *LORA),
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    nodes = [
        start(
            dirs["nodes"],
            *FSDP,
            "trainer.devices=1",
            "trainer.num_nodes=2",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=port,
            NODE_RANK=str(r),
        )
        for r in (0, 1)
    ]
    # HF's shard_grad_op (gathered block weights kept until backward), no activation checkpointing
    merged = start(
        dirs["lora_merged"],
        *FSDP,
        *LORA,
        "trainer.devices=2",
        "export.merge_adapters=true",
        "trainer.strategy.reshard_after_forward=false",
        "trainer.strategy.activation_checkpointing=false",
    )
    logs["nodes"] = finish(*nodes, merged)[0]
    return dirs, logs


def assert_same_steps(run, reference, grad_norm_rel: float) -> None:
    loss, ref_loss = logged(run, "train/loss"), logged(reference, "train/loss")
    assert sorted(loss) == sorted(ref_loss) == [1, 2, 3]
    for step, value in ref_loss.items():
        assert loss[step] == pytest.approx(value, rel=1e-6, abs=0), step
    norm, ref_norm = logged(run, "grad_norm"), logged(reference, "grad_norm")
    assert sorted(norm) == [1, 2, 3]
    for step, value in ref_norm.items():
        assert norm[step] == pytest.approx(value, rel=grad_norm_rel, abs=0), step
    # the validation at step 3 (the lean loss's evaluation path on the sharded model)
    assert logged(run, "val/loss")[3] == pytest.approx(logged(reference, "val/loss")[3], rel=1e-6)


def assert_same_weights(run, reference) -> float:
    weights, ref = exported(run), exported(reference)
    assert weights.keys() == ref.keys()
    largest = max(float(t.abs().max()) for t in ref.values())
    diff = max(float((weights[k] - ref[k]).abs().max()) for k in ref)
    assert diff <= 1e-5 * largest, (diff, largest)
    return diff / largest


def test_fsdp2_two_ranks_equal_one_process(runs):
    dirs, _ = runs
    log = (dirs["fsdp"] / "train.log").read_text()
    assert "FSDP2: 2 ranks, one fully_shard unit per LlamaDecoderLayer block plus model (the rest)" in log
    assert "lean loss: on" in log and "full logits" not in log  # the lean loss ran on the sharded model
    assert_same_steps(dirs["fsdp"], dirs["single"], grad_norm_rel=5e-5)
    print(f"fsdp2 vs 1 process: weights within {assert_same_weights(dirs['fsdp'], dirs['single']):.1e}")


def test_fsdp2_lora_two_ranks_equal_one_process(runs):
    dirs, _ = runs
    assert_same_steps(dirs["lora_fsdp"], dirs["lora_single"], grad_norm_rel=5e-5)
    weights = exported(dirs["lora_fsdp"])
    assert weights and all("lora_" in k for k in weights)  # the adapter, not the base model
    print(f"lora: weights within {assert_same_weights(dirs['lora_fsdp'], dirs['lora_single']):.1e}")


def test_fsdp2_two_nodes_equal_one_node(runs):
    dirs, _ = runs
    assert (dirs["nodes"] / "train_node_1.log").read_text().count(" - done: ") == 1
    assert_same_steps(dirs["nodes"], dirs["fsdp"], grad_norm_rel=1e-6)
    assert_same_weights(dirs["nodes"], dirs["fsdp"])


def test_fsdp2_lora_merged_export_equals_the_merged_one_process_adapter(runs, tmp_path):
    from peft import AutoPeftModelForCausalLM

    dirs, _ = runs
    reference = AutoPeftModelForCausalLM.from_pretrained(str(dirs["lora_single"] / "hf_model"))
    reference.merge_and_unload().save_pretrained(str(tmp_path / "hf_model"))
    assert not (dirs["lora_merged"] / "hf_model" / "adapter_model.safetensors").exists()
    log = (dirs["lora_merged"] / "train.log").read_text()
    assert "reshard_after_forward=False, activation_checkpointing=False" in log
    print(f"lora merged: weights within {assert_same_weights(dirs['lora_merged'], tmp_path):.1e}")
