"""Find the checkpoint to resume from (or to evaluate), and refuse one that cannot give an exact resume.

``ckpt_path=last`` is the newest state of the run in its checkpoint folder: ``last.ckpt``; when the run was
killed before writing its first ``last.ckpt``, the newest intact periodic checkpoint (said in a note); when it
was killed before any checkpoint, step 0 (said in a note). A ``last.ckpt`` that exists but is not an intact
checkpoint file (its bytes fail their checksum; it is empty, truncated or not a checkpoint; a directory, a
dangling symbolic link, unreadable) is refused: the message names the newest intact checkpoint, and passing
that one as ``ckpt_path`` resumes from it in the same folder. ``python -m hf_lightning.evaluate`` resolves
``ckpt_path`` with the same function (:func:`resolve_ckpt_path`), so ``last`` means the same there.
``ckpt_path=best`` is the run's best checkpoint by ``metric_for_best_model`` (``checkpoints/best.ckpt``), or
a one-line refusal when the run kept none. A path that a symbolic link loop makes unreachable is said to be
one.

A sharded run (``strategy=fsdp``, ``deepspeed_zero2`` / ``deepspeed_zero3``) writes each checkpoint as a
folder (``last.ckpt/``, :mod:`hf_lightning.checkpointing.sharded`): such a folder is a checkpoint like a file
here, checked against its manifest and its parts
(:func:`~hf_lightning.checkpointing.sharded.sharded_checkpoint_problem`).
"""

from __future__ import annotations

import errno
import glob
import logging
import os

from hf_lightning.checkpointing.io import checksum_problem
from hf_lightning.checkpointing.safe_load import load_checkpoint_file
from hf_lightning.checkpointing.sharded import is_sharded_checkpoint, sharded_checkpoint_problem
from hf_lightning.core.errors import ConfigError, UnsafeCheckpointError

log = logging.getLogger(__name__)

REQUIRED_KEYS = ("state_dict", "optimizer_states", "lr_schedulers", "loops")


def _short(err: BaseException) -> str:
    """The first line of a load error, without torch's advice paragraphs."""
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return f"{type(err).__name__}: {text[:160]}"


def _not_a_file(path: str) -> str | None:
    """Why ``path`` (which exists, maybe as a dangling link) is not a checkpoint file, or ``None`` if it is a
    regular file (directly or through a link). Raises ``OSError`` where the OS cannot follow it (a link
    loop)."""
    if os.path.islink(path):
        try:
            os.stat(path)
        except FileNotFoundError:
            return f"is a symbolic link to {os.readlink(path)}, which does not exist"
        except OSError as err:
            if err.errno != errno.ELOOP:
                raise
            return f"is a symbolic link loop (it links back to itself through {os.readlink(path)})"
    link = " (a symbolic link to one)" if os.path.islink(path) else ""
    if os.path.isdir(path):
        return f"is a directory{link}, not a checkpoint file"
    if not os.path.isfile(path):
        return f"is not a regular file{link}, so not a checkpoint file"
    return None


def checkpoint_problem(path: str, weights_only: bool = False) -> tuple[str | None, int | None]:
    """``(why path cannot be resumed from, its global_step)``; the reason is ``None`` when it can.

    The reason reads after the file's name: ``is a directory, not a checkpoint file``, ``is a symbolic link to
    X, which does not exist``, ``cannot be read (...)``, ``is damaged: ...`` (checksum mismatch, an empty
    file, or not a readable checkpoint), ``holds a pickled TYPE, ...`` (a type outside the allow-list of
    :mod:`~hf_lightning.checkpointing.safe_load`, refused unread), ``is not a Lightning checkpoint``,
    ``lacks ...``. A sharded
    checkpoint folder is checked by
    :func:`~hf_lightning.checkpointing.sharded.sharded_checkpoint_problem`.
    """
    if is_sharded_checkpoint(path):
        try:
            return sharded_checkpoint_problem(path, weights_only)
        except OSError as err:
            return f"cannot be read ({err.strerror or err})", None
    try:
        problem = _not_a_file(path) or checksum_problem(path)
        if problem:
            return problem, None
        with open(path, "rb") as fh:
            # torch's format; mmap on anything else fails with advice, not a reason
            head = fh.read(4)
    except OSError as err:
        return f"cannot be read ({err.strerror or err})", None
    if not head:
        return "is damaged: it is empty (0 bytes), not a checkpoint", None
    try:
        ckpt = load_checkpoint_file(path, mmap=head == b"PK\x03\x04")
    except UnsafeCheckpointError as err:  # a pickled type outside the allow-list, refused unread
        return err.reason, None
    except Exception as err:  # a truncated zip, a pickle error
        return f"is damaged: not a readable checkpoint ({_short(err)})", None
    if not isinstance(ckpt, dict):
        return "is not a Lightning checkpoint", None
    step = ckpt.get("global_step")
    needed = ("state_dict",) if weights_only else REQUIRED_KEYS
    missing = [k for k in needed if k not in ckpt or (k != "state_dict" and not ckpt[k])]
    if missing:
        return f"lacks {', '.join(missing)}", step
    return None, step


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:  # a dangling link, or removed since it was listed
        return float("-inf")


def _candidates(folder: str, exclude: str | None = None) -> list[str]:
    """The ``*.ckpt`` entries of ``folder`` (files, folders, links), newest first."""
    files = [f for f in glob.glob(os.path.join(glob.escape(folder), "*.ckpt")) if f != exclude]
    return sorted(files, key=_mtime, reverse=True)


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
    (:func:`hf_lightning.cli.output.note`)."""
    from hf_lightning.cli.output import note as say

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
    """Resolve a training run's ``ckpt_path`` (``None``, ``last``, ``best`` or a file) to a checkpoint that
    can resume exactly: :func:`resolve_ckpt_path` for training (the run-folder guard's answer, when it gave
    one).

    Raises:
        ConfigError: as :func:`resolve_ckpt_path`.
    """
    if ckpt_path is None:
        return None
    key = (ckpt_path, output_dir, weights_only, checkpoint_dir)
    if key in _RESOLVED:
        return _RESOLVED.pop(key)
    return resolve_ckpt_path(ckpt_path, output_dir, checkpoint_dir, weights_only)


_VERB = {"train": "resume", "evaluate": "evaluate"}


def resolve_ckpt_path(
    ckpt_path: str | None,
    output_dir: str,
    checkpoint_dir: str | None = None,
    weights_only: bool = False,
    purpose: str = "train",
) -> str | None:
    """Resolve ``ckpt_path`` (``None``, ``last``, ``best`` or a file) to the checkpoint a run loads: the one
    function behind ``train`` (resume, ``resume_weights_only``) and ``evaluate``.

    ``last`` means ``<checkpoint_dir>/last.ckpt`` (``checkpoint_dir``: ``callbacks.model_checkpoint.dirpath``,
    default ``<output_dir>/checkpoints``); without that file, the newest intact checkpoint there (said in a
    note), or ``None`` (step 0) for a training run stopped before any checkpoint. ``best`` means
    ``<output_dir>/checkpoints/best.ckpt`` (:func:`best_checkpoint`). A checkpoint must be a
    readable checkpoint file holding the model, optimizer and scheduler states and the loop state, unless
    ``weights_only`` or ``purpose="evaluate"`` (then only the weights are read).

    Args:
        purpose: ``"train"`` or ``"evaluate"`` (the notes and refusals speak of evaluating; a run folder
            without a checkpoint is refused, since there is nothing trained to evaluate).

    Raises:
        ConfigError: ``last`` in a folder that holds no run (or, to evaluate, no checkpoint); ``best`` in a
            run that kept no best checkpoint; a missing path, or one behind a symbolic link loop; one that is
            not an intact checkpoint file (a directory, a dangling symbolic link or a link loop, unreadable,
            empty, truncated or garbage, a checksum mismatch) or lacks optimizer/scheduler state. The message
            names the file and the newest intact checkpoint of its folder, which loads when passed as
            ``ckpt_path``. To resume into a checkpoint folder whose ``last.ckpt`` is a directory (the run
            saves its last checkpoint under that name).
    """
    if ckpt_path is None:
        return None
    evaluating = purpose == "evaluate"
    weights_only = weights_only or evaluating
    verb = _VERB[purpose]
    folder = checkpoint_dir or os.path.join(output_dir, "checkpoints")
    if ckpt_path == "last":
        path = os.path.join(folder, "last.ckpt")
        _refuse_a_loop(ckpt_path, path)
        if not os.path.lexists(path):
            return _without_last(path, folder, output_dir, weights_only, purpose)
    elif ckpt_path == "best":
        path = best_checkpoint(output_dir)
        _refuse_a_loop(ckpt_path, path)
        if not os.path.lexists(path):
            raise ConfigError(
                f"ckpt_path=best: the run in {output_dir} kept no best checkpoint (there is no {path}; it is "
                "kept when the run sets metric_for_best_model and a validation ran); use ckpt_path=last or a "
                "checkpoint file"
            )
    else:
        path = os.fspath(ckpt_path)
        _refuse_a_loop(ckpt_path, path)
        if not os.path.lexists(path):
            raise ConfigError(f"ckpt_path={ckpt_path}: no such file; check the path")
    problem, step = checkpoint_problem(path, weights_only)
    if problem is None:
        if not evaluating and not weights_only:
            _check_last_is_a_file(ckpt_path, folder)
        if purpose == "train":  # evaluate says which weights it evaluates once it has loaded them
            note(
                f"loading the weights of {path}{_step(step)}; the run starts at step 0"
                if weights_only
                else f"resuming from {path} at optimizer step {step}"
            )
        return path
    # a folder given as ckpt_path: its own checkpoints first
    places = [path, os.path.dirname(path)] if os.path.isdir(path) else [os.path.dirname(path)]
    alternative, step = next(
        (found for found in (newest_intact(p, weights_only, exclude=path) for p in places) if found[0]),
        (None, None),
    )
    in_it = "in it" if alternative and os.path.dirname(alternative) == path else "there"
    blocks = (
        ckpt_path == "last" and not evaluating and os.path.isdir(path) and not is_sharded_checkpoint(path)
    )
    fix = (
        f"the newest intact checkpoint {in_it} is {alternative}{_step(step)}: "
        + (
            f"move {path} out of the way (this run saves its last checkpoint under that name) and resume "
            f"from it with ckpt_path={alternative}"
            if blocks
            else f"{verb} {'it' if evaluating else 'from it'} with ckpt_path={alternative}"
        )
        if alternative
        else "no intact checkpoint is left there"
    )
    weights = (
        ""
        if weights_only or not problem.startswith("lacks")
        else "; to load only the weights, set resume_weights_only=true"
    )
    raise ConfigError(f"ckpt_path={ckpt_path}: cannot {verb}: {path} {problem}; {fix}{weights}")


def best_checkpoint(output_dir: str) -> str:
    """``ckpt_path=best``: ``<output_dir>/checkpoints/best.ckpt``, where a run with ``metric_for_best_model``
    keeps its best checkpoint (:func:`~hf_lightning.config.build.with_best_model`)."""
    return os.path.join(output_dir, "checkpoints", "best.ckpt")


def _refuse_a_loop(ckpt_path: str, path: str) -> None:
    """A folder on ``path`` that is a symbolic link loop: the OS cannot reach anything through it, and
    ``os.path.lexists`` would call the checkpoint missing.

    Raises:
        ConfigError: names the path and says it is a loop.
    """
    parent = os.path.dirname(os.path.abspath(path))
    try:
        os.stat(parent)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise ConfigError(
                f"ckpt_path={ckpt_path}: {path} cannot be reached: a folder on its path is a symbolic link "
                "loop (it links back to itself); fix the link, or give the checkpoint's real path"
            ) from None


def _check_last_is_a_file(ckpt_path: str, folder: str) -> None:
    """A resume saves ``<folder>/last.ckpt``: a directory of that name would refuse the first save, after
    training."""
    last = os.path.join(folder, "last.ckpt")
    if os.path.isdir(last) and not is_sharded_checkpoint(last):
        raise ConfigError(
            f"ckpt_path={ckpt_path}: {last} is a directory, and this run saves its last checkpoint under "
            "that name (the save would fail after training): move it out of the way, then run the command "
            "again"
        )


def _without_last(
    path: str, folder: str, output_dir: str, weights_only: bool, purpose: str = "train"
) -> str | None:
    """``ckpt_path=last`` without a ``last.ckpt``: the newest intact checkpoint, step 0, or a refusal."""
    evaluating = purpose == "evaluate"
    alternative, step = newest_intact(folder, weights_only)
    if alternative is not None:
        doing = "evaluating" if evaluating else "resuming from"
        note(
            f"ckpt_path=last: there is no {path} (the run stopped before writing it): {doing} the "
            f"newest intact checkpoint, {alternative}{_step(step)}"
        )
        return alternative
    hf_model = os.path.join(output_dir, "hf_model")
    export = f"; evaluate its export with model.name_or_path={hf_model}" if os.path.isdir(hf_model) else ""
    damaged = _candidates(folder)
    if damaged:
        shown = ", ".join(
            f"{os.path.basename(p)} {checkpoint_problem(p, weights_only)[0]}" for p in damaged[:3]
        )
        if evaluating:
            raise ConfigError(
                f"ckpt_path=last: there is no {path}, and no checkpoint in {folder} can be evaluated "
                f"({shown}){export}"
            )
        raise ConfigError(
            f"ckpt_path=last: there is no {path}, and no checkpoint in {folder} can be resumed from "
            f"({shown}); start the run again in a new hydra.run.dir"
        )
    started, finished = run_traces(output_dir, folder)
    if evaluating:
        if started or finished:
            raise ConfigError(
                f"ckpt_path=last: there is no checkpoint in {folder}: the run in {output_dir} has none to "
                f"evaluate{export}"
            )
        raise ConfigError(
            f"ckpt_path=last: no checkpoint at {path}, and {output_dir} holds no training run; give the run "
            "folder of a training run (hydra.run.dir=RUN, with the run's overrides), or ckpt_path=FILE"
        )
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
