"""The files, folders and model settings a config names, checked before anything is built.

:func:`~hf_lightning.config.build.check` calls :func:`check_inputs` after the schema pass, so a missing
``data.path`` or model folder, or a misspelt ``model.config`` key, is said in one line before the tokenizer,
the data or the model is loaded (and before the run folder holds anything of this run). A string that is not
an existing path may be a hub id (:func:`hf_lightning.models.hub.looks_like_hub_id`): the loaders resolve it
through their cache and say it when they cannot, so it passes here.

``model.config`` holds settings of the model's config class (``LlamaConfig``'s ``hidden_size``, ...).
``transformers``' config classes keep any keyword as an attribute, so a misspelt name
(``model.config.hiden_size=64``) would build a model that ignores it: each name is checked against the
config class of the model (the ``architecture``'s with ``model.name_or_path=null``, the folder's
``config.json`` otherwise), with the closest name as a suggestion. A pretrained model keeps its
``config.json`` (the weights were trained with it): a ``model.config`` value given on the command line that
differs from the folder's cannot take effect, and is refused; the model group's own defaults (written for a
model built from its ``architecture``, whose names the folder's class may not have: a Llama's
``num_key_value_heads`` with a GPT-2 folder) are not used with a folder, which one INFO line says. A name
neither class has is refused wherever it comes from.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import logging
import os
from collections.abc import Collection, Mapping
from typing import Any

from hf_lightning.core.arguments import shown
from hf_lightning.core.errors import ConfigError, DataError

log = logging.getLogger("hf_lightning.build")

#: the data settings that name a file, a ``save_to_disk`` folder or a hub dataset
DATA_PATHS = ("path", "validation_path", "test_path")


def check_inputs(c: Mapping[str, Any], given: Collection[str] | None = None) -> None:
    """Check every path and ``model.config`` key of the resolved config ``c``; nothing is loaded.

    Args:
        c: the resolved config (a plain mapping).
        given: the dotted keys the command line sets (``None``: no command line, a config composed in
            Python; then no ``model.config`` value counts as given).

    Raises:
        DataError: a data path that is neither an existing file or folder nor a hub id.
        ModelError: a ``model.name_or_path`` / ``model.tokenizer_name_or_path`` that is neither a model
            (tokenizer) folder nor a hub id (:func:`hf_lightning.models.files.check_folder`).
        ConfigError: a ``model.config`` key its config class does not have, or a value given for a pretrained
            model that differs from its ``config.json``.
    """
    data, model = c.get("data") or {}, c.get("model") or {}
    for key in DATA_PATHS:
        data_path_error(data.get(key), f"data.{key}")
    if not isinstance(model, Mapping) or "name_or_path" not in model:
        return  # a model node of one's own: its _target_ says what it takes
    from hf_lightning.models.files import check_folder
    from hf_lightning.models.loading import resolve_name_or_path, tokenizer_from

    name = model.get("name_or_path")
    if name is not None:
        check_folder(resolve_name_or_path(name), os.fspath(name))
    tokenizer = model.get("tokenizer_name_or_path")
    if tokenizer is not None:
        from hf_lightning.models.hub import looks_like_hub_id

        path = resolve_name_or_path(tokenizer)
        if not looks_like_hub_id(path) and not os.path.isdir(path):
            tokenizer_from(tokenizer, "model.tokenizer_name_or_path")  # its one line for a missing folder
    errors = model_config_errors(model, given)
    if errors:
        raise ConfigError("; ".join(errors))


def data_path_error(value: Any, key: str) -> None:
    """Raise :class:`DataError` for a path string that names nothing on disk and is not a hub id (the words
    of :func:`hf_lightning.data.sources.load_source`); other values (``None``, an in-memory dataset) pass."""
    if not isinstance(value, (str, os.PathLike)) or os.path.exists(value):
        return
    from hf_lightning.models.hub import looks_like_hub_id

    if not looks_like_hub_id(os.fspath(value)):
        raise DataError(f"{key}={os.fspath(value)}: no such file or folder")


def config_settings(config: Any) -> set[str]:
    """The settings a ``transformers`` config object has: its ``to_dict()`` keys, its class's
    ``attribute_map`` aliases (``n_embd`` for ``hidden_size``) and its ``__init__`` arguments."""
    names = set(config.to_dict())
    names |= set(getattr(type(config), "attribute_map", {}) or {})
    names |= {
        p.name
        for p in inspect.signature(type(config).__init__).parameters.values()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self"
    }
    return names


def _base_config(model: Mapping[str, Any]) -> tuple[Any, str | None]:
    """``(config object, folder or hub id)``: the config a ``model`` node's ``model.config`` keys belong to
    (the folder's ``config.json``, else the ``architecture``'s defaults); ``(None, ...)`` when it cannot be
    read here (an uncached hub id, an unknown architecture: the loader says it)."""
    from transformers import AutoConfig

    from hf_lightning.models.loading import resolve_name_or_path

    name = model.get("name_or_path")
    if name is None:
        try:
            return AutoConfig.for_model(model.get("architecture") or "llama"), None
        except (ValueError, KeyError):
            return None, None
    path = resolve_name_or_path(name)
    kwargs = {"revision": model["revision"]} if model.get("revision") else {}
    try:  # a hub id from the cache only: a download is the loader's business
        return AutoConfig.from_pretrained(path, local_files_only=True, **kwargs), os.fspath(name)
    except Exception:  # not cached, an adapter export without config.json: the loader decides
        return None, os.fspath(name)


def model_config_errors(model: Mapping[str, Any], given: Collection[str] | None) -> list[str]:
    """The ``model.config`` keys that cannot take effect (see the module docstring), one line each."""
    overrides = model.get("config") or {}
    if not isinstance(overrides, Mapping) or not overrides:
        return []
    config, pretrained = _base_config(model)
    if config is None:
        return []
    known = sorted(config_settings(config))

    @functools.cache
    def group_known() -> frozenset[str]:  # the settings of the architecture the model group is written for
        from transformers import AutoConfig

        try:
            return frozenset(config_settings(AutoConfig.for_model(model.get("architecture") or "llama")))
        except (ValueError, KeyError):
            return frozenset()

    kind = type(config).__name__
    errors, unused = [], []
    for key, value in overrides.items():
        key = str(key)
        user_given = given is not None and ("model.config" in given or f"model.config.{key}" in given)
        if pretrained is not None and not user_given and (key in known or key in group_known()):
            # the model group's own keys, written for a model built from its architecture (a Llama's with a
            # GPT-2 folder): not used with a folder; a name neither class has is a typo, refused below
            if key not in known or getattr(config, key, None) != value:
                unused.append(key)
            continue
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f" (did you mean model.config.{close[0]}?)" if close else ""
            errors.append(
                f"model.config.{key}={shown(value)}: {kind} has no setting {key}{hint}; model.config takes "
                f"the settings of the model's config class ({kind}: the keys of its config.json)"
            )
            continue
        if pretrained is None:
            continue
        current = getattr(config, key, None)
        if value == current:
            continue
        errors.append(
            f"model.config.{key}={shown(value)} with model.name_or_path={pretrained}: a pretrained model "
            f"keeps its config.json ({key}={shown(current)}), with which its weights were trained, so "
            "model.config cannot take effect; drop it, or set model.name_or_path=null to build a model "
            "from model.config"
        )
    if unused and not errors:
        log.info(
            "model.name_or_path=%s: the model keeps its config.json; the model group's model.config (%s, "
            "for a model built from a config) is not used",
            pretrained,
            ", ".join(unused),
        )
    return errors
