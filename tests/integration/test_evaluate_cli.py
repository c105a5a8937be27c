"""``python -m hf_lightning.evaluate`` on a trained run: a metrics table, files, predictions in dataset
order."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.fork_server import run_module

pytestmark = pytest.mark.slow


def test_evaluate_a_checkpoint_on_a_file(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    run = tmp_path / "run"
    data = tmp_path / "eval.jsonl"
    rows = [{"text": f"Sentence number {i} is here."} for i in range(5)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    train = subprocess.run(
        [
            sys.executable,
            "-m",
            "hf_lightning.train",
            "+experiment=clm",
            f"data.path={data}",
            f"hydra.run.dir={run}",
            "trainer.max_steps=2",
            "data.per_device_train_batch_size=2",
            "data.validation_split=0.2",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert train.returncode == 0, train.stderr[-2000:]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "hf_lightning.evaluate",
            "+experiment=clm",
            f"data.path={data}",
            "ckpt_path=last",  # as train reads it: RUN/checkpoints/last.ckpt (before: "no such file")
            f"hydra.run.dir={run}",
            "data.per_device_eval_batch_size=2",
            "generate=true",
            "max_new_tokens=3",
            "trainer.enable_progress_bar=false",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"evaluating the weights of {run}/checkpoints/last.ckpt (optimizer step 2)" in proc.stdout
    metrics = json.loads((run / "eval_metrics.json").read_text())
    assert set(metrics) == {"val/loss", "val/perplexity", "val/accuracy"}
    assert "val/loss" in proc.stdout and "metric" in proc.stdout
    preds = [json.loads(x) for x in (run / "predictions.jsonl").read_text().splitlines()]
    assert [p["index"] for p in preds] == list(range(5))  # all of data.path, in file order

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(run / "hf_model")
    for p, r in zip(preds, rows):
        ids = tok(r["text"])["input_ids"]
        assert p["label_ids"] == ids[1:] and "reply" in p
    # the training run's own config is untouched; evaluate keeps its config beside it
    train_overrides = (run / ".hydra" / "overrides.yaml").read_text()
    assert "trainer.max_steps=2" in train_overrides and "generate=true" not in train_overrides
    assert (run / ".hydra-evaluate" / "config.yaml").is_file()


def test_evaluate_refuses_another_runs_checkpoint_in_one_line(tmp_path):
    """``hydra.run.dir=A ckpt_path=B/checkpoints/last.ckpt`` (before: B's weights evaluated, and the results
    written into A as A's, over A's own ``eval_metrics.json``)."""
    import shutil

    from tests.errors.support import one_line_error

    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    run_a, run_b = tmp_path / "a", tmp_path / "b"
    data = tmp_path / "eval.jsonl"
    data.write_text("".join(json.dumps({"text": f"Sentence number {i} is here."}) + "\n" for i in range(6)))
    common = ["+experiment=clm", f"data.path={data}", "trainer.enable_progress_bar=false"]

    def cli(module, *args):
        return run_module(f"hf_lightning.{module}", [*common, *args], env=env, cwd=os.getcwd(), timeout=600)

    train = cli(
        "train", f"hydra.run.dir={run_a}", "trainer.max_steps=2", "data.per_device_train_batch_size=2"
    )
    assert train.returncode == 0, train.stderr[-2000:]
    shutil.copytree(run_a, run_b)  # another run folder (a copy: its checkpoints are B's now)
    (run_a / "eval_metrics.json").write_text('{"val/loss": 1.5}')
    other = run_b / "checkpoints" / "last.ckpt"
    line = one_line_error(cli("evaluate", f"hydra.run.dir={run_a}", f"ckpt_path={other}"))
    assert line == (
        f"hf_lightning: error: ckpt_path={other} is a checkpoint of the run in {run_b}, not of the run in "
        f"hydra.run.dir={run_a}, which this evaluation would write its eval_metrics.json and "
        f"predictions.jsonl into as that run's; evaluate it in its own run folder (hydra.run.dir={run_b} "
        f"ckpt_path=last, with that run's overrides), or in a new folder (hydra.run.dir=NEW "
        f"ckpt_path={other})"
    )
    assert (run_a / "eval_metrics.json").read_text() == '{"val/loss": 1.5}'
    # the fix it names evaluates (the copied folder's lock still names A: its own checkpoint folder wins)
    proc = cli("evaluate", f"hydra.run.dir={run_b}", "ckpt_path=last")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert set(json.loads((run_b / "eval_metrics.json").read_text())) == {
        "val/loss",
        "val/perplexity",
        "val/accuracy",
    }
