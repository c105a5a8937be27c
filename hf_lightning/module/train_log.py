"""The train log row survives a stop: what a row is made of is part of every checkpoint.

A ``train/loss`` row is the mean of the window losses since the previous row (HF's ``loss``), written every
``trainer.log_every_n_steps`` optimizer steps. A run stopped between two rows and resumed from a checkpoint would
otherwise start that mean afresh (a wrong value at the next row) and write a partial row at the stop. So:

- the losses accumulated since the last row (every rank's, gathered), the ``lr``/``grad_norm``/``epoch`` of the
  newest step and the step whose validation was logged last are saved with each checkpoint and restored on
  resume (:meth:`TrainLogState.on_save_checkpoint`, :meth:`TrainLogState.on_load_checkpoint`);
- a checkpoint saved at the end of an optimizer step first ends that step's bookkeeping, writing its row when it
  is a log step: the row of step N is on disk before checkpoint N, so a kill just after the checkpoint cannot
  lose it (a kill between the two leaves a row that the resume from the older checkpoint truncates);
- a stop on a signal writes no partial row (the accumulated losses are in ``last.ckpt``).
"""

from __future__ import annotations

from typing import Any

import torch

KEY = "hf_lightning_train_log"


class TrainLogState:
    """Mixin of :class:`~hf_lightning.HFLightningModule`: checkpoint and restore the train log accumulator.

    Needs ``_loss_since_log`` (0-dim float tensors, one per optimizer step since the last row), ``_steps_seen``,
    ``_end_step()`` (the bookkeeping of a finished optimizer step), ``_last_lr``, ``_last_grad_norm``,
    ``_step_epoch`` and ``last_validated_step``.
    """

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        trainer = self.trainer
        if trainer.training and self.global_step != self._steps_seen:
            self._end_step()  # the callbacks' on_train_batch_end (where checkpoints are saved) run before ours
        pending = torch.stack(self._loss_since_log).float() if self._loss_since_log else torch.zeros(0)
        if trainer.world_size > 1:
            # every rank holds its own share of each step's loss: rank 0 writes the checkpoint for all of them
            pending = trainer.strategy.all_gather(pending.to(self.device)).reshape(trainer.world_size, -1)
        else:
            pending = pending.reshape(1, -1)
        grad_norm = self._last_grad_norm
        checkpoint[KEY] = {
            "loss_since_log": pending.detach().cpu(),
            "lr": self._last_lr,
            "grad_norm": float(grad_norm) if grad_norm is not None else None,
            "epoch": self._step_epoch,
            "last_validated_step": self.last_validated_step,
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = checkpoint.get(KEY)
        if not state:
            return
        pending = state["loss_since_log"]
        trainer = self._trainer
        world = trainer.world_size if trainer is not None else 1
        rank = trainer.global_rank if trainer is not None else 0
        # the same ranks: each its own values; another world size: the mean over ranks, so the logged mean is kept
        row = pending[rank] if pending.shape[0] == world else pending.mean(0)
        self._loss_since_log = list(row.to(self.device).unbind(0))
        self._last_lr = state.get("lr")
        norm = state.get("grad_norm")
        self._last_grad_norm = torch.tensor(norm) if norm is not None else None
        self._step_epoch = state.get("epoch")
        self.last_validated_step = state.get("last_validated_step")

    @property
    def has_pending_train_log(self) -> bool:
        """Whether losses were accumulated since the last ``train/loss`` row (a final row is due)."""
        return bool(self._loss_since_log)
