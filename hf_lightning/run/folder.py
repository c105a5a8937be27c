"""Refuse a run folder that cannot hold this run: unwritable, or already holding another run.

A fresh run (``ckpt_path=null``) in a folder that already holds checkpoints would overwrite ``last.ckpt`` and
mix two runs in ``metrics.csv``; ``ckpt_path=last`` in a folder whose run had another model, data or optimizer
would silently continue a different experiment. Hydra writes ``.hydra/config.yaml`` into the folder before the
task function runs, so the comparison with the previous run's config happens in a Hydra callback
(:class:`RunFolderGuard`, ``on_run_start``), before anything is written; :func:`check_run_folder` is the part
that ``train()`` repeats for callers that bypass Hydra.
"""

from __future__ import annotations

import contextlib
import copy
import glob
import logging
import os
import sys
import tempfile
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from hf_lightning.core.arguments import flatten, shown
from hf_lightning.core.errors import ConfigError

log = logging.getLogger(__name__)


def note(message: str) -> None:
    """A ``hf_lightning: note: ...`` line on stderr, once, and in the log file
    (:func:`hf_lightning.cli.output.note`)."""
    from hf_lightning.cli.output import note as say

    say(message, log)


# the settings that make a run what it is; anything else (max_steps, logging, loader workers, eval batch size,
# callbacks) may change when a run is resumed
IDENTITY = ("model", "data", "optim", "scheduler", "module", "seed")
MAY_CHANGE = (
    "data.num_workers",
    "data.pin_memory",
    "data.persistent_workers",
    "data.prefetch_factor",
    "data.per_device_eval_batch_size",
    "data.num_proc",  # tokenization processes: the same rows either way (tests/unit/test_num_proc.py)
    # the same loss either way (float rounding aside), computed with less memory
    "module.lean_loss",
)


def checkpoint_dir(cfg: DictConfig, run_dir: str) -> str:
    """The run's checkpoint folder: ``callbacks.model_checkpoint.dirpath`` (resolved, absolute), default
    ``RUN/checkpoints``. ``run_dir`` stands in for ``output_dir`` where Hydra has not set it yet."""
    node = OmegaConf.select(
        cfg, "callbacks.model_checkpoint", default=None, throw_on_resolution_failure=False
    )
    dirpath = None
    if isinstance(node, DictConfig) and "dirpath" in node:
        raw = OmegaConf.to_container(node, resolve=False).get("dirpath")
        probe = OmegaConf.create({"output_dir": os.path.abspath(run_dir), "dirpath": raw})
        with contextlib.suppress(Exception):  # an interpolation of another key: Lightning's own default then
            dirpath = probe.dirpath
    return os.path.abspath(str(dirpath)) if dirpath else os.path.join(os.path.abspath(run_dir), "checkpoints")


def run_artifacts(run_dir: str, ckpt_dir: str | None = None) -> list[str]:
    """What a previous run left in ``run_dir``: checkpoints, ``metrics.csv``, ``hf_model/`` (relative
    paths; the checkpoints of a ``ckpt_dir`` outside ``run_dir`` are :func:`checkpoint_artifacts`)."""
    folder = ckpt_dir or os.path.join(run_dir, "checkpoints")
    found = checkpoint_artifacts(folder) if _within(folder, run_dir) else []
    found = [os.path.relpath(os.path.join(folder, name), run_dir) for name in found]
    for name in ("metrics.csv", "hf_model"):
        if os.path.exists(os.path.join(run_dir, name)):
            found.append(name)
    return found


def checkpoint_artifacts(ckpt_dir: str) -> list[str]:
    """The names of the checkpoints (``*.ckpt``: files, folders or links) in ``ckpt_dir``, sorted."""
    return sorted(os.path.basename(p) for p in glob.glob(os.path.join(glob.escape(ckpt_dir), "*.ckpt")))


def _within(path: str, folder: str) -> bool:
    """``path`` is ``folder`` or lies under it (as the file system sees both)."""
    path, folder = os.path.realpath(path), os.path.realpath(folder)
    return os.path.commonpath([path, folder]) == folder


def _listed(found: list[str]) -> str:
    return ", ".join(found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")


PROBE_BYTES = 1 << 16


def check_writable(run_dir: str) -> None:
    """Create ``run_dir`` if needed and write a probe file there.

    Raises:
        ConfigError: the folder cannot be created or written (names it and the OS reason).
    """
    try:
        os.makedirs(run_dir, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=run_dir, prefix=".write-probe-") as fh:
            # some room too: Hydra writes .hydra/ next, and a full disk there would end in its traceback
            fh.write(b"\0" * PROBE_BYTES)
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as err:
        raise ConfigError(
            f"hydra.run.dir={run_dir} is not writable ({err.strerror or err}): checkpoints, metrics and the "
            "exported model could not be saved; choose another hydra.run.dir"
        ) from err


def check_run_folder(
    run_dir: str, ckpt_path: str | None, ckpt_dir: str | None = None, weights_only: bool = False
) -> None:
    """A run that starts at step 0 (a fresh one, or ``resume_weights_only=true``) needs a run folder without a
    previous run's checkpoints, metrics or export, and a checkpoint folder (``ckpt_dir``,
    ``callbacks.model_checkpoint.dirpath``) without a previous run's checkpoints; it never rewrites another
    run's history.

    Raises:
        ConfigError: ``run_dir`` holds a previous run (lists what it holds), or else the checkpoint folder
        outside it holds checkpoints (names ``callbacks.model_checkpoint.dirpath``, its checkpoints and the
        run folder of the run that wrote them, when recorded), and this run would start at step 0.
    """
    from hf_lightning.run.lock import checkpoint_folder_writer

    weights_only = weights_only and ckpt_path is not None  # without a checkpoint there are no weights to load
    if ckpt_path is not None and not weights_only:
        return
    folder = ckpt_dir or os.path.join(run_dir, "checkpoints")
    found = run_artifacts(run_dir, folder) if os.path.isdir(run_dir) else []
    elsewhere = [] if found or _within(folder, run_dir) else checkpoint_artifacts(folder)
    if not found and not elsewhere:
        return
    source = ckpt_path
    if weights_only and ckpt_path == "last":
        source = os.path.join(folder, "last.ckpt")
    elif weights_only and ckpt_path == "best":
        source = os.path.join(run_dir, "checkpoints", "best.ckpt")
    if found:
        where = f"hydra.run.dir={run_dir} already holds a run ({_listed(found)})"
        own = "hydra.run.dir=NEW"
        fresh = (
            "a fresh run there would overwrite it. Use a new hydra.run.dir, or ckpt_path=last to resume that "
            "run"
        )
    else:
        writer = checkpoint_folder_writer(folder)
        by = f"; written by the run in {writer}" if writer and writer != os.path.abspath(run_dir) else ""
        where = (
            f"callbacks.model_checkpoint.dirpath={folder} already holds the checkpoints of a run "
            f"({_listed(elsewhere)}{by})"
        )
        own = "callbacks.model_checkpoint.dirpath=NEW"
        resume = f"hydra.run.dir={writer} ckpt_path=last" if by else "ckpt_path=last"
        fresh = (
            "a fresh run would overwrite them. Give this run its own callbacks.model_checkpoint.dirpath, or "
            f"resume that run with {resume}"
        )
    if weights_only:
        raise ConfigError(
            f"resume_weights_only=true starts a new run at step 0 from the weights of {source}, and {where} "
            f"whose history it would overwrite. Give the new run its own folder ({own} ckpt_path={source} "
            "resume_weights_only=true), or drop resume_weights_only to continue that run"
        )
    raise ConfigError(f"{where}; {fresh}")


def _select(cfg: DictConfig, key: str) -> Any:
    node = OmegaConf.select(cfg, key, default=None, throw_on_resolution_failure=False)
    if isinstance(node, DictConfig):
        try:
            return OmegaConf.to_container(node, resolve=True)
        except Exception:  # an interpolation that needs Hydra's runtime: compare as written
            return OmegaConf.to_container(node, resolve=False)
    return node


def _same_path_form(value: Any) -> Any:
    """A path as the file system sees it: an existing file or folder by its real path (a relative path and a
    trailing ``/`` name the same data); anything else as written."""
    if isinstance(value, str) and value and os.path.exists(value):
        return os.path.realpath(value)
    return value


def _settings(value: Any, prefix: str) -> dict[str, Any]:
    """The leaves of a setting, without Hydra's ``_target_`` / ``_partial_`` (what a node builds is not part
    of the run's identity: a run saved before the groups had them resumes)."""
    return {
        k: v
        for k, v in flatten(value, prefix, _same_path_form).items()
        if not k.rpartition(".")[2].startswith("_")
    }


#: keys of a run saved before the module stepped its accumulation windows itself -> today's names
RENAMED = {
    "trainer.accumulate_grad_batches": "data.gradient_accumulation_steps",
    "trainer.gradient_clip_val": "module.max_grad_norm",
}


def _with_current_names(saved: DictConfig) -> DictConfig:
    """``saved`` with every :data:`RENAMED` key it sets (and does not set under its new name) under its new
    name, so that a run saved with them compares equal to the same run today."""
    moved = [
        (old, new) for old, new in RENAMED.items() if OmegaConf.select(saved, old, default=None) is not None
    ]
    if not moved:
        return saved
    saved = copy.deepcopy(saved)
    with open_dict(saved):
        for old, new in moved:
            if OmegaConf.select(saved, new, default=None) is None:
                OmegaConf.update(saved, new, OmegaConf.select(saved, old), force_add=True)
    return saved


def config_differences(saved: DictConfig, current: DictConfig) -> list[str]:
    """``key: saved -> current`` for every identity setting (:data:`IDENTITY`) that differs."""
    saved = _with_current_names(saved)
    diffs = []
    for key in IDENTITY:
        old, new = _settings(_select(saved, key), key), _settings(_select(current, key), key)
        for k in sorted(set(old) | set(new)):
            if k in MAY_CHANGE or old.get(k) == new.get(k):
                continue
            diffs.append(f"{k}: {shown(old.get(k))} -> {shown(new.get(k))}")
    return diffs


# the run length: it may change on resume, but the learning-rate schedule is rebuilt for the new length
LENGTH = ("trainer.max_steps", "trainer.max_epochs")


def length_changes(saved: DictConfig, current: DictConfig) -> list[str]:
    """``key: saved -> current`` for the run-length settings (:data:`LENGTH`) that differ."""
    return [
        f"{key}: {_select(saved, key)!r} -> {_select(current, key)!r}"
        for key in LENGTH
        if _select(saved, key) != _select(current, key)
    ]


def _override_value(value: Any) -> str:
    """``value`` as a Hydra override writes it (``None`` is ``null``)."""
    return "null" if value is None else str(value)


def keep_previous_settings(run_dir: str) -> str | None:
    """Copy the folder's ``.hydra/*.yaml`` into ``.hydra/previous-N/`` (N = 1, 2, ...) before a resume
    rewrites them, so the command line of every segment of the run stays in the folder. Returns the copy's
    path."""
    src = os.path.join(run_dir, ".hydra")
    files = sorted(glob.glob(os.path.join(src, "*.yaml")))
    if not files:
        return None
    n = 1
    while os.path.exists(os.path.join(src, f"previous-{n}")):
        n += 1
    dst = os.path.join(src, f"previous-{n}")
    os.makedirs(dst)
    for path in files:
        with open(path, "rb") as fh_in, open(os.path.join(dst, os.path.basename(path)), "wb") as fh_out:
            fh_out.write(fh_in.read())
    return dst


def check_same_run(run_dir: str, current: DictConfig, ckpt_dir: str | None = None) -> None:
    """``ckpt_path=last`` must resume the run the folder holds: same model, data, optimizer, schedule, seed.
    A changed run length is allowed and reported on stderr (the schedule follows the new length, as in HF
    ``Trainer``, which rebuilds its scheduler for the new ``max_steps`` and then loads its step count).

    Raises:
        ConfigError: the folder's ``.hydra/config.yaml`` differs in an identity setting (all differences
        listed).
    """
    saved_file = os.path.join(run_dir, ".hydra", "config.yaml")
    if not os.path.isfile(saved_file):
        return
    saved = OmegaConf.load(saved_file)
    diffs = config_differences(saved, current)
    changed = length_changes(saved, current)
    if changed and not diffs:
        # a forgotten override (trainer.max_steps=-1 after a 10-step run) would train far longer than meant
        keep = " ".join(
            f"{key}={_override_value(_select(saved, key))}"
            for key in LENGTH
            if _select(saved, key) != _select(current, key)
        )
        note(
            f"resuming with a new run length ({'; '.join(changed)}): the learning-rate schedule is rebuilt "
            f"for it from the checkpoint's step on; to keep the old length, give {keep}"
        )
    if diffs:
        raise ConfigError(
            f"ckpt_path=last: hydra.run.dir={run_dir} holds a different run ({'; '.join(diffs)}). Resume it "
            "with its own settings, or start a new run folder from its weights and state with "
            f"ckpt_path={os.path.join(ckpt_dir or os.path.join(run_dir, 'checkpoints'), 'last.ckpt')}"
        )


# the model settings that may differ between a run and its evaluation: where the weights come from and how the
# model runs (load_model_weights refuses weights of another shape), not what the model is
EVALUATE_MAY_CHANGE = (
    "model.name_or_path",
    "model.tokenizer_name_or_path",
    "model.revision",
    "model.attn_implementation",
    "model.gradient_checkpointing",
    "model.compile",
)


def checkpoint_run(ckpt_path: str) -> str | None:
    """The run folder of the run whose checkpoint the file ``ckpt_path`` is: the folder above its checkpoint
    folder when that holds a run's ``.hydra/config.yaml`` (the default ``RUN/checkpoints``, also of a copied
    run folder), else the run that its checkpoint folder's owner lock records
    (``callbacks.model_checkpoint.dirpath`` outside the run); ``None`` when neither says."""
    from hf_lightning.run.lock import checkpoint_folder_writer

    folder = os.path.dirname(os.path.realpath(ckpt_path))
    parent = os.path.dirname(folder)
    if os.path.isfile(os.path.join(parent, ".hydra", "config.yaml")):
        return parent
    return checkpoint_folder_writer(folder)


def check_checkpoint_of_run(
    run_dir: str, ckpt_path: str | None, current: DictConfig, ckpt_dir: str | None = None
) -> None:
    """``evaluate hydra.run.dir=RUN ckpt_path=FILE`` where ``RUN`` holds a training run: ``FILE`` must be a
    checkpoint of that run, and the model settings those of its ``.hydra/config.yaml``; the evaluation's
    files (``eval_metrics.json``, ``predictions.jsonl``) go into ``RUN`` as that run's. A folder without a
    training run (a new output folder) takes any checkpoint, and a file in the run's checkpoint folder
    (``ckpt_dir``) is the run's.

    Raises:
        ConfigError: the checkpoint was written by another run (names both folders), or the model settings
        differ from the run's (lists them).
    """
    saved_file = os.path.join(run_dir, ".hydra", "config.yaml")
    if not ckpt_path or not os.path.isfile(saved_file):
        return
    own = ckpt_dir is not None and _inside(str(ckpt_path), ckpt_dir)  # the run's checkpoint folder
    owner = None if own else checkpoint_run(str(ckpt_path))
    if owner and os.path.realpath(owner) != os.path.realpath(run_dir):
        raise ConfigError(
            f"ckpt_path={ckpt_path} is a checkpoint of the run in {owner}, not of the run in "
            f"hydra.run.dir={run_dir}, which this evaluation would write its eval_metrics.json and "
            f"predictions.jsonl into as that run's; evaluate it in its own run folder (hydra.run.dir={owner} "
            "ckpt_path=last, with that run's overrides), or in a new folder (hydra.run.dir=NEW "
            f"ckpt_path={ckpt_path})"
        )
    saved = OmegaConf.load(saved_file)
    diffs = []
    for key in ("model", "peft"):
        old, new = _settings(_select(saved, key), key), _settings(_select(current, key), key)
        for k in sorted(set(old) | set(new)):
            if k not in EVALUATE_MAY_CHANGE and old.get(k) != new.get(k):
                diffs.append(f"{k}: {shown(old.get(k))} -> {shown(new.get(k))}")
    if diffs:
        raise ConfigError(
            f"ckpt_path={ckpt_path}: the run in hydra.run.dir={run_dir} was trained with other model "
            f"settings ({'; '.join(diffs)}); evaluate it with that run's overrides "
            f"({run_dir}/.hydra/overrides.yaml)"
        )


_FINISHED: dict[str, dict[str, Any] | None] = {}


def finished_resume(run_dir: str, current: DictConfig, resolved: str | None) -> dict[str, Any] | None:
    """The final metrics of the finished run in ``run_dir`` when resuming it from ``resolved`` trains nothing:
    its ``final_metrics.json`` was written at the checkpoint's step and the run length (:data:`LENGTH`) is the
    one of its saved ``.hydra/config.yaml``. ``None`` otherwise (also without a saved config: then ``fit``
    finds out). The run-folder guard's answer is kept for ``train()`` (:func:`take_finished`), since Hydra
    rewrites the saved config in between."""
    from hf_lightning.checkpointing.resume import checkpoint_problem
    from hf_lightning.run.end import METRICS_FILE, finished_metrics

    saved_file = os.path.join(run_dir, ".hydra", "config.yaml")
    if resolved is None or not os.path.isfile(os.path.join(run_dir, METRICS_FILE)):
        return None
    if not os.path.isfile(saved_file) or length_changes(OmegaConf.load(saved_file), current):
        return None
    problem, step = checkpoint_problem(resolved)
    return None if problem or step is None else finished_metrics(run_dir, step)


_STEPS: dict[tuple[str, int], int | None] = {}


def _checkpoint_step(path: str) -> int | None:
    """The optimizer step of the checkpoint ``path`` (read once per file version)."""
    from hf_lightning.checkpointing.resume import checkpoint_problem

    try:
        key = (os.path.realpath(path), os.stat(path).st_mtime_ns)
    except OSError:
        return None
    if key not in _STEPS:
        _STEPS[key] = checkpoint_problem(path)[1]
    return _STEPS[key]


def check_steps_left(current: DictConfig, resolved: str | None) -> None:
    """A resume must have steps left to train: ``trainer.max_steps`` below the step of the checkpoint it
    resumes from asks for a run that ended before the checkpoint was written, which no resume can give.

    Raises:
        ConfigError: names the checkpoint, its step and ``trainer.max_steps``; said before anything is
            written, so the run folder stays as it was.
    """
    max_steps = OmegaConf.select(current, "trainer.max_steps", default=None)
    if resolved is None or not isinstance(max_steps, int) or max_steps < 0:
        return
    step = _checkpoint_step(resolved)
    if step is None or step <= max_steps:
        return
    raise ConfigError(
        f"trainer.max_steps={max_steps} is below optimizer step {step} of {resolved}, where this resume "
        "would start: there is nothing to train below the checkpoint's step. Give "
        f"trainer.max_steps={step + 1} or more to continue the run (the run folder is unchanged)"
    )


def take_finished(run_dir: str) -> tuple[bool, dict[str, Any] | None]:
    """``(the guard answered, its answer)`` of :func:`finished_resume` for ``run_dir`` (said once)."""
    key = os.path.abspath(run_dir)
    return (key in _FINISHED), _FINISHED.pop(key, None)


def _leave_folder_as_it_is(config: DictConfig) -> None:
    """A resume that trains nothing writes nothing: no ``.hydra/`` rewrite, no ``train.log`` lines (Hydra
    reads both settings after ``on_run_start``)."""
    from omegaconf import open_dict, read_write

    with read_write(config.hydra), open_dict(config.hydra):
        config.hydra.output_subdir = None
        logging_cfg = config.hydra.job_logging
        handlers = logging_cfg.get("handlers") or {}
        files = [name for name, h in handlers.items() if "FileHandler" in str(h.get("class", ""))]
        for name in files:
            del logging_cfg.handlers[name]
        root = logging_cfg.get("root")
        if root is not None and root.get("handlers") is not None:
            root.handlers = [h for h in root.handlers if h not in files]


def _inside(ckpt_path: str, ckpt_dir: str) -> bool:
    """``ckpt_path`` is ``last``, ``best`` or a file in the run's own checkpoint folder."""
    if ckpt_path in ("last", "best"):
        return True
    return os.path.dirname(os.path.realpath(str(ckpt_path))) == os.path.realpath(ckpt_dir)


def _task_config(config: DictConfig) -> DictConfig:
    task = OmegaConf.masked_copy(config, [k for k in config if k != "hydra"])
    return task


try:
    from hydra.experimental.callback import Callback as _HydraCallback
except ImportError:  # hydra is an entry-point dependency only
    _HydraCallback = object  # type: ignore[assignment,misc]


class RunFolderGuard(_HydraCallback):  # type: ignore[misc,valid-type]
    """Hydra callback (``hydra.callbacks.run_folder``): check ``hydra.run.dir`` before Hydra writes into it.

    Takes the owner locks (:mod:`hf_lightning.run.lock`) of the run folder and of an existing checkpoint
    folder first (a new checkpoint folder is created and locked after the checks), then refuses, with
    ``hf_lightning: error: ...`` and exit status 2: an unwritable folder; a run or checkpoint folder another
    process is writing; a run starting at step 0 (fresh, or ``resume_weights_only``) in a folder holding a
    previous run; ``ckpt_path=last`` (or one of the run's own checkpoints) against a folder whose saved config
    differs in an identity setting; a checkpoint that cannot be resumed from
    (:func:`~hf_lightning.checkpointing.resume.find_resume_checkpoint`, whose answer ``train`` reuses).

    Args:
        enabled: ``False`` turns it off (``evaluate`` reads a training run's folder on purpose).
    """

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._checkpoint_folder: str | None = None

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        # a SystemExit, not an exception: Hydra turns exceptions raised by callbacks into warnings
        from hf_lightning.run.lock import launched_as_other_rank, remember_new_run_folder

        if not launched_as_other_rank():
            remember_new_run_folder(str(config.hydra.run.dir))  # a command refused before any work removes it
        if not self.enabled:
            return
        from hf_lightning.checkpointing.resume import find_resume_checkpoint, remember_resolved
        from hf_lightning.run.decision import agreed_decision
        from hf_lightning.run.lock import hold_checkpoint_folder, hold_run_folder

        run_dir = str(config.hydra.run.dir)
        ckpt_path = config.get("ckpt_path")
        weights_only = bool(config.get("resume_weights_only"))
        if agreed_decision(run_dir, ckpt_path, weights_only) is not None:
            return  # launched by rank 0, which checked the folder before writing into it: train() takes that
        try:
            check_writable(run_dir)
            hold_run_folder(run_dir)  # before anything is read or written: one process per run folder
            task = _task_config(config)
            ckpt_dir = checkpoint_dir(task, run_dir)
            self._checkpoint_folder = ckpt_dir
            hold_checkpoint_folder(ckpt_dir, run_dir, create=False)  # an existing one, before it is read
            check_run_folder(run_dir, ckpt_path, ckpt_dir, weights_only)
            if ckpt_path is not None and not weights_only and _inside(ckpt_path, ckpt_dir):
                check_same_run(run_dir, task, ckpt_dir)  # ckpt_path=last or one of the run's own checkpoints
            resolved = find_resume_checkpoint(ckpt_path, os.path.abspath(run_dir), weights_only, ckpt_dir)
            remember_resolved(ckpt_path, os.path.abspath(run_dir), weights_only, ckpt_dir, resolved)
            if not weights_only:
                check_steps_left(task, resolved)
            if ckpt_path is not None and not weights_only and _inside(ckpt_path, ckpt_dir):
                finished = finished_resume(run_dir, task, resolved)
                _FINISHED[os.path.abspath(run_dir)] = finished
                if finished is not None:
                    _leave_folder_as_it_is(config)
                    return
            # a new checkpoint folder is created and locked by train(), after the schema pass: a refused run
            # leaves none behind
            # Hydra is about to rewrite .hydra/ with this command line (the launcher's other ranks re-run it
            # into the same folder after rank 0 has: their copy would be of this segment's settings)
            if ckpt_path is not None and not weights_only and not launched_as_other_rank():
                kept = keep_previous_settings(run_dir)
                if kept:
                    note(f"the previous settings of this run are kept in {kept}")
        except ConfigError as err:
            from hf_lightning.run.lock import discard_new_run_folder

            print(f"hf_lightning: error: {err}", file=sys.stderr)
            discard_new_run_folder(run_dir)  # made by this check: a refused command leaves no folder
            sys.exit(2)

    def on_run_end(self, config: DictConfig, **kwargs: Any) -> None:
        from hf_lightning.run.lock import release_checkpoint_folder, release_run_folder

        if self.enabled:
            if self._checkpoint_folder is not None:
                release_checkpoint_folder(self._checkpoint_folder)
            release_run_folder(str(config.hydra.run.dir))
