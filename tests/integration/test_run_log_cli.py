"""What a run prints with its output going to a file, as under ``nohup`` or SLURM.

One packed GPT-2 run of 2 steps x 4 rows, every row a 40-token document plus its EOS: 2 x 4 x 41 = 328 real
tokens, counted by hand. Checked: no progress bar in the output (stdout is a pipe here), none of the listed
noise (Lightning's tip, transformers' attention-mask advice on packed rows, the use_cache INFO line,
"Checkpoint directory ... exists and is not empty" on a resume), one ``done:`` line whose token count is 328
and whose tokens/s is the one ``final_metrics.json`` holds, a wall time covering the whole logged run, an
error said once, and a resume of the finished run that leaves every file of the folder as it was.
"""

from __future__ import annotations

import csv
import json
import re
from datetime import datetime
from pathlib import Path

import pytest

from tests.errors.support import one_line_error, run_train_cli
from tests.integration.log_support import DOC_TOKENS, equal_length_docs, gpt2_tokenizer, save_gpt2

pytestmark = pytest.mark.slow

NOISE = (
    "💡",
    "We strongly recommend passing in an `attention_mask`",
    "use_cache is true",
    "exists and is not empty",
    "it/s]",
    "\r",
    "[ERROR]",
)


def _stamp(line: str) -> datetime:
    return datetime.strptime(line[1:24], "%Y-%m-%d %H:%M:%S,%f")


def _snapshot(run: Path) -> dict[str, tuple[bytes, int]]:
    """Every file of the run folder: its bytes and modification time (the owner lock's time aside)."""
    return {
        str(p.relative_to(run)): (
            p.read_bytes(),
            0 if p.name == ".hf_lightning.lock" else p.stat().st_mtime_ns,
        )
        for p in sorted(run.rglob("*"))
        if p.is_file()
    }


def test_a_run_to_a_file_prints_what_a_user_needs(shared_data, tmp_path):
    tok = gpt2_tokenizer(shared_data)
    model = save_gpt2(tmp_path / "gpt2", tok)
    data = equal_length_docs(shared_data, tok, tmp_path / "docs.jsonl")
    run = tmp_path / "run"
    args = (
        "+experiment=clm",
        f"model.name_or_path={model}",
        f"data.path={data}",
        "data.packing=bfd",
        "data.max_length=64",
        "data.per_device_train_batch_size=4",
        "trainer.log_every_n_steps=1",
        "trainer.enable_model_summary=false",
        f"hydra.run.dir={run}",
    )
    proc = run_train_cli(*args, "trainer.max_steps=2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    for noise in NOISE:
        assert noise not in out, noise

    # no bar: each train/loss row of metrics.csv is a log line too (HF Trainer prints its dict every
    # logging_steps)
    with open(run / "metrics.csv") as fh:
        rows = {int(r["step"]): float(r["train/loss"]) for r in csv.DictReader(fh) if r["train/loss"]}
    said = {
        int(m.group(1)): float(m.group(2))
        # "step 1 of 2 [00:04<?]: ...": the time left is known from the second step on
        for m in re.finditer(r"step (\d+) of 2 \[[\d:]+<[\d:?]+\]: train/loss=(\S+) lr=", proc.stdout)
    }
    assert sorted(said) == sorted(rows) == [1, 2]
    assert all(said[s] == pytest.approx(rows[s], rel=1e-4) for s in rows)

    done = [line for line in proc.stdout.splitlines() if "] - done: " in line]
    assert len(done) == 1, proc.stdout[-3000:]
    tokens = 2 * 4 * (DOC_TOKENS + 1)  # steps x rows x (document + EOS), no padding
    assert f" {tokens} real tokens trained at " in done[0]
    assert done[0].count("tokens/s") == 1 and "throughput/" not in done[0]
    final = json.loads((run / "final_metrics.json").read_text())
    assert f"at {final['train_tokens_per_s']:.0f} real tokens/s" in done[0]
    # the wall time covers the whole run as its own log shows it: first line to the done line
    logged = [line for line in proc.stdout.splitlines() if re.match(r"\[\d{4}-", line)]
    assert final["wall_time_s"] >= (_stamp(done[0]) - _stamp(logged[0])).total_seconds()

    # resuming the finished run trains nothing and changes nothing (no .hydra/previous-1, no log lines)
    before = _snapshot(run)
    proc = run_train_cli(*args, "trainer.max_steps=2", "ckpt_path=last")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "nothing was trained" in proc.stdout and "The run folder is unchanged" in proc.stdout
    assert _snapshot(run) == before

    # a resume that trains on: no "Checkpoint directory ... exists and is not empty"
    proc = run_train_cli(*args, "trainer.max_steps=3", "ckpt_path=last")
    assert proc.returncode == 0, proc.stderr[-3000:]
    for noise in NOISE:
        assert noise not in proc.stdout + proc.stderr, noise
    # its done line: the steps of this command, whose time and tokens it gives (1 step x 4 rows x 41 tokens);
    # it used to say "3 optimizer steps" beside the time and tokens of 1
    done = [line for line in proc.stdout.splitlines() if "] - done: " in line]
    assert len(done) == 1 and "done: optimizer steps 2 -> 3 (a resume: 1 in this command" in done[0], done
    assert f" {1 * 4 * (DOC_TOKENS + 1)} real tokens trained at " in done[0]

    # an error: once on stderr, and in train.log (of a folder that existed: a refused command removes a
    # folder it made)
    bad = tmp_path / "bad"
    bad.mkdir()
    kept = [a for a in args if not a.startswith(("hydra.run.dir=", "data.per_device_train_batch_size="))]
    proc = run_train_cli(*kept, "data.per_device_train_batch_size=-4", f"hydra.run.dir={bad}")
    line = one_line_error(proc)
    assert (proc.stdout + proc.stderr).count("data.per_device_train_batch_size=-4: allowed values") == 1
    assert line.removeprefix("hf_lightning: error: ") in (bad / "train.log").read_text()


def test_without_the_throughput_callback_the_run_says_its_tokens_were_not_counted(shared_data, tmp_path):
    # the Throughput callback is the one place tokens are counted: without it the done line says so and
    # final_metrics.json has no train_tokens_per_s (not a 0 that reads as a measurement)
    tok = gpt2_tokenizer(shared_data)
    run = tmp_path / "run"
    proc = run_train_cli(
        "+experiment=clm",
        f"model.name_or_path={save_gpt2(tmp_path / 'gpt2', tok)}",
        f"data.path={equal_length_docs(shared_data, tok, tmp_path / 'docs.jsonl')}",
        "data.max_length=64",
        "trainer.max_steps=1",
        "callbacks.throughput=null",
        f"hydra.run.dir={run}",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    done = [line for line in proc.stdout.splitlines() if "] - done: " in line]
    assert len(done) == 1 and "real tokens not counted (callbacks.throughput is off)" in done[0], done
    final = json.loads((run / "final_metrics.json").read_text())
    assert "train_tokens_per_s" not in final and final["global_step"] == 1.0
