"""HF ``TrainingArguments``' run-level names, top level of our config, with HF's semantics.

Why top level: these keys say *when* things happen over the whole run (in optimizer steps), which is neither a
``lightning.Trainer`` argument (``trainer.val_check_interval`` counts micro-batches and restarts each epoch)
nor one callback's (evaluation, saving, logging and the best model are decided together, as HF's
``DefaultFlowCallback`` does). HF users write them flat, so flat they stay, under HF's names.

:data:`HF_RUN_KEYS` is the whole list. Every key defaults to "not given" (``null``, ``false``), and then
Lightning's own knobs (``trainer.val_check_interval``, ``trainer.log_every_n_steps``,
``callbacks.model_checkpoint.every_n_train_steps``) decide, as before. :func:`resolve_schedule` checks the
keys and turns them into a :class:`StepSchedule`; :func:`apply_schedule` makes Lightning's knobs step aside.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, open_dict

from hf_lightning.core.errors import ConfigError

log = logging.getLogger(__name__)

# the top-level keys with HF's names and semantics (the config's closed top level lists them)
HF_RUN_KEYS = (
    "eval_strategy",
    "eval_steps",
    "save_strategy",
    "save_steps",
    "logging_steps",
    "logging_first_step",
    "load_best_model_at_end",
    "metric_for_best_model",
    "greater_is_better",
)
STRATEGIES = ("steps", "epoch", "no")
# Lightning's knobs that the HF keys replace: given together on the command line, the user meant two things
EVAL_KNOBS = ("trainer.val_check_interval", "trainer.check_val_every_n_epoch")
LOG_KNOBS = ("trainer.log_every_n_steps",)
SAVE_KNOBS = ("callbacks.model_checkpoint.every_n_train_steps",)


@dataclass(frozen=True)
class StepSchedule:
    """When to evaluate, save and log, as HF ``TrainingArguments`` say it (``None``: Lightning's knobs
    decide).

    ``*_steps`` may be a ratio (a float in (0, 1)) of the run's optimizer steps, resolved by :meth:`steps`
    as HF's ``TrainerState.compute_steps`` does: ``ceil(max_steps * ratio)``.
    """

    eval_strategy: str | None = None
    eval_steps: float | None = None
    save_strategy: str | None = None
    save_steps: float | None = None
    logging_steps: float | None = None
    logging_first_step: bool = False

    def steps(self, kind: str, max_steps: int) -> int | None:
        """``eval_steps``, ``save_steps`` or ``logging_steps`` (``kind``: ``eval``, ``save``, ``logging``) in
        optimizer steps for a run of ``max_steps`` steps."""
        value = getattr(self, f"{kind}_steps")
        if value is None:
            return None
        return math.ceil(max_steps * value) if value < 1 else int(value)


def _steps_value(key: str, value: Any) -> list[str]:
    if value is None:
        return []
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        return [
            f"{key}={value!r}: allowed values: null, an integer >= 1, or a ratio in (0, 1) of the run's steps"
        ]
    if value > 1 and value != int(value):
        return [
            f"{key}={value!r}: a value above 1 must be a whole number of optimizer steps (HF refuses it too)"
        ]
    return []


def _strategy(key: str, value: Any) -> list[str]:
    if value is None or value in STRATEGIES:
        return []
    if key == "save_strategy" and value == "best":
        return [
            "save_strategy='best' is not supported: use save_strategy=steps or epoch with "
            "load_best_model_at_end=true (checkpoints/best.ckpt holds the best one)"
        ]
    return [f"{key}={value!r}: allowed values: null, {', '.join(STRATEGIES)}"]


def resolve_schedule(cfg: Mapping[str, Any], given: Iterable[str] | None = None) -> StepSchedule:
    """Check the HF run-level keys of a composed config and resolve their defaults as HF does.

    - ``eval_steps`` alone means ``eval_strategy=steps``; ``eval_strategy=steps`` without ``eval_steps`` takes
      ``logging_steps`` (HF's fallback); ``save_steps`` alone means ``save_strategy=steps``.
    - With an evaluation schedule and no save schedule, checkpoints follow the evaluations (our default saves
      after every validation).
    - ``load_best_model_at_end=true`` needs an evaluation schedule whose strategy the saves share and, for
      ``steps``, ``save_steps`` a multiple of ``eval_steps`` (HF's own checks).

    Args:
        cfg: the composed config (a mapping).
        given: the keys given on the command line (``None``: unknown, no clash check).

    Raises:
        ConfigError: a bad value, a key that would be ignored (``eval_steps`` with ``eval_strategy=epoch``),
            an HF key given together with the Lightning knob it replaces, or a ``load_best_model_at_end`` HF
            refuses.
    """
    errors: list[str] = []
    get = cfg.get
    for key in ("eval_strategy", "save_strategy"):
        errors += _strategy(key, get(key))
    for key in ("eval_steps", "save_steps", "logging_steps"):
        errors += _steps_value(key, get(key))
    for key in ("logging_first_step", "load_best_model_at_end"):
        if not isinstance(get(key) or False, bool):
            errors.append(f"{key}={get(key)!r}: allowed values: true, false")
    if errors:
        raise ConfigError("; ".join(errors))

    eval_strategy, eval_steps = get("eval_strategy"), get("eval_steps")
    save_strategy, save_steps = get("save_strategy"), get("save_steps")
    logging_steps = get("logging_steps")
    if eval_strategy is None and eval_steps is not None:
        eval_strategy = "steps"
    if eval_strategy == "steps" and eval_steps is None:
        if logging_steps is None:
            errors.append("eval_strategy=steps needs eval_steps (or logging_steps, which HF falls back to)")
        eval_steps = logging_steps
    if save_strategy is None and save_steps is not None:
        save_strategy = "steps"
    if save_strategy == "steps" and save_steps is None:
        errors.append("save_strategy=steps needs save_steps")
    for strategy, name in ((eval_strategy, "eval"), (save_strategy, "save")):
        if strategy in ("epoch", "no") and get(f"{name}_steps") is not None:
            errors.append(
                f"{name}_steps={get(f'{name}_steps')} with {name}_strategy={strategy}: the steps would be "
                f"ignored; drop {name}_steps or set {name}_strategy=steps"
            )
    if save_strategy is None and eval_strategy in ("steps", "epoch"):
        save_strategy, save_steps = eval_strategy, eval_steps
        log.info(
            "checkpoints follow the evaluations (%s): set save_strategy / save_steps for another schedule",
            ("every step" if eval_steps == 1 else f"every {eval_steps} steps")
            if eval_strategy == "steps"
            else "every epoch",
        )
    if get("load_best_model_at_end"):
        errors += _load_best_errors(eval_strategy, eval_steps, save_strategy, save_steps)
    if given is not None:
        errors += _clashes(set(given), cfg)
    if errors:
        raise ConfigError("; ".join(errors))
    return StepSchedule(
        eval_strategy, eval_steps, save_strategy, save_steps, logging_steps, bool(get("logging_first_step"))
    )


def _load_best_errors(eval_strategy: Any, eval_steps: Any, save_strategy: Any, save_steps: Any) -> list[str]:
    if eval_strategy in (None, "no"):
        return [
            "load_best_model_at_end=true needs evaluations to choose from: set eval_strategy=steps with "
            "eval_steps=N, or eval_strategy=epoch"
        ]
    if save_strategy != eval_strategy:
        return [
            f"load_best_model_at_end=true needs save_strategy equal to eval_strategy (got {save_strategy} "
            f"and {eval_strategy}), as HF requires"
        ]
    if eval_strategy == "steps" and (eval_steps < 1) != (save_steps < 1):
        return [
            f"load_best_model_at_end=true with save_steps={save_steps} and eval_steps={eval_steps}: mixing a "
            "ratio and a step count cannot guarantee saves at evaluation steps; give both the same kind"
        ]
    if eval_strategy == "steps" and round(save_steps * 1_000_000) % round(eval_steps * 1_000_000):
        return [
            f"load_best_model_at_end=true needs save_steps={save_steps} to be a multiple of "
            f"eval_steps={eval_steps} (HF's rule: the best model must be a saved one)"
        ]
    return []


def _clashes(given: set[str], cfg: Mapping[str, Any]) -> list[str]:
    errors = []
    pairs = (
        (("eval_strategy", "eval_steps"), EVAL_KNOBS),
        (("logging_steps",), LOG_KNOBS),
        (("save_strategy", "save_steps"), SAVE_KNOBS),
    )
    for ours, knobs in pairs:
        hf = [k for k in ours if cfg.get(k) is not None]
        for knob in knobs:
            if hf and knob in given:  # given_keys drops the +, ++ and ~ prefixes
                errors.append(
                    f"{hf[0]}={cfg.get(hf[0])} and {knob} are both given: {hf[0]} counts optimizer steps "
                    f"over the whole run (HF's semantics) and replaces {knob}; drop one"
                )
    return errors


def is_active(schedule: StepSchedule) -> bool:
    """Whether any HF key takes over from Lightning's knobs."""
    return any(
        v is not None for v in (schedule.eval_strategy, schedule.save_strategy, schedule.logging_steps)
    ) or bool(schedule.logging_first_step)


def apply_schedule(cfg: DictConfig, schedule: StepSchedule) -> None:
    """Make Lightning's knobs step aside for the HF keys the schedule uses (in place).

    - an evaluation schedule: ``trainer.val_check_interval=null`` and ``trainer.check_val_every_n_epoch=1``
      (every epoch may validate; :class:`~hf_lightning.callbacks.hf_steps.HFSteps` picks the steps);
      ``eval_strategy=no``: ``trainer.limit_val_batches=0`` (no validation, the final one included);
    - a save schedule: ``callbacks.model_checkpoint.every_n_train_steps=null`` (``HFSteps`` triggers the
      saves);
    - ``logging_steps``: ``trainer.log_every_n_steps`` (already counted in optimizer steps over the run by
      :class:`~hf_lightning.HFLightningModule`); a ratio is resolved when the run's length is known.
    """
    with open_dict(cfg):
        if schedule.eval_strategy == "no":
            cfg.trainer.limit_val_batches = 0
        elif schedule.eval_strategy is not None:
            cfg.trainer.val_check_interval = None
            cfg.trainer.check_val_every_n_epoch = 1
        checkpoint = (cfg.get("callbacks") or {}).get("model_checkpoint")
        if schedule.save_strategy is not None and checkpoint is not None:
            checkpoint.every_n_train_steps = None
        if schedule.logging_steps is not None and schedule.logging_steps >= 1:
            cfg.trainer.log_every_n_steps = int(schedule.logging_steps)


#: the strategy whose checkpoint folders ``load_best_model_at_end`` loads back (``strategy=fsdp``, FSDP2)
FSDP2_TARGET = "hf_lightning.strategies.fsdp_strategy"


def load_best_problem(strategy: Any) -> str | None:
    """Why ``load_best_model_at_end`` cannot run under ``trainer.strategy`` (a composed node or a name), or
    ``None``: FSDP2 (``strategy=fsdp``) loads its ``best.ckpt`` folder back into the sharded model; its
    ``state_dict_type=full`` (one gathered file) and the other sharded strategies (Lightning's FSDP,
    DeepSpeed) do not."""
    target = str(strategy.get("_target_", "") if isinstance(strategy, DictConfig) else strategy)
    if target == FSDP2_TARGET:
        kind = strategy.get("state_dict_type", "sharded")
        if kind == "sharded":
            return None
        return (
            f"load_best_model_at_end=true with strategy.state_dict_type={kind}: the best checkpoint would be "
            "one gathered file, which is not loaded back into the sharded model; use "
            "strategy.state_dict_type=sharded"
        )
    if "fsdp" in target.lower() or "deepspeed" in target.lower():
        return (
            f"load_best_model_at_end=true with trainer.strategy={target}: not supported yet (its "
            "checkpoints are sharded); use strategy=fsdp (FSDP2), or drop load_best_model_at_end and export "
            "checkpoints/best.ckpt yourself"
        )
    return None


def prepare_schedule(cfg: DictConfig) -> StepSchedule | None:
    """The HF run-level keys (``eval_steps``, ``save_steps``, ``logging_steps``, ...) checked, resolved and
    applied to Lightning's knobs (:mod:`hf_lightning.config.hf_args`); ``None`` when none is given.

    Raises:
        ConfigError: a bad value, a clash with the Lightning knob it replaces, or ``load_best_model_at_end``
            under a strategy whose best checkpoint is not loaded back (:func:`load_best_problem`).
    """
    from hf_lightning.config.run_length import command_line_overrides, given_keys

    overrides = command_line_overrides()
    schedule = resolve_schedule(cfg, given_keys(overrides) if overrides is not None else None)
    if cfg.get("load_best_model_at_end"):
        problem = load_best_problem(cfg.trainer.get("strategy"))
        if problem:
            raise ConfigError(problem)
    if not is_active(schedule):
        return None
    apply_schedule(cfg, schedule)
    return schedule
