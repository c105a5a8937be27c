"""Every ``python -m hf_lightning...`` command of README.md and docs/migration.md runs as written.

``test_docs.py`` composes each command and checks the schema; here each one is executed, as a subprocess from
a fresh folder, shortened by overrides the test appends (:data:`SHORT`, replacing a key the command gives
itself) so the docs keep the real numbers. Placeholders become real files: ``/path/to/hf_folder`` and
``RUN/hf_model`` the export of the README's first command, ``chats.jsonl`` / ``corpus.jsonl`` a few rows. A
command shown with its ``hf_lightning: error:`` line must fail with that line and status 2; GPU and SLURM
commands must be refused in one line with status 2 on a machine without them. The migration tutorial's own
commands (its numbered steps) run in ``test_docs.py::test_the_migration_tutorial_runs_as_written``, the
README's hub commands in ``test_docs_hub.py``.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.fork_server import run_module
from tests.integration.test_docs import documented_commands

pytestmark = pytest.mark.slow

# what makes a documented command short: a couple of steps, a tiny validation, short rows
SHORT = {
    "trainer.max_steps": "2",
    "trainer.limit_val_batches": "1",
    "trainer.val_check_interval": "null",
    "trainer.check_val_every_n_epoch": "1",
    "trainer.enable_model_summary": "false",
    "data.max_length": "64",
    "data.per_device_train_batch_size": "4",
    "data.per_device_eval_batch_size": "4",
}
TUTORIAL_FILES = ("gpt2-qa", "qa_train.jsonl", "qa_val.jsonl", "outputs/qa")


def _names_a_hub_id(command: str) -> bool:
    """Whether the command reads a hub id (``Qwen/...``, ``HuggingFaceH4/...``): those commands run in
    ``test_docs_hub.py``, against hub caches that test lays out (this machine is offline)."""
    from hf_lightning.models.hub import looks_like_hub_id

    for word in shlex.split(command):
        key, _, value = word.partition("=")
        placeholder = "/path/to/" in value or value.startswith("RUN/")
        reads = key.lstrip("+") in ("model.name_or_path", "data.path") and not placeholder
        if reads and "/" in value and looks_like_hub_id(value):
            return True
    return False


def _runnable() -> list[tuple[str, str, str]]:
    """The commands run here: all but the migration tutorial's steps (which need its prepared files), the
    hub commands (``test_docs_hub.py``) and the evaluate command's bare name in prose (it names the
    command; as it stands it is refused, nothing trained to evaluate:
    ``test_the_bare_evaluate_command_is_refused``)."""
    return [
        c
        for c in documented_commands()
        if not any(t in c[1] for t in TUTORIAL_FILES) and not _names_a_hub_id(c[1]) and c[1] != BARE_EVALUATE
    ]


BARE_EVALUATE = "python -m hf_lightning.evaluate"


def test_the_bare_evaluate_command_is_refused(tmp_path):
    """The pages name ``python -m hf_lightning.evaluate`` bare; as it stands it has no model to score."""
    args = [f"hydra.run.dir={tmp_path / 'run'}"]
    proc = run_module("hf_lightning.evaluate", args, env=_env(), cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("hf_lightning: error: nothing trained to evaluate")


def _env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1"}


# HF's step keys replace Lightning's evaluation knobs (giving both is refused)
HF_STEP_KEYS = ("eval_steps", "save_steps", "logging_steps", "eval_strategy", "save_strategy")
EVAL_KNOBS = ("trainer.val_check_interval", "trainer.check_val_every_n_epoch")


def _shorten(words: list[str], entry: str, run_dir: str) -> list[str]:
    keys = dict(SHORT) if entry == "train" else {}
    if any(w.split("=", 1)[0].lstrip("+") in HF_STEP_KEYS for w in words):
        keys = {k: v for k, v in keys.items() if k not in EVAL_KNOBS}
    kept = [w for w in words if w.split("=", 1)[0].lstrip("+") not in keys]
    added = [f"{k}={v}" for k, v in keys.items()]
    if entry != "inspect_batch":
        multirun = "-m" in words or "--multirun" in words
        added.append(f"hydra.sweep.dir={run_dir}" if multirun else f"hydra.run.dir={run_dir}")
    # Hydra's overrides form one run of words: after the command's own, before an option such as --cfg job
    cut = next((i for i, w in enumerate(kept) if w.startswith("--cfg")), len(kept))
    return kept[:cut] + added + kept[cut:]


def _run(command: str, cwd: Path, run_dir: str, shorten: bool = True) -> subprocess.CompletedProcess:
    words = shlex.split(command)
    entry = words[2].split(".")[1]
    args = _shorten(words[3:], entry, run_dir) if shorten else words[3:]
    return run_module(words[2], args, env=_env(), cwd=cwd, timeout=900)


@pytest.fixture(scope="module")
def doc_folder(tmp_path_factory):
    """A folder holding the README's first run (its export stands for every model folder) and small files."""
    folder = tmp_path_factory.mktemp("docs_run")
    proc = _run("python -m hf_lightning.train +experiment=sft", folder, "first")
    assert proc.returncode == 0, proc.stderr[-3000:]
    chats = [
        {
            "messages": [
                {"role": "user", "content": f"Hi number {i}"},
                {"role": "assistant", "content": "Hello."},
            ]
        }
        for i in range(12)
    ]
    (folder / "chats.jsonl").write_text("".join(json.dumps(r) + "\n" for r in chats))
    texts = [{"text": f"Sentence {i} of a short corpus for the docs test."} for i in range(12)]
    (folder / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in texts))
    return folder


@pytest.mark.parametrize("source,command,error", _runnable())
def test_every_documented_command_runs(source, command, error, doc_folder, tmp_path):
    import torch

    model = str(doc_folder / "first" / "hf_model")
    command = command.replace("/path/to/hf_folder", model).replace("RUN/hf_model", model)
    run_dir = str(tmp_path / "run")
    if error:
        proc = _run(command, doc_folder, run_dir, shorten=False)
        assert (
            proc.returncode == 2 and proc.stderr.strip().splitlines()[-1] == f"hf_lightning: error: {error}"
        )
        return
    gpu = "trainer=gpu" in command
    if gpu and not torch.cuda.is_available():
        proc = _run(command, doc_folder, run_dir)
        assert proc.returncode == 2, proc.stderr[-3000:]
        lines = [line for line in proc.stderr.splitlines() if line.startswith("hf_lightning: error:")]
        assert len(lines) == 1, proc.stderr[-3000:]
        return
    proc = _run(command, doc_folder, run_dir)
    assert proc.returncode == 0, f"{source}: {command}\n{proc.stderr[-3000:]}"
    if "--cfg" in command:
        assert "optim:" in proc.stdout
    elif "inspect_batch" in command:
        assert "training batch 1 of rank 0" in proc.stdout
    elif "evaluate" in command:
        assert (Path(run_dir) / "eval_metrics.json").is_file()
    elif {"-m", "--multirun"} & set(shlex.split(command)[3:]):
        assert (Path(run_dir) / "summary.csv").is_file()
    else:
        assert (Path(run_dir) / "final_metrics.json").is_file()
