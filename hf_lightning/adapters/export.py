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


def base_state_dict(model: Any, full_state: dict[str, Any] | None = None) -> dict[str, Any]:
    """The base model's own weights, under its own names, from a ``PeftModel`` whose LoRA layers wrap them.

    peft renames a wrapped layer's weight ``x.base_layer.weight`` and a ``modules_to_save`` module's original
    ``x.original_module.weight``; adapter tensors (``lora_*``, the trained copies of ``modules_to_save``) are
    left out. The result loads into the base architecture with ``from_pretrained``. ``full_state``: the
    ``PeftModel``'s whole state dict gathered already (a sharded model's), read instead of the model's own.
    """
    if full_state is None:
        items = model.get_base_model().state_dict().items()
    else:
        items = [(k.removeprefix("base_model.model."), v) for k, v in full_state.items()]
    state = {}
    for name, value in items:
        if ".lora_" in name or ".modules_to_save." in name:
            continue
        state[name.replace(".base_layer.", ".").replace(".original_module.", ".")] = value
    return state


def save_adapter(model: Any, folder: str, final_folder: str, full_state: dict[str, Any] | None = None) -> str:
    """Write the adapter of ``model`` into ``folder`` (which will be renamed ``final_folder``); returns what
    was written, for the log. ``full_state``: the ``PeftModel``'s whole state dict where its parameters are
    shards (FSDP2), gathered on this rank beforehand; ``None``: the model's own tensors."""
    base = _base_source(model)
    config = model.peft_config["default"]
    previous = config.base_model_name_or_path
    embeddings: str | bool = "auto"  # peft saves the embeddings when their vocabulary changed
    if base is None:  # the random-init base: keep it beside the adapter
        model.get_base_model().save_pretrained(
            os.path.join(folder, BASE_FOLDER), state_dict=base_state_dict(model, full_state)
        )
        base = os.path.join(os.path.abspath(final_folder), BASE_FOLDER)
        embeddings = False  # saved with the base
    config.base_model_name_or_path = base
    try:
        model.save_pretrained(folder, save_embedding_layers=embeddings, state_dict=full_state)
    finally:
        config.base_model_name_or_path = previous
    return f"the adapter (base: {base})"


def save_merged(model: Any, folder: str, full_state: dict[str, Any] | None = None) -> str:
    """Write the base model with the adapter merged into ``folder``; returns what was written, for the log.
    ``full_state``: as in :func:`save_adapter` (a sharded model's tensors, gathered on this rank)."""
    if full_state is not None:
        merged = _merged_from_state(model, full_state)
    elif getattr(model.get_base_model(), "is_loaded_in_4bit", False):
        merged = _merged_from_reloaded_base(model)
    else:
        merged = copy.deepcopy(model).merge_and_unload()
    merged.save_pretrained(folder)
    return "the model with the adapter merged"


def _merged_from_state(model: Any, full_state: dict[str, Any]) -> Any:
    """A sharded ``PeftModel``'s merge on one rank: a fresh base of the same class and config on the CPU, the
    gathered base and adapter tensors set into it, merged (the sharded model itself is left as it is)."""
    from peft import get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict

    base = model.get_base_model()
    fresh = type(base)(copy.deepcopy(base.config))
    missing, unexpected = fresh.load_state_dict(base_state_dict(model, full_state), strict=False)
    tied = set(getattr(fresh, "all_tied_weights_keys", None) or {})
    if unexpected or set(missing) - tied:
        raise RuntimeError(f"merging the gathered adapter: missing {missing}, unexpected {unexpected}")
    fresh.tie_weights()
    peft_model = get_peft_model(fresh, copy.deepcopy(model.peft_config["default"]))
    set_peft_model_state_dict(peft_model, get_peft_model_state_dict(model, state_dict=full_state))
    return peft_model.merge_and_unload()


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
