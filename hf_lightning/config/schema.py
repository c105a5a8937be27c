"""The schema of a composed config, checked before the model is built.

Config keys equal constructor argument names, so the signature a node is bound to is its schema: unknown keys
are found by binding (``hf_lightning.config_check.check_keys``) and value types by the signature's annotations
(``int``, ``float``, ``bool``, ``str``, ``Literal[...]``, unions of them). What an annotation cannot say (a
batch size >= 1, an optimizer from a closed list, packing with an encoder-decoder) is in :func:`_rules` and
:func:`cross_field_errors`. Every problem found is reported in one :class:`~hf_lightning.errors.ConfigError`
whose message names each key, its value and the allowed values.

This is the "equivalent validation pass" to dataclasses in Hydra's ConfigStore: a dataclass per group would
repeat every constructor signature and drift from it; binding the signatures cannot drift.
"""

from __future__ import annotations

import inspect
import math
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from hf_lightning.errors import ConfigError, HFLightningError

_ABSENT = object()


@dataclass(frozen=True)
class Rule:
    """A value rule: ``check(value)`` must hold for the key ``key`` (skipped when the key is absent)."""

    key: str
    check: Callable[[Any], bool]
    allowed: str


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _num(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _positive_int(value: Any) -> bool:
    return _int(value) and value >= 1


def _some_training(value: Any) -> bool:
    """``trainer.limit_train_batches``: some batches (Lightning's 0 "trains" 0 steps and reports success)."""
    if value is None:
        return True
    if _int(value):
        return value >= 1
    return isinstance(value, float) and 0 < value <= 1


def _devices_ok(value: Any) -> bool:
    if value in ("auto", -1, "-1"):
        return True
    if _int(value):
        return value >= 1
    if isinstance(value, str):
        if "," in value:  # "0,1": device indices
            parts = [p.strip() for p in value.split(",") if p.strip()]
            return bool(parts) and all(p.isdigit() for p in parts)
        return value.strip().isdigit() and int(value) >= 1
    if isinstance(value, (list, tuple, ListConfig)):
        return len(value) > 0 and all(_int(v) and v >= 0 for v in value)
    return False


def _rules() -> list[Rule]:
    from hf_lightning.models import TASKS
    from hf_lightning.module.optim import OPTIMIZERS, SCHEDULERS

    return [
        Rule("data.per_device_train_batch_size", _positive_int, "an integer >= 1"),
        Rule("data.per_device_eval_batch_size", _positive_int, "an integer >= 1"),
        Rule("data.max_length", _positive_int, "an integer >= 1"),
        Rule("data.validation_split", lambda v: _num(v) and 0 <= v < 1, "a number in [0, 1)"),
        Rule("data.num_workers", lambda v: _int(v) and v >= 0, "an integer >= 0"),
        Rule("trainer.accumulate_grad_batches", _positive_int, "an integer >= 1"),
        Rule(
            "trainer.max_steps", lambda v: _int(v) and (v == -1 or v >= 1), "-1 (no limit) or an integer >= 1"
        ),
        Rule(
            "trainer.max_epochs",
            lambda v: v is None or (_int(v) and (v == -1 or v >= 1)),
            "null, -1 or an integer >= 1",
        ),
        Rule("trainer.num_nodes", _positive_int, "an integer >= 1"),
        Rule("trainer.devices", _devices_ok, "an integer >= 1, -1, 'auto', or a list of device indices"),
        Rule(
            "trainer.accelerator",
            lambda v: v in ("cpu", "gpu", "cuda", "mps", "tpu", "auto"),
            "cpu, gpu, cuda, mps, tpu, auto",
        ),
        Rule("trainer.precision", lambda v: str(v) in PRECISIONS, ", ".join(PRECISIONS)),
        Rule(
            "trainer.gradient_clip_val", lambda v: v is None or (_num(v) and v >= 0), "null or a number >= 0"
        ),
        Rule("trainer.gradient_clip_algorithm", lambda v: v in ("norm", "value"), "norm, value"),
        Rule(
            "optim.name",
            lambda v: v is None or v in OPTIMIZERS,
            ", ".join(OPTIMIZERS) + ", null (optim.optimizer)",
        ),
        Rule("optim.lr", lambda v: _num(v) and math.isfinite(v) and v >= 0, "a finite number >= 0"),
        Rule(
            "trainer.limit_train_batches",
            _some_training,
            "null (every batch), a fraction in (0, 1] or a count "
            ">= 1: 0 trains nothing (to only evaluate, use python -m hf_lightning.evaluate)",
        ),
        Rule("optim.weight_decay", lambda v: _num(v) and v >= 0, "a number >= 0"),
        Rule("optim.eps", lambda v: v is None or (_num(v) and v > 0), "null or a number > 0"),
        Rule(
            "optim.betas",
            lambda v: (
                v is None
                or (
                    isinstance(v, (list, tuple, ListConfig))
                    and len(v) == 2
                    and all(_num(b) and 0 <= b < 1 for b in v)
                )
            ),
            "null or two numbers in [0, 1)",
        ),
        Rule("optim.fused", lambda v: v is None or isinstance(v, bool), "null (fused on CUDA), true, false"),
        Rule("scheduler.name", lambda v: v in SCHEDULERS, ", ".join(SCHEDULERS)),
        Rule("scheduler.warmup_steps", lambda v: _int(v) and v >= 0, "an integer >= 0"),
        Rule("scheduler.warmup_ratio", lambda v: _num(v) and 0 <= v <= 1, "a number in [0, 1]"),
        Rule("model.task", lambda v: v in TASKS, ", ".join(TASKS)),
        Rule("model.num_labels", lambda v: v is None or _positive_int(v), "null or an integer >= 1"),
        Rule("seed", _int, "an integer"),
        Rule(
            "required_keys",
            lambda v: isinstance(v, list) and all(isinstance(k, str) for k in v),
            "a list of dotted keys",
        ),
        Rule(
            "optimized_metric",
            lambda v: v is None or isinstance(v, str),
            "null or a metric name such as val/loss",
        ),
    ]


# the precisions this project supports (lightning accepts a few more that no path here is tested with)
PRECISIONS = ("32", "32-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true", "64-true")


# ------------------------------------------------------------------------------------------------- helpers
def _describe(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(hint))
    if origin is typing.Literal:
        return ", ".join(repr(a) for a in typing.get_args(hint))
    if hint is type(None):
        return "null"
    return getattr(hint, "__name__", str(hint))


def type_ok(value: Any, hint: Any) -> bool | None:
    """Whether ``value`` fits the annotation ``hint``; ``None`` when the annotation is not one we can judge."""
    if hint is Any:
        return None
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        results = [type_ok(value, a) for a in typing.get_args(hint)]
        if any(r is True for r in results):
            return True
        return None if any(r is None for r in results) else False
    if origin is typing.Literal:
        return value in typing.get_args(hint)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return _int(value)
    if hint is float:
        return _num(value)
    if hint is str:
        return isinstance(value, str)
    return None


def node_errors(node: Mapping[str, Any], target: Callable, group: str, skip: Iterable[str] = ()) -> list[str]:
    """Unknown keys and values of the wrong type in ``node`` bound to ``target``'s signature."""
    from hf_lightning.config_check import check_keys

    errors: list[str] = []
    try:
        check_keys(node, target, group, skip=skip)
    except ConfigError as err:
        errors.append(str(err))
    try:
        hints = typing.get_type_hints(target)
    except Exception:  # an annotation that does not evaluate here: only the keys are checked
        hints = {}
    params = inspect.signature(target).parameters
    for key, value in node.items():
        if key not in params or key not in hints or key in skip:
            continue
        if isinstance(value, str) and value.startswith("${"):
            continue  # unresolved interpolation (the caller resolves before us when it can)
        if type_ok(value, hints[key]) is False:
            errors.append(f"{group}.{key}={value!r}: allowed values: {_describe(hints[key])}")
    return errors


def _target_nodes(cfg: Mapping[str, Any]) -> Iterable[tuple[str, Mapping[str, Any]]]:
    """``(dotted name, node)`` for every node with a ``_target_`` under ``trainer``, ``logger``, ``callbacks``."""
    strategy = (cfg.get("trainer") or {}).get("strategy")
    if isinstance(strategy, Mapping) and "_target_" in strategy:
        yield "trainer.strategy", strategy
    for group in ("logger", "callbacks"):
        for name, node in (cfg.get(group) or {}).items():
            if isinstance(node, Mapping) and "_target_" in node:
                yield f"{group}.{name}", node


# ---------------------------------------------------------------------------------------- cross-field rules
def cross_field_errors(c: Mapping[str, Any]) -> list[str]:
    """Rules that involve more than one key."""
    from hf_lightning.models import is_encoder_decoder
    from hf_lightning.module.optim import optim_config_errors

    errors: list[str] = []
    data, model, trainer = c.get("data") or {}, c.get("model") or {}, c.get("trainer") or {}
    accelerator = trainer.get("accelerator")
    precision = str(trainer.get("precision"))

    packing = data.get("packing")
    if packing:
        task = model.get("task", "causal_lm")
        try:
            encdec = is_encoder_decoder(task, model.get("name_or_path"))
        except HFLightningError:
            encdec = task == "seq2seq_lm"
        if encdec:
            errors.append(
                f"data.packing={packing!r} with an encoder-decoder model (model.task={task}): packing concatenates "
                "examples into one causal sequence, which an encoder-decoder cannot attend correctly; allowed "
                "values: false"
            )
        elif task == "sequence_classification":
            errors.append(
                f"data.packing={packing!r} with model.task=sequence_classification; allowed values: false"
            )

    if accelerator == "cpu" and precision in ("16-mixed", "16-true"):
        errors.append(
            f"trainer.precision={precision} on trainer.accelerator=cpu: float16 autocast needs a GPU; allowed values "
            "on cpu: 32-true, bf16-mixed, bf16-true"
        )

    strategy = trainer.get("strategy")
    target = strategy.get("_target_", "") if isinstance(strategy, Mapping) else str(strategy)
    if accelerator == "cpu" and ("fsdp" in target.lower() or "deepspeed" in target.lower()):
        errors.append(
            f"trainer.strategy={target} on trainer.accelerator=cpu: FSDP and DeepSpeed run on GPUs here; "
            "allowed strategies on cpu: auto, ddp (trainer.accelerator=gpu for fsdp, deepspeed_zero2, deepspeed_zero3)"
        )
    if "deepspeed" in target.lower() and isinstance(strategy, Mapping):
        from hf_lightning.strategies.deepspeed import deepspeed_config

        try:
            deepspeed_config(
                strategy.get("stage", 2),
                strategy.get("micro_batch_size"),
                strategy.get("accumulate_grad_batches"),
                strategy.get("gradient_clip_val"),
                strategy.get("precision"),
                strategy.get("devices", 1),
                strategy.get("num_nodes", 1),
                strategy.get("offload_optimizer", False),
                strategy.get("offload_parameters", False),
                strategy.get("config"),
            )
        except ConfigError as err:
            errors.append(str(err))
    peft = c.get("peft")
    if isinstance(peft, Mapping) and peft.get("load_in_4bit"):
        import torch

        from hf_lightning.adapters.quantization import qlora_refusal
        from hf_lightning.adapters.settings import AdapterSettings

        refusal = qlora_refusal(AdapterSettings(load_in_4bit=True), accelerator, torch.cuda.is_available())
        if refusal:
            errors.append(refusal)
        if model.get("name_or_path") is None:
            errors.append(
                "peft=qlora with model.name_or_path=null: QLoRA quantizes pretrained weights; set model.name_or_path "
                "to a model folder or hub id"
            )
    if model.get("gradient_checkpointing") and "fsdp" in target.lower():
        errors.append(
            "model.gradient_checkpointing=true with strategy=fsdp: FSDP checkpoints its wrapped layers itself; "
            "use strategy.activation_checkpointing=true (allowed: model.gradient_checkpointing=false)"
        )
    errors += optim_config_errors(c)  # hf_lightning.module.optim: CUDA-only names, metric-driven schedules
    return errors


# ------------------------------------------------------------------------------------------------ the pass
def validate_config(cfg: DictConfig) -> None:
    """Check the whole composed config; nothing is built.

    Checks: unknown keys of ``data``, ``model``, ``optim``, ``scheduler``, ``module``, ``trainer`` and of every
    ``_target_`` node (strategy, loggers, callbacks) against the signatures they are bound to; value types from
    those signatures' annotations; the value rules of :func:`_rules`; the cross-field rules (packing with an
    encoder-decoder, float16 on CPU, FSDP / DeepSpeed on CPU, the derived DeepSpeed config); required values
    (``???``).

    Raises:
        ConfigError: one message listing every problem (``key=value: allowed values: ...``), separated by ``; ``.
    """
    import lightning as L
    from hydra.utils import get_object

    from hf_lightning.adapters import AdapterSettings
    from hf_lightning.data import HFDataModule
    from hf_lightning.models import load_model_and_tokenizer
    from hf_lightning.module import HFLightningModule
    from hf_lightning.module.optim import build_optimizer, build_scheduler

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

    # the value rules first: where a key breaks a rule and its annotation, the rule's message is the clearer one
    errors: list[str] = []
    for rule in _rules():
        value = _select_container(c, rule.key)
        if value is _ABSENT:
            continue
        try:
            ok = rule.check(value)
        except TypeError:  # a list or mapping where a name is expected (unhashable, not comparable)
            ok = False
        if not ok:
            errors.append(f"{rule.key}={value!r}: allowed values: {rule.allowed}")
    bound = (
        ("data", HFDataModule.__init__, ("tokenizer",)),
        ("model", load_model_and_tokenizer, ()),
        ("optim", build_optimizer, ("model",)),
        ("scheduler", build_scheduler, ("optimizer", "num_training_steps")),
        ("module", HFLightningModule.__init__, ("model", "tokenizer", "optim", "scheduler")),
        ("trainer", L.Trainer.__init__, ("callbacks", "logger", "plugins")),
        ("peft", AdapterSettings.__init__, ("extra",)),
    )
    for group, target, skip in bound:
        if isinstance(c.get(group), Mapping):
            node = {k: v for k, v in c[group].items() if k != "_target_"}
            errors += node_errors(node, target, group, skip)
    for name, node in _target_nodes(c):
        try:
            target = get_object(node["_target_"])
        except Exception as err:
            errors.append(
                f"{name}._target_={node['_target_']!r} cannot be imported ({str(err).splitlines()[0]})"
            )
            continue
        fn = target.__init__ if inspect.isclass(target) else target
        errors += node_errors({k: v for k, v in node.items() if not k.startswith("_")}, fn, name, ("model",))

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


def _is_missing(cfg: DictConfig, key: str) -> bool:
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(cfg, parent, default=None) if parent else cfg
    return isinstance(node, DictConfig) and leaf in node and OmegaConf.is_missing(node, leaf)


def _select_container(c: Mapping[str, Any], key: str) -> Any:
    node: Any = c
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return _ABSENT
        node = node[part]
    return node
