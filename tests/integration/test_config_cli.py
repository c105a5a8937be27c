"""The config as a user meets it on the command line: HF names refused with our key, a group named on the
command line winning over the experiment, ``evaluate`` honouring ``module``, precision and devices."""

from __future__ import annotations

import csv
import json
import os
import subprocess

import pytest
import yaml

from tests.fork_server import run_module

pytestmark = pytest.mark.slow
ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}


def cli(module: str, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return run_module(f"hf_lightning.{module}", args, env=ENV, cwd=os.getcwd(), timeout=timeout)


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "eval.jsonl"
    path.write_text("".join(json.dumps({"text": f"Sentence number {i} is here."}) + "\n" for i in range(6)))
    return path


@pytest.mark.parametrize(
    ("override", "line"),
    [
        ("+learning_rate=5e-5", "hf_lightning: error: learning_rate is HF's name: use optim.lr=5e-05"),
        (
            "+num_train_epochs=1",
            "hf_lightning: error: num_train_epochs is HF's name: use trainer.max_epochs=1",
        ),
    ],
)
def test_an_hf_name_on_the_command_line_stops_the_run_with_our_key(tmp_path, override, line):
    run = tmp_path / "run"
    proc = cli("train", "+experiment=sft", override, f"hydra.run.dir={run}")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert line in proc.stderr.splitlines()
    assert not (run / "metrics.csv").exists() and not (run / "checkpoints").exists()


def test_a_group_on_the_command_line_wins_over_the_experiment(tmp_path):
    """``+experiment=sft trainer=debug``: debug's "4 steps, a row every step, validation every 2", not sft's
    ``val_check_interval=0.5`` and ``log_every_n_steps=5``; a key given on the command line wins over both."""
    run = tmp_path / "run"
    proc = cli(
        "train",
        "+experiment=sft",
        "trainer=debug",
        "trainer.limit_val_batches=1",
        "data.max_length=64",
        "data.per_device_train_batch_size=4",
        f"hydra.run.dir={run}",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    saved = yaml.safe_load((run / ".hydra" / "config.yaml").read_text())["trainer"]
    assert (saved["val_check_interval"], saved["log_every_n_steps"], saved["max_epochs"]) == (2, 1, 1)
    assert saved["limit_val_batches"] == 1  # given on the command line: neither file's value
    assert "trainer.val_check_interval: 0.5 -> 2 (trainer=debug over +experiment=sft)" in proc.stderr
    with open(run / "metrics.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    train_steps = sorted({int(r["step"]) for r in rows if r.get("train/loss")})
    val_steps = sorted({int(r["step"]) for r in rows if r.get("val/loss")})
    assert train_steps == [1, 2, 3, 4]  # sft's log_every_n_steps=5 would give the final row only
    assert val_steps == [2, 4]


def test_evaluate_honours_trainer_precision(tmp_path, text_file):
    """The same saved weights evaluated in float32 and in bfloat16 (``trainer.precision=bf16-true``: bf16
    weights) give close but different losses; before the one builder, evaluate ignored the precision (equal
    losses)."""
    from hf_lightning.models.loading import load_model_and_tokenizer

    small = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2}
    model, tokenizer = load_model_and_tokenizer(config={**small, "num_key_value_heads": 2})
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    losses = {}
    for precision in ("32-true", "bf16-true", "32-true"):
        out = tmp_path / f"{precision}-{len(losses)}"
        proc = cli(
            "evaluate",
            "+experiment=clm",
            f"model.name_or_path={folder}",
            f"data.path={text_file}",
            f"trainer.precision={precision}",
            "trainer.enable_progress_bar=false",
            f"hydra.run.dir={out}",
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        losses.setdefault(precision, []).append(
            json.loads((out / "eval_metrics.json").read_text())["val/loss"]
        )
    (full, again), (half,) = losses["32-true"], losses["bf16-true"]
    assert full == again  # the same weights and data: the difference below is the precision's
    assert half != full and abs(half - full) < 0.05 * full


@pytest.mark.parametrize(
    ("override", "line"),
    [
        (
            "trainer.devices=2",
            "hf_lightning: error: trainer.devices=2 with trainer.num_nodes=1: python -m "
            "hf_lightning.evaluate runs on one device",
        ),
        (
            "module.label_smoothing_factor=1.5",
            "hf_lightning: error: module.label_smoothing_factor=1.5: allowed values: a number in [0, 1)",
        ),
    ],
)
def test_evaluate_refuses_in_one_line(tmp_path, text_file, override, line):
    proc = cli(
        "evaluate", "+experiment=clm", f"data.path={text_file}", override, f"hydra.run.dir={tmp_path / 'e'}"
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert any(x.startswith(line) for x in proc.stderr.splitlines()), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def test_a_new_key_of_a_mapping_setting_is_taken_in_every_spelling(tmp_path):
    """``scheduler.kwargs={num_decay_steps: 100}`` and ``data.rename_columns.question=prompt`` (Hydra alone:
    "Could not override", exit 1) are taken as ``++KEY=VALUE``; ``--cfg job`` prints the config they give."""
    proc = cli(
        "train",
        "+experiment=sft",
        "scheduler.name=warmup_stable_decay",
        "scheduler.kwargs={num_decay_steps: 100}",
        "data.rename_columns.question=prompt",
        "optim.kwargs.amsgrad=true",
        "--cfg",
        "job",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    printed = yaml.safe_load(proc.stdout)
    assert printed["scheduler"]["kwargs"] == {"num_decay_steps": 100}
    assert printed["data"]["rename_columns"] == {"question": "prompt"}
    assert printed["optim"]["kwargs"] == {"amsgrad": True}
