"""``eval_steps``, ``save_steps``, ``logging_steps`` as a user runs them.

10 training rows, micro-batch 2, accumulation 2: 5 micro-batches per epoch, so 3 optimizer steps per epoch
(the last window a single micro-batch); 8 steps in all. HF's rule (``DefaultFlowCallback``): evaluations at 2,
4, 6 and 8, saves at 4 and 8, log rows at 3 and 6 (plus our tail row at the final step 8, where HF logs its
run summary). The old mapping ``trainer.val_check_interval=4 trainer.check_val_every_n_epoch=null``
(``eval_steps x K`` micro-batches) validated at steps 2, 4 (after micro-batch 8, inside step 5's window), 7
and the final 8 (measured on main before this change).
"""

from __future__ import annotations

import json
from itertools import islice

import pytest
import torch

from tests.integration.test_cli import read_metrics, run_cli

pytestmark = pytest.mark.slow


@pytest.fixture
def files(tmp_path, shared_data):
    with open(f"{shared_data}/c4-demo/c4_demo.jsonl") as fh:
        rows = [json.loads(line)["text"] for line in islice(fh, 10)]
    # validation on 4 of the rows it trains on: its loss falls with every step, which the best-model
    # assertions read (on 4 other rows, this 8-step run's validation loss is noise around ln(vocabulary))
    for name, part in (("train", rows[:10]), ("val", rows[:4])):
        with open(tmp_path / f"{name}.jsonl", "w") as fh:
            fh.writelines(json.dumps({"text": t}) + "\n" for t in part)
    return tmp_path / "train.jsonl", tmp_path / "val.jsonl"


def common(files, run_dir):
    train, val = files
    return (
        "+experiment=clm",
        f"data.path={train}",
        f"data.validation_path={val}",
        "data.shuffle=false",
        "data.max_length=32",
        "data.per_device_train_batch_size=2",
        "data.gradient_accumulation_steps=2",
        "trainer.max_steps=8",
        "trainer.enable_progress_bar=false",
        "callbacks.model_checkpoint.save_top_k=-1",
        f"hydra.run.dir={run_dir}",
    )


def test_steps_are_optimizer_steps_over_the_whole_run(files, tmp_path):
    run_dir = tmp_path / "run"
    proc = run_cli(
        *common(files, run_dir),
        "eval_steps=2",
        "save_steps=4",
        "logging_steps=3",
        "metric_for_best_model=loss",
        "greater_is_better=true",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_metrics(run_dir)
    val = {int(r["step"]): float(r["val/loss"]) for r in rows if r.get("val/loss")}
    assert list(val) == [2, 4, 6, 8]
    # without load_best_model_at_end, best.ckpt is the best of every validation, mid-epoch ones included (the
    # highest loss here, the first validation's: Lightning's epoch-end rule would have considered 6 and 8
    # only)
    best = torch.load(run_dir / "checkpoints" / "best.ckpt", map_location="cpu", weights_only=False)
    assert best["global_step"] == max(val, key=val.get) == 2
    # ckpt_path=best names that checkpoint, the one metrics.csv's val/loss ranks first
    from hf_lightning.checkpointing.resume import resolve_ckpt_path

    assert resolve_ckpt_path("best", str(run_dir), purpose="evaluate") == str(
        run_dir / "checkpoints" / "best.ckpt"
    )
    assert [int(r["step"]) for r in rows if r.get("train/loss")] == [3, 6, 8]
    saved = sorted(p.name for p in (run_dir / "checkpoints").glob("step*.ckpt"))
    assert saved == ["step000004.ckpt", "step000008.ckpt"]
    assert (
        "HF step schedule over 8 optimizer steps: eval every 2 steps and at the last"
        in proc.stderr + proc.stdout
    )


def test_an_hf_key_with_the_lightning_knob_it_replaces_is_one_line(files, tmp_path):
    run_dir = tmp_path / "run"
    proc = run_cli(*common(files, run_dir), "eval_steps=2", "trainer.val_check_interval=4")
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("hf_lightning: error:")]
    assert errors == [
        "hf_lightning: error: eval_steps=2 and trainer.val_check_interval are both given: eval_steps counts "
        "optimizer steps over the whole run (HF's semantics) and replaces trainer.val_check_interval; drop "
        "one"
    ]
    assert "Traceback" not in proc.stderr


@pytest.mark.distributed
def test_two_ddp_ranks_keep_hf_steps_and_the_best_model(files, tmp_path):
    """2 gloo ranks x micro-batch 1 = the single-process batch of 2: the same 3 steps per epoch, so the same
    evaluation, save and log steps, and ``hf_model/`` holds ``best.ckpt``'s weights."""
    from safetensors.torch import load_file

    run_dir = tmp_path / "ddp"
    args = [w for w in common(files, run_dir) if not w.startswith("data.per_device_train_batch_size")]
    proc = run_cli(
        *args,
        "data.per_device_train_batch_size=1",
        "trainer.devices=2",
        "strategy=ddp",
        "eval_steps=2",
        "save_steps=4",
        "logging_steps=3",
        "load_best_model_at_end=true",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_metrics(run_dir)
    assert [int(r["step"]) for r in rows if r.get("val/loss")] == [2, 4, 6, 8]
    assert [int(r["step"]) for r in rows if r.get("train/loss")] == [3, 6, 8]
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("step*.ckpt")) == [
        "step000004.ckpt",
        "step000008.ckpt",
    ]
    best = torch.load(run_dir / "checkpoints" / "best.ckpt", map_location="cpu", weights_only=False)
    exported = load_file(str(run_dir / "hf_model" / "model.safetensors"))
    for name, tensor in exported.items():
        torch.testing.assert_close(tensor, best["state_dict"][f"model.{name}"], rtol=0, atol=0, msg=name)
