"""``hf_model/`` of an adapter run: the adapter (``PeftModel.save_pretrained``) or the merged model.

- Adapter (default): ``adapter_config.json`` + ``adapter_model.safetensors``, loadable with
  ``peft.AutoPeftModelForCausalLM.from_pretrained(hf_model)`` (which loads the base named by
  ``base_model_name_or_path``) or ``transformers.AutoModelForCausalLM.from_pretrained(hf_model)`` with peft
  installed. A base built from a config (the embedded default, no ``model.name_or_path``) has no folder to
  point at: it is saved into ``hf_model/base_model/``, and the adapter points at that folder by its absolute
  path (move the two together and edit ``base_model_name_or_path`` in ``adapter_config.json``).
- Merged (``export.merge_adapters=true``): ``merge_and_unload`` of a copy of the model (the trained one is
  left as it is), saved with ``save_pretrained``: a plain model folder for ``AutoModelForCausalLM``. A 4-bit
  (QLoRA) base is not merged into: the base is loaded again unquantized (in the compute dtype) and the adapter
  merged into that, as PEFT recommends.
"""

from __future__ import annotations

import copy
import logging
import os
from typing import Any

log = logging.getLogger(__name__)


def _base_source(model: Any) -> str | None:
    """The folder or hub id the base model was loaded from, if it can be loaded again."""
    name = getattr(model.get_base_model().config, "name_or_path", None)
    if not name:
        return None
    from hf_lightning.models.hub import looks_like_hub_id

    if os.path.isdir(name):
        return os.path.abspath(name)
    return name if looks_like_hub_id(name) else None


BASE_FOLDER = "base_model"


def base_state_dict(model: Any, state: dict[str, Any] | None = None) -> dict[str, Any]:
    """The base model's own weights, under its own names, from a ``PeftModel`` whose LoRA layers wrap them
    (or from ``state``, the ``PeftModel``'s whole state dict gathered from a sharded run).

    peft renames a wrapped layer's weight ``x.base_layer.weight`` and a ``modules_to_save`` module's original
    ``x.original_module.weight``; adapter tensors (``lora_*``, the trained copies of ``modules_to_save``) are
    left out. The result loads into the base architecture with ``from_pretrained``.
    """
    own = (
        model.get_base_model().state_dict()
        if state is None
        else {k.removeprefix("base_model.model."): v for k, v in state.items()}
    )
    base = {}
    for name, value in own.items():
        if ".lora_" in name or ".modules_to_save." in name:
            continue
        base[name.replace(".base_layer.", ".").replace(".original_module.", ".")] = value
    return base


def save_adapter(model: Any, folder: str, final_folder: str, state: dict[str, Any] | None = None) -> str:
    """Write the adapter of ``model`` into ``folder`` (which will be renamed ``final_folder``); returns what
    was written, for the log. ``state``: the ``PeftModel``'s whole state dict, gathered from a sharded run
    (``None``: the model's own tensors)."""
    base = _base_source(model)
    config = model.peft_config["default"]
    previous = config.base_model_name_or_path
    embeddings: str | bool = "auto"  # peft saves the embeddings when their vocabulary changed
    if base is None:  # the random-init base: keep it beside the adapter
        model.get_base_model().save_pretrained(
            os.path.join(folder, BASE_FOLDER), state_dict=base_state_dict(model, state)
        )
        base = os.path.join(os.path.abspath(final_folder), BASE_FOLDER)
        embeddings = False  # saved with the base
    config.base_model_name_or_path = base
    try:
        extra = {} if state is None else {"state_dict": state}
        model.save_pretrained(folder, save_embedding_layers=embeddings, **extra)
    finally:
        config.base_model_name_or_path = previous
    return f"the adapter (base: {base})"


def save_merged(model: Any, folder: str, state: dict[str, Any] | None = None) -> str:
    """Write the base model with the adapter merged into ``folder``; returns what was written, for the log.
    ``state``: the ``PeftModel``'s whole state dict, gathered from a sharded run: merged in an unsharded
    copy built from the model's config."""
    if state is not None:
        _unsharded_copy(model, state).merge_and_unload().save_pretrained(folder)
        return "the model with the adapter merged"
    if getattr(model.get_base_model(), "is_loaded_in_4bit", False):
        merged = _merged_from_reloaded_base(model)
    else:
        merged = copy.deepcopy(model).merge_and_unload()
    merged.save_pretrained(folder)
    return "the model with the adapter merged"


def _merged_from_reloaded_base(model: Any) -> Any:
    """QLoRA: the base loaded again in its compute dtype on CPU, the trained adapter set into it and
    merged."""
    import torch
    import transformers
    from peft import get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict

    base = model.get_base_model()
    source = _base_source(model)
    quantization = getattr(base.config, "quantization_config", None)
    if isinstance(quantization, dict):
        compute = quantization.get("bnb_4bit_compute_dtype")
    else:
        compute = getattr(quantization, "bnb_4bit_compute_dtype", None)
    if isinstance(compute, str):
        compute = getattr(torch, compute.removeprefix("torch."), None)
    auto = getattr(transformers, type(base).__name__)
    fresh = auto.from_pretrained(source, dtype=compute or torch.bfloat16)
    peft_model = get_peft_model(fresh, copy.deepcopy(model.peft_config["default"]))
    set_peft_model_state_dict(peft_model, {k: v.cpu() for k, v in get_peft_model_state_dict(model).items()})
    return peft_model.merge_and_unload()


def _unsharded_copy(model: Any, state: dict[str, Any]) -> Any:
    """A ``PeftModel`` like ``model`` on CPU, unsharded, holding ``state`` (its gathered state dict)."""
    from peft import get_peft_model

    base = model.get_base_model()
    fresh = type(base)(base.config)
    copy_ = get_peft_model(fresh, copy.deepcopy(model.peft_config["default"]))
    copy_.load_state_dict(state)
    return copy_
