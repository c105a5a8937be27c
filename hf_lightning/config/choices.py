"""A config group the user names on the command line wins over what ``+experiment=...`` sets for the same
keys.

Hydra merges an experiment (``# @package _global_``) after the defaults list, so ``+experiment=sft
trainer=debug`` would run with sft's ``trainer.val_check_interval`` and ``log_every_n_steps``, not debug's "4
steps, validation every 2": the option the user typed would lose silently. Here the keys that the named
option's own file sets (its ``defaults`` excluded) take that file's value again wherever the experiment set
them too, unless the key itself is on the command line (``trainer.val_check_interval=0.5`` wins over both).
Each key taken back is said.

:class:`CommandLineGroupsWin` (``hydra.callbacks.group_choices`` in ``train.yaml``) does it before Hydra
writes ``.hydra/config.yaml``, so the saved config is the run's; :func:`hf_lightning.config.build.check`
repeats it for a multirun job and :func:`~hf_lightning.config.compose.compose_train` for a config composed
from Python.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from hf_lightning.core.arguments import MISSING, flatten, get_dotted

CONF_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "conf")
# groups whose options are not config keys of the run
NOT_KEYS = ("experiment", "hparams_search")


def _package(path: str, group: str) -> str:
    """The package a group file writes into: its ``# @package`` line, else the group's path."""
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if not line.startswith("#"):
                break
            if line.startswith("# @package"):
                package = line.split("@package", 1)[1].strip()
                return "" if package == "_global_" else package.replace("_group_", group)
    return group.replace("/", ".")


def _file_keys(group: str, option: str) -> dict[str, Any] | None:
    """``{dotted key: value}`` that ``conf/GROUP/OPTION.yaml`` sets itself (unresolved); ``None`` if no such
    file."""
    path = os.path.join(CONF_DIR, group, f"{option}.yaml")
    if not os.path.isfile(path):
        return None
    content = OmegaConf.to_container(OmegaConf.load(path), resolve=False) or {}
    content.pop("defaults", None)
    package = _package(path, group)
    if not package:
        out: dict[str, Any] = {}
        for k, v in content.items():
            out.update(flatten(v, k) if isinstance(v, dict) else {k: v})
        return out
    return flatten(content, package) if content else {}


def _choices(overrides: Iterable[str]) -> tuple[dict[str, str], set[str]]:
    """``({group: option} named on the command line, {keys given on the command line})``."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    groups: dict[str, str] = {}
    keys: set[str] = set()
    for o in OverridesParser.create().parse_overrides(list(overrides)):
        name = o.key_or_group
        value = o.value() if not o.is_delete() else None
        if isinstance(value, str) and os.path.isdir(os.path.join(CONF_DIR, name)):
            groups[name] = value
        else:
            keys.add(name)
    return groups, keys


def apply_group_precedence(cfg: DictConfig, overrides: Iterable[str] | None) -> list[str]:
    """Give the keys of each group option on the command line back their option's values where the experiment
    set them; returns ``["trainer.val_check_interval: 0.5 -> 2 (trainer=debug over +experiment=sft)", ...]``.

    ``overrides=None`` (no command line) or no ``+experiment=`` changes nothing; an option or experiment file
    that is not in this package's ``conf/`` (a user's own search path) is left to Hydra's order.
    """
    if not overrides:
        return []
    groups, given = _choices(overrides)
    experiment = groups.pop("experiment", None)
    if experiment is None:
        return []
    theirs = _file_keys("experiment", experiment)
    if not theirs:
        return []
    changes = []
    for group, option in groups.items():
        if group in NOT_KEYS:
            continue
        for key, value in (_file_keys(group, option) or {}).items():
            if key in given or key not in theirs:
                continue
            current = get_dotted(OmegaConf.to_container(cfg, resolve=False), key)
            if current is MISSING or current == value:
                continue
            with open_dict(cfg):
                OmegaConf.update(cfg, key, value, merge=False)
            changes.append(
                f"{key}: {current!r} -> {value!r} ({group}={option} over +experiment={experiment})"
            )
    return changes


def say(changes: list[str]) -> None:
    """One line on stderr naming the keys a command-line group took back from the experiment."""
    if changes:
        print(
            "hf_lightning: note: a group named on the command line wins over the experiment: "
            + "; ".join(changes),
            file=sys.stderr,
        )


try:
    from hydra.experimental.callback import Callback as _HydraCallback
except ImportError:  # hydra is an entry-point dependency only
    _HydraCallback = object  # type: ignore[assignment,misc]


class CommandLineGroupsWin(_HydraCallback):  # type: ignore[misc,valid-type]
    """Hydra callback: :func:`apply_group_precedence` on a single run's config before Hydra saves it."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        task = list(config.hydra.overrides.task)
        with open_dict(config):
            say(apply_group_precedence(config, task))
