"""A misspelt key on the command line, said in our words before Hydra says it in its own.

Hydra refuses an override of a key that the composed config does not hold (``data.max_lenght=128``,
``learning_rate=1e-4``) with ``Could not override 'data.max_lenght'. To append to your config use
+data.max_lenght=128``, exit status 1: it advises adding the misspelt key. Here the command line is composed
once before Hydra runs; such a key gets the schema's line instead (the allowed keys of its group and the
closest one, or our key for an HF ``TrainingArguments`` name), exit status 2, as with a leading ``+``. An
unknown group option, a group that needs a ``+`` and a ``+`` on a key that exists get one line too
(:func:`composition_line`); every other composition failure is left to Hydra's message.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence
from typing import Any

from omegaconf import OmegaConf

from hf_lightning.config.compose import CONF_DIR

# Hydra's message for an override of a key the config does not hold
_COULD_NOT_OVERRIDE = re.compile(r"Could not override '([^']+)'")


def misspelt_override(args: Sequence[str], config_name: str = "train", purpose: str = "train") -> str | None:
    """The one-line refusal of the first override in ``args`` whose key the composed config lacks, or
    ``None`` (nothing misspelt, or a command line this check leaves to Hydra: a multirun, a sweep, an
    override that fails for another reason).

    Args:
        args: the command line after the module name (``sys.argv[1:]``).
        config_name: the primary config (``train``, ``evaluate``).
        purpose: the schema's purpose (``evaluate`` allows its own top-level switches).
    """
    if any(a.startswith("-") for a in args):  # -m, --config-dir, --cfg ...: Hydra's business
        return None
    overrides = [a for a in args if not a.lstrip("+~").startswith("hydra")]
    if any("," in a.partition("=")[2] and "[" not in a for a in overrides):
        return None  # a sweep (a=1,2): Hydra composes each job
    from hydra import compose, initialize_config_dir
    from hydra.errors import ConfigCompositionException

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        try:
            compose(config_name, overrides=overrides)
            return None
        except Exception as err:  # a malformed override: Hydra's own message says it
            line = composition_line(err, overrides)
            if line:
                return line
            composing = isinstance(err, ConfigCompositionException)
            found = _COULD_NOT_OVERRIDE.search(str(err)) if composing else None
            if not found:
                return None
            key = found.group(1)
            given = [i for i, a in enumerate(overrides) if a.split("=", 1)[0] == key]
            if not given:
                return None
            overrides[given[0]] = "+" + overrides[given[0]]
            try:  # with the key added, as Hydra advises: the config the schema reads
                cfg = compose(config_name, overrides=overrides)
            except Exception:  # anything else: Hydra says it when it composes
                return None
    try:
        return unknown_key_line(OmegaConf.to_container(cfg, resolve=False), key, purpose)
    except Exception:  # never a traceback from this check: Hydra's message is the fallback
        return None


def composition_line(err: Exception, overrides: Sequence[str]) -> str | None:
    """One line for Hydra's multi-line composition errors a newcomer meets first, or ``None``:

    - an unknown group option (``+experiment=sfy``, ``scheduler=cosin``): ``experiment=sfy: no such option
      (did you mean experiment=sft?); allowed values: classification, clm, seq2seq, sft``;
    - a group that is not in the defaults list given without ``+`` (``experiment=sft``): ``use
      +experiment=sft``;
    - a ``+`` on a key the config already holds (``+trainer.max_steps=5``): drop the ``+``.
    """
    from hydra.errors import ConfigCompositionException, MissingConfigException

    text = str(err)
    if isinstance(err, MissingConfigException) and err.options and err.missing_cfg_file:
        group, _, name = err.missing_cfg_file.rpartition("/")
        options = [str(o) for o in err.options]
        close = difflib.get_close_matches(name, options, n=1)
        guess = f" (did you mean {group}={close[0]}?)" if close else ""
        return f"{group}={name}: no such option{guess}; allowed values: {', '.join(options)}"
    if not isinstance(err, ConfigCompositionException):
        return None
    found = re.search(r"Could not override '([^']+)'\. No match in the defaults list", text)
    if found:
        group = found.group(1)
        value = next((a.split("=", 1)[1] for a in overrides if a.split("=", 1)[0] == group), "...")
        return f"{group}={value}: {group} is not in the defaults, so it takes a leading +: +{group}={value}"
    found = re.search(r"An item is already at '([^']+)'", text)
    if found:
        key = found.group(1)
        value = next((a.split("=", 1)[1] for a in overrides if a.lstrip("+").split("=", 1)[0] == key), "...")
        return f"+{key}={value}: {key} is already in the config, so it is set without the +: {key}={value}"
    return None


def unknown_key_line(c: Mapping[str, Any], key: str, purpose: str = "train") -> str | None:
    """``unknown config key data.max_lenght (did you mean data.max_length?); allowed keys of data: ...`` for
    a dotted ``key`` of the config ``c`` that its node does not take (``None`` where the node takes any key:
    the schema's line, :func:`~hf_lightning.config.schema.check_keys`, for a node with a ``_target_``).
    A top-level key gets :func:`~hf_lightning.config.schema.top_level_errors`'s line (HF names included)."""
    from hf_lightning.arguments import get_dotted
    from hf_lightning.config.schema import SUPPLIED, node_errors, target_signature, top_level_errors

    parent, _, leaf = key.rpartition(".")
    first = key.split(".", 1)[0]
    lines = top_level_errors({first: c.get(first)}, purpose)  # not a group nor a run setting
    if lines:
        keys = _top_level_keys(purpose)
        close = difflib.get_close_matches(first, keys, n=1)
        if parent:  # dat.max_length=3: no node named dat
            guess = f" (did you mean {close[0]}.{key.split('.', 1)[1]}?)" if close else ""
            return f"unknown config key {key}: no node {first}{guess}; top-level keys: {', '.join(keys)}"
        head, sep, rest = lines[0].partition("; ")
        return f"{head} (did you mean {close[0]}?){sep}{rest}" if close and "HF" not in head else lines[0]
    if not parent:
        return None
    node = get_dotted(c, parent)
    if not isinstance(node, Mapping):
        return None
    if "_target_" in node:
        target, error = target_signature(node, parent)
        if error:
            return error
        lines = node_errors({leaf: node[leaf]}, target, parent, SUPPLIED.get(parent, ("model",)))
        return next((x for x in lines if x.startswith("unknown config key")), None)  # with the closest key
    allowed = [k for k in node if k != leaf and not str(k).startswith("_")]
    close = difflib.get_close_matches(leaf, allowed, n=1)
    guess = f" (did you mean {parent}.{close[0]}?)" if close else ""
    return f"unknown config key {key}{guess}; allowed keys of {parent}: {', '.join(allowed)}"


def _top_level_keys(purpose: str) -> list[str]:
    from hf_lightning.config.schema import EVALUATE_SETTINGS, GROUPS, RUN_SETTINGS

    return [*GROUPS, *RUN_SETTINGS, *(EVALUATE_SETTINGS if purpose == "evaluate" else ())]


def exit_on_misspelt_override(args: Sequence[str], config_name: str, purpose: str) -> None:
    """:func:`misspelt_override` for an entry point: its line on stderr and exit status 2."""
    import sys

    line = misspelt_override(args, config_name, purpose)
    if line:
        print(f"hf_lightning: error: {line}", file=sys.stderr)
        sys.exit(2)
