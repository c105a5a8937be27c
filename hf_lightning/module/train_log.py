"""The train log of :class:`~hf_lightning.HFLightningModule`: window losses since the last row, HF's
``logging_steps``.

Ours rather than ``self.log`` (the measured reasons are in :meth:`TrainLog.log_to_loggers`, the one place that
writes): HF's ``loss`` is the mean of the *window* losses of the optimizer steps since the previous row (not
of micro-batch values), written every ``trainer.log_every_n_steps`` optimizer steps counted across epochs,
with ``step`` = optimizer steps done; and the row survives a stop:

- the losses accumulated since the last row (every rank's, gathered), the ``lr``/``grad_norm``/``epoch`` of
  the newest step and the step whose validation was logged last are saved with each checkpoint and restored on
  resume (:meth:`TrainLog.on_save_checkpoint`, :meth:`TrainLog.on_load_checkpoint`);
- a checkpoint saved at the end of an optimizer step first ends that step's bookkeeping, writing its row when
  it is a log step: the row of step N is on disk before checkpoint N, so a kill just after the checkpoint
  cannot lose it (a kill between the two leaves a row that the resume from the older checkpoint truncates);
- a stop on a signal writes no partial row (the accumulated losses are in ``last.ckpt``);
- a step that :class:`~hf_lightning.callbacks.NonFiniteGuard` skips (``on_nonfinite=skip``) applied nothing:
  its window loss stays out of ``train/loss`` (the mean over the applied steps since the last row) and it has
  no ``grad_norm``, so no NaN/inf reaches a row, a log line or ``final_metrics.json``; a row whose steps were
  all skipped leaves ``train/loss`` empty.

Zero-target windows are warned about here too: summed across ranks, the count is only read on the host at the
next row, where a sync happens anyway.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch

from hf_lightning.compat import attached_trainer
from hf_lightning.run.loggers import adopt_csv_header

log = logging.getLogger(__name__)

KEY = "hf_lightning_train_log"


def warn_empty_window(step: int, rank: int | None = None) -> None:
    """One WARNING: optimizer step ``step``'s window has no label target (on ``rank``, or on any rank)."""
    where = "on any rank" if rank is None else f"on rank {rank}"
    log.warning(
        "optimizer step %d: its accumulation window has no label targets %s (every label is -100): its loss "
        "is 0 and its gradient zero (the optimizer still steps, so weight decay and momentum still move "
        "weights)",
        step,
        where,
    )


class TrainLog:
    """Mixin of :class:`~hf_lightning.HFLightningModule` (a ``LightningModule``): the ``train/loss`` rows.

    ``training_step`` hands each micro-batch's logged share to :meth:`add_window_share`; at the end of every
    optimizer step the window's loss joins the row, and a log step writes the row (``train/loss``: the mean
    over the steps since the last row and over ranks; ``lr``; ``grad_norm``; ``epoch``; a callback's
    :meth:`add_train_metrics`).
    """

    def _init_train_log(self) -> None:
        self._window_loss: torch.Tensor | None = None
        self._loss_since_log: list[torch.Tensor] = []
        self._unchecked_counts: list[tuple[int, torch.Tensor]] = []
        self._last_lr: float | None = None
        self._last_grad_norm: torch.Tensor | None = None
        self._extra_train_metrics: dict[str, float] = {}
        self._bar_loss: float | None = None
        #: the newest value of every metric written to the loggers (``final_metrics.json`` is built from it)
        self.last_logged: dict[str, float] = {}
        self._steps_seen = 0
        self._step_epoch: int | None = None
        self._step_skipped = False  # the optimizer step being taken was skipped (skip_step_in_log)
        self._skipped_since_log = 0  # skipped steps since the last row (they still make a row due)

    # ----------------------------------------------------------------------------------- accumulating
    def add_window_share(self, share: torch.Tensor) -> None:
        """Add one micro-batch's logged share (detached, 0-dim) to the loss of its optimizer step's window."""
        self._window_loss = share if self._window_loss is None else self._window_loss + share

    def check_window_count(self, step: int, count: torch.Tensor) -> None:
        """Warn at the next row if the window count of optimizer step ``step`` (summed across ranks) is 0."""
        self._unchecked_counts.append((step, count))

    def add_train_metrics(self, metrics: Mapping[str, float]) -> None:
        """Add ``metrics`` (host floats) to the next train log row, so that a callback's figures for a step
        share the row of ``train/loss`` (e.g. :class:`~hf_lightning.callbacks.Throughput`)."""
        self._extra_train_metrics.update(metrics)

    def skip_step_in_log(self) -> None:
        """The optimizer step being taken is skipped (no update): its window loss and gradient norm stay out
        of the train log. Called by :class:`~hf_lightning.callbacks.NonFiniteGuard` between ``backward`` and
        ``optimizer.step`` (in ``on_before_optimizer_step``, which runs before this module's)."""
        self._step_skipped = True

    def is_log_step(self, step: int) -> bool:
        """Whether the train row is written after optimizer step ``step`` (1-based): every
        ``trainer.log_every_n_steps`` steps across epochs (HF's ``logging_steps``), at ``max_steps``, and
        after the first step with ``logging_first_step``."""
        trainer = self.trainer
        if step == 1 and self.logging_first_step:  # HF's logging_first_step (set by HFSteps)
            return True
        return step % max(trainer.log_every_n_steps, 1) == 0 or step >= trainer.max_steps > 0

    def wants_grad_norm(self) -> bool:
        """Whether the optimizer step being taken is logged (its row, or the final flush after an epoch's last
        batch): only then is ``grad_norm`` worth a pass over every gradient."""
        return self.is_log_step(self.global_step + 1) or bool(self.trainer.is_last_batch)

    # ---------------------------------------------------------------------------------- step bounds
    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        self._last_lr = optimizer.param_groups[0]["lr"]  # the rate this step uses (read before the scheduler)
        # read only by the log row of this step: a pass over every gradient on the other steps would be
        # wasted; a skipped step has none
        wanted = self.wants_grad_norm() and not self._step_skipped
        self._last_grad_norm = self.step_gradient_norm(optimizer) if wanted else None

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.global_step != self._steps_seen:  # else still accumulating, or a checkpoint ended the step
            self._end_step()
        if self._bar_loss is not None:  # the progress bar shows the newest row (self.log: not from a save)
            self.log("train/loss", self._bar_loss, prog_bar=True, logger=False, on_step=True, on_epoch=False)
            self._bar_loss = None

    def _end_step(self) -> None:
        """The bookkeeping of a finished optimizer step: its window loss joins the next row; a log step
        writes it."""
        self._steps_seen = self.global_step
        # the epoch of the step's batches: by the final flush (on_train_end) Lightning has already counted the
        # epoch a stop or the last batch ended, and the row would show the next one
        self._step_epoch = self.current_epoch
        self._grad_norm.reset()
        if self._step_skipped:
            self._skipped_since_log += 1
        elif self._window_loss is not None:
            self._loss_since_log.append(self._window_loss)
        self._window_loss = None
        self._step_skipped = False
        if self.is_log_step(self.global_step):
            self.flush_train_log()

    def on_train_end(self) -> None:
        if getattr(self, "preempted", None):
            return  # stopped on a signal: the losses since the last row are in last.ckpt, the resume goes on
        self.flush_train_log(progress_bar=False)  # the steps since the last log boundary

    # -------------------------------------------------------------------------------------- writing
    def flush_train_log(self, progress_bar: bool = True) -> None:
        """Write the row of the steps since the last one (nothing when there are none); every rank must call
        it (the mean over ranks is a collective)."""
        if self._unchecked_counts:
            steps = [s for s, c in self._unchecked_counts]
            counts = torch.stack([c for s, c in self._unchecked_counts]).tolist()
            self._unchecked_counts = []
            if self.trainer.is_global_zero:
                for step, n in zip(steps, counts):
                    if n == 0:
                        warn_empty_window(step)
        if not self._loss_since_log and not self._skipped_since_log:
            return
        # every rank skips the same steps (the guard's verdict is all-reduced): the same branch on every rank
        loss = torch.stack(self._loss_since_log).mean() if self._loss_since_log else None
        self._loss_since_log, self._skipped_since_log = [], 0
        if loss is not None and self.trainer.world_size > 1:
            # training_step logs each rank's share times world size: the mean over ranks is the window loss
            loss = self.trainer.strategy.reduce(loss, reduce_op="mean")
        metrics = {"train/loss": loss.item() if loss is not None else None, "lr": self._last_lr}
        if self._last_grad_norm is not None:
            metrics["grad_norm"] = self._last_grad_norm.item()
        metrics["epoch"] = self._step_epoch if self._step_epoch is not None else self.current_epoch
        metrics.update(self._extra_train_metrics)
        self._extra_train_metrics = {}
        metrics = {k: v for k, v in metrics.items() if v is not None}  # an empty cell, not a NaN
        if progress_bar:
            self._bar_loss = metrics.get("train/loss")
        self.log_to_loggers(metrics)
        if self.trainer.is_global_zero and self.trainer.progress_bar_callback is None:
            self._say_row(metrics)  # no bar shows it (output to a file): the row as a log line, as HF prints

    def _say_row(self, metrics: Mapping[str, float]) -> None:
        """One INFO line per ``train/loss`` row: ``step 4 of 20: train/loss=5.9149 lr=0.00045
        grad_norm=2.061 epoch=0`` (HF ``Trainer`` prints the same dict every ``logging_steps``). The total is
        the run's planned optimizer steps (``trainer.max_epochs`` with ``trainer.max_steps=-1`` too); a stream
        of unknown length gives none."""
        total = getattr(self, "planned_steps", None) or self.trainer.max_steps
        step = f"step {self.global_step}" + (f" of {total}" if total and total > 0 else "")
        values = " ".join(f"{k}={v:.5g}" for k, v in metrics.items() if k != "epoch")
        log.info("%s: %s epoch=%d", step, values, int(metrics.get("epoch", 0)))

    def log_to_loggers(self, metrics: Mapping[str, float | None], step: int | None = None) -> None:
        """Write one row to every logger at ``step`` (default: optimizer steps done, HF's ``global_step``);
        ``None`` values are left out. The one place where hf_lightning writes metrics to the loggers: the
        ``train/loss`` rows, the evaluation rows (:mod:`~hf_lightning.module.eval_steps`) and the
        :class:`~hf_lightning.callbacks.NonFiniteGuard` counters.

        Why not ``self.log`` (what Lightning's ``_LoggerConnector`` does with it):

        - Lightning writes a step's logged values after every ``on_train_batch_end`` hook has run, i.e. after
          ``ModelCheckpoint`` / ``Preemption`` saved the checkpoint of that step. The row of step N must be on
          disk before checkpoint N: a kill between the two would resume from N without its row (the i15 kill
          harness's ``after_save`` point). Here the row is written from ``on_save_checkpoint`` first.
        - Lightning writes only when ``(batches_that_stepped + 1) % log_every_n_steps == 0`` or on
          ``should_stop``: the rows of ``max_steps`` and of HF's ``logging_first_step`` would be dropped, and
          it refuses ``self.log`` in ``on_train_end`` (the final flush) and in ``on_save_checkpoint``.
        - Its step is ``batches_that_stepped``, one less than HF's inside ``on_train_batch_end`` and for a
          validation inside ``fit``; the explicit ``"step"`` key that fixes it is also copied into
          ``trainer.callback_metrics`` (hence ``final_metrics.json``) and the dicts ``trainer.validate()``
          returns, and without it Lightning adds an ``epoch`` column to the evaluation rows.

        The cost is the same as Lightning's: one ``log_metrics`` and one ``save`` per row, on log steps only
        (Lightning's ``log_metrics`` also calls ``save`` after every write), plus the first line of a CSV
        logger's file read (:func:`~hf_lightning.run.loggers.adopt_csv_header`: a ``trainer.test`` under
        ``ddp_spawn`` writes from a new process whose logger has not seen the training columns)."""
        clean = {k: float(v) for k, v in metrics.items() if v is not None}
        self.last_logged.update(clean)
        for logger in self.loggers:
            adopt_csv_header(logger)
            logger.log_metrics(clean, step=self.global_step if step is None else step)
            logger.save()

    @property
    def has_pending_train_log(self) -> bool:
        """Whether losses were accumulated since the last ``train/loss`` row (a final row is due)."""
        return bool(self._loss_since_log or self._skipped_since_log)

    # ---------------------------------------------------------------------------------- checkpoints
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        trainer = self.trainer
        if trainer.training and self.global_step != self._steps_seen:
            # the callbacks' on_train_batch_end (where checkpoints are saved) run before ours
            self._end_step()
        pending = torch.stack(self._loss_since_log).float() if self._loss_since_log else torch.zeros(0)
        if trainer.world_size > 1:
            # every rank holds its own share of each step's loss: rank 0 writes the checkpoint for all of them
            pending = trainer.strategy.all_gather(pending.to(self.device)).reshape(trainer.world_size, -1)
        else:
            pending = pending.reshape(1, -1)
        grad_norm = self._last_grad_norm
        checkpoint[KEY] = {
            "loss_since_log": pending.detach().cpu(),
            "skipped_since_log": self._skipped_since_log,
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
        trainer = attached_trainer(self)
        world = trainer.world_size if trainer is not None else 1
        rank = trainer.global_rank if trainer is not None else 0
        # the same ranks: each its own values; another world size: the mean over ranks, so the logged mean is
        # kept
        row = pending[rank] if pending.shape[0] == world else pending.mean(0)
        self._loss_since_log = list(row.to(self.device).unbind(0))
        self._skipped_since_log = int(state.get("skipped_since_log", 0))
        self._last_lr = state.get("lr")
        norm = state.get("grad_norm")
        self._last_grad_norm = torch.tensor(norm) if norm is not None else None
        self._step_epoch = state.get("epoch")
        self.last_validated_step = state.get("last_validated_step")
