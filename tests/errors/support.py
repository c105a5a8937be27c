"""Helpers of the error-matrix tests: files with a planted fault, a one-step real fit, a tiny filesystem, a
real run whose batches holding one token turn NaN."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch

from tests.fork_server import run_module

TEXT_ROWS = [{"text": f"{'abcdefghij'[i % 10]} b c d e"} for i in range(100)]
CHAT_ROW = {"messages": [{"role": "user", "content": "a b"}, {"role": "assistant", "content": "c d"}]}
POISON = 29  # "z": batches holding it get NaN activations
# 12 rows, batch 2, no shuffle: batch k = rows 2k, 2k+1; row 5 holds the poison, so batch 2 is poisoned
ROWS = [{"text": "a b c d e"}] * 5 + [{"text": "a b z d e"}] + [{"text": "b c d e f"}] * 6


def write_jsonl(path: Path, rows: Sequence[Any], raw: dict[int, str | bytes] | None = None) -> Path:
    """One JSON object per line; ``raw`` replaces line ``i`` (0-based) by the given text or bytes as they
    are."""
    lines: list[bytes] = []
    for i, row in enumerate(rows):
        value = (raw or {}).get(i)
        if value is None:
            lines.append(json.dumps(row).encode())
        else:
            lines.append(value if isinstance(value, bytes) else value.encode())
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def trainer(tmp_path: Path, **kwargs: Any) -> L.Trainer:
    """A real CPU ``lightning.Trainer`` that logs nothing and writes under ``tmp_path``."""
    defaults = dict(
        accelerator="cpu",
        devices=1,
        max_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        default_root_dir=str(tmp_path),
    )
    return L.Trainer(**{**defaults, **kwargs})


def fit(tmp_path: Path, model: Any, datamodule: Any, **trainer_kwargs: Any) -> L.Trainer:
    """``HFLightningModule(model)`` fitted on ``datamodule`` by a real Trainer (the DataModule sees the
    model)."""
    from hf_lightning import HFLightningModule

    module = HFLightningModule(model, optim={"name": "sgd", "lr": 0.1}, scheduler={"name": "constant"})
    t = trainer(tmp_path, **trainer_kwargs)
    t.fit(module, datamodule=datamodule)
    return t


def poison(model: torch.nn.Module) -> None:
    """NaN out the embeddings of every batch that holds token ``POISON`` (loss and gradients become NaN)."""

    def hook(module, inputs, output):
        return output * float("nan") if (inputs[0] == POISON).any() else output

    model.model.embed_tokens.register_forward_hook(hook)


def run(tmp_path, word_tokenizer, callbacks, max_steps=6, accumulate=1, optim=None, rows=ROWS, **kwargs):
    """A real ``Trainer`` (see :func:`trainer`), a tiny Llama poisoned by :func:`poison` and a DataModule
    over ``rows`` (batch 2, no shuffle); returns ``(trainer, module, datamodule)`` for the test to fit."""
    import datasets

    from hf_lightning import HFDataModule, HFLightningModule
    from tests.data_support import tiny_llama

    model = tiny_llama(vocab_size=32)
    poison(model)
    module = HFLightningModule(
        model,
        optim=optim or {"name": "adamw", "lr": 1e-2, "weight_decay": 0.1},
        scheduler={"name": "constant"},
    )
    dm = HFDataModule(
        tokenizer=word_tokenizer,
        path=datasets.Dataset.from_list(rows),
        validation_split=0.0,
        shuffle=False,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=accumulate,
    )
    if "gradient_clip_val" in kwargs:
        module.max_grad_norm = kwargs.pop("gradient_clip_val")
    else:
        module.max_grad_norm = None
    t = trainer(tmp_path, max_steps=max_steps, callbacks=callbacks, **kwargs)
    return t, module, dm


@contextlib.contextmanager
def tiny_filesystem(folder: Path, size: str = "2m") -> Iterator[Path]:
    """A real tmpfs of ``size`` mounted at ``folder`` (needs CAP_SYS_ADMIN; the test is skipped without
    it)."""
    folder.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip() or 'not permitted'})")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def remount_read_only(folder: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True, capture_output=True)


def run_train_cli(
    *overrides: str, timeout: int = 600, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``python -m hf_lightning.train`` as a user runs it (the worktree's package first on the path), forked
    from a process that has imported ``hf_lightning`` (:mod:`tests.fork_server`); ``env`` adds to the
    environment."""
    repo = str(Path(__file__).resolve().parents[2])
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": repo + os.pathsep + os.environ.get("PYTHONPATH", ""),
        **(env or {}),
    }
    return run_module("hf_lightning.train", overrides, env=env, cwd=repo, timeout=timeout)


def one_line_error(proc: subprocess.CompletedProcess) -> str:
    """The CLI contract: exit status 2, no traceback, one ``hf_lightning: error:`` line; returns that line."""
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("hf_lightning: error: ")]
    assert len(lines) == 1, proc.stderr[-3000:]
    return lines[0]
