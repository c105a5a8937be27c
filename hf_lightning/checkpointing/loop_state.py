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
"""

from __future__ import annotations

from typing import Any

from hf_lightning.compat import batches_ready, epoch_progress_state, is_epoch_end


def epoch_ended_early(trainer: Any) -> bool:
    """Whether the current epoch's loop ended before its last batch (``max_steps``, a stop): some batches of
    the epoch were trained, and neither the data nor ``limit_train_batches`` had run out."""
    return batches_ready(trainer) > 0 and not is_epoch_end(trainer)


def reopen_stopped_epoch(checkpoint: dict[str, Any], trainer: Any) -> bool:
    """Mark the epoch of ``checkpoint`` as still running when training stopped in its middle; ``True`` if
    changed.

    Only a checkpoint written after the epoch loop ended early (:func:`epoch_ended_early`) and after the fit
    loop counted the epoch (``processed`` or ``completed`` caught up with ``started``) is changed:
    ``processed`` and ``completed`` go back to ``started - 1`` in both the ``total`` and ``current`` counters.
    Lightning's restart then reads it as "restarted mid-epoch" and continues after the batches already done.
    Checkpoints written inside an epoch, and at the end of a finished one, are left alone.
    """
    if not epoch_ended_early(trainer):
        return False
    progress = epoch_progress_state(checkpoint)
    if not progress:
        return False
    changed = False
    for counters in (progress["total"], progress["current"]):
        open_epoch = counters["started"] - 1
        if counters["processed"] > open_epoch or counters["completed"] > open_epoch:
            counters["processed"] = counters["completed"] = open_epoch
            changed = True
    return changed
