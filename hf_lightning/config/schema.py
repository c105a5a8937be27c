"""The schema of a composed config, checked before the model is built.

Config keys equal constructor argument names, so the signature a node's ``_target_`` names is its schema
(generated from it, nothing copied): unknown keys are found by binding (:func:`check_keys`) and value types by
the signature's annotations (``int``, ``float``, ``bool``, ``str``, ``Literal[...]``, unions of them). The top
level is closed too: the groups and :data:`RUN_SETTINGS` (HF ``TrainingArguments`` names get our key for them,
:mod:`hf_lightning.config.hf_names`). Value rules (a batch size >= 1, an optimizer from a closed list) are in
the signatures too (``lr: Annotated[float, FINITE_NON_NEGATIVE]``, :mod:`hf_lightning.core.arguments`), or in
:data:`OVERLAY` for signatures that do not carry them (Lightning's); rules between keys are in
:func:`cross_field_errors`. Every problem found is reported in one
:class:`~hf_lightning.core.errors.ConfigError` whose message names each key, its value and the allowed values.

This is the "equivalent validation pass" to dataclasses in Hydra's ConfigStore: a dataclass per group would
repeat every constructor signature and drift from it; binding the signatures cannot drift.
"""

from __future__ import annotations

import difflib
import inspect
import re
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from hf_lightning.config.cross_fields import cross_field_errors
from hf_lightning.config.hf_args import HF_RUN_KEYS
from hf_lightning.core.arguments import (
    ACCELERATORS,
    MISSING,
    NON_NEGATIVE_INT,
    POSITIVE_INT,
    PRECISIONS,
    Allowed,
    argument_errors,
    devices_ok,
    get_dotted,
    one_of,
    shown,
)
from hf_lightning.core.errors import ConfigError

# The top level of a composed config, one list: the groups (each bound to the signature its ``_target_``
# names) and the run's own settings. A key added at the top level by a new feature goes here.
GROUPS = ("model", "data", "optim", "scheduler", "module", "trainer", "logger", "callbacks", "peft")
RUN_SETTINGS = (
    "seed",
    "required_keys",
    "ckpt_path",
    "resume_weights_only",
    "output_dir",
    "optimized_metric",
    "export",  # export.merge_adapters (with peft)
    *HF_RUN_KEYS,  # eval_steps, save_steps, logging_steps, ... with HF's semantics (hf_args.py)
)
# python -m hf_lightning.evaluate's own switches (conf/evaluate.yaml)
EVALUATE_SETTINGS = ("generate", "max_new_tokens")
# Hydra's own node, present when a config is composed with return_hydra_config=True
HYDRA_KEYS = ("hydra",)


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _num(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _some_training(value: Any) -> bool:
    """``trainer.limit_train_batches``: some batches (Lightning's 0 "trains" 0 steps and reports success)."""
    if value is None:
        return True
    if _int(value):
        return value >= 1
    return isinstance(value, float) and 0 < value <= 1


def _validation_interval(value: Any) -> bool:
    """``trainer.val_check_interval``: training batches, i.e. optimizer steps (an integer >= 1, or a whole
    float Lightning reads as one), a fraction of the epoch in (0, 1], or Lightning's time-based forms (a
    string or a mapping, which Lightning checks)."""
    if value is None or isinstance(value, (str, Mapping)):
        return True
    if _int(value):
        return value >= 1
    return isinstance(value, float) and (0 < value <= 1 or (value > 1 and value.is_integer()))


def _batch_limit(value: Any) -> bool:
    """``trainer.limit_val_batches`` and Lightning's other batch limits: ``null``, a fraction in [0, 1] or a
    count >= 0 (a whole float above 1 is a count, as Lightning reads it)."""
    if value is None:
        return True
    if _int(value):
        return value >= 0
    return isinstance(value, float) and (0 <= value <= 1 or (value > 1 and value.is_integer()))


def _duration(value: Any) -> bool:
    """``trainer.max_time``: ``null``, ``"DD:HH:MM:SS"`` or a mapping of ``timedelta`` fields (Lightning's
    forms)."""
    if value is None or isinstance(value, Mapping):
        return True
    parts = value.strip().split(":") if isinstance(value, str) else []
    return len(parts) == 4 and all(p.isdigit() for p in parts)


# the range of a seed: numpy's (Lightning's seed_everything refuses any other)
SEED_RANGE = (0, 2**32 - 1)
_SEED = Allowed(
    lambda v: _int(v) and SEED_RANGE[0] <= v <= SEED_RANGE[1],
    f"an integer in [{SEED_RANGE[0]}, {SEED_RANGE[1]}] (numpy's seed range, which Lightning's "
    "seed_everything takes)",
)
_BATCH_LIMIT = Allowed(_batch_limit, "null (every batch), a fraction in [0, 1] or a count >= 0")

# Value rules for settings whose signature is not ours to annotate: Lightning's Trainer and callbacks, and the
# run's own top-level keys. Every ``_target_`` of ours carries its rules in its signature
# (``Annotated[..., Allowed]``), read by :func:`node_errors` here and by the constructor itself for a
# Python call.
OVERLAY: dict[str, Allowed] = {
    "trainer.max_steps": Allowed(
        lambda v: _int(v) and (v == -1 or v >= 1), "-1 (no limit) or an integer >= 1"
    ),
    "trainer.max_epochs": Allowed(
        lambda v: v is None or (_int(v) and (v == -1 or v >= 1)), "null, -1 or an integer >= 1"
    ),
    "trainer.num_nodes": POSITIVE_INT,
    "trainer.devices": Allowed(devices_ok, "an integer >= 1, -1, 'auto', or a list of device indices"),
    "trainer.accelerator": one_of(ACCELERATORS),
    "trainer.precision": Allowed(
        lambda v: str(v) in PRECISIONS,
        ", ".join(PRECISIONS)
        + " (HF's bf16: bf16-mixed; HF's fp16: 16-mixed on a GPU, bf16-mixed on the CPU)",
    ),
    "trainer.limit_train_batches": Allowed(
        _some_training,
        "null (every batch), a fraction in (0, 1] or a count >= 1: 0 trains nothing (to only evaluate, use "
        "python -m hf_lightning.evaluate)",
    ),
    "trainer.min_steps": Allowed(lambda v: v is None or (_int(v) and v >= 0), "null or an integer >= 0"),
    "trainer.min_epochs": Allowed(lambda v: v is None or (_int(v) and v >= 0), "null or an integer >= 0"),
    # Lightning divides by these: 0 fails at the end of the first step, a negative value validates or logs
    # at every step
    "trainer.val_check_interval": Allowed(
        _validation_interval,
        "null (once per epoch), an integer >= 1 (optimizer steps: each training batch is one; eval_steps "
        "counts them over the whole run), a fraction of the epoch in (0, 1], or a time ('DD:HH:MM:SS'); no "
        "validation: trainer.limit_val_batches=0",
    ),
    "trainer.check_val_every_n_epoch": Allowed(
        lambda v: v is None or (_int(v) and v >= 1),
        "null (trainer.val_check_interval counts optimizer steps across epochs) or an integer >= 1; no "
        "validation: "
        "trainer.limit_val_batches=0",
    ),
    "trainer.log_every_n_steps": POSITIVE_INT,
    "trainer.num_sanity_val_steps": Allowed(
        lambda v: _int(v) and v >= -1, "-1 (every validation batch) or an integer >= 0"
    ),
    "trainer.limit_val_batches": _BATCH_LIMIT,
    "trainer.limit_test_batches": _BATCH_LIMIT,
    "trainer.limit_predict_batches": _BATCH_LIMIT,
    "trainer.overfit_batches": _BATCH_LIMIT,
    "trainer.max_time": Allowed(_duration, "null, 'DD:HH:MM:SS' or a mapping such as {hours: 2}"),
    "callbacks.model_checkpoint.every_n_train_steps": Allowed(
        lambda v: v is None or (_int(v) and v >= 0), "null or an integer >= 0 (0: no step-based saves)"
    ),
    "callbacks.model_checkpoint.save_top_k": Allowed(
        lambda v: _int(v) and v >= -1, "-1 (every checkpoint), 0 (none but last.ckpt) or an integer >= 1"
    ),
    "callbacks.early_stopping.patience": NON_NEGATIVE_INT,
    "seed": _SEED,
    # python -m hf_lightning.evaluate's switches (absent from training configs)
    "generate": Allowed(lambda v: isinstance(v, bool), "true or false"),
    "max_new_tokens": POSITIVE_INT,
    "required_keys": Allowed(
        lambda v: isinstance(v, list) and all(isinstance(k, str) for k in v), "a list of dotted keys"
    ),
    "optimized_metric": Allowed(
        lambda v: v is None or isinstance(v, str), "null or a metric name such as val/loss"
    ),
}


# ------------------------------------------------------------------------------------------------- helpers
def check_keys(node: Mapping[str, Any], target: Callable, group: str, skip: Iterable[str] = ()) -> None:
    """Raise :class:`ConfigError` if ``node`` holds a key that ``target`` does not accept.

    Args:
        node: the config node (``cfg.data``, ...); keys starting with ``_`` (``_target_``, ``_partial_``) are
            Hydra's, not arguments.
        target: the callable the node's keys are passed to.
        group: the node's name, used in the message (``data`` gives ``data.foo``).
        skip: parameter names supplied by the code rather than the config (for example ``tokenizer``).
    """
    params = inspect.signature(target).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    allowed = [n for n in params if n not in ("self", *skip)]
    unknown = [k for k in node if not str(k).startswith("_") and k not in allowed]
    if unknown:
        guess = ""
        if len(unknown) == 1:  # an HF name gets our key; a misspelling, the closest allowed one
            ours = _our_key_for_hf_name(str(unknown[0]), group)
            close = difflib.get_close_matches(str(unknown[0]), allowed, n=1)
            if ours:
                guess = f" (HF's name: did you mean {ours}?)"
            elif close:
                guess = f" (did you mean {group}.{close[0]}?)"
        keys = ", ".join(f"{group}.{k}" for k in unknown)
        raise ConfigError(
            f"unknown config key{'s' if len(unknown) > 1 else ''} {keys}{guess}; "
            f"allowed keys of {group}: {', '.join(allowed)}"
        )


def is_mapping_setting(target: Callable, name: str) -> bool:
    """Whether ``target``'s argument ``name`` takes a mapping of free keys: its annotation is a mapping, or a
    union of mappings with ``None`` and ``str`` (``scheduler.kwargs``, ``optim.kwargs`` (a mapping or HF's
    ``optim_args`` string), ``data.rename_columns``, ``model.config``); not a union with other kinds
    (``trainer.max_time``: a string, a ``timedelta`` or a mapping of its fields)."""
    if name not in inspect.signature(target).parameters:
        return False
    try:
        hint = typing.get_type_hints(target).get(name)
    except Exception:  # an annotation that does not evaluate here
        return False
    members = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)

    def mapping(t: Any) -> bool:
        origin = typing.get_origin(t) or t
        return inspect.isclass(origin) and issubclass(origin, Mapping)

    return any(mapping(t) for t in members) and all(mapping(t) or t in (str, type(None)) for t in members)


def _our_key_for_hf_name(name: str, group: str) -> str | None:
    """Our key under ``group`` for an HF ``TrainingArguments`` name given there (``optim.learning_rate`` ->
    ``optim.lr``), or ``None``."""
    from hf_lightning.config.hf_names import OURS

    ours = OURS.get(name)
    key = ours.split("=", 1)[0] if isinstance(ours, str) else ""
    return key if key.startswith(f"{group}.") else None


def node_errors(
    node: Mapping[str, Any],
    target: Callable,
    group: str,
    skip: Iterable[str] = (),
    unjudged: Iterable[str] = (),
) -> list[str]:
    """Unknown keys and values of the wrong type in ``node`` bound to ``target``'s signature; ``skip``: keys
    the builder supplies (refused in the node), ``unjudged``: keys whose value is not judged here."""
    errors: list[str] = []
    try:
        check_keys(node, target, group, skip=skip)
    except ConfigError as err:
        errors.append(str(err))
    return errors + argument_errors(target, node, group, (*skip, *unjudged))


def _target_nodes(cfg: Mapping[str, Any]) -> Iterable[tuple[str, Mapping[str, Any]]]:
    """``(dotted name, node)`` for every group with a ``_target_`` and every ``_target_`` node under
    ``trainer``, ``logger``, ``callbacks``."""
    for group in BUILT_GROUPS:
        node = cfg.get(group)
        if isinstance(node, Mapping) and "_target_" in node:
            yield group, node
    strategy = (cfg.get("trainer") or {}).get("strategy")
    if isinstance(strategy, Mapping) and "_target_" in strategy:
        yield "trainer.strategy", strategy
    for group in ("logger", "callbacks"):
        for name, node in (cfg.get(group) or {}).items():
            if isinstance(node, Mapping) and "_target_" in node:
                yield f"{group}.{name}", node


# ------------------------------------------------------------------------------------------------ the pass
def target_signature(node: Mapping[str, Any], name: str) -> tuple[Callable | None, str | None]:
    """``(callable whose signature binds the node, None)`` for a node's ``_target_``, or ``(None, error)``.

    A class binds its ``__init__``; a class that keeps its settings for later
    (:class:`~hf_lightning.models.loading.ModelLoader`) names the function they are for in ``settings_of``.
    """
    from hydra.utils import get_object

    try:
        target = get_object(node["_target_"])
    except Exception as err:
        return None, f"{name}._target_={node['_target_']!r} cannot be imported ({str(err).splitlines()[0]})"
    target = getattr(target, "settings_of", target)
    return (target.__init__ if inspect.isclass(target) else target), None


def _repeats_checked(written: Any) -> bool:
    """Whether a value as written is the interpolation of a key with a rule of :data:`OVERLAY`."""
    return isinstance(written, str) and written.strip("${}") in OVERLAY


def top_level_errors(c: Mapping[str, Any], purpose: str = "train") -> list[str]:
    """Keys at the top level that are neither a group nor one of :data:`RUN_SETTINGS` (``evaluate`` adds
    :data:`EVALUATE_SETTINGS`); an HF ``TrainingArguments`` name gets our key for it."""
    from hf_lightning.config.hf_names import hf_name_error

    allowed = (*GROUPS, *RUN_SETTINGS, *HYDRA_KEYS, *(EVALUATE_SETTINGS if purpose == "evaluate" else ()))
    errors = []
    for key in c:
        if key in allowed:
            continue
        errors.append(
            _judged_hf_name_error(key, c[key])
            or hf_name_error(key, c[key])
            or f"unknown top-level key {key}={c[key]!r}; allowed top-level keys: {', '.join(allowed)}"
        )
    return errors


def _judged_hf_name_error(key: str, value: Any) -> str | None:
    """An HF name whose key of ours takes the value as given (``gradient_accumulation_steps=0`` ->
    ``data.gradient_accumulation_steps``), when our key refuses that value: the line names our key and what
    it takes, not the refused value; ``None`` otherwise (:func:`~hf_lightning.config.hf_names.hf_name_error`
    says it)."""
    from hf_lightning.config.hf_names import OURS

    ours = OURS.get(key)
    if not isinstance(ours, str) or not re.fullmatch(r"[\w.]+=\{value\}", ours):
        return None
    target = ours.split("=", 1)[0]
    takes = _ours_allowed(target, value)
    if takes is None:
        return None
    return f"{key} is HF's name: use {target}, which takes {takes} ({key}={shown(value)} is not one)"


def validate_config(cfg: DictConfig, purpose: str = "train") -> None:
    """Check the whole composed config; nothing is built.

    Checks: the top level (closed: groups and :data:`RUN_SETTINGS`); unknown keys of ``data``, ``model``,
    ``optim``, ``scheduler``, ``module``, ``trainer`` and of every other ``_target_`` node (strategy, loggers,
    callbacks) against the signatures their ``_target_`` names, minus the arguments the builder supplies;
    value types from those signatures' annotations; the value rules in those annotations and in
    :data:`OVERLAY`; the cross-field rules (:func:`cross_field_errors`); required values (``???``).

    Args:
        cfg: a composed config.
        purpose: ``train``, ``evaluate`` or ``inspect`` (``evaluate`` allows its own top-level switches).

    Raises:
        ConfigError: one message listing every problem (``key=value: allowed values: ...``), separated by ``;
        ``.
    """
    required = list(cfg.get("required_keys") or [])
    missing = [k for k in required if OmegaConf.select(cfg, k, default=None) is None]
    missing += [k for k in ("data.path", "model.name_or_path") if k not in missing and _is_missing(cfg, k)]
    if missing:
        raise ConfigError(
            "; ".join(
                f"{k} is required by this experiment (set {k}=..."
                + (" a json/jsonl/csv/parquet file or a save_to_disk folder)" if k == "data.path" else ")")
                for k in missing
            )
        )
    try:
        c = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except OmegaConfBaseException as err:
        raise ConfigError(f"config: {str(err).splitlines()[0]}") from err

    errors = top_level_errors(c, purpose)
    errors += [
        f"{group}._target_ is missing: every group names what it builds (conf/{group}/*.yaml show it)"
        for group in BUILT_GROUPS
        if isinstance(c.get(group), Mapping) and "_target_" not in c[group]
    ]
    # the overlay's rules first: where a key breaks a rule and its annotation, the rule's message is the
    # clearer one
    raw = OmegaConf.to_container(cfg, resolve=False)
    for key, rule in OVERLAY.items():
        value = get_dotted(c, key)
        written = get_dotted(raw, key)
        if _repeats_checked(written):
            continue  # the rule of the key it repeats says it
        if value is not MISSING and not rule(value):
            errors.append(f"{key}={shown(value)}: allowed values: {rule.text}")
    errors += moved_trainer_keys(c)
    for group, target, skip in _untargeted_groups():
        if isinstance(c.get(group), Mapping):
            errors += node_errors(c[group], target, group, skip)
    for name, node in _target_nodes(c):
        target, error = target_signature(node, name)
        if error:
            errors.append(error)
            continue
        # a key written as the interpolation of a checked key (data.seed: ${seed}) is said by that key's rule
        written = get_dotted(raw, name)
        repeats = [
            k for k, v in (written.items() if isinstance(written, Mapping) else ()) if _repeats_checked(v)
        ]
        errors += node_errors(node, target, name, SUPPLIED.get(name, ("model",)), repeats)

    errors += cross_field_errors(c)
    if errors:
        # one error per key, first reason wins (a bad type is also a bad range)
        seen, unique = set(), []
        for e in errors:
            key = e.split("=", 1)[0].split(":", 1)[0]
            if key not in seen:
                seen.add(key)
                unique.append(e)
        raise ConfigError("; ".join(unique))


#: Lightning Trainer arguments that ``HFLightningModule`` replaces (it steps each accumulation window itself,
#: and Lightning refuses them then): ``key -> (our key, or None where none takes the value; what it is)``.
#: Every value is refused, ``null`` and Lightning's defaults included: none of them acts, and a key that is
#: accepted but does nothing is a silent one.
NOT_FOR_WINDOWS: dict[str, tuple[str | None, str]] = {
    "trainer.accumulate_grad_batches": (
        "data.gradient_accumulation_steps",
        "the accumulation window is data.gradient_accumulation_steps (HF's gradient_accumulation_steps)",
    ),
    "trainer.gradient_clip_val": (
        "module.max_grad_norm",
        "clipping is module.max_grad_norm (HF's max_grad_norm, by norm)",
    ),
    "trainer.gradient_clip_algorithm": (
        None,
        "clipping is module.max_grad_norm, always by the gradients' total 2-norm (HF's max_grad_norm): "
        "remove the key",
    ),
}


def _ours_allowed(key: str, value: Any) -> str | None:
    """``None`` when our ``key`` takes ``value`` (by its rule in :data:`OVERLAY`, or the annotation of the
    ``data``, ``module``, ``optim`` or ``scheduler`` argument it names), else what it takes (the rule's text):
    a refusal never suggests a value that is itself refused."""
    from hf_lightning.data.datamodule import HFDataModule
    from hf_lightning.module.lightning_module import HFLightningModule
    from hf_lightning.module.optim import build_optimizer, build_scheduler

    if key in OVERLAY:
        return None if OVERLAY[key](value) else OVERLAY[key].text
    group, _, name = key.partition(".")
    targets = {
        "data": HFDataModule.__init__,
        "module": HFLightningModule.__init__,
        "optim": build_optimizer,
        "scheduler": build_scheduler,
    }
    if group not in targets:
        return None
    errors = argument_errors(targets[group], {name: value}, group)
    return errors[0].split(": allowed values: ", 1)[-1] if errors else None


def moved_trainer_keys(c: Mapping[str, Any]) -> list[str]:
    """One error per :data:`NOT_FOR_WINDOWS` key the resolved config ``c`` holds, whatever its value
    (``null`` too); the fix names our key with the value only where our key takes that value."""
    errors = []
    for key, (ours, what) in NOT_FOR_WINDOWS.items():
        value = get_dotted(c, key)
        if value is MISSING:
            continue
        fix = what
        if ours is not None:
            takes = _ours_allowed(ours, value)
            fix += f": set {ours}={shown(value)} instead" if takes is None else f", which takes {takes}"
            fix += f"; remove {key}" if takes is not None else ""
        if ours == "module.max_grad_norm":
            fix += " (null: no clipping; unset: 1.0, HF's default)"
        errors.append(f"{key}={shown(value)}: {fix}")
    return errors


# the groups hf_lightning.config.build instantiates from their _target_
BUILT_GROUPS = ("model", "data", "optim", "scheduler", "module", "trainer")
# the arguments the builder (hf_lightning.config.build) passes itself, not the config
SUPPLIED = {
    "data": ("tokenizer",),
    "module": ("model", "tokenizer", "optim", "scheduler"),
    "optim": ("model",),
    "scheduler": ("optimizer", "num_training_steps"),
    "trainer": ("callbacks", "logger", "plugins"),
}


def _untargeted_groups() -> tuple[tuple[str, Callable, tuple[str, ...]], ...]:
    """``(group, signature, supplied arguments)`` of the groups without a ``_target_`` that the builder reads
    itself: ``peft`` (:class:`~hf_lightning.adapters.AdapterSettings`)."""
    from hf_lightning.adapters import AdapterSettings

    return (("peft", AdapterSettings.__init__, ("extra",)),)


def _is_missing(cfg: DictConfig, key: str) -> bool:
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(cfg, parent, default=None) if parent else cfg
    return isinstance(node, DictConfig) and leaf in node and OmegaConf.is_missing(node, leaf)
