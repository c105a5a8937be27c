"""Find the checkpoint to resume from, and refuse one that cannot give an exact resume."""

from __future__ import annotations

import glob
import logging
import os
from typing import Any

import torch

from hf_lightning.errors import ConfigError

log = logging.getLogger(__name__)

REQUIRED_KEYS = ("state_dict", "optimizer_states", "lr_schedulers", "loops")


def _problem(path: str, weights_only: bool) -> str | None:
    """Why ``path`` cannot be resumed from, or ``None`` if it can."""
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    except Exception as err:  # a truncated zip, a pickle error, an empty file
        return f"truncated or corrupt ({type(err).__name__}: {err})"
    if not isinstance(ckpt, dict):
        return "not a Lightning checkpoint"
    needed = ("state_dict",) if weights_only else REQUIRED_KEYS
    missing = [k for k in needed if k not in ckpt or (k != "state_dict" and not ckpt[k])]
    if missing:
        return f"missing {', '.join(missing)}"
    return None


def _candidates(folder: str) -> list[str]:
    files = glob.glob(os.path.join(folder, "*.ckpt"))
    return sorted(files, key=os.path.getmtime, reverse=True)


def find_resume_checkpoint(ckpt_path: str | None, output_dir: str, weights_only: bool = False) -> str | None:
    """Resolve ``ckpt_path`` (``None``, ``last`` or a file) to a checkpoint that can resume exactly.

    ``last`` means ``<output_dir>/checkpoints/last.ckpt``. A checkpoint must hold the model, optimizer and
    scheduler states and the loop state, unless ``weights_only`` (then only the weights are loaded and the
    run starts at step 0).

    Raises:
        ConfigError: no checkpoint (``last`` in a folder without one), a missing file, or a file that is
            truncated/corrupt or lacks optimizer/scheduler state; the message names the file and the newest
            valid checkpoint of the folder, if any.
    """
    if ckpt_path is None:
        return None
    folder = os.path.join(output_dir, "checkpoints")
    path = os.path.join(folder, "last.ckpt") if ckpt_path == "last" else os.fspath(ckpt_path)
    if not os.path.isfile(path):
        hint = "drop ckpt_path to start fresh" if ckpt_path == "last" else "check the path"
        raise ConfigError(
            f"ckpt_path={ckpt_path}: no checkpoint at {path}. Resume needs the same run folder "
            f"(hydra.run.dir=...); {hint}"
        )
    problem = _problem(path, weights_only)
    if problem is None:
        return path
    folder = os.path.dirname(path)
    valid = next((c for c in _candidates(folder) if c != path and _problem(c, weights_only) is None), None)
    fix = f"the newest valid checkpoint there is {valid} (pass ckpt_path={valid})" if valid else "no valid checkpoint is left there"
    weights = "" if weights_only else "; to load only the weights, set resume_weights_only=true"
    raise ConfigError(f"ckpt_path={ckpt_path}: cannot resume from {path}: {problem}; {fix}{weights}")


def describe_differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """``"key: saved -> current"`` for every setting that differs (used to warn before an inexact resume)."""
    return [f"{k}: {saved.get(k)!r} -> {current.get(k)!r}" for k in sorted(set(saved) | set(current)) if saved.get(k) != current.get(k)]
