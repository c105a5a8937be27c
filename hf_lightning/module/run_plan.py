"""How many optimizer steps a run takes, how many of them close a short accumulation window, and the log lines
that say so.

Each training batch is one accumulation window of ``k = data.gradient_accumulation_steps`` micro-batches, cut
per epoch, so an epoch of ``B`` micro-batches takes ``ceil(B / k)`` steps and, when ``B % k != 0``, its last
window holds ``B % k`` micro-batches (HF ``Trainer`` cuts its windows per epoch the same way);
``trainer.limit_train_batches`` counts windows. The run ends at ``trainer.max_steps`` or after
``trainer.max_epochs`` epochs, whichever comes first.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

from hf_lightning.core.arguments import counted

log = logging.getLogger(__name__)

INF = float("inf")


@dataclass(frozen=True)
class RunPlan:
    """The step counts of one run, per process.

    Attributes:
        batches_per_epoch: micro-batches per epoch on this process (``inf``: a stream of unknown length).
        accumulation: ``gradient_accumulation_steps``.
        steps_per_epoch: optimizer steps per epoch, ``ceil(batches_per_epoch / accumulation)``.
        epoch_steps: steps the epoch limit allows (``inf`` without one).
        max_steps: ``trainer.max_steps`` (``-1``: none).
        total_steps: the run's optimizer steps, the length of the learning-rate schedule.
    """

    batches_per_epoch: float
    accumulation: int
    steps_per_epoch: float
    epoch_steps: float
    max_steps: int
    total_steps: float

    @property
    def short_window(self) -> int:
        """Micro-batches in the last window of an epoch when it is shorter than ``accumulation`` (else 0)."""
        if not math.isfinite(self.batches_per_epoch) or self.steps_per_epoch * self.accumulation < (
            self.batches_per_epoch
        ):
            return (
                0  # a stream of unknown length, or limit_train_batches ends the epoch before its last window
            )
        return int(self.batches_per_epoch) % self.accumulation

    @property
    def short_steps(self) -> int:
        """Optimizer steps of the run that close a short window: the last step of each epoch the run
        reaches."""
        if not self.short_window or not math.isfinite(self.total_steps):
            return 0
        return int(self.total_steps // self.steps_per_epoch)


def plan_run(
    batches_per_epoch: float,
    accumulation: int,
    max_epochs: int | None,
    max_steps: int,
    limit: int | float | None = None,
) -> RunPlan:
    """The :class:`RunPlan` of ``batches_per_epoch`` micro-batches per epoch (``inf`` if unknown) with
    Lightning's resolved limits (``max_epochs`` ``-1`` or ``None``: no epoch limit; ``max_steps`` ``-1``: no
    step limit; ``limit``: ``trainer.limit_train_batches``, a count or fraction of an epoch's windows).

    Example: 5 micro-batches per epoch, accumulation 2, 2 epochs: windows of 2, 2, 1 per epoch, 3 steps per
    epoch, 6 in all, 2 of them short.
    """
    steps_per_epoch = math.ceil(batches_per_epoch / accumulation) if math.isfinite(batches_per_epoch) else INF
    if isinstance(limit, int):
        steps_per_epoch = min(steps_per_epoch, limit)
    elif limit is not None and steps_per_epoch != INF:
        steps_per_epoch = int(steps_per_epoch * limit)
    epochs = INF if max_epochs in (None, -1) else max(max_epochs, 1)
    epoch_steps = steps_per_epoch * epochs if epochs != INF else INF
    total = min(epoch_steps, max_steps) if max_steps != -1 else epoch_steps
    return RunPlan(batches_per_epoch, accumulation, steps_per_epoch, epoch_steps, max_steps, total)


def report(plan: RunPlan, max_epochs: int | None) -> None:
    """One WARNING for each limit or window the run does not get as configured (call once per fit, on rank 0):
    ``max_epochs`` ending the run before ``max_steps``, and the steps whose window is short."""
    if plan.max_steps != -1 and plan.epoch_steps < plan.max_steps:
        log.warning(
            "trainer.max_epochs=%s ends this run after %s, before trainer.max_steps=%d "
            "(Lightning stops at the first limit reached); set trainer.max_epochs=null to run %d steps",
            max_epochs,
            counted(plan.epoch_steps, "optimizer step"),
            plan.max_steps,
            plan.max_steps,
        )
    if plan.short_steps:
        log.warning(
            "gradient-accumulation windows: data.gradient_accumulation_steps=%d, but an epoch has %d "
            "micro-batches on this process, so its last window holds %d: %d of this run's %s "
            "are short (each normalised by its own target count, as HF Trainer does)",
            plan.accumulation,
            plan.batches_per_epoch,
            plan.short_window,
            plan.short_steps,
            counted(plan.total_steps, "optimizer step"),
        )


def training_steps(trainer: Any) -> float:
    """Optimizer steps of the whole run, for the LR schedule (:func:`plan_run`:
    ``trainer.estimated_stepping_batches``'s formula); logs :func:`report` on rank zero. ``inf`` for a stream
    of unknown length without ``max_steps``.

    Lightning's property builds the train loader through ``fit_loop.setup_data()`` while the optimizers are
    configured, before a checkpoint's loop state is restored; the loader state of a mid-epoch resume is then
    never loaded. Here the length comes from the DataModule (``HFDataModule.train_batches_per_epoch``,
    computed without a loader; another DataModule's own loader), and Lightning's loader is built once, after
    the restore.
    """
    datamodule = trainer.datamodule
    if datamodule is None:
        return trainer.estimated_stepping_batches
    per_epoch = getattr(datamodule, "train_batches_per_epoch", None)  # HFDataModule: no loader is built
    try:
        batches: float | None = per_epoch() if per_epoch is not None else len(datamodule.train_dataloader())
    except TypeError:  # a stream of unknown length
        batches = None
    batches = INF if batches is None else batches
    accumulation = int(getattr(datamodule, "gradient_accumulation_steps", 1) or 1)
    plan = plan_run(batches, accumulation, trainer.max_epochs, trainer.max_steps, trainer.limit_train_batches)
    check_validation_interval(  # a time-based interval leaves Lightning's val_check_interval unset
        getattr(trainer, "val_check_interval", None),
        plan.steps_per_epoch,
        trainer.check_val_every_n_epoch,
        trainer.limit_val_batches,
    )
    if trainer.is_global_zero:
        report(plan, trainer.max_epochs)
    return plan.total_steps


def check_validation_interval(
    interval: Any, batches: float, every_n_epoch: int | None, limit_val_batches: float | None
) -> None:
    """Refuse a ``trainer.val_check_interval`` count larger than an epoch's ``batches`` (training batches,
    i.e. optimizer steps, on this process) while validation counts within epochs (``check_val_every_n_epoch``
    set) and is on: Lightning's ``fit_loop.setup_data`` rule, whose ``ValueError`` would come as a traceback
    once ``fit`` has started.

    Raises:
        ConfigError: the interval, the epoch's batches and the settings that work instead.
    """
    from hf_lightning.core.errors import ConfigError

    on = limit_val_batches is None or limit_val_batches > 0
    if not isinstance(interval, int) or isinstance(interval, bool) or every_n_epoch is None or not on:
        return
    if interval > batches:
        raise ConfigError(
            f"trainer.val_check_interval={interval} is more than the {int(batches)} optimizer steps of an "
            f"epoch on this process, and Lightning counts it within each epoch; use at most {int(batches)}, "
            "a fraction of the epoch (0.5), trainer.check_val_every_n_epoch=null to count steps across "
            f"epochs, or eval_steps={interval} (optimizer steps over the whole run, HF's)"
        )
