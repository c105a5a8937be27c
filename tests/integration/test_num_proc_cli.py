"""``data.num_proc`` through ``python -m hf_lightning.train``: GSM8K tokenized by two processes trains, with
the tokenization rate in the log; a bad value stops the run in one line naming the key (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.errors.support import one_line_error, run_train_cli

pytestmark = pytest.mark.slow

SHORT = (
    "trainer.max_steps=2",
    "trainer.limit_val_batches=1",
    "trainer.enable_model_summary=false",
    "data.per_device_train_batch_size=2",
    "data.per_device_eval_batch_size=2",
    "data.max_length=256",
)


def _gsm8k(shared_data: str, target: Path, n: int = 64) -> Path:
    with open(Path(shared_data) / "gsm8k" / "train.jsonl") as src, open(target, "w") as dst:
        for _, line in zip(range(n), src):
            row = json.loads(line)
            dst.write(json.dumps({"prompt": row["question"], "completion": row["answer"]}) + "\n")
    return target


def test_two_tokenizing_processes_through_the_cli(shared_data, tmp_path):
    rows = _gsm8k(shared_data, tmp_path / "gsm8k.jsonl")
    run = tmp_path / "run"
    proc = run_train_cli(
        "+experiment=sft", f"data.path={rows}", "data.num_proc=2", *SHORT, f"hydra.run.dir={run}"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = proc.stdout + proc.stderr
    # the 5% hold-out of 64 rows: 60 train rows (datasets' train_test_split rounds the test share up)
    assert "tokenized train: 60 rows, " in log and "num_proc=2" in log, log[-3000:]
    assert "tokenized validation: 4 rows, " in log
    assert json.loads((run / "final_metrics.json").read_text())["global_step"] == 2


@pytest.mark.parametrize(
    ("value", "shown"),
    [("0", "data.num_proc=0"), ("two", "data.num_proc='two'"), ("1.5", "data.num_proc=1.5")],
)
def test_a_bad_num_proc_stops_the_run_in_one_line(shared_data, tmp_path, value, shown):
    rows = _gsm8k(shared_data, tmp_path / "gsm8k.jsonl", 8)
    proc = run_train_cli("+experiment=sft", f"data.path={rows}", f"data.num_proc={value}", *SHORT)
    line = one_line_error(proc)
    assert f"{shown}: allowed values: null or an integer >= 1" in line
