"""Validate the final weights inside ``fit``, so that the value competes for ``best.ckpt`` like any other."""

from __future__ import annotations

import logging
from typing import Any

import lightning as L

from hf_lightning.checkpointing.loop_state import ends_epoch

log = logging.getLogger(__name__)


def is_final_step(trainer: L.Trainer, batch_idx: int) -> bool:
    """Whether the optimizer step just taken (training batch ``batch_idx`` of its epoch) ends the run:
    ``trainer.max_steps`` reached, or the last batch of the last epoch of ``trainer.max_epochs`` (valid in
    ``on_train_batch_end``)."""
    if trainer.max_steps is not None and 0 < trainer.max_steps <= trainer.global_step:
        return True
    if trainer.max_epochs in (None, -1) or trainer.current_epoch + 1 < trainer.max_epochs:
        return False
    return ends_epoch(trainer, batch_idx)


class FinalValidation(L.Callback):
    """Run a validation at the run's last optimizer step when the schedule (``val_check_interval``,
    ``check_val_every_n_epoch``) would not, *inside* ``fit``: ``ModelCheckpoint`` (``best.ckpt``, the periodic
    checkpoints), ``EarlyStopping`` and the loggers treat it as any other validation. HF ``Trainer`` does the
    same (``DefaultFlowCallback.on_step_end`` evaluates at ``max_steps`` when that step is not an eval step,
    and its best model is chosen among all evaluations). Logs ``validating the final weights (step N)``.

    How: ``trainer.should_stop`` set after the final step, which makes Lightning validate at once (its rule
    for a stop request, e.g. early stopping) where validation is allowed in this epoch; the run ends at that
    step anyway. When this epoch does not validate (``check_val_every_n_epoch`` > 1 skipping it), ``train()``
    validates after ``fit`` instead.
    """

    def __init__(self) -> None:
        self._steps_seen: int | None = None
        self._final_step: int | None = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._steps_seen = trainer.global_step
        self._final_step = None

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if trainer.global_step == self._steps_seen:
            return  # inside an accumulation window
        self._steps_seen = trainer.global_step
        if is_final_step(trainer, batch_idx):
            self._final_step = trainer.global_step
            trainer.should_stop = True

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or self._final_step is None or self._final_step != trainer.global_step:
            return
        last = getattr(pl_module, "last_validated_step", None)
        log.info(
            "validating the final weights (step %d, where the run ends; %s)",
            trainer.global_step,
            "no validation before" if last is None else f"the validation before was at step {last}",
        )
