"""The ``SFTConfig`` the TRL parity tests run ``SFTTrainer`` with: our run's settings in TRL's names, on the
CPU, in the data's order (no shuffling, sequential sampling), one optimizer step logged per row, nothing
saved."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def sft_config(
    output_dir: Path, micro: int, accumulation: int, lr: float, seed: int, **overrides: Any
) -> Any:
    """``trl.SFTConfig`` for a side-by-side run: AdamW (torch's), a linear schedule without warm-up,
    clipping at 1.0, no weight decay, one epoch; ``overrides`` (``padding_free``, ...) replace any of them."""
    from trl import SFTConfig

    settings: dict[str, Any] = {
        "output_dir": str(output_dir),
        "per_device_train_batch_size": micro,
        "gradient_accumulation_steps": accumulation,
        "num_train_epochs": 1,
        "learning_rate": lr,
        "weight_decay": 0.0,
        "max_grad_norm": 1.0,
        "lr_scheduler_type": "linear",
        "warmup_steps": 0,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": [],
        "use_cpu": True,
        "bf16": False,
        "fp16": False,
        "seed": seed,
        "optim": "adamw_torch",
        "gradient_checkpointing": False,
        "max_length": None,
        "packing": False,
        "padding_free": False,
        "shuffle_dataset": False,
        "train_sampling_strategy": "sequential",
        "dataloader_num_workers": 0,
        "disable_tqdm": True,
    }
    settings.update(overrides)
    return SFTConfig(**settings)
