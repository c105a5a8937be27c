"""A checkpoint of an adapter run holds what trains, not the frozen base model.

Lightning writes ``LightningModule.state_dict()`` whole: with LoRA that is the base model (frozen, and read
again from ``model.name_or_path`` by every run) plus a fraction of a percent of adapter weights. Here the
checkpoint's ``state_dict`` keeps the trainable parameters only (and the optimizer state, which holds only
those: see :func:`hf_lightning.module.optim.parameter_groups`), and records how many frozen entries it left
out. On load the frozen entries are filled back from the model as built, so Lightning's strict load still
refuses a checkpoint whose trainable weights do not fit (an adapter checkpoint without ``peft``, or another
rank or target list). ``HFLightningModule.on_save_checkpoint`` / ``on_load_checkpoint`` call
:func:`drop_frozen` / :func:`fill_frozen`.
"""

from __future__ import annotations

from typing import Any
from weakref import WeakKeyDictionary

KEY = "hf_lightning_adapter"
# the frozen base's fingerprint per LightningModule, computed once (the base does not change)
_FINGERPRINTS: WeakKeyDictionary = WeakKeyDictionary()


def is_adapter_model(model: Any) -> bool:
    """Whether ``model`` is a ``peft.PeftModel`` (checked without importing peft)."""
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def trainable_keys(module: Any) -> set[str]:
    """``state_dict`` names of ``module``'s parameters that require grad."""
    return {name for name, p in module.named_parameters() if p.requires_grad}


def base_fingerprint(module: Any) -> list[float]:
    """One float64 sum per frozen parameter of ``module`` (computed once, then cached on it: the base is
    frozen).

    A checkpoint without its base can be put on the wrong one (another ``model.name_or_path``, or a base built
    from a config with another seed); the fingerprint tells, within the rounding of a sum on another device.
    """
    cached = _FINGERPRINTS.get(module)
    if cached is None:
        cached = [
            float(p.detach().double().sum()) for _, p in module.named_parameters() if not p.requires_grad
        ]
        _FINGERPRINTS[module] = cached
    return cached


def same_base(saved: list[float], current: list[float]) -> bool:
    """Whether two fingerprints are of the same base (relative 1e-6 per sum, for sums taken on other
    devices)."""
    if len(saved) != len(current):
        return False
    return all(abs(a - b) <= 1e-6 * max(abs(a), abs(b), 1.0) for a, b in zip(saved, current, strict=True))


# LoRA settings that change what the same adapter weights compute (the scaling, the DoRA magnitude)
COMPUTE_SETTINGS = ("r", "lora_alpha", "use_rslora", "use_dora")


def adapter_settings_of(model: Any) -> dict[str, Any]:
    """The ``peft`` settings of ``model``'s default adapter that change its output
    (:data:`COMPUTE_SETTINGS`)."""
    config = model.peft_config["default"]
    return {k: getattr(config, k, None) for k in COMPUTE_SETTINGS}


def drop_frozen(module: Any, checkpoint: dict[str, Any]) -> None:
    """Keep only trainable entries in ``checkpoint["state_dict"]`` when ``module.model`` is an adapter
    model."""
    if not is_adapter_model(getattr(module, "model", None)) or "state_dict" not in checkpoint:
        return
    keep = trainable_keys(module)
    state = checkpoint["state_dict"]
    checkpoint["state_dict"] = {k: v for k, v in state.items() if k in keep}
    checkpoint[KEY] = {
        "frozen_entries_left_out": len(state) - len(checkpoint["state_dict"]),
        "base_model": str(getattr(module.model.get_base_model().config, "name_or_path", "") or ""),
        "base_fingerprint": base_fingerprint(module),
        "settings": adapter_settings_of(module.model),
    }


def fill_frozen(module: Any, checkpoint: dict[str, Any]) -> None:
    """Put the frozen entries of ``module`` (as built) into an adapter checkpoint's ``state_dict``.

    Only entries that are frozen in ``module`` and absent from the checkpoint are filled: a trainable weight
    the checkpoint lacks stays missing, and the strict load names it.

    Raises:
        ModelError: the checkpoint's base fingerprint (:func:`base_fingerprint`) is not the model's.
        ConfigError: the model's ``peft.r`` / ``lora_alpha`` / ``use_rslora`` / ``use_dora`` are not the ones
            the adapter was trained with (the same weights would compute another model).
    """
    if KEY not in checkpoint or "state_dict" not in checkpoint:
        return
    saved = checkpoint[KEY].get("base_fingerprint")
    adapter = is_adapter_model(getattr(module, "model", None))
    if saved is not None and adapter and not same_base(saved, base_fingerprint(module)):
        from hf_lightning.core.errors import ModelError

        base = checkpoint[KEY].get("base_model") or "a base built from model.config"
        raise ModelError(
            f"ckpt_path: this adapter checkpoint was trained on another base model ({base}); its frozen "
            "weights differ from the ones built now. Use the run's model.name_or_path and model.* overrides "
            "(and its seed, for a base built from a config)"
        )
    saved_settings = checkpoint[KEY].get("settings") or {}
    if adapter and saved_settings:
        now = adapter_settings_of(module.model)
        wrong = [k for k in COMPUTE_SETTINGS if k in saved_settings and saved_settings[k] != now[k]]
        if wrong:
            from hf_lightning.core.errors import ConfigError

            raise ConfigError(
                "; ".join(
                    f"peft.{k}={now[k]} but the checkpoint's adapter was trained with {saved_settings[k]}"
                    for k in wrong
                )
                + ": the same adapter weights would compute another model; use the run's peft.* overrides"
            )
    keep = trainable_keys(module)
    state = checkpoint["state_dict"]
    for name, value in module.state_dict().items():
        if name not in keep and name not in state:
            state[name] = value
