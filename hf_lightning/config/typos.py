"""The command line in our words before Hydra says it in its own.

Hydra refuses an override of a key that the composed config does not hold (``data.max_lenght=128``,
``learning_rate=1e-4``) with ``Could not override 'data.max_lenght'. To append to your config use
+data.max_lenght=128``, exit status 1: it advises adding the misspelt key. Here the command line is composed
once before Hydra runs; such a key gets the schema's line instead (the allowed keys of its group and the
closest one, or our key for an HF ``TrainingArguments`` name), exit status 2, as with a leading ``+``. An
unknown group option, a group that needs a ``+``, a ``+`` on a key that exists and a key under a plain value
get one line too (:func:`composition_line`); every other composition failure is left to Hydra's message.

A setting whose value is a mapping of free keys (a ``_target_`` argument typed as a mapping:
``scheduler.kwargs``, ``optim.kwargs``, ``data.rename_columns``, ``model.config``, ...) takes every spelling
of a new key: ``scheduler.kwargs={num_decay_steps: 100}`` and ``scheduler.kwargs.num_decay_steps=100``, which
Hydra refuses because the key is new, are given to Hydra as ``++KEY=VALUE`` (add or override), the spelling
it takes (:func:`mapping_spellings`), and a mapping given whole replaces the shipped one. What the mapping's
keys may be is checked where they are used. An argument of a ``_target_`` that the YAML leaves out
(``trainer.overfit_batches=2``) is added as with a ``+``.
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
    parsed = _parsed(overrides)
    if parsed is None or any(o.is_sweep_override() for o in parsed):
        return None  # malformed (Hydra's parser says it), or a sweep (a=1,2): Hydra composes each job
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
            # a mapping given whole (callbacks.model_checkpoint={save_top_k: 1, foo: 2}): the key it lacks
            missing = str(getattr(err.__cause__, "full_key", None) or "")
            key = missing if missing.startswith(f"{key}.") else key
            try:  # a key below a plain value (data.validation_path.a=b): said before + makes it a node
                without = compose(config_name, overrides=overrides[: given[0]] + overrides[given[0] + 1 :])
                line = _under_a_value(OmegaConf.to_container(without, resolve=False), key)
                if line:
                    return line
            except Exception:  # another override fails too: the first one is said below
                pass
            overrides[given[0]] = "+" + overrides[given[0]]
            try:  # with the key added, as Hydra advises: the config the schema reads
                cfg = compose(config_name, overrides=overrides)
            except Exception:  # anything else: Hydra says it when it composes
                return None
    try:
        return unknown_key_line(OmegaConf.to_container(cfg, resolve=False), key, purpose)
    except Exception:  # never a traceback from this check: Hydra's message is the fallback
        return None


def _parsed(overrides: Sequence[str]) -> list[Any] | None:
    """Hydra's parse of ``overrides`` (its ``Override`` objects), or ``None`` where one does not parse."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        return OverridesParser.create().parse_overrides(list(overrides))
    except Exception:  # Hydra's parser error, said by Hydra itself
        return None


# Hydra's flags that leave the config as composed from the overrides (the others, --config-dir,
# --config-name, ..., change what is composed): the mapping spellings are rewritten beside them
_PLAIN_FLAGS = ("-m", "--multirun", "--resolve")
_FLAGS_WITH_A_VALUE = ("--cfg", "-c", "--package", "-p")


def mapping_spellings(args: Sequence[str], config_name: str = "train") -> list[str]:
    """``args`` with each override that Hydra refuses only because it adds a key to a mapping setting
    written as ``++KEY=VALUE`` (add or override), the spelling Hydra takes; everything else as given.

    A mapping setting is an argument of a node's ``_target_`` whose annotation is a mapping (or a mapping or
    a string): ``scheduler.kwargs``, ``optim.kwargs``, ``data.rename_columns``, ``model.config``,
    ``model.id2label``, ``trainer.strategy.config``, ``logger.mlflow.tags``. Hydra's ``KEY=VALUE`` may not
    add a key to the composed config, so ``scheduler.kwargs={num_decay_steps: 100}`` and
    ``scheduler.kwargs.num_decay_steps=100`` fail with ``Could not override`` where ``+`` or ``++`` works.
    A mapping given whole replaces the composed one (``~KEY +KEY=VALUE``): what the user wrote is what
    runs, where Hydra alone would merge it into the shipped entries (``data.rename_columns={text: sentence}``
    under ``+experiment=classification`` would keep the experiment's ``category: label``); one entry is
    changed by its dotted key (``model.config.hidden_size=64`` keeps the other ``model.config`` keys).

    An argument of a node's ``_target_`` that the shipped YAML leaves out (``trainer.overfit_batches=2``,
    any ``lightning.Trainer`` argument) is given as ``+KEY=VALUE``: the schema takes it, so it needs no
    ``+``. Overrides of other keys, and a command line that does not compose for another reason, are left
    as they are (for :func:`misspelt_override` and Hydra).

    Args:
        args: the command line after the module name (``sys.argv[1:]``).
        config_name: the primary config (``train``, ``evaluate``).
    """
    return _spelled(args, config_name)[0]


def _spelled(args: Sequence[str], config_name: str) -> tuple[list[str], bool]:
    """:func:`mapping_spellings`, and whether the overrides composed as given (nothing refused, no sweep: then
    :func:`misspelt_override` has nothing to say)."""
    args = list(args)
    overrides: list[int] = []  # positions in args
    flag_value = False
    for i, a in enumerate(args):
        if flag_value:
            flag_value = False
        elif a in _FLAGS_WITH_A_VALUE:
            flag_value = True
        elif a.startswith("-"):
            if a not in _PLAIN_FLAGS:
                return args, False
        elif not a.lstrip("+~").startswith("hydra"):
            overrides.append(i)
    parsed = _parsed([args[i] for i in overrides])
    if parsed is None:
        return args, False
    plain = {j for j, o in enumerate(parsed) if not (o.is_add() or o.is_force_add() or o.is_delete())}
    # a mapping given whole (data.rename_columns={text: sentence}): composed without it, to see what it
    # replaces (in every spelling: KEY=, +KEY=, ++KEY=; Hydra merges the last two into the shipped entries)
    whole = {
        j
        for j, o in enumerate(parsed)
        if not o.is_delete() and not o.is_sweep_override() and isinstance(o.value(), Mapping)
    }
    kept = [j for j, o in enumerate(parsed) if not o.is_sweep_override() and j not in whole]
    try:
        composed, refused = _compose_without_refused(
            [args[overrides[j]] for j in kept], kept, plain, config_name
        )
    except Exception:  # another composition failure: misspelt_override or Hydra says it
        return args, False
    from hf_lightning.core.arguments import MISSING, get_dotted

    replaced: dict[int, list[str]] = {}  # position in args -> what stands there instead
    unsettled = False  # a whole mapping given to a key that is not a mapping setting: Hydra decides
    for j, o in enumerate(parsed):
        key, line = o.key_or_group, args[overrides[j]]
        if j not in plain:
            shipped = get_dotted(composed, key) if j in whole else None
            if isinstance(shipped, Mapping) and shipped and _in_a_mapping_setting(composed, key):
                replaced[overrides[j]] = [f"~{key}", f"+{line.lstrip('+')}"]  # +KEY={...}: not a merge either
            continue
        shipped = get_dotted(composed, key)
        if _in_a_mapping_setting(composed, key):
            if j in whole and isinstance(shipped, Mapping) and shipped:
                replaced[overrides[j]] = [f"~{key}", f"+{line}"]  # what the user wrote, not a merge
            elif (
                (j in whole and shipped is not None)  # an empty mapping, or none yet: added
                or j in refused
                or (o.is_sweep_override() and shipped is MISSING)
            ):
                replaced[overrides[j]] = [f"++{line}"]
        elif j in whole:
            unsettled = True
        elif (j in refused or o.is_sweep_override()) and _a_signature_argument(composed, key):
            replaced[overrides[j]] = [f"+{line}"]  # trainer.overfit_batches=2: Lightning's, not in the YAML
    args = [x for i, a in enumerate(args) for x in replaced.get(i, [a])]
    return args, not refused and not unsettled and not any(o.is_sweep_override() for o in parsed)


def _compose_without_refused(
    overrides: list[str], numbers: list[int], plain: set[int], config_name: str
) -> tuple[dict[str, Any], set[int]]:
    """The config composed from ``overrides`` without the plain ones Hydra refuses as ``Could not override``
    (a new key), and the numbers (from ``numbers``) of those left out.

    Raises:
        Exception: any other composition failure (Hydra's).
    """
    from hydra import compose, initialize_config_dir

    refused: set[int] = set()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        while True:
            kept = [o for o, n in zip(overrides, numbers, strict=True) if n not in refused]
            try:
                cfg = compose(config_name, overrides=kept)
                return OmegaConf.to_container(cfg, resolve=False), refused
            except Exception as err:
                found = _COULD_NOT_OVERRIDE.search(str(err))
                key = found.group(1) if found else None
                failing = [
                    n
                    for o, n in zip(overrides, numbers, strict=True)
                    if n in plain and n not in refused and o.split("=", 1)[0] == key
                ]
                if not failing:
                    raise
                refused.add(failing[0])


def _in_a_mapping_setting(c: Mapping[str, Any], key: str) -> bool:
    """Whether the dotted ``key`` is a mapping setting of ``c`` (see :func:`mapping_spellings`) or lies
    inside one."""
    from hf_lightning.config.schema import SUPPLIED, is_mapping_setting, target_signature
    from hf_lightning.core.arguments import get_dotted

    parts = key.split(".")
    for n in range(1, len(parts) + 1):
        parent = ".".join(parts[: n - 1])
        node = get_dotted(c, parent) if parent else c
        if not isinstance(node, Mapping):
            return False
        if "_target_" not in node:
            continue
        target, error = target_signature(node, parent)
        name = parts[n - 1]
        if error is None and name not in SUPPLIED.get(parent, ()) and is_mapping_setting(target, name):
            return True
    return False


def _a_signature_argument(c: Mapping[str, Any], key: str) -> bool:
    """Whether the dotted ``key`` names an argument of its parent node's ``_target_`` that the composed config
    ``c`` does not hold (``trainer.overfit_batches``: a ``lightning.Trainer`` argument the shipped YAML leaves
    out), one the schema takes under that node."""
    import inspect

    from hf_lightning.config.schema import SUPPLIED, target_signature
    from hf_lightning.core.arguments import get_dotted

    parent, _, leaf = key.rpartition(".")
    node = get_dotted(c, parent) if parent else None
    if not isinstance(node, Mapping) or "_target_" not in node or leaf in node or leaf.startswith("_"):
        return False
    target, error = target_signature(node, parent)
    if error is not None or leaf in SUPPLIED.get(parent, ()):
        return False
    try:
        param = inspect.signature(target).parameters.get(leaf)
    except (TypeError, ValueError):  # no signature to read: the schema has nothing to check it against
        return False
    return param is not None and param.kind in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY)


def composition_line(err: Exception, overrides: Sequence[str]) -> str | None:
    """One line for Hydra's multi-line composition errors a newcomer meets first, or ``None``:

    - an unknown group option (``+experiment=sfy``, ``scheduler=cosin``): ``experiment=sfy: no such option
      (did you mean experiment=sft?); allowed values: classification, clm, seq2seq, sft``;
    - a group that is not in the defaults list given without ``+`` (``experiment=sft``): ``use
      +experiment=sft``;
    - a ``+`` on a key the config already holds (``+trainer.max_steps=5``): drop the ``+``;
    - a group given twice (``+experiment=sft +experiment=classification``): give one.
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
    found = re.search(r"Multiple values for (\S+?)\.", text)
    if found:  # +experiment=sft +experiment=classification: Hydra advises editing a config file
        return twice_given_line(overrides, found.group(1)) or f"{found.group(1)}: given twice; give one"
    found = re.search(r"An item is already at '([^']+)'", text)
    if found:
        key = found.group(1)
        value = next((a.split("=", 1)[1] for a in overrides if a.lstrip("+").split("=", 1)[0] == key), "...")
        return f"+{key}={value}: {key} is already in the config, so it is set without the +: {key}={value}"
    return None


# the groups a command line names once: a second experiment replaces the first (``experiment=...``) or fails
# in Hydra's words (``+experiment=...``), and experiments do not combine
ONCE_GROUPS = ("experiment",)


def twice_given_line(args: Sequence[str], group: str | None = None) -> str | None:
    """``+experiment=sft and +experiment=classification: experiment is one choice, given twice; ...`` for a
    group of :data:`ONCE_GROUPS` (or ``group``) that the command line names with two or more options, in any
    spelling (``+``, ``++`` or none: Hydra silently takes the last of ``+experiment=sft
    experiment=classification``); ``None`` otherwise. A sweep (``+experiment=sft,clm``) is one override."""
    groups = (group,) if group else ONCE_GROUPS
    for name in groups:
        given = [a for a in args if not a.startswith("-") and a.lstrip("+").split("=", 1)[0] == name]
        if len({a.lstrip("+").split("=", 1)[-1] for a in given}) > 1:
            times = "twice" if len(given) == 2 else f"{len(given)} times"
            return (
                f"{' and '.join(given)}: {name} is one choice, given {times}; give one +{name}=NAME (the "
                f"{name} options do not combine: each is a whole run)"
            )
    return None


def unknown_key_line(c: Mapping[str, Any], key: str, purpose: str = "train") -> str | None:
    """``unknown config key data.max_lenght (did you mean data.max_length?); allowed keys of data: ...`` for
    a dotted ``key`` of the config ``c`` that its node does not take (``None`` where the node takes any key:
    the schema's line, :func:`~hf_lightning.config.schema.check_keys`, for a node with a ``_target_``).
    A top-level key gets :func:`~hf_lightning.config.schema.top_level_errors`'s line (HF names included)."""
    from hf_lightning.config.schema import SUPPLIED, node_errors, target_signature, top_level_errors
    from hf_lightning.core.arguments import get_dotted

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
        unknown = head.startswith("unknown top-level key")  # not an HF name, which names our key itself
        return f"{head} (did you mean {close[0]}?){sep}{rest}" if close and unknown else lines[0]
    if not parent:
        return None
    node = get_dotted(c, parent)
    if not isinstance(node, Mapping):
        return _under_a_value(c, key)
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


def _under_a_value(c: Mapping[str, Any], key: str) -> str | None:
    """``unknown config key data.validation_path.a: data.validation_path is a value (null), not a node with
    keys`` for a ``key`` below a plain value of ``c`` (Hydra: ``Could not override``, exit 1); ``None`` where
    no part of the key is a plain value."""
    from hf_lightning.core.arguments import MISSING, get_dotted, shown

    parts = key.split(".")
    for n in range(1, len(parts)):
        value = get_dotted(c, ".".join(parts[:n]))
        if value is MISSING:
            return None
        if not isinstance(value, Mapping):
            head = ".".join(parts[:n])
            return (
                f"unknown config key {key}: {head} is a value ({shown(value)}), not a node with keys; set it "
                f"as {head}=..."
            )
    return None


def _top_level_keys(purpose: str) -> list[str]:
    from hf_lightning.config.schema import EVALUATE_SETTINGS, GROUPS, RUN_SETTINGS

    return [*GROUPS, *RUN_SETTINGS, *(EVALUATE_SETTINGS if purpose == "evaluate" else ())]


def checked_command_line(args: Sequence[str], config_name: str, purpose: str) -> list[str]:
    """The command line an entry point hands to Hydra: :func:`mapping_spellings` of ``args``, refused by
    :func:`misspelt_override`'s line.

    Raises:
        ConfigError: the override that does not compose, in one line.
    """
    from hf_lightning.core.errors import ConfigError

    line = twice_given_line(args)
    if line:
        raise ConfigError(line)
    args, composed = _spelled(args, config_name)
    line = None if composed else misspelt_override(args, config_name, purpose)
    if line:
        raise ConfigError(line)
    return args


def exit_on_misspelt_override(args: Sequence[str], config_name: str, purpose: str) -> list[str]:
    """:func:`checked_command_line` for an entry point: its line on stderr and exit status 2, else the
    command line to give Hydra (``sys.argv[1:]``)."""
    import sys

    from hf_lightning.core.errors import ConfigError

    try:
        return checked_command_line(args, config_name, purpose)
    except ConfigError as err:
        print(f"hf_lightning: error: {err}", file=sys.stderr)
        sys.exit(2)
