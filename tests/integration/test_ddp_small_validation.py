"""DDP with fewer validation rows than ranks, or unequal shares: two real gloo processes.

Before: 8 rows, the default 5% hold-out (1 validation row) and 2 ranks died in Lightning with
"`EpochDataLoader` within local rank has zero length" and a traceback per rank (exit 1). Now the empty rank
evaluates one placeholder (a masked copy that adds nothing) and ``val/loss`` equals the one-process value,
which is the oracle here: one process with twice the micro-batch trains on the same rows and validates the
same held-out rows.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import pytest

from tests.fork_server import run_module

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

TEXTS = [
    "the cat sat on the mat and looked at the door",
    "a dog ran in the park after a red ball",
    "rain fell on the old roof all night long",
    "she read a book by the window in the morning",
    "the train left the station at noon on monday",
    "we had soup and bread for dinner last night",
    "birds sang in the tall trees near the river",
    "he fixed the bike and rode it to school",
]

COMMON = (
    "+experiment=clm",
    "trainer.max_steps=2",
    "trainer.log_every_n_steps=1",
    "trainer.num_sanity_val_steps=2",
    "trainer.enable_progress_bar=false",
    "trainer.enable_model_summary=false",
    "scheduler.warmup_steps=0",
    "optim.lr=1e-3",
    "data.max_length=32",
)


def run_cli(*args: str, cwd) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("LOCAL_RANK", None)
    return run_module("hf_lightning.train", args, env=env, cwd=cwd, timeout=600)


def val_losses(run_dir) -> dict[int, float]:
    with open(run_dir / "metrics.csv") as fh:
        return {int(r["step"]): float(r["val/loss"]) for r in csv.DictReader(fh) if r.get("val/loss")}


@pytest.mark.parametrize(
    "split,eval_batch,n_val",
    [(0.05, 8, 1), (0.3, 1, 3)],  # 1 row for 2 ranks; 3 rows as 2 + 1, one batch each vs two batches
    ids=["one-validation-row", "three-rows-unequal-shares"],
)
def test_two_ranks_validate_like_one_process(tmp_path, request, split, eval_batch, n_val):
    data = tmp_path / "eight.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    args = (
        *COMMON,
        f"data.path={data}",
        f"data.validation_split={split}",
        f"data.per_device_eval_batch_size={eval_batch}",
    )
    root = request.config.rootpath
    ddp_dir, single_dir = tmp_path / "ddp", tmp_path / "single"
    ddp = run_cli(
        *args,
        "trainer.accelerator=cpu",
        "trainer.devices=2",
        "strategy=ddp",
        "data.per_device_train_batch_size=2",
        f"hydra.run.dir={ddp_dir}",
        cwd=root,
    )
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    assert "Traceback" not in ddp.stderr
    single = run_cli(*args, "data.per_device_train_batch_size=4", f"hydra.run.dir={single_dir}", cwd=root)
    assert single.returncode == 0, single.stderr[-3000:]
    assert f"held out {n_val} of 8 rows for validation" in (single_dir / "train.log").read_text()

    ddp_val, single_val = val_losses(ddp_dir), val_losses(single_dir)
    assert sorted(ddp_val) == sorted(single_val) == [2]
    assert ddp_val[2] == pytest.approx(single_val[2], rel=1e-5, abs=0)


# ------------------------------------------------------------------ validate / test / predict (Python API)
SCRIPT = r"""
import json, sys
import datasets, lightning as L
from hf_lightning import HFDataModule, HFLightningModule
from tests.data_support import PadOnly
from tests.unit.test_evaluation import ROWS
from tests.unit.test_loss_exactness import TableLM

def compute_metrics(p):
    # the row count and, from each row's first target, the order of the rows
    return {"n": float(len(p.predictions)), "order": float(int("".join(str(int(r[r != -100][0]) + 1) for r in p.label_ids)))}

if __name__ == "__main__":
    devices, out = int(sys.argv[1]), sys.argv[2]
    trainer = L.Trainer(accelerator="cpu", devices=devices, strategy="ddp" if devices > 1 else "auto", logger=False,
                        enable_progress_bar=False, enable_model_summary=False, use_distributed_sampler=False)
    results = {}
    for n_val in (1, 3):
        val = datasets.Dataset.from_list(ROWS[:n_val])
        dm = HFDataModule(PadOnly(), path=datasets.Dataset.from_list(ROWS), validation_path=val,
                          per_device_eval_batch_size=1)
        module = HFLightningModule(TableLM(), compute_metrics=compute_metrics)
        validated = trainer.validate(module, datamodule=dm, verbose=False)
        tested = trainer.test(module, dataloaders=dm.val_dataloader(), verbose=False)
        predicted = trainer.predict(module, dataloaders=dm.predict_dataloader())
        results[n_val] = {"validate": validated, "test": tested, "predict": [r for b in predicted for r in b]}
    json.dump(results, open(f"{out}.{trainer.global_rank}.json", "w"))
"""


def run_script(tmp_path, root, devices: int) -> list[dict]:
    script = tmp_path / "small_eval.py"
    script.write_text(SCRIPT)
    out = tmp_path / f"out{devices}"
    env = {**os.environ, "PYTHONPATH": str(root), "HF_HUB_OFFLINE": "1"}
    env.pop("LOCAL_RANK", None)
    proc = subprocess.run(
        [sys.executable, str(script), str(devices), str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads((tmp_path / f"{out.name}.{rank}.json").read_text()) for rank in range(devices)]


def test_validate_test_and_predict_on_two_ranks_with_few_rows(tmp_path, request):
    """1 row (rank 1 empty) and 3 rows (2 + 1) of the evaluation set, one example per batch."""
    (single,) = run_script(tmp_path, request.config.rootpath, 1)
    ranks = run_script(tmp_path, request.config.rootpath, 2)
    for n_val in ("1", "3"):
        for stage, prefix in (("validate", "val"), ("test", "test")):
            expected = single[n_val][stage][0]
            assert expected[f"{prefix}/n"] == int(n_val)
            for rank in ranks:  # every rank returns the same, whole-set values
                assert rank[n_val][stage][0] == pytest.approx(expected, rel=1e-6), (
                    n_val,
                    stage,
                    rank[n_val][stage],
                )
        # rank r predicts rows r, r + 2, ...; the empty rank predicts nothing
        merged = [None] * int(n_val)
        for r, rank in enumerate(ranks):
            assert len(rank[n_val]["predict"]) == len(range(r, int(n_val), 2))
            merged[r::2] = rank[n_val]["predict"]
        assert merged == single[n_val]["predict"]
