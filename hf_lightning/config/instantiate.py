"""``hydra.utils.instantiate`` with our errors: a refusal inside a ``_target_`` (ours, a missing package,
Lightning's ``MisconfigurationException``) becomes one line naming the config key, instead of Hydra's
multi-line "Error in call to target" and exit status 1."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from hf_lightning.core.errors import ConfigError


def resolve_function(path: str, key: str) -> Any:
    """The function at a dotted ``path`` (``package.module.function``).

    Raises:
        ConfigError: the path does not name an importable callable (the message names ``key``).
    """
    from hydra.utils import get_method

    try:
        return get_method(path)
    except Exception as err:
        raise ConfigError(f"{key}={path}: not an importable function ({err})") from err


def instantiate(node: Any, **kwargs: Any) -> Any:
    """``hydra.utils.instantiate``, with our own errors (and missing packages) raised inside a ``_target_`` as
    one line instead of Hydra's multi-line "Error in call to target" (exit status 1)."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate as hydra_instantiate

    from hf_lightning.config.optional import explain_instantiation_error

    try:
        return hydra_instantiate(node, **kwargs)
    except InstantiationException as err:
        ours = explain_instantiation_error(err)
        if ours is None:
            raise
        raise ours from err


def lightning_object(node: DictConfig, key: str, **kwargs: Any) -> Any:
    """``hydra.utils.instantiate(node, **kwargs)``, with the constructor's refusal as one :class:`ConfigError`
    naming ``key`` (Lightning raises ``MisconfigurationException`` / ``ValueError``, which Hydra wraps in a
    multi-line ``InstantiationException``).

    Raises:
        ConfigError: the constructor refused a value (``key``, the value where the message names it, and the
            constructor's own first line).
        HFLightningError: raised by one of our constructors, as it is.
    """
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate as hydra_instantiate

    from hf_lightning.config.optional import explain_instantiation_error

    try:
        return hydra_instantiate(node, **kwargs)
    except InstantiationException as err:
        ours = explain_instantiation_error(err)  # our own errors, a missing package
        if ours is not None:
            raise ours from None
        cause = err.__cause__
        if (
            not isinstance(cause, (ValueError, TypeError, RuntimeError))
            and type(cause).__name__ != "MisconfigurationException"
        ):
            raise
        text = " ".join(str(cause).split())
        keys = [k for k in node if isinstance(k, str) and not k.startswith("_")]
        # the key the message names, else the one whose (string) value it quotes ("No supported gpu backend")
        named = next((k for k in keys if k in text), None) or next(
            (
                k
                for k in keys
                if isinstance(node.get(k), str) and len(node.get(k)) >= 3 and node.get(k) in text
            ),
            None,
        )
        where = f"{key}.{named}={node.get(named)}" if named else key
        raise ConfigError(f"{where}: {text} (refused by {node.get('_target_', key)})") from None
