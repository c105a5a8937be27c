"""Find the checkpoint to resume from, and refuse one that cannot give an exact resume.

``ckpt_path=last`` is the newest state of the run in its checkpoint folder: ``last.ckpt``; when the run was
killed before writing its first ``last.ckpt``, the newest intact periodic checkpoint (said in a note); when it
was killed before any checkpoint, step 0 (said in a note). A ``last.ckpt`` that exists but is damaged (its
bytes fail their checksum, or it is not a readable checkpoint) is refused: the message names the newest intact
checkpoint, and passing that one as ``ckpt_path`` resumes from it in the same folder.
"""

from __future__ import annotations

import glob
import logging
import os

import torch

from hf_lightning.checkpointing.io import checksum_problem
from hf_lightning.errors import ConfigError

log = logging.getLogger(__name__)

REQUIRED_KEYS = ("state_dict", "optimizer_states", "lr_schedulers", "loops")


def _short(err: BaseException) -> str:
    """The first line of a load error, without torch's advice paragraphs."""
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return f"{type(err).__name__}: {text[:160]}"


def checkpoint_problem(path: str, weights_only: bool = False) -> tuple[str | None, int | None]:
    """``(why path cannot be resumed from, its global_step)``; the reason is ``None`` when it can.

    The reason reads after the file's name: ``is damaged: ...`` (checksum mismatch, or not a readable
    checkpoint), ``is not a Lightning checkpoint``, ``lacks ...``.
    """
    problem = checksum_problem(path)
    if problem:
        return problem, None
    try:
        with open(path, "rb") as fh:
            # torch's format; mmap on anything else fails with advice, not a reason
            zipped = fh.read(4) == b"PK\x03\x04"
        ckpt = torch.load(path, map_location="cpu", weights_only=False, mmap=zipped)
    except Exception as err:  # a truncated zip, a pickle error, an empty file
        return f"is damaged: not a readable checkpoint ({_short(err)})", None
    if not isinstance(ckpt, dict):
        return "is not a Lightning checkpoint", None
    step = ckpt.get("global_step")
    needed = ("state_dict",) if weights_only else REQUIRED_KEYS
    missing = [k for k in needed if k not in ckpt or (k != "state_dict" and not ckpt[k])]
    if missing:
        return f"lacks {', '.join(missing)}", step
    return None, step


def _candidates(folder: str, exclude: str | None = None) -> list[str]:
    files = [f for f in glob.glob(os.path.join(folder, "*.ckpt")) if f != exclude]
    return sorted(files, key=os.path.getmtime, reverse=True)


def newest_intact(
    folder: str, weights_only: bool = False, exclude: str | None = None
) -> tuple[str | None, int | None]:
    """The newest (by modification time) checkpoint of ``folder`` that passes :func:`checkpoint_problem`."""
    for path in _candidates(folder, exclude):
        problem, step = checkpoint_problem(path, weights_only)
        if problem is None:
            return path, step
    return None, None


def note(message: str) -> None:
    """A ``hf_lightning: note: ...`` line on stderr, once, and in the log file
    (:func:`hf_lightning.cli_output.note`)."""
    from hf_lightning.cli_output import note as say

    say(message, log)


def run_traces(output_dir: str, folder: str) -> tuple[bool, list[str]]:
    """``(a run was started there, what of a finished run's end it holds)``: a config, a log or a checkpoint
    folder; ``hf_model``, ``final_metrics.json``."""
    traces = [
        os.path.join(output_dir, ".hydra", "config.yaml"),
        os.path.join(output_dir, "metrics.csv"),
        folder,
    ]
    finished = [
        name for name in ("hf_model", "final_metrics.json") if os.path.exists(os.path.join(output_dir, name))
    ]
    return any(os.path.exists(p) for p in traces), finished


def _step(step: int | None) -> str:
    return f" (step {step})" if step is not None else ""


_RESOLVED: dict[tuple, str | None] = {}


def remember_resolved(
    ckpt_path: str | None,
    output_dir: str,
    weights_only: bool,
    checkpoint_dir: str | None,
    resolved: str | None,
) -> None:
    """Keep the run-folder guard's answer for ``train()``'s own call (so the notes are said once and the
    answer does not change after Hydra has written ``.hydra/`` into the folder)."""
    _RESOLVED[(ckpt_path, output_dir, weights_only, checkpoint_dir)] = resolved


def find_resume_checkpoint(
    ckpt_path: str | None, output_dir: str, weights_only: bool = False, checkpoint_dir: str | None = None
) -> str | None:
    """Resolve ``ckpt_path`` (``None``, ``last`` or a file) to a checkpoint that can resume exactly.

    ``last`` means ``<checkpoint_dir>/last.ckpt`` (``checkpoint_dir``: ``callbacks.model_checkpoint.dirpath``,
    default ``<output_dir>/checkpoints``); without that file, the newest intact checkpoint there, or ``None``
    (step 0) for a run stopped before any checkpoint. A checkpoint must hold the model, optimizer and
    scheduler states and the loop state, unless ``weights_only`` (then only the weights are loaded and the run
    starts at step 0).

    Raises:
        ConfigError: ``last`` in a folder that holds no run; a missing file; a damaged file (checksum
            mismatch, unreadable) or one without optimizer/scheduler state. The message names the file and the
            newest intact checkpoint of its folder, which resumes when passed as ``ckpt_path``.
    """
    if ckpt_path is None:
        return None
    key = (ckpt_path, output_dir, weights_only, checkpoint_dir)
    if key in _RESOLVED:
        return _RESOLVED.pop(key)
    folder = checkpoint_dir or os.path.join(output_dir, "checkpoints")
    if ckpt_path == "last":
        path = os.path.join(folder, "last.ckpt")
        if not os.path.isfile(path):
            return _without_last(path, folder, output_dir, weights_only)
    else:
        path = os.fspath(ckpt_path)
        if not os.path.isfile(path):
            raise ConfigError(f"ckpt_path={ckpt_path}: no such file; check the path")
    problem, step = checkpoint_problem(path, weights_only)
    if problem is None:
        if weights_only:
            note(f"loading the weights of {path}{_step(step)}; the run starts at step 0")
        else:
            note(f"resuming from {path} at optimizer step {step}")
        return path
    alternative, step = newest_intact(os.path.dirname(path), weights_only, exclude=path)
    fix = (
        f"the newest intact checkpoint there is {alternative}{_step(step)}: resume from it with "
        f"ckpt_path={alternative}"
        if alternative
        else "no intact checkpoint is left there"
    )
    weights = (
        ""
        if weights_only or not problem.startswith("lacks")
        else "; to load only the weights, set resume_weights_only=true"
    )
    raise ConfigError(f"ckpt_path={ckpt_path}: cannot resume: {path} {problem}; {fix}{weights}")


def _without_last(path: str, folder: str, output_dir: str, weights_only: bool) -> str | None:
    """``ckpt_path=last`` without a ``last.ckpt``: the newest intact checkpoint, step 0, or a refusal."""
    alternative, step = newest_intact(folder, weights_only)
    if alternative is not None:
        note(
            f"ckpt_path=last: there is no {path} (the run stopped before writing it): resuming from the "
            f"newest intact checkpoint, {alternative}{_step(step)}"
        )
        return alternative
    damaged = _candidates(folder)
    if damaged:
        shown = ", ".join(
            f"{os.path.basename(p)} {checkpoint_problem(p, weights_only)[0]}" for p in damaged[:3]
        )
        raise ConfigError(
            f"ckpt_path=last: there is no {path}, and no checkpoint in {folder} can be resumed from "
            f"({shown}); start the run again in a new hydra.run.dir"
        )
    started, finished = run_traces(output_dir, folder)
    if finished:
        raise ConfigError(
            f"ckpt_path=last: there is no checkpoint in {folder}, and {output_dir} holds a finished run "
            f"({', '.join(finished)}) with none left to resume from; start a new run in a new hydra.run.dir"
        )
    if started:
        note(
            f"ckpt_path=last: {output_dir} holds no checkpoint yet (the run stopped before its first one): "
            "the run starts again from step 0"
        )
        return None
    raise ConfigError(
        f"ckpt_path=last: no checkpoint at {path}, and {output_dir} holds no stopped run to resume. Resume "
        "needs the folder of that run (hydra.run.dir=...); to start a new run here instead, drop ckpt_path"
    )
