"""LR schedules: ``transformers.get_scheduler`` for every ``SchedulerType``, as HF
``Trainer.create_scheduler``.

Steps are optimizer steps. ``scheduler.kwargs`` is HF's ``lr_scheduler_kwargs``
(``scheduler_specific_kwargs``), checked against the schedule function's signature here instead of failing
inside it. ``reduce_lr_on_plateau`` and ``greedy`` are driven by a validation metric, as HF drives them:
stepped once after each validation during training with ``metric_for_best_model`` (default ``eval_loss``),
never per optimizer step (:func:`step_on_validation`).
"""

from __future__ import annotations

import inspect
import logging
import math
from collections.abc import Mapping
from typing import Annotated, Any

import torch

from hf_lightning.core.arguments import NON_NEGATIVE_INT, UNIT_INTERVAL, check_call, counted, one_of
from hf_lightning.core.errors import ConfigError

log = logging.getLogger(__name__)

#: every ``transformers.trainer_utils.SchedulerType`` value (transformers 5.x)
SCHEDULERS = (
    "linear",
    "cosine",
    "cosine_with_restarts",
    "polynomial",
    "constant",
    "constant_with_warmup",
    "inverse_sqrt",
    "reduce_lr_on_plateau",
    "cosine_with_min_lr",
    "cosine_warmup_with_min_lr",
    "warmup_stable_decay",
    "greedy",
)
#: stepped with a validation metric after each validation (HF ``Trainer._evaluate``)
METRIC_DRIVEN = ("reduce_lr_on_plateau", "greedy")
#: get_scheduler passes no warmup to these (HF ignores ``warmup_steps`` for them)
NO_WARMUP = ("constant", "reduce_lr_on_plateau", "greedy")
#: get_scheduler passes no ``scheduler_specific_kwargs`` to these
NO_KWARGS = ("constant", "constant_with_warmup")
#: arguments get_scheduler fills itself
_FILLED = {"optimizer", "num_warmup_steps", "num_training_steps", "last_epoch"}


def _schedule_function(name: str):
    from transformers.optimization import TYPE_TO_SCHEDULER_FUNCTION
    from transformers.trainer_utils import SchedulerType

    return TYPE_TO_SCHEDULER_FUNCTION[SchedulerType(name)]


def _schedule_arguments(name: str) -> set[str] | None:
    """The ``scheduler.kwargs`` keys schedule ``name`` takes (``None``: any, it forwards ``**kwargs``)."""
    fn = _schedule_function(name)
    if name == "reduce_lr_on_plateau":
        fn = torch.optim.lr_scheduler.ReduceLROnPlateau
    elif name == "greedy":
        from transformers.optimization import GreedyLR

        fn = GreedyLR
    params = inspect.signature(fn).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return None
    return {n for n in params if n not in _FILLED}


def build_scheduler(
    optimizer: torch.optim.Optimizer,
    num_training_steps: int,
    name: Annotated[str, one_of(SCHEDULERS)] = "linear",
    warmup_steps: Annotated[int, NON_NEGATIVE_INT] = 0,
    warmup_ratio: Annotated[float, UNIT_INTERVAL] = 0.0,
    kwargs: Mapping[str, Any] | None = None,
):
    """``transformers.get_scheduler(name, optimizer, warmup, num_training_steps,
    scheduler_specific_kwargs=kwargs)``.

    ``warmup_steps`` wins over ``warmup_ratio`` (HF ``TrainingArguments.get_warmup_steps``:
    ``ceil(num_training_steps * warmup_ratio)``). A warmup given to ``constant``, ``reduce_lr_on_plateau`` or
    ``greedy`` (which HF ignores) gets one WARNING, as does a warmup as long as the whole run (the rate would
    never reach ``optim.lr``). ``reduce_lr_on_plateau`` / ``greedy`` return the scheduler
    unstepped: :func:`step_on_validation` steps it.

    Raises:
        ConfigError: an unknown ``name`` (the allowed list in the message), a negative warmup, a ``kwargs``
            key the schedule does not take, ``kwargs`` for ``constant`` / ``constant_with_warmup`` (HF drops
            them), or a value the schedule refuses (e.g. ``cosine_with_min_lr`` without ``min_lr`` /
            ``min_lr_rate``).
    """
    from transformers import get_scheduler

    check_call(build_scheduler, locals(), "scheduler")
    kwargs = dict(kwargs or {})
    if kwargs and name in NO_KWARGS:
        raise ConfigError(
            f"scheduler.kwargs={kwargs} with scheduler.name={name}: this schedule takes none "
            "(HF's get_scheduler drops them); remove scheduler.kwargs"
        )
    accepted = _schedule_arguments(name)
    unknown = sorted(set(kwargs) - accepted) if accepted is not None else []
    if unknown:
        raise ConfigError(
            f"scheduler.kwargs.{unknown[0]}: scheduler.name={name} takes no {unknown[0]!r} "
            f"(it takes: {', '.join(sorted(accepted)) or 'nothing'})"
        )
    warmup = warmup_steps if warmup_steps > 0 else math.ceil(num_training_steps * warmup_ratio)
    if warmup and name in NO_WARMUP:
        log.warning(
            "scheduler.name=%s has no warmup: scheduler.warmup_steps / warmup_ratio (%d steps) are not used "
            "(HF ignores them too)%s",
            name,
            warmup,
            "; constant_with_warmup warms up" if name == "constant" else "",
        )
    elif warmup and math.isfinite(num_training_steps) and warmup >= num_training_steps:
        log.warning(
            "scheduler.warmup_steps / warmup_ratio give %s, the whole run of %s: the learning rate rises "
            "to the end and never reaches optim.lr; lower scheduler.warmup_steps, or set "
            "scheduler.warmup_steps=0 and a scheduler.warmup_ratio",
            counted(warmup, "warm-up step"),
            counted(num_training_steps, "optimizer step"),
        )
    try:
        scheduler = get_scheduler(
            name,
            optimizer,
            num_warmup_steps=warmup,
            num_training_steps=num_training_steps,
            scheduler_specific_kwargs=kwargs,
        )
    except (TypeError, ValueError) as err:
        raise ConfigError(
            f"scheduler.name={name} with scheduler.kwargs={kwargs}: {str(err).splitlines()[0]}"
        ) from err
    _warn_overlong_decay(name, kwargs, warmup, num_training_steps, scheduler)
    return scheduler


def _warn_overlong_decay(
    name: str, kwargs: dict[str, Any], warmup: int, num_training_steps: float, scheduler: Any
) -> None:
    """One WARNING when ``warmup_stable_decay``'s warm-up, stable and decay steps are more than the run: HF's
    schedule then has a negative stable phase and starts the decay part-way through, so the rate falls from
    the warm-up's peak straight to a fraction of ``optim.lr`` (read from the built schedule)."""
    if name != "warmup_stable_decay" or not math.isfinite(num_training_steps):
        return
    decay = kwargs.get("num_decay_steps")
    stable = kwargs.get("num_stable_steps") or 0
    if not isinstance(decay, int) or warmup + stable + decay <= num_training_steps:
        return
    after_warmup = scheduler.lr_lambdas[0](warmup)
    log.warning(
        "scheduler.kwargs.num_decay_steps=%d does not fit the run: %d warm-up%s and %d decay steps are more "
        "than its %s, so the decay starts part-way through and the rate after the warm-up is "
        "%.3g of optim.lr; set scheduler.kwargs.num_decay_steps=%d or lower",
        decay,
        warmup,
        f", {stable} stable" if stable else "",
        decay,
        counted(int(num_training_steps), "optimizer step"),
        after_warmup,
        max(int(num_training_steps) - warmup - stable, 0),
    )


def make_scheduler(scheduler: Any, optimizer: torch.optim.Optimizer, num_training_steps: int) -> Any:
    """The LR schedule of ``HFLightningModule(scheduler=...)``, stepped after every optimizer step (as HF
    steps the scheduler it is given), a metric-driven one after each validation instead.

    Args:
        scheduler: :func:`build_scheduler`'s keyword arguments (``None``: its defaults); a
            ``torch.optim.lr_scheduler`` class or a partial of one (a ``_target_`` node with ``_partial_:
            true``, as lightning-hydra-template's ``scheduler`` nodes), called with the optimizer alone; a
            callable taking ``num_training_steps`` (a partial of ``build_scheduler`` or of HF's
            ``get_cosine_schedule_with_warmup`` ...), given it by name; any other callable, called as
            ``(optimizer, num_training_steps)``.
        num_training_steps: the run's optimizer steps.

    Raises:
        ConfigError: see :func:`build_scheduler`.
    """
    import functools

    if scheduler is None or isinstance(scheduler, Mapping):
        return build_scheduler(optimizer, num_training_steps, **dict(scheduler or {}))
    target = scheduler.func if isinstance(scheduler, functools.partial) else scheduler
    torch_schedules = (torch.optim.lr_scheduler.LRScheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
    if isinstance(target, type) and issubclass(target, torch_schedules):
        return scheduler(optimizer)
    try:
        takes_steps = "num_training_steps" in inspect.signature(scheduler).parameters
    except (TypeError, ValueError):
        takes_steps = False
    if takes_steps:
        return scheduler(optimizer, num_training_steps=num_training_steps)
    return scheduler(optimizer, num_training_steps)


def is_metric_driven(scheduler: Any) -> bool:
    """Whether ``scheduler`` steps on a validation metric (``ReduceLROnPlateau``, HF's ``GreedyLR``)."""
    from transformers.optimization import GreedyLR

    return isinstance(scheduler, (torch.optim.lr_scheduler.ReduceLROnPlateau, GreedyLR))


def metric_key(metric_for_best_model: str | None) -> str:
    """The logged key of HF's ``metric_for_best_model`` (``None``: ``eval_loss``, HF's default for these
    schedules): ``loss`` / ``eval_loss`` -> ``val/loss``; ``val/...`` names pass through."""
    name = metric_for_best_model or "eval_loss"
    return name if "/" in name else "val/" + name.removeprefix("eval_")


def step_on_validation(scheduler: Any, metrics: Mapping[str, float], key: str) -> None:
    """Step a metric-driven scheduler with ``metrics[key]`` (HF ``Trainer._evaluate`` after each evaluation).

    Raises:
        ConfigError: ``key`` not among the validation metrics (the message lists them).
    """
    if key not in metrics:
        raise ConfigError(
            f"metric_for_best_model: {key} drives the learning-rate schedule but validation logged only "
            f"{sorted(k for k in metrics if k.startswith('val/'))}; name one of them"
        )
    scheduler.step(float(metrics[key]))
