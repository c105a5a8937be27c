"""Optimizers and LR schedules, built as HF `Trainer` builds them.

Parameter groups follow ``Trainer.get_decay_parameter_names``: no weight decay for parameters inside
``nn.LayerNorm`` modules or whose name matches bias / layernorm / rmsnorm / norm (HF's own
``get_parameter_names`` is called with HF's patterns). Schedules are ``transformers.get_scheduler``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Annotated

import torch
from torch import nn

from hf_lightning.arguments import (
    BETAS,
    FINITE_NON_NEGATIVE,
    NON_NEGATIVE,
    NON_NEGATIVE_INT,
    POSITIVE,
    UNIT_INTERVAL,
    one_of,
)
from hf_lightning.errors import ConfigError

NO_DECAY_PATTERNS = [r"bias", r"layernorm", r"rmsnorm", r"(?:^|\.)norm(?:$|\.)", r"_norm(?:$|\.)"]
OPTIMIZERS = ("adamw", "sgd")
SCHEDULERS = ("constant", "constant_with_warmup", "linear", "cosine")


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


def build_optimizer(
    model: nn.Module,
    name: Annotated[str, one_of(OPTIMIZERS)] = "adamw",
    lr: Annotated[float, FINITE_NON_NEGATIVE] = 5e-5,
    weight_decay: Annotated[float, NON_NEGATIVE] = 0.0,
    betas: Annotated[Sequence[float], BETAS] = (0.9, 0.999),
    eps: Annotated[float, POSITIVE] = 1e-8,
    momentum: float = 0.0,
    fused: bool | None = None,
) -> torch.optim.Optimizer:
    """The optimizer named by ``optim.name``, with HF's parameter groups.

    Defaults are HF ``TrainingArguments``' (``learning_rate=5e-5``, ``adam_beta1/2``, ``adam_epsilon``).

    Raises:
        ConfigError: an unknown ``optim.name`` or a negative ``lr`` / ``weight_decay``.
    """
    if not (math.isfinite(lr) and lr >= 0 and weight_decay >= 0):
        raise ConfigError(
            f"optim.lr must be a finite number >= 0 and optim.weight_decay >= 0, got lr={lr}, weight_decay={weight_decay}"
        )
    groups = parameter_groups(model, weight_decay)
    if name == "adamw":
        return torch.optim.AdamW(groups, lr=lr, betas=tuple(betas), eps=eps, fused=fused)
    if name == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=momentum)
    raise ConfigError(f"optim.name={name!r}; expected one of {list(OPTIMIZERS)}")


def build_scheduler(
    optimizer: torch.optim.Optimizer,
    num_training_steps: int,
    name: Annotated[str, one_of(SCHEDULERS)] = "linear",
    warmup_steps: Annotated[int, NON_NEGATIVE_INT] = 0,
    warmup_ratio: Annotated[float, UNIT_INTERVAL] = 0.0,
):
    """``transformers.get_scheduler`` for ``scheduler.name``; steps are optimizer steps.

    ``warmup_steps`` wins over ``warmup_ratio`` (HF ``TrainingArguments.get_warmup_steps``:
    ``ceil(num_training_steps * warmup_ratio)``).

    Raises:
        ConfigError: an unknown ``scheduler.name`` or a negative warmup.
    """
    import math

    from transformers import get_scheduler

    if name not in SCHEDULERS:
        raise ConfigError(f"scheduler.name={name!r}; expected one of {list(SCHEDULERS)}")
    if warmup_steps < 0 or not 0 <= warmup_ratio <= 1:
        raise ConfigError(
            f"scheduler.warmup_steps must be >= 0 and scheduler.warmup_ratio in [0, 1], "
            f"got {warmup_steps}, {warmup_ratio}"
        )
    warmup = warmup_steps if warmup_steps > 0 else math.ceil(num_training_steps * warmup_ratio)
    return get_scheduler(name, optimizer, num_warmup_steps=warmup, num_training_steps=num_training_steps)
