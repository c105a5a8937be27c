"""Evaluate, save and log at HF ``Trainer``'s optimizer steps (``eval_steps``, ``save_steps``,
``logging_steps``).

With :class:`~hf_lightning.HFLightningModule` each training batch is one optimizer step, so Lightning's
``val_check_interval`` counts the same steps as HF; but with ``check_val_every_n_epoch`` set it restarts each
epoch, it never adds the final step, and ``ModelCheckpoint`` saves before the validation of its step. HF
counts over the whole run, evaluates and saves at the final step, and saves after it evaluates.
:class:`HFSteps` decides at the end of every optimizer step, with the rules of
``DefaultFlowCallback.on_step_end`` / ``on_epoch_end`` (transformers 5.24):

- ``steps``: at every multiple of ``eval_steps`` / ``save_steps``, and at the final step (HF evaluates and
  saves at ``max_steps`` when it is not a multiple);
- ``epoch``: at the last step of every epoch, and at the final step (HF's epoch loop ends there and calls
  ``on_epoch_end``);
- ``logging_steps``: every multiple (``trainer.log_every_n_steps``, which
  :class:`~hf_lightning.HFLightningModule` counts in optimizer steps over the run), plus step 1 with
  ``logging_first_step``;
- a ratio (a float < 1) is ``ceil(run steps x ratio)``, as ``TrainerState.compute_steps``.

HF saves after it evaluates at the same step (``_maybe_log_save_evaluate``); so does this callback: a
checkpoint at an evaluation step is written at the end of that validation, with the validation's results in
it.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint

from hf_lightning.callbacks.final_validation import is_final_step
from hf_lightning.checkpointing.loop_state import ends_epoch
from hf_lightning.compat import acts_after_every_validation, save_checkpoint_now, stop_own_triggers
from hf_lightning.config.hf_args import StepSchedule
from hf_lightning.core.arguments import counted

log = logging.getLogger(__name__)


def fires(strategy: str | None, every: int | None, step: int, epoch_end: bool, final: bool) -> bool:
    """HF's rule for one kind (evaluate or save) at the end of optimizer step ``step`` (1-based)."""
    if strategy == "steps":
        return step % every == 0 or final
    if strategy == "epoch":
        return epoch_end or final
    return False


class HFSteps(L.Callback):
    """Validation, periodic checkpoints and log rows at HF ``Trainer``'s optimizer steps.

    Args:
        schedule: the resolved HF keys (:func:`~hf_lightning.config.hf_args.resolve_schedule`).

    Validation (``eval_strategy`` ``steps`` / ``epoch``): Lightning validates after a training batch when
    ``(batch index + 1) % trainer.val_check_batch == 0``; this sets ``trainer.val_check_batch`` (a Lightning
    attribute without a public setter) after every batch, so that exactly HF's steps pass. The config
    leaves ``trainer.val_check_interval`` to this callback
    (:func:`~hf_lightning.config.hf_args.apply_schedule`).

    Saving (``save_strategy`` ``steps`` / ``epoch``): every ``ModelCheckpoint`` that does not monitor a metric
    (the periodic one, ``monitor`` ``step`` or ``None``) saves when this callback says, with its own rotation
    (``save_top_k``) and ``last.ckpt``; its own triggers (private ``_every_n_train_steps``,
    ``_every_n_epochs``, ``_train_time_interval``) are switched off, and its private ``_save_topk_checkpoint``
    / ``_save_last_checkpoint`` / ``_monitor_candidates`` do the saving, as its own hooks do.
    ``save_strategy=no``: no periodic checkpoint (``last.ckpt`` is still written at the end, for a resume).

    Attributes:
        steps: ``{"eval": n, "save": n, "logging": n}`` resolved at the start of training (``None``: unused).
        evaluated_steps, saved_steps: the optimizer steps where it asked for a validation / wrote a
        checkpoint.
    """

    def __init__(self, schedule: StepSchedule) -> None:
        self.schedule = schedule
        self.steps: dict[str, int | None] = {}
        self.evaluated_steps: list[int] = []
        self.saved_steps: list[int] = []
        self._seen: int | None = None
        self._pending_save: int | None = None

    # ------------------------------------------------------------------------------------------ set-up
    def _periodic(self, trainer: L.Trainer) -> list[ModelCheckpoint]:
        return [cb for cb in trainer.checkpoint_callbacks if getattr(cb, "monitor", None) in (None, "step")]

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.schedule.eval_strategy not in ("steps", "epoch"):
            return
        # Lightning reads trainer.val_check_interval == 1.0 as "validation only at epoch ends" and then lets a
        # monitoring ModelCheckpoint / EarlyStopping act at train epoch end only; validations come at our
        # steps, so they act after each validation (private: the constructors' save_on_train_epoch_end /
        # check_on_train_epoch_end, which their own setup fills in when None; this callback's setup runs
        # first)
        from lightning.pytorch.callbacks import EarlyStopping

        for cb in trainer.callbacks:
            if (isinstance(cb, ModelCheckpoint) and cb.monitor not in (None, "step")) or isinstance(
                cb, EarlyStopping
            ):
                acts_after_every_validation(cb)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.schedule.save_strategy is not None:
            for cb in self._periodic(trainer):
                stop_own_triggers(cb)  # ModelCheckpoint's own triggers, off (see class doc)
        if self.schedule.logging_first_step:
            pl_module.logging_first_step = True

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        total = getattr(pl_module, "planned_steps", None) or trainer.max_steps
        self.steps = {kind: self.schedule.steps(kind, total) for kind in ("eval", "save", "logging")}
        if self.steps["logging"] is not None:
            trainer.log_every_n_steps = self.steps["logging"]
        self._seen = trainer.global_step
        if trainer.is_global_zero:
            log.info("HF step schedule over %s: %s", counted(total, "optimizer step"), self.describe())

    def describe(self) -> str:
        """One line: when this run evaluates, saves and logs."""
        s = self.schedule
        parts = []
        for kind, strategy in (("eval", s.eval_strategy), ("save", s.save_strategy)):
            if strategy == "steps":
                parts.append(f"{kind} every {_every(self.steps.get(kind))} and at the last")
            elif strategy is not None:
                parts.append(
                    f"{kind} {'every epoch and at the last step' if strategy == 'epoch' else 'never'}"
                )
        if self.steps.get("logging") is not None:
            first = ", and step 1" if s.logging_first_step else ""
            parts.append(f"log every {_every(self.steps['logging'])}{first}")
        return "; ".join(parts)

    # ------------------------------------------------------------------------------------- per step
    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        # a save that waited for a validation that did not come (an empty validation set)
        self._flush_pending(trainer)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step
        stepped = step != self._seen
        self._seen = step
        evaluate = save = False
        if stepped:
            epoch_end, final = ends_epoch(trainer, batch_idx), is_final_step(trainer, batch_idx)
            s = self.schedule
            evaluate = fires(s.eval_strategy, self.steps.get("eval"), step, epoch_end, final)
            save = fires(s.save_strategy, self.steps.get("save"), step, epoch_end, final)
        if self.schedule.eval_strategy in ("steps", "epoch"):
            # Lightning validates after this batch iff (batch index + 1) % val_check_batch == 0, whichever
            # index it counts (the epoch's or the run's): 1 passes every index, sys.maxsize none
            trainer.val_check_batch = 1 if evaluate else sys.maxsize
            if evaluate:
                self.evaluated_steps.append(step)
        if save:
            if evaluate and trainer.enable_validation:
                self._pending_save = step  # after the validation of this step, as HF
            else:
                self._save(trainer)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._flush_pending(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._flush_pending(trainer)

    def _flush_pending(self, trainer: L.Trainer) -> None:
        if self._pending_save is not None and self._pending_save == trainer.global_step:
            self._save(trainer)
        self._pending_save = None

    def _save(self, trainer: L.Trainer) -> None:
        self.saved_steps.append(trainer.global_step)
        for cb in self._periodic(trainer):
            save_checkpoint_now(cb, trainer)  # not in a sanity check, nor twice at one step

    def is_save_step(self, step: int) -> bool:
        """Whether a periodic checkpoint is (or will be, after this step's validation) written at ``step``."""
        return step in self.saved_steps or self._pending_save == step

    # ---------------------------------------------------------------------------------------- resume
    def state_dict(self) -> dict[str, Any]:
        return {"evaluated_steps": list(self.evaluated_steps), "saved_steps": list(self.saved_steps)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.evaluated_steps = list(state_dict.get("evaluated_steps", []))
        self.saved_steps = list(state_dict.get("saved_steps", []))


def _every(steps: Any) -> str:
    """``step`` for 1, ``2 steps``: the interval of ``every ...``."""
    return "step" if steps == 1 else f"{steps} steps"
