"""Load a model and tokenizer from a local HF folder, or build the embedded default."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from typing import Any

from hf_lightning.errors import ModelError

log = logging.getLogger(__name__)

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")


def check_config_json(path: str) -> None:
    """Raise :class:`ModelError` when ``path/config.json`` is not one JSON object (a truncated copy, a merge
    conflict), naming the line and column, before the tokenizer or the model loader trip over it."""
    file = os.path.join(path, "config.json")
    try:
        with open(file, encoding="utf-8") as fh:
            value = json.load(fh)
    except (ValueError, UnicodeDecodeError) as err:
        raise ModelError(f"model.name_or_path={path}: config.json is not valid JSON ({err})") from err
    if not isinstance(value, dict):
        raise ModelError(f"model.name_or_path={path}: config.json holds a JSON {type(value).__name__}, not an object")


def from_pretrained(auto_class: Any, path: str, **kwargs: Any) -> Any:
    """``auto_class.from_pretrained(path, **kwargs)``; a folder whose files cannot be read becomes a ModelError.

    Raises:
        ModelError: a ``config.json`` that is not valid JSON or names an unknown architecture, weights that are
            truncated or corrupt, or weights that do not fit the config (the loader's reason is kept).
    """
    try:
        return auto_class.from_pretrained(path, **kwargs)
    except Exception as err:  # json, safetensors, pickle and torch each raise their own types for a bad file
        reason = " ".join(str(err).split())[:300]
        raise ModelError(
            f"model.name_or_path={path}: the model could not be loaded ({type(err).__name__}: {reason}); the folder "
            "must hold a complete save_pretrained output (config.json and all weight files)"
        ) from err


def load_model_and_tokenizer(
    name_or_path: str | None = None,
    config: Mapping[str, Any] | None = None,
    architecture: str = "llama",
    tokenizer_vocab_size: int = 2048,
    attn_implementation: str | None = "sdpa",
) -> tuple[Any, Any]:
    """``(model, tokenizer)`` for ``model.name_or_path``.

    Args:
        name_or_path: a local folder saved with ``save_pretrained`` that holds a model (``config.json`` and
            weights) and its tokenizer. ``None``: the embedded default, a tokenizer trained on the
            chatterbot-corpus and a randomly initialised model built from ``config``.
        config: keyword arguments of the default architecture's config class (``LlamaConfig``); ignored with
            a folder.
        architecture: the ``transformers`` model type of the default model.
        tokenizer_vocab_size: vocabulary of the default tokenizer.
        attn_implementation: passed to ``transformers`` (``"sdpa"``, ``"eager"``, ...).

    Raises:
        ModelError: the folder does not exist, has no ``config.json``, no weights, or no tokenizer.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    if name_or_path is None:
        from hf_lightning.defaults import prepare_chatterbot, train_default_tokenizer

        tok_dir = train_default_tokenizer(prepare_chatterbot()["train"], vocab_size=tokenizer_vocab_size)
        tokenizer = AutoTokenizer.from_pretrained(tok_dir)
        cfg = AutoConfig.for_model(
            architecture,
            vocab_size=len(tokenizer),
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            bos_token_id=tokenizer.convert_tokens_to_ids("<|im_start|>"),
            **dict(config or {}),
        )
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation=attn_implementation)
        return model, tokenizer

    path = os.fspath(name_or_path)
    if not os.path.isdir(path):
        raise ModelError(f"model.name_or_path={path}: not a folder (expected a local HF model folder)")
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise ModelError(f"model.name_or_path={path}: no config.json, so not a model folder saved by save_pretrained")
    check_config_json(path)
    if not any(os.path.exists(os.path.join(path, f)) for f in WEIGHT_FILES):
        raise ModelError(f"model.name_or_path={path}: no weights (looked for {', '.join(WEIGHT_FILES)})")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except Exception as err:
        raise ModelError(f"model.name_or_path={path}: no loadable tokenizer in the folder ({err})") from err
    model = from_pretrained(AutoModelForCausalLM, path, attn_implementation=attn_implementation)
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        log.warning("tokenizer in %s has no pad token: using its eos token %r", path, tokenizer.eos_token)
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer
