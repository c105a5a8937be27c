"""Check a composed config against the signatures it will be bound to, before anything is built.

Config keys equal constructor argument names, so the signature is the schema: an unknown key is reported
with the allowed ones, instead of a ``TypeError`` deep inside instantiation.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import Any

from omegaconf import DictConfig

from hf_lightning.errors import ConfigError


def check_keys(node: DictConfig | dict, target: Callable, group: str, skip: Iterable[str] = ()) -> None:
    """Raise :class:`ConfigError` if ``node`` holds a key that ``target`` does not accept.

    Args:
        node: the config node (``cfg.data``, ...).
        target: the callable the node's keys are passed to.
        group: the node's name, used in the message (``data`` gives ``data.foo``).
        skip: parameter names supplied by the code rather than the config (for example ``tokenizer``).
    """
    params = inspect.signature(target).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    allowed = [n for n in params if n not in ("self", *skip)]
    unknown = [k for k in node if k != "_target_" and k not in allowed]
    if unknown:
        raise ConfigError(
            f"unknown config key{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(f'{group}.{k}' for k in unknown)}; allowed keys of {group}: {', '.join(allowed)}"
        )


def require(value: Any, key: str, expected: str) -> None:
    """Raise :class:`ConfigError` if a mandatory key is missing (``None`` or ``???``)."""
    if value is None or value == "???":
        raise ConfigError(f"{key} is required: {expected}")
