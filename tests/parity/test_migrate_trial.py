"""The migration trial, as a user runs it: an HF ``Trainer`` job with ``eval_steps``, ``save_steps``,
``logging_steps``, ``load_best_model_at_end`` and ``metric_for_best_model``; its ``training_args.bin``
(written by transformers beside a checkpoint) converted by ``python -m hf_lightning.migrate``; the printed
command run as is (plus the model and data words); HF's evaluation steps, saved steps and best step come out.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

import pytest

from tests.integration.test_cli import read_metrics
from tests.parity.test_hf_steps_parity import STEPS, job, run_hf  # noqa: F401 (job is a fixture)

pytestmark = pytest.mark.slow


def test_migrated_command_gets_hf_steps_and_best_model(job, tmp_path):  # noqa: F811
    folder, train_file, val_file = job
    hf, hf_evals, hf_saved, hf_logged = run_hf(
        folder,
        train_file,
        val_file,
        tmp_path / "hf",
        eval_strategy="steps",
        eval_steps=4,
        save_steps=8,
        logging_steps=3,
        load_best_model_at_end=True,
        metric_for_best_model="eval_loss",
    )
    assert sorted(hf_evals) == [4, 8, 12, 16, STEPS] and hf_saved == [8, 16, STEPS]

    extra = [
        f"model.name_or_path={folder}",
        f"data.path={train_file}",
        f"data.validation_path={val_file}",
        "data.max_length=32",
        "trainer.enable_progress_bar=false",
    ]
    args_file = tmp_path / "hf" / f"checkpoint-{STEPS}" / "training_args.bin"
    proc = subprocess.run(
        [sys.executable, "-m", "hf_lightning.migrate", str(args_file), *extra],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    lines = [line.removesuffix(" \\") for line in proc.stdout.splitlines() if not line.startswith("#")]
    words = shlex.split(" ".join(lines))
    assert words[:3] == ["python", "-m", "hf_lightning.train"] and "hydra.run.dir=outputs/hf" in words
    run = subprocess.run(
        [sys.executable, *words[1:]], capture_output=True, text=True, timeout=900, cwd=tmp_path
    )
    assert run.returncode == 0, run.stderr[-3000:]

    out = tmp_path / "outputs" / "hf"
    rows = read_metrics(out)
    assert [int(r["step"]) for r in rows if r.get("val/loss")] == sorted(hf_evals)
    assert [int(r["step"]) for r in rows if r.get("train/loss")] == hf_logged
    saved = sorted(int(p.stem.removeprefix("step")) for p in (out / "checkpoints").glob("step*.ckpt"))
    assert saved == hf_saved
    final = json.loads((out / "final_metrics.json").read_text())
    assert final["best_model_step"] == int(hf.state.best_model_checkpoint.rsplit("-", 1)[1])
