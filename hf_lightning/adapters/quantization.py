"""QLoRA's 4-bit base model: ``transformers.BitsAndBytesConfig`` for ``from_pretrained``, CUDA only."""

from __future__ import annotations

from typing import Any

from hf_lightning.adapters.settings import AdapterSettings
from hf_lightning.core.errors import ConfigError


def qlora_refusal(settings: AdapterSettings | None, accelerator: Any, cuda_available: bool) -> str | None:
    """The one-line refusal of ``peft=qlora`` where it cannot run, or ``None``.

    ``bitsandbytes``' 4-bit kernels need CUDA: a CPU run (``trainer.accelerator=cpu``, or ``auto`` / ``gpu``
    on a machine without a CUDA device) is refused before the model is loaded.
    """
    if settings is None or not settings.load_in_4bit:
        return None
    if str(accelerator) == "cpu" or not cuda_available:
        where = "trainer.accelerator=cpu" if str(accelerator) == "cpu" else "this machine has no CUDA device"
        return (
            f"peft=qlora (peft.load_in_4bit=true) on {where}: the 4-bit base model needs bitsandbytes on a "
            "CUDA GPU; use peft=lora on CPU, or trainer=gpu on a machine with a GPU"
        )
    return None


def quantization_config(settings: AdapterSettings | None) -> Any:
    """``BitsAndBytesConfig(load_in_4bit=True, ...)`` for a QLoRA base model, else ``None``.

    Raises:
        ConfigError: ``bitsandbytes`` is not installed (``pip install 'hf_lightning[qlora]'``), or an unknown
            ``bnb_4bit_compute_dtype``.
    """
    if settings is None or not settings.load_in_4bit:
        return None
    import importlib.util

    import torch
    from transformers import BitsAndBytesConfig

    if importlib.util.find_spec("bitsandbytes") is None:
        raise ConfigError("peft=qlora needs the package bitsandbytes: pip install 'hf_lightning[qlora]'")
    dtype = getattr(torch, str(settings.bnb_4bit_compute_dtype), None)
    if not isinstance(dtype, torch.dtype):
        raise ConfigError(
            f"peft.bnb_4bit_compute_dtype={settings.bnb_4bit_compute_dtype}: allowed values: bfloat16, "
            "float16, float32"
        )
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type=settings.bnb_4bit_quant_type,
        bnb_4bit_compute_dtype=dtype,
        bnb_4bit_use_double_quant=settings.bnb_4bit_use_double_quant,
        bnb_4bit_quant_storage=dtype,
    )
