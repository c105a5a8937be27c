"""The config rules that involve more than one key (the schema's last pass, before the model is built).

Each rule returns its problems as lines naming every key involved, its value and what to change; rules whose
subject has one home elsewhere call it (``data.packing``:
:func:`hf_lightning.data.packing.packing_config_errors`; optimizers:
:func:`hf_lightning.module.optim.optim_config_errors`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hf_lightning.core.arguments import GPU_ONLY_PRECISIONS, gpu_only_precision_error
from hf_lightning.core.errors import ConfigError


def cross_field_errors(c: Mapping[str, Any]) -> list[str]:
    """Rules that involve more than one key."""
    from hf_lightning.data.packing import packing_config_errors
    from hf_lightning.module.optim import optim_config_errors

    errors: list[str] = []
    data, model, trainer = c.get("data") or {}, c.get("model") or {}, c.get("trainer") or {}
    accelerator = trainer.get("accelerator")
    precision = str(trainer.get("precision"))

    errors += packing_config_errors(data, model)  # data.packing: its rules live in data/packing.py

    if precision in GPU_ONLY_PRECISIONS:
        import torch

        refusal = gpu_only_precision_error(precision, accelerator, torch.cuda.is_available())
        if refusal:
            errors.append(refusal)

    strategy = trainer.get("strategy")
    target = strategy.get("_target_", "") if isinstance(strategy, Mapping) else str(strategy)
    if "fsdp" in target.lower() and isinstance(strategy, Mapping):
        from hf_lightning.strategies.fsdp import fsdp_config_errors

        errors += fsdp_config_errors(strategy, accelerator)
    if "deepspeed" in target.lower() and isinstance(strategy, Mapping):
        from hf_lightning.strategies.deepspeed import deepspeed_config

        try:
            deepspeed_config(
                strategy.get("stage", 2),
                strategy.get("micro_batch_size"),
                strategy.get("gradient_accumulation_steps"),
                strategy.get("max_grad_norm"),
                strategy.get("precision"),
                strategy.get("devices", 1),
                strategy.get("num_nodes", 1),
                strategy.get("offload_optimizer", False),
                strategy.get("offload_parameters", False),
                strategy.get("config"),
            )
        except ConfigError as err:
            errors.append(str(err))
    peft = c.get("peft")
    if isinstance(peft, Mapping) and peft.get("load_in_4bit"):
        import torch

        from hf_lightning.adapters.quantization import qlora_refusal
        from hf_lightning.adapters.settings import AdapterSettings

        refusal = qlora_refusal(AdapterSettings(load_in_4bit=True), accelerator, torch.cuda.is_available())
        if refusal:
            errors.append(refusal)
        if model.get("name_or_path") is None:
            errors.append(
                "peft=qlora with model.name_or_path=null: QLoRA quantizes pretrained weights; set "
                "model.name_or_path to a model folder or hub id"
            )
    if model.get("gradient_checkpointing") and "fsdp" in target.lower():
        errors.append(
            "model.gradient_checkpointing=true with strategy=fsdp: FSDP checkpoints its wrapped layers "
            "itself; use strategy.activation_checkpointing=true (allowed: model.gradient_checkpointing=false)"
        )
    errors += optim_config_errors(c)  # hf_lightning.module.optim: CUDA-only names, metric-driven schedules
    return errors


#: Lightning's settings that take a fraction of a loader's length, which a stream does not have (Lightning
#: refuses them once ``fit`` has started, with a ``MisconfigurationException``): key -> what to give instead
FRACTIONS_OF_A_LOADER = {
    "trainer.val_check_interval": (
        "an integer N (validate every N optimizer steps), eval_steps=N, or 1.0 (at the end of the stream)"
    ),
    "trainer.limit_train_batches": "an integer (that many optimizer steps an epoch) or 1.0",
    "trainer.overfit_batches": "an integer (that many batches) or 0",
    "trainer.limit_val_batches": "an integer (that many batches) or 1.0",
    "trainer.limit_test_batches": "an integer (that many batches) or 1.0",
}


#: the keys of :data:`FRACTIONS_OF_A_LOADER` that only a training run reads
TRAINING_ONLY = ("trainer.val_check_interval", "trainer.limit_train_batches", "trainer.overfit_batches")


def stream_length_errors(c: Mapping[str, Any], purpose: str = "train") -> list[str]:
    """With ``data.streaming=true`` the loaders are streams, with no length to take a fraction of: a
    fraction in (0, 1) of :data:`FRACTIONS_OF_A_LOADER` is refused, naming both keys. Run on the config the
    HF step keys were applied to (``eval_steps`` sets ``trainer.val_check_interval=null``); ``purpose`` other
    than ``train`` leaves out :data:`TRAINING_ONLY`."""
    data, trainer = c.get("data") or {}, c.get("trainer") or {}
    if not data.get("streaming"):
        return []
    errors = []
    for key, instead in FRACTIONS_OF_A_LOADER.items():
        if purpose != "train" and key in TRAINING_ONLY:
            continue
        value = trainer.get(key.split(".", 1)[1])
        if isinstance(value, float) and 0 < value < 1:
            errors.append(
                f"data.streaming=true with {key}={value:g}: a stream has no length to take a fraction of "
                f"(Lightning needs a sized loader for it); give {key} {instead}, or data.streaming=false"
            )
    return errors
