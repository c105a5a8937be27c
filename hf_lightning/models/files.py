"""``from_pretrained`` whose failures name the culprit: a folder without weights or with a broken
``config.json``, an attention implementation whose package is missing, an unreachable hub id."""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from hf_lightning.core.errors import ModelError
from hf_lightning.models.hub import hub_error_message, looks_like_hub_id

log = logging.getLogger(__name__)

WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


def check_config_json(path: str, key: str = "model.name_or_path") -> None:
    """Raise :class:`ModelError` when ``path/config.json`` is not one JSON object (a truncated copy, a merge
    conflict), naming the line and column, before the tokenizer or the model loader trip over it; ``key`` is
    the setting that named the folder."""
    file = os.path.join(path, "config.json")
    try:
        with open(file, encoding="utf-8") as fh:
            value = json.load(fh)
    except (ValueError, UnicodeDecodeError) as err:
        raise ModelError(f"{key}={path}: config.json is not valid JSON ({err})") from err
    if not isinstance(value, dict):
        raise ModelError(f"{key}={path}: config.json holds a JSON {type(value).__name__}, not an object")


# the package each attention backend needs (transformers names only the backend when it is missing)
ATTENTION_PACKAGES = {
    "flash_attention_2": "flash-attn (pip install flash-attn, on a machine with CUDA)",
    "flash_attention_3": "flash-attn 3 (flash_attn_interface, built from the flash-attention repository's "
    "hopper/)",
    "flash_attention_4": "flash-attn 4 (flash_attn.cute)",
}


def attention_error(attn_implementation: Any, err: BaseException) -> ModelError | None:
    """``model.attn_implementation`` as the culprit of a model construction error: a backend whose package is
    not installed, or one transformers does not know; ``None`` when ``err`` is about something else."""
    text = " ".join(str(err).split())
    if isinstance(err, ImportError) and "toggled on" in text:
        package = ATTENTION_PACKAGES.get(str(attn_implementation), "the package that backend needs")
        return ModelError(
            f"model.attn_implementation={attn_implementation}: its package is not installed "
            f"({text.split(': ')[-1]}); install {package}, or use model.attn_implementation=sdpa"
        )
    if "attn_implementation" in text and "is not supported" in text:
        return ModelError(f"model.attn_implementation={attn_implementation}: {text}")
    return None


HUB_ERRORS = ("HfHubHTTPError", "LocalEntryNotFoundError", "OfflineModeIsEnabled", "EntryNotFoundError")


def is_hub_failure(err: BaseException) -> bool:
    """Whether a loader's exception is about reaching the hub or its cache (not about a file's content)."""
    from hf_lightning.models.hub import _causes

    for e in _causes(err):
        if any(c.__name__ in HUB_ERRORS or c.__name__.endswith("NotFoundError") for c in type(e).__mro__):
            return True
        text = str(e)
        if (
            "couldn't connect" in text
            or "not a valid model identifier" in text
            or "is not a local folder" in text
        ):
            return True
    return False


def from_pretrained(auto_class: Any, path: str, key: str = "model.name_or_path", **kwargs: Any) -> Any:
    """``auto_class.from_pretrained(path, **kwargs)``; a folder whose files cannot be read becomes a
    ModelError.

    ``path`` may be a hub id: ``from_pretrained`` resolves it through its cache (``HF_HUB_CACHE``) and, unless
    ``HF_HUB_OFFLINE=1``, the hub; ``kwargs`` may carry its ``revision``.

    Raises:
        ModelError: weights that are truncated or corrupt, a config naming an unknown architecture, or weights
            that do not fit the config (the loader's reason is kept); a hub id that is neither cached nor
            reachable (:func:`hf_lightning.models.hub.hub_error_message`).
    """
    try:
        return auto_class.from_pretrained(path, **kwargs)
    except Exception as err:  # json, safetensors, pickle and torch each raise their own types for a bad file
        attention = attention_error(kwargs.get("attn_implementation"), err)
        if attention is not None:
            raise attention from err
        if looks_like_hub_id(path) and is_hub_failure(err):
            raise ModelError(hub_error_message(key, path, "model", kwargs.get("revision"), err)) from None
        reason = " ".join(str(err).split())[:300]
        raise ModelError(
            f"{key}={path}: the model could not be loaded ({type(err).__name__}: {reason}); the "
            "folder must hold a complete save_pretrained output (config.json and all weight files)"
        ) from err


def check_folder(path: str, original: str, key: str = "model.name_or_path") -> None:
    """Raise a ModelError naming ``key=original`` when ``path`` is not a model folder (no folder, no
    ``config.json``, a broken one, no weights); a hub id or a ``peft`` adapter export passes."""
    if looks_like_hub_id(path):
        return  # from_pretrained resolves it through the hub cache, and says so when it cannot
    if not os.path.isdir(path):
        hint = ""
        if str(original).endswith(".ckpt"):
            # a Lightning checkpoint: its weights are read with ckpt_path, by evaluate or by a resume
            hint = (
                "; a .ckpt is read with ckpt_path: python -m hf_lightning.evaluate ckpt_path="
                + str(original)
                + " (with the run's overrides), or train ... ckpt_path="
                + str(original)
                + " to continue from it"
            )
        raise ModelError(f"{key}={original}: not a folder (expected a local HF model folder){hint}")
    if os.path.isfile(os.path.join(path, "adapter_config.json")):
        return  # a peft adapter export: from_pretrained loads its base model and the adapter (peft installed)
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise ModelError(f"{key}={original}: no config.json, so not a model folder saved by save_pretrained")
    check_config_json(path, key)
    if not any(os.path.exists(os.path.join(path, f)) for f in WEIGHT_FILES):
        raise ModelError(f"{key}={original}: no weights (looked for {', '.join(WEIGHT_FILES)})")
