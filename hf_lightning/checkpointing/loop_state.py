"""A checkpoint written after training stopped in the middle of an epoch records that epoch as unfinished.

When ``trainer.max_steps`` (or ``trainer.should_stop``) ends training before the epoch's last batch, Lightning
still closes the epoch: it counts it as processed, calls ``on_train_epoch_end`` (where ``ModelCheckpoint``
saves when validation runs at epoch ends) and, at ``on_train_end``, as completed. A checkpoint written there
says the epoch is over, so a run continued from it with a larger ``max_steps`` starts the next epoch (its
sampler order too) and never trains the rest of this one; under a ``max_epochs`` it trains nothing at all. HF
``Trainer`` continues mid-epoch: its checkpoint records the step, and a resume skips the batches of the epoch
already seen.

:func:`reopen_stopped_epoch` rewrites the fit loop's epoch counters of such a checkpoint to those of one
written inside the epoch (as a checkpoint saved at ``on_train_batch_end`` has them), so that Lightning
restarts mid-epoch, sets the sampler to this epoch, and the train loader's own state (batches consumed) takes
it from there.

:func:`steps_windows_from_micro_batches` carries a checkpoint of the micro-batch loop (written before
``HFLightningModule`` stepped its accumulation windows itself) over to the window loop's counts.

Both edit the fit loop's counters inside a checkpoint (``checkpoint["loops"]["fit_loop"]``, written by
Lightning's loops' ``state_dict`` before any hook of ours can run at a resume): the one place that reads that
layout; no live loop state is read (a running fit is read through the ``Trainer``'s public attributes only).
"""

from __future__ import annotations

import copy
import math
from typing import Any


def epoch_progress(checkpoint: dict[str, Any]) -> dict[str, Any] | None:
    """The fit loop's epoch counters in a Lightning checkpoint, ``checkpoint["loops"]["fit_loop"]
    ["epoch_progress"]`` (``{"total": {...}, "current": {"ready", "started", "processed", "completed"}}``,
    as the loop's ``state_dict`` writes them); ``None`` when absent. The dict is the checkpoint's own:
    changing it changes the checkpoint."""
    fit = (checkpoint.get("loops") or {}).get("fit_loop") or {}
    return fit.get("epoch_progress") or None


def ends_epoch(trainer: Any, batch_idx: int) -> bool:
    """Whether training batch ``batch_idx`` (0-based, in its epoch) is the epoch's last: the loader ran out
    (``trainer.is_last_batch``), or ``trainer.num_training_batches`` (``limit_train_batches`` included) were
    trained. Valid in ``on_train_batch_end``."""
    return bool(trainer.is_last_batch) or batch_idx + 1 >= trainer.num_training_batches


def reopen_stopped_epoch(checkpoint: dict[str, Any], ended_early: bool) -> bool:
    """Mark the epoch of ``checkpoint`` as still running when training stopped in its middle; ``True`` if
    changed.

    Args:
        checkpoint: the Lightning checkpoint being written (changed in place).
        ended_early: whether the current epoch's loop ended before its last batch (``max_steps``, a stop):
            some of its batches were trained, and neither the data nor ``limit_train_batches`` ran out.

    Only a checkpoint written after the epoch loop ended early and after the fit loop counted the epoch
    (``processed`` or ``completed`` caught up with ``started``) is changed: ``processed`` and ``completed``
    go back to ``started - 1`` in both the ``total`` and ``current`` counters. Lightning's restart then reads
    it as "restarted mid-epoch" and continues after the batches already done. Checkpoints written inside an
    epoch, and at the end of a finished one, are left alone.
    """
    if not ended_early:
        return False
    progress = epoch_progress(checkpoint)
    if not progress:
        return False
    changed = False
    for counters in (progress["total"], progress["current"]):
        open_epoch = counters["started"] - 1
        if counters["processed"] > open_epoch or counters["completed"] > open_epoch:
            counters["processed"] = counters["completed"] = open_epoch
            changed = True
    return changed


def steps_windows_from_micro_batches(checkpoint: dict[str, Any], accumulation: int) -> bool:
    """Rewrite the fit loop of a checkpoint written while Lightning counted micro-batches (automatic
    optimization, ``accumulation`` micro-batches per optimizer step) into the counts of a module that steps
    one accumulation window per training batch; ``True`` if changed.

    Each window is one optimizer step, so the run's batches become its optimizer steps and the current
    epoch's the ``ceil(micro-batches / accumulation)`` windows they filled (a checkpoint is written at a step
    boundary; an epoch's last window may be short); the manual loop's step counter takes the automatic one's;
    the train loader's ``batches_consumed`` becomes windows too. A checkpoint whose manual counter already ran
    is left alone.
    """
    fit = (checkpoint.get("loops") or {}).get("fit_loop")
    if not fit:
        return False
    automatic = (
        fit.get("epoch_loop.automatic_optimization.optim_progress", {}).get("optimizer", {}).get("step")
    )
    manual = fit.get("epoch_loop.manual_optimization.optim_step_progress")
    if not automatic or manual is None or manual["total"]["completed"] > 0:
        return False
    fit["epoch_loop.manual_optimization.optim_step_progress"] = copy.deepcopy(automatic)
    steps = int(automatic["total"]["completed"])
    batches = fit.get("epoch_loop.batch_progress") or {}
    for name in ("ready", "started", "processed", "completed"):
        if name in batches.get("total", {}):
            batches["total"][name] = steps
        if name in batches.get("current", {}):
            batches["current"][name] = math.ceil(batches["current"][name] / accumulation)
    for state in (fit.get("state_dict") or {}).get("combined_loader") or []:
        if isinstance(state, dict) and "batches_consumed" in state:
            state["batches_consumed"] = math.ceil(state["batches_consumed"] / accumulation)
    return True
