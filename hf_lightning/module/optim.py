"""Optimizers, built as HF ``Trainer.create_optimizer`` builds them (LR schedules: :mod:`.schedules`).

``optim.name`` takes HF's ``TrainingArguments.optim`` names that run without an accelerator-specific build
(``transformers.trainer_optimizer`` handlers): ``adamw_torch``, ``adamw_torch_fused``, ``adafactor``, ``sgd``,
``adagrad``, ``rmsprop``; and, on CUDA with ``bitsandbytes`` installed, ``adamw_8bit`` / ``adamw_bnb_8bit``,
``paged_adamw_8bit``, ``lion_8bit``. ``adamw`` is ours: ``adamw_torch_fused`` (HF's default optimizer on
torch >= 2.8) wherever torch's fused kernel takes the parameters (plain floating tensors on the CPU or CUDA),
else ``adamw_torch`` (a sharded ``DTensor`` parameter, another device). Any other ``torch.optim.Optimizer``
class comes through ``optim.optimizer`` (a ``_target_`` node with ``_partial_: true``, or a callable in
Python), as HF's ``Trainer(optimizer_cls_and_kwargs=...)``.

Every optimizer gets HF's two parameter groups (``Trainer.get_decay_parameter_names``): no weight decay for
parameters inside ``nn.LayerNorm`` modules or whose name matches bias / layernorm / rmsnorm / norm; parameters
that do not require grad are left out.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any

import torch
from torch import nn

from hf_lightning.core.arguments import (
    BETAS,
    FINITE_NON_NEGATIVE,
    NON_NEGATIVE,
    POSITIVE,
    Allowed,
    check_call,
    shown,
)
from hf_lightning.core.errors import ConfigError
from hf_lightning.module.schedules import SCHEDULERS, build_scheduler  # noqa: F401  (re-exported)

NO_DECAY_PATTERNS = [r"bias", r"layernorm", r"rmsnorm", r"(?:^|\.)norm(?:$|\.)", r"_norm(?:$|\.)"]
#: the knobs with a top-level key (``optim.betas``...); everything else goes through ``optim.kwargs``
KNOBS = ("betas", "eps", "momentum", "fused")
#: keys ``optim.kwargs`` may not hold: other keys own them
OWNED = {"params": "the model", "lr": "optim.lr", "weight_decay": "optim.weight_decay (HF's decay groups)"}
BNB_INSTALL = "pip install bitsandbytes (a CUDA build of torch is needed too)"


@dataclass(frozen=True)
class OptimizerSpec:
    """One ``optim.name``: the class (``module:attr``), HF's fixed keyword arguments, the top-level knobs it
    takes and their HF defaults (``TrainingArguments.adam_beta1/2``, ``adam_epsilon``), and whether it needs
    CUDA."""

    cls: str
    fixed: Mapping[str, Any] = field(default_factory=dict)
    knobs: Mapping[str, Any] = field(default_factory=dict)
    cuda: bool = False


_ADAM = {"betas": (0.9, 0.999), "eps": 1e-8}
SPECS: dict[str, OptimizerSpec] = {
    "adamw": OptimizerSpec("torch.optim:AdamW", knobs={**_ADAM, "fused": "auto"}),
    "adamw_torch": OptimizerSpec("torch.optim:AdamW", knobs={**_ADAM, "fused": None}),
    "adamw_torch_fused": OptimizerSpec("torch.optim:AdamW", fixed={"fused": True}, knobs=dict(_ADAM)),
    "adafactor": OptimizerSpec(
        "transformers.optimization:Adafactor", fixed={"scale_parameter": False, "relative_step": False}
    ),
    "sgd": OptimizerSpec("torch.optim:SGD", knobs={"momentum": None, "fused": None}),
    "adagrad": OptimizerSpec("torch.optim:Adagrad", knobs={"fused": None}),
    "rmsprop": OptimizerSpec("torch.optim:RMSprop", knobs={"momentum": None}),
    "adamw_8bit": OptimizerSpec(
        "bitsandbytes.optim:AdamW", fixed={"optim_bits": 8, "is_paged": False}, knobs=dict(_ADAM), cuda=True
    ),
    "adamw_bnb_8bit": OptimizerSpec(
        "bitsandbytes.optim:AdamW", fixed={"optim_bits": 8, "is_paged": False}, knobs=dict(_ADAM), cuda=True
    ),
    "paged_adamw_8bit": OptimizerSpec(
        "bitsandbytes.optim:AdamW", fixed={"optim_bits": 8, "is_paged": True}, knobs=dict(_ADAM), cuda=True
    ),
    # HF passes (adam_beta1, adam_beta2) to Lion: (0.9, 0.999), not bitsandbytes' own (0.9, 0.99)
    "lion_8bit": OptimizerSpec(
        "bitsandbytes.optim:Lion",
        fixed={"optim_bits": 8, "is_paged": False},
        knobs={"betas": (0.9, 0.999)},
        cuda=True,
    ),
}
OPTIMIZERS = tuple(SPECS)
CUDA_ONLY = tuple(n for n, s in SPECS.items() if s.cuda)


def decay_parameter_names(model: nn.Module) -> set[str]:
    """Names of the parameters that get weight decay (HF ``Trainer.get_decay_parameter_names``)."""
    from transformers.trainer_pt_utils import get_parameter_names

    return set(get_parameter_names(model, [nn.LayerNorm], NO_DECAY_PATTERNS))


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two groups: decayed weights, and biases / normalization weights with ``weight_decay=0``."""
    decay = decay_parameter_names(model)
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    return [
        {"params": [p for n, p in params if n in decay], "weight_decay": weight_decay},
        {"params": [p for n, p in params if n not in decay], "weight_decay": 0.0},
    ]


def parse_optim_args(value: Mapping[str, Any] | str | None) -> dict[str, Any]:
    """``optim.kwargs`` as a dict: a mapping as given, or HF's ``optim_args`` string ``"k=v,k2=v2"`` with each
    value read as an int, float, bool (``true``/``false``) or left a string.

    Raises:
        ConfigError: a string entry without ``=``, or a value that is neither.
    """
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return dict(value)
    if not isinstance(value, str):
        raise ConfigError(f"optim.kwargs={value!r}: allowed values: a mapping or HF's 'key=value,...' string")
    out: dict[str, Any] = {}
    for item in filter(None, value.replace(" ", "").split(",")):
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"optim.kwargs={value!r}: {item!r} is not key=value (HF's optim_args format)")
        out[key] = _literal(raw)
    return out


def _literal(raw: str) -> Any:
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    for kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            pass
    return raw


def _import(path: str, key: str) -> Any:
    module, _, attr = path.partition(":") if ":" in path else path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as err:
        hint = f"; {BNB_INSTALL}" if module.startswith("bitsandbytes") else ""
        raise ConfigError(f"{key}={path!r} cannot be imported ({str(err).splitlines()[0]}){hint}") from err


def resolve_optimizer(optimizer: Any) -> tuple[Callable[..., torch.optim.Optimizer], dict[str, Any]]:
    """``optim.optimizer`` as ``(class or callable, its fixed keyword arguments)``.

    Takes a ``torch.optim.Optimizer`` subclass, a ``functools.partial`` of one (what Hydra's ``_partial_:
    true`` builds), or the mapping ``{"_target_": "torch.optim.NAdam", "_partial_": true, **kwargs}`` as it
    comes from the config (imported here, so the library needs no Hydra).

    Raises:
        ConfigError: a mapping without ``_target_``, ``_partial_: false``, or a target that does not import.
    """
    import functools

    if isinstance(optimizer, Mapping):
        node = dict(optimizer)
        if "_target_" not in node:
            raise ConfigError(f"optim.optimizer={optimizer!r}: a mapping needs _target_ (an optimizer class)")
        if node.pop("_partial_", True) is not True:
            raise ConfigError(
                "optim.optimizer._partial_ must be true: the parameters are given when the model exists"
            )
        target = node.pop("_target_")
        return _import(target, "optim.optimizer._target_"), node
    if isinstance(optimizer, functools.partial):
        if optimizer.args:
            raise ConfigError("optim.optimizer: a partial with positional arguments; give keywords only")
        return optimizer.func, dict(optimizer.keywords)
    if callable(optimizer):
        return optimizer, {}
    raise ConfigError(
        f"optim.optimizer={optimizer!r}: allowed values: an optimizer class, a partial, a _target_"
    )


def _accepted(cls: Callable) -> tuple[set[str], bool]:
    """Keyword arguments of ``cls``'s constructor, and whether it takes ``**kwargs``."""
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return set(), True
    names = {n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return names, any(p.kind is p.VAR_KEYWORD for p in params.values())


def fused_kernel_applies(model: nn.Module) -> bool:
    """Whether torch's fused AdamW kernel takes every trainable parameter of ``model``: plain (not
    ``DTensor``) floating tensors on the CPU or CUDA."""
    from torch.distributed.tensor import DTensor

    params = [p for p in model.parameters() if p.requires_grad]
    return bool(params) and all(
        not isinstance(p, DTensor) and p.is_floating_point() and p.device.type in ("cpu", "cuda")
        for p in params
    )


def _on_cuda(model: nn.Module) -> bool:
    return any(p.is_cuda for p in model.parameters())


def _or_null(rule: Allowed) -> Allowed:
    """``rule``, or ``None`` (HF's default)."""
    return Allowed(lambda v: v is None or rule(v), f"null or {rule.text}")


# optim.name: an HF name, or null with optim.optimizer (read by the schema pass from the annotation)
OPTIM_NAME = Allowed(
    lambda v: v is None or v in OPTIMIZERS, ", ".join(OPTIMIZERS) + ", null (optim.optimizer)"
)


def build_optimizer(
    model: nn.Module,
    name: Annotated[str | None, OPTIM_NAME] = "adamw",
    lr: Annotated[float, FINITE_NON_NEGATIVE] = 5e-5,
    weight_decay: Annotated[float, NON_NEGATIVE] = 0.0,
    betas: Annotated[Sequence[float] | None, _or_null(BETAS)] = None,
    eps: Annotated[float | None, _or_null(POSITIVE)] = None,
    momentum: float | None = None,
    fused: bool | None = None,
    kwargs: Mapping[str, Any] | str | None = None,
    optimizer: Any = None,
) -> torch.optim.Optimizer:
    """The optimizer named by ``optim.name`` (HF ``Trainer.get_optimizer_cls_and_kwargs``), or the class of
    ``optim.optimizer``, over HF's two parameter groups (``weight_decay`` on the first, 0 on the second).

    Args:
        model: its trainable parameters are optimized.
        name: an HF ``optim`` name (:data:`OPTIMIZERS`); ``None`` with ``optimizer``.
        lr: the peak learning rate (HF ``learning_rate``; default HF's 5e-5).
        weight_decay: decoupled / L2 decay of the decayed group, as the class applies it.
        betas, eps: HF's ``adam_beta1/2`` and ``adam_epsilon`` (``None``: HF's 0.9, 0.999, 1e-8) for the AdamW
            names and Lion (betas only); for ``optim.optimizer`` passed when given.
        momentum: SGD / RMSprop momentum (``None``: 0, as HF, whose ``optim_args`` sets it).
        fused: torch's fused kernel (``adamw``, ``adamw_torch``, ``sgd``, ``adagrad``; ``None``: for ``adamw``
            where the kernel takes the parameters (:func:`fused_kernel_applies`), else torch's choice).
        kwargs: more keyword arguments of the optimizer class (HF's ``optim_args``: a mapping, or the
            ``"momentum=0.9,nesterov=true"`` string); checked against the class's signature.
        optimizer: another optimizer class (see :func:`resolve_optimizer`); ``name`` must then be ``None``.

    Raises:
        ConfigError: an unknown ``name`` (the allowed list in the message), ``name`` and ``optimizer`` both or
            neither given, a negative or non-finite ``lr`` / ``weight_decay``, a knob or ``kwargs`` key the
            optimizer does not take, a ``bitsandbytes`` name on a model not on CUDA, or ``bitsandbytes``
            missing.
    """
    check_call(build_optimizer, locals(), "optim")
    given = {k: v for k, v in (("betas", betas), ("eps", eps), ("momentum", momentum), ("fused", fused))}
    given = {k: v for k, v in given.items() if v is not None}
    extra = parse_optim_args(kwargs)
    if optimizer is not None:
        if name is not None:
            raise ConfigError(
                f"optim.name={name!r} and optim.optimizer both choose the optimizer; set optim.name=null "
                "(or use optim=custom)"
            )
        cls, fixed = resolve_optimizer(optimizer)
        label = f"optim.optimizer ({getattr(cls, '__name__', cls)})"
        knobs = dict.fromkeys(KNOBS)
    else:
        if name is None:  # any other name outside SPECS was refused by the annotation
            raise ConfigError("optim.name=null needs optim.optimizer._target_=<an optimizer class>")
        spec = SPECS[name]
        if spec.cuda and not _on_cuda(model):
            raise ConfigError(
                f"optim.name={name} is a bitsandbytes optimizer and runs on CUDA only; this model is on "
                f"{next(model.parameters()).device.type}: use a GPU (trainer.accelerator=gpu) or another "
                "optim.name"
            )
        cls, fixed, knobs = _import(spec.cls, "optim.name"), dict(spec.fixed), dict(spec.knobs)
        label = f"optim.name={name}"
    accepted, open_kwargs = _accepted(cls)
    for key in given:
        if key not in knobs or not (open_kwargs or key in accepted):
            raise ConfigError(
                f"optim.{key}={given[key]!r} does not apply to {label}; set it to null "
                f"(its knobs: {sorted(k for k in knobs if open_kwargs or k in accepted) or 'none'})"
            )
    for key, value in extra.items():
        if key in OWNED:
            raise ConfigError(f"optim.kwargs.{key}: set by {OWNED[key]}, not optim.kwargs")
        if key in given or key in fixed:
            raise ConfigError(f"optim.kwargs.{key} is given twice (also optim.{key} or by {label}); keep one")
        if not (open_kwargs or key in accepted):
            raise ConfigError(
                f"optim.kwargs.{key}={shown(value)}: {label} takes no {key!r} "
                f"(it takes: {', '.join(sorted(accepted - set(OWNED)))})"
            )
    for key in set(fixed) & set(OWNED):
        raise ConfigError(f"optim.optimizer.{key}: set by {OWNED[key]}; remove it from the optimizer node")
    defaults = {k: v for k, v in knobs.items() if v is not None and k not in given}
    if defaults.get("fused") == "auto":
        defaults["fused"] = fused_kernel_applies(model)
    options = {**defaults, **given, **fixed, **extra}
    if "betas" in options:
        options["betas"] = tuple(options["betas"])
    return cls(parameter_groups(model, weight_decay), lr=lr, **options)


def optimizer_class(optim: Any) -> tuple[type, dict[str, Any]] | None:
    """``(class, keyword arguments)`` when ``optim`` is a ``torch.optim.Optimizer`` subclass or a
    ``functools.partial`` of one (a config's ``{_target_: torch.optim.AdamW, _partial_: true, lr: ...}``),
    else ``None``."""
    import functools

    target, keywords = optim, {}
    if isinstance(optim, functools.partial) and not optim.args:
        target, keywords = optim.func, dict(optim.keywords)
    if isinstance(target, type) and issubclass(target, torch.optim.Optimizer):
        return target, keywords
    return None


def make_optimizer(optim: Any, model: nn.Module) -> torch.optim.Optimizer:
    """The optimizer of ``HFLightningModule(optim=...)`` for ``model``, always over HF's two parameter groups
    (:func:`parameter_groups`: no weight decay on biases and normalization weights).

    Args:
        optim: :func:`build_optimizer`'s keyword arguments (``None``: its defaults, HF's); a
            ``torch.optim.Optimizer`` class or a partial of one (what a ``_target_`` node with ``_partial_:
            true`` builds, as lightning-hydra-template's ``optimizer`` nodes do; HF's
            ``optimizer_cls_and_kwargs``): its ``lr`` and ``weight_decay`` (default: the class's own) go to
            the decayed group, the rest to the class; or any other callable ``(model) -> Optimizer``, called
            as it is.

    Raises:
        ConfigError: see :func:`build_optimizer`; a class without a default ``lr`` given none.
    """
    import functools

    if optim is None or isinstance(optim, Mapping):
        return build_optimizer(model, **dict(optim or {}))
    found = optimizer_class(optim)
    if found is None:
        return optim(model)
    cls, keywords = found
    defaults = {
        n: p.default for n, p in inspect.signature(cls).parameters.items() if p.default is not p.empty
    }
    lr = keywords.pop("lr", defaults.get("lr"))
    if lr is None:
        raise ConfigError(f"optim: {cls.__name__} has no default learning rate; give it lr")
    weight_decay = keywords.pop("weight_decay", defaults.get("weight_decay", 0.0))
    return build_optimizer(
        model,
        name=None,
        lr=float(lr),
        weight_decay=float(weight_decay),
        optimizer=functools.partial(cls, **keywords),
    )


def optim_config_errors(config: Mapping[str, Any]) -> list[str]:
    """Cross-field rules of the ``optim`` / ``scheduler`` groups on a composed config (a plain container), for
    the schema pass before anything is built: a bitsandbytes ``optim.name`` on ``trainer.accelerator=cpu`` (or
    ``auto`` without CUDA), and ``reduce_lr_on_plateau`` / ``greedy``, which step on a validation metric,
    without validation (HF: "requires an eval strategy").

    Returns:
        one message per problem (empty: none).
    """
    from hf_lightning.module.schedules import METRIC_DRIVEN

    errors = []
    data, trainer = config.get("data") or {}, config.get("trainer") or {}
    name, accelerator = (config.get("optim") or {}).get("name"), trainer.get("accelerator")
    if name in CUDA_ONLY and (
        accelerator == "cpu" or (accelerator == "auto" and not torch.cuda.is_available())
    ):
        errors.append(
            f"optim.name={name} is a bitsandbytes optimizer and runs on CUDA only "
            f"(trainer.accelerator={accelerator}); use trainer.accelerator=gpu, or an optimizer that runs "
            "here: adamw_torch, adafactor, sgd, ..."
        )
    schedule = (config.get("scheduler") or {}).get("name")
    no_val_batches = trainer.get("limit_val_batches") == 0
    no_split = data.get("validation_split") == 0 and not data.get("validation_path")
    if schedule in METRIC_DRIVEN and (no_val_batches or no_split):
        off = "trainer.limit_val_batches=0" if no_val_batches else "data.validation_split=0"
        errors.append(
            f"scheduler.name={schedule} steps on a validation metric after each validation, but validation "
            f"is off ({off}); turn validation on, or choose a schedule of its own (linear, cosine, ...)"
        )
    return errors
