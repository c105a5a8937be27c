"""The train log of :class:`~hf_lightning.HFLightningModule`: window losses since the last row, HF's
``logging_steps``.

Ours rather than ``self.log`` (the measured reasons are in ``HFLightningModule.log_to_loggers``, the one
place that writes): HF's ``loss`` is the mean of the *window* losses of the optimizer steps since the previous
row (not of micro-batch values), written every ``trainer.log_every_n_steps`` optimizer steps counted across
epochs, with ``step`` = optimizer steps done; and the row survives a stop:

- the losses accumulated since the last row (every rank's, gathered), the ``lr``/``grad_norm``/``epoch`` of
  the newest step and the step whose validation was logged last are saved with each checkpoint and restored on
  resume (:meth:`TrainRows.state_dict`, :meth:`TrainRows.load_state_dict`, called from the module's
  ``on_save_checkpoint`` / ``on_load_checkpoint``);
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

:class:`TrainRows` holds what the next row is made of; ``HFLightningModule``'s hooks feed it and write the row
(:func:`say_row` is its log line).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping
from typing import Any

import torch

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


class TrainRows:
    """What the next ``train/loss`` row of :class:`~hf_lightning.HFLightningModule` is made of.

    ``training_step`` adds each micro-batch's logged share (:meth:`add_share`); when an optimizer step ends
    (:meth:`end_step`) its window loss joins the row, unless the step was skipped (:attr:`step_skipped`);
    :meth:`take_loss` and :meth:`metrics` empty it into a row.

    Attributes:
        lr: the learning rate the newest optimizer step used.
        grad_norm: its gradient norm before clipping (0-dim tensor; ``None`` when the step is not logged or
            was skipped).
        epoch: HF's ``state.epoch`` at the newest ended step, the fraction of epochs done (``1.5`` half way
            through the second; :func:`epoch_fraction`; ``None`` before the first).
        step_skipped: the optimizer step being taken is skipped (``NonFiniteGuard``): no update.
        extra: a callback's figures for the next row (host floats).
        bar_loss: the newest row's loss, for the progress bar (``None`` once shown).
    """

    def __init__(self) -> None:
        self.window_loss: torch.Tensor | None = None
        self.losses: list[torch.Tensor] = []  # window losses of the applied steps since the last row
        self.skipped = 0  # skipped steps since the last row (they still make a row due)
        self.unchecked_counts: list[tuple[int, torch.Tensor]] = []
        self.lr: float | None = None
        self.grad_norm: torch.Tensor | None = None
        self.epoch: float | None = None
        self.step_skipped = False
        self.extra: dict[str, float] = {}
        self.bar_loss: float | None = None

    def add_share(self, share: torch.Tensor) -> None:
        """Add one micro-batch's logged share (detached, 0-dim) to the loss of its optimizer step's window."""
        self.window_loss = share if self.window_loss is None else self.window_loss + share

    def end_step(self, epoch: float) -> None:
        """The optimizer step ended, with ``epoch`` epochs done (:func:`epoch_fraction`): its window loss
        joins the row (a skipped step only counts)."""
        self.epoch = epoch
        if self.step_skipped:
            self.skipped += 1
        elif self.window_loss is not None:
            self.losses.append(self.window_loss)
        self.window_loss = None
        self.step_skipped = False

    @property
    def pending(self) -> bool:
        """Whether steps ended since the last row (a row is due)."""
        return bool(self.losses or self.skipped)

    def warn_empty_windows(self, speaks: bool) -> None:
        """Read the window counts summed across ranks since the last row (one host sync) and warn, when
        ``speaks``, of each that is 0."""
        if not self.unchecked_counts:
            return
        steps = [s for s, c in self.unchecked_counts]
        counts = torch.stack([c for s, c in self.unchecked_counts]).tolist()
        self.unchecked_counts = []
        if speaks:
            for step, n in zip(steps, counts):
                if n == 0:
                    warn_empty_window(step)

    def take_loss(self) -> torch.Tensor | None:
        """This rank's mean window loss over the applied steps since the last row (``None`` when every one was
        skipped); the row is emptied."""
        loss = torch.stack(self.losses).mean() if self.losses else None
        self.losses, self.skipped = [], 0
        return loss

    def metrics(self, loss: float | None, current_epoch: int) -> dict[str, float]:
        """The row: ``train/loss``, ``lr``, ``grad_norm``, ``epoch`` (the newest ended step's, else
        ``current_epoch``) and the callbacks' figures; ``None`` values left out (an empty cell, not a NaN)."""
        metrics = {"train/loss": loss, "lr": self.lr}
        if self.grad_norm is not None:
            metrics["grad_norm"] = self.grad_norm.item()
        metrics["epoch"] = self.epoch if self.epoch is not None else current_epoch
        metrics.update(self.extra)
        self.extra = {}
        return {k: v for k, v in metrics.items() if v is not None}

    def pending_losses(self) -> torch.Tensor:
        """The window losses since the last row, float ``(steps,)`` (what a checkpoint keeps)."""
        return torch.stack(self.losses).float() if self.losses else torch.zeros(0)

    def state_dict(self, losses: torch.Tensor) -> dict[str, Any]:
        """The checkpoint's state: ``losses`` ``(ranks, steps)`` (:meth:`pending_losses` of every rank), the
        skipped steps, and the newest step's ``lr``, ``grad_norm`` and ``epoch``."""
        grad_norm = self.grad_norm
        return {
            "loss_since_log": losses.detach().cpu(),
            "skipped_since_log": self.skipped,
            "lr": self.lr,
            "grad_norm": float(grad_norm) if grad_norm is not None else None,
            "epoch": self.epoch,
        }

    def load_state_dict(self, state: Mapping[str, Any], rank: int, world: int, device: torch.device) -> None:
        """Restore :meth:`state_dict` on rank ``rank`` of ``world``: the same ranks each take their own
        losses; another world size the mean over ranks, so the logged mean is kept."""
        pending = state["loss_since_log"]
        row = pending[rank] if pending.shape[0] == world else pending.mean(0)
        self.losses = list(row.to(device).unbind(0))
        self.skipped = int(state.get("skipped_since_log", 0))
        self.lr = state.get("lr")
        norm = state.get("grad_norm")
        self.grad_norm = torch.tensor(norm) if norm is not None else None
        self.epoch = state.get("epoch")


def epoch_fraction(
    epoch: int,
    windows_done: int,
    windows_per_epoch: float,
    micro_batches_per_epoch: int | None = None,
    accumulation: int = 1,
) -> float:
    """HF ``Trainer``'s ``state.epoch`` after an optimizer step: ``epoch + (step + 1) / steps_in_epoch``, with
    ``step`` the index of the step's last micro-batch in the epoch and ``steps_in_epoch`` the epoch's
    micro-batches (its train loader's length).

    Args:
        epoch: the 0-based epoch the step's batches belong to.
        windows_done: optimizer steps (accumulation windows) done in this epoch, this one included.
        windows_per_epoch: the epoch's windows (Lightning's ``num_training_batches``; ``inf``: unknown).
        micro_batches_per_epoch: the epoch's micro-batches (``None``: count in windows).
        accumulation: micro-batches per window (the last of an epoch may hold fewer).

    The epoch's last window ends at ``epoch + 1`` exactly; of an epoch of unknown length, ``epoch``. An epoch
    cut short (Lightning's ``limit_train_batches``, which HF has not) counts in its own windows.
    """
    if not math.isfinite(windows_per_epoch) or windows_per_epoch <= 0:
        return float(epoch)
    if windows_done >= windows_per_epoch:
        return float(epoch + 1)
    if micro_batches_per_epoch:
        micro = min(micro_batches_per_epoch, windows_per_epoch * accumulation)
        return epoch + min(windows_done * accumulation, micro) / micro
    return epoch + windows_done / windows_per_epoch


def clock(seconds: float) -> str:
    """``seconds`` as tqdm (and HF ``Trainer``'s bar) shows them: ``MM:SS``, ``H:MM:SS`` from an hour."""
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


class StepClock:
    """Elapsed time and an estimate of the time left, as HF ``Trainer``'s tqdm bar shows them
    (``elapsed<remaining``).

    The elapsed time counts from :meth:`start` (this command's training). The time left is the optimizer steps
    left times the mean time of the steps ended in this command after its first one (the first carries the
    warm-up: compilation, the first loader workers), so it is known from the second ended step on;
    validations during training count in the mean as they do in the remaining run.
    """

    #: steps ended in this command before the time left is estimated
    WARMUP_STEPS = 2

    def __init__(self, timer: Any = time.monotonic) -> None:
        self.timer = timer  # seconds, monotonic
        self.started: float | None = None
        self.first: tuple[float, int] | None = None  # (time, step) at the end of the first step

    def start(self) -> None:
        self.started, self.first = self.timer(), None

    def step_ended(self, step: int) -> None:
        if self.first is None:
            self.first = (self.timer(), step)

    def remaining(self, step: int, total: int | None) -> float | None:
        """Seconds left after optimizer step ``step`` of ``total``; ``None`` while unknown."""
        if self.first is None or not total or total <= 0:
            return None
        since, first_step = self.first
        done = step - first_step
        if done < max(self.WARMUP_STEPS - 1, 1):
            return None
        return max(total - step, 0) * (self.timer() - since) / done

    def text(self, step: int, total: int | None) -> str | None:
        """``[elapsed<remaining]`` at optimizer step ``step`` of ``total`` (``?`` while the time left is not
        known: too few steps, or no total); ``None`` before :meth:`start`."""
        if self.started is None:
            return None
        left = self.remaining(step, total)
        return f"[{clock(self.timer() - self.started)}<{'?' if left is None else clock(left)}]"


def say_row(metrics: Mapping[str, float], step: int, total: int | None, timing: str | None = None) -> None:
    """One INFO line per ``train/loss`` row: ``step 4 of 20 [00:12<00:48]: train/loss=5.9149 lr=0.00045
    grad_norm=2.061 epoch=0.4`` (HF ``Trainer`` prints the same dict every ``logging_steps``, its bar the
    elapsed and remaining time); ``total``: the run's planned optimizer steps (``None`` or <= 0: unknown, not
    shown); ``timing``: :meth:`StepClock.text`."""
    where = (
        f"step {step}" + (f" of {total}" if total and total > 0 else "") + (f" {timing}" if timing else "")
    )
    values = " ".join(f"{k}={v:.5g}" for k, v in metrics.items() if k != "epoch")
    log.info("%s: %s epoch=%.4g", where, values, float(metrics.get("epoch", 0)))
