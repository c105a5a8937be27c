"""HF ``TrainingArguments`` names at the top level of a config: our key for each, or why it is not honoured.

A Trainer user writes ``+learning_rate=5e-5``; Hydra would store it and the run would ignore it. The schema's
closed top level refuses it with our key instead (``learning_rate is HF's name: use optim.lr=5e-05``). Every
field of the installed ``transformers.TrainingArguments`` is in :data:`OURS` or :data:`NOT_HONOURED` (a test
checks it, so a new transformers field shows up as one failing test). Names that are ours too (``seed``,
``output_dir``, and :data:`~hf_lightning.config.hf_args.HF_RUN_KEYS`: ``eval_steps``,
``metric_for_best_model``, ...) are accepted by the schema before this table is read. TODO (coordinator):
:mod:`hf_lightning.migrate.fields` holds a second table of the same fields for ``python -m
hf_lightning.migrate``; one of the two should read the other.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from hf_lightning.config.hf_args import HF_RUN_KEYS


def _value(v: Any) -> str:
    """A value as a Hydra override writes it."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_value(x)}" for k, x in v.items()) + "}"
    return str(v)


def _warmup(v: Any) -> str:
    """HF's ``warmup_steps``: a whole number of steps, or below 1 a ratio of the run (transformers 5)."""
    if isinstance(v, float) and 0 < v < 1:
        return f"scheduler.warmup_steps=0 scheduler.warmup_ratio={_value(v)}"
    steps = int(v) if isinstance(v, float) and v.is_integer() else v
    return f"scheduler.warmup_steps={_value(steps)}"


def _optim_args(v: Any) -> str:
    """HF's ``optim_args`` string (``"k=v,k2=v2"``) as the mapping ``optim.kwargs`` (which takes the string
    too, but a shell and Hydra's parser split it at its commas and equals signs)."""
    from hf_lightning.core.errors import ConfigError
    from hf_lightning.module.optim import parse_optim_args

    try:
        kwargs = parse_optim_args(v)
    except ConfigError:
        kwargs = {}
    return f"optim.kwargs='{_value(kwargs)}'" if kwargs else "optim.kwargs='{KEY: VALUE}'"


def _scheduler_kwargs(v: Any) -> str:
    """HF's ``lr_scheduler_kwargs`` (a mapping, or its JSON text) as ``scheduler.kwargs``."""
    import json

    if isinstance(v, str):
        with contextlib.suppress(ValueError):
            v = json.loads(v)
    return f"scheduler.kwargs='{_value(v)}'" if isinstance(v, dict) else "scheduler.kwargs='{KEY: VALUE}'"


_Key = str | Callable[[Any], str]

# HF field -> our override ("{value}" is the user's value)
OURS: dict[str, _Key] = {
    "output_dir": "hydra.run.dir={value}",
    "per_device_train_batch_size": "data.per_device_train_batch_size={value}",
    "per_device_eval_batch_size": "data.per_device_eval_batch_size={value}",
    "num_train_epochs": "trainer.max_epochs={value}",
    "max_steps": "trainer.max_steps={value}",
    "learning_rate": "optim.lr={value}",
    "lr_scheduler_type": "scheduler={value} (constant, linear, cosine; constant_with_warmup as "
    "scheduler.name)",
    "warmup_steps": _warmup,
    "lr_scheduler_kwargs": _scheduler_kwargs,
    "optim_args": _optim_args,
    "optim": "optim=adamw or optim=sgd (HF's adamw_torch / adamw_torch_fused: optim=adamw)",
    "weight_decay": "optim.weight_decay={value}",
    "adam_beta1": "optim.betas=[{value},0.999]",
    "adam_beta2": "optim.betas=[0.9,{value}]",
    "adam_epsilon": "optim.eps={value}",
    "gradient_accumulation_steps": "data.gradient_accumulation_steps={value}",
    "average_tokens_across_devices": "module.average_tokens_across_devices={value}",
    "max_grad_norm": "module.max_grad_norm={value}",
    "label_smoothing_factor": "module.label_smoothing_factor={value}",
    "bf16": lambda v: f"trainer.precision={'bf16-mixed' if v else '32-true'}",
    "fp16": lambda v: (
        "trainer=gpu trainer.precision=16-mixed on a GPU (on the CPU: trainer.precision=bf16-mixed)"
        if v
        else "trainer.precision=32-true"
    ),
    "activation_checkpointing": "model.gradient_checkpointing={value}",
    "gradient_checkpointing": "model.gradient_checkpointing={value}",
    "torch_compile": "model.compile={value}",
    "disable_tqdm": lambda v: f"trainer.enable_progress_bar={_value(not v)}",
    "report_to": "logger={value} (csv, tensorboard, mlflow, wandb, many)",
    "save_total_limit": "callbacks.model_checkpoint.save_top_k={value}",
    "eval_accumulation_steps": "+module.eval_accumulation_steps={value}",
    "batch_eval_metrics": "+module.batch_eval_metrics={value}",
    "full_determinism": "trainer.deterministic={value}",
    "seed": "seed={value}",
    "data_seed": "data.seed={value}",
    "use_cpu": lambda v: "trainer.accelerator=cpu" if v else "trainer=gpu",
    "dataloader_drop_last": "data.drop_last={value}",
    "dataloader_num_workers": "data.num_workers={value}",
    "dataloader_pin_memory": "data.pin_memory={value}",
    "dataloader_persistent_workers": "data.persistent_workers={value}",
    "dataloader_prefetch_factor": "data.prefetch_factor={value}",
    "remove_unused_columns": "data.remove_unused_columns={value}",
    "label_names": "data.label_names={value}",
    "train_sampling_strategy": "data.group_by_length=true for group_by_length (random order is the default)",
    "ddp_find_unused_parameters": "strategy=ddp trainer.strategy.find_unused_parameters={value}",
    "ddp_static_graph": "strategy=ddp trainer.strategy.static_graph={value}",
    "ddp_bucket_cap_mb": "strategy=ddp +trainer.strategy.bucket_cap_mb={value}",
    "ddp_broadcast_buffers": "strategy=ddp +trainer.strategy.broadcast_buffers={value}",
    "fsdp": "strategy=fsdp (its settings are trainer.strategy.*)",
    "fsdp_config": "strategy=fsdp with trainer.strategy.* keys",
    "deepspeed": "strategy=deepspeed_zero2 or deepspeed_zero3 trainer.strategy.config={value}",
    "resume_from_checkpoint": "ckpt_path={value} (ckpt_path=last: this run folder's newest checkpoint)",
    # HF's run-level names are ours too, with HF's semantics (hf_lightning/config/hf_args.py): accepted by the
    # schema before this table is read, listed here so the table covers every field
    **{key: f"{key}={{value}}" for key in HF_RUN_KEYS},
}

_HUB = "no upload to the Hub here: hf_model/ is a save_pretrained folder to push yourself"
_EVAL = "validation runs every trainer.val_check_interval micro-batches and at the end of training"
# HF field -> why it has no key here
NOT_HONOURED: dict[str, str] = {
    "optim_target_modules": "no GaLore/APOLLO optimizers here",
    "tf32": "not a setting here (torch.backends.cuda.matmul.allow_tf32 in your own launcher)",
    "bf16_full_eval": "evaluation runs at trainer.precision",
    "fp16_full_eval": "evaluation runs at trainer.precision",
    "activation_checkpointing_kwargs": "activation checkpointing is always non-reentrant here",
    "gradient_checkpointing_kwargs": "activation checkpointing is always non-reentrant here",
    "torch_compile_backend": "model.compile=true uses torch.compile's defaults",
    "torch_compile_mode": "model.compile=true uses torch.compile's defaults",
    "use_liger_kernel": "no Liger kernels; module.lean_loss (on by default) gives the fused loss's memory "
    "saving",
    "liger_kernel_config": "no Liger kernels",
    "use_cache": "the model's use_cache is switched off for training by the module itself",
    "neftune_noise_alpha": "NEFTune is not implemented",
    "torch_empty_cache_steps": "not implemented",
    "auto_find_batch_size": "not implemented; an out-of-memory error names the batch size and accumulation "
    "to try",
    "logging_strategy": "rows are written every trainer.log_every_n_steps optimizer steps",
    "log_on_each_node": "rank 0 logs for the run",
    "logging_nan_inf_filter": "callbacks.nonfinite_guard stops (or skips) a non-finite step instead of "
    "hiding it",
    "include_num_input_tokens_seen": "callbacks.throughput logs the real and padded tokens of each row",
    "log_level": "log levels are Hydra's (hydra.job_logging)",
    "log_level_replica": "log levels are Hydra's (hydra.job_logging)",
    "run_name": "the run folder (hydra.run.dir) names the run; a logger's own name is logger.NAME.name",
    "project": "a tracker's project is a logger setting (logger=wandb: logger.wandb.project)",
    "trackio_space_id": "no trackio logger here",
    "trackio_bucket_id": "no trackio logger here",
    "trackio_static_space_id": "no trackio logger here",
    "eval_delay": _EVAL,
    "prediction_loss_only": "python -m hf_lightning.evaluate writes the loss and the predictions",
    "eval_on_start": "trainer.num_sanity_val_steps runs validation batches before training",
    "eval_do_concat_batches": "predictions are gathered per example in dataset order",
    "eval_use_gather_object": "predictions are gathered per example in dataset order",
    "include_for_metrics": "compute_metrics receives predictions and labels",
    "save_only_model": "checkpoints hold the optimizer state so a resume is exact; hf_model/ holds the model "
    "only",
    "save_on_each_node": "rank 0 writes the checkpoints",
    "enable_jit_checkpoint": "callbacks.preemption checkpoints on SIGTERM/SIGINT at the next optimizer step",
    "push_to_hub": _HUB,
    "hub_token": _HUB,
    "hub_private_repo": _HUB,
    "hub_model_id": _HUB,
    "hub_strategy": _HUB,
    "hub_always_push": _HUB,
    "hub_revision": _HUB,
    "ignore_data_skip": "a resume restores the data position exactly, without replaying batches",
    "restore_callback_states_from_checkpoint": "callback states are always restored with ckpt_path",
    "accelerator_config": "the strategy group chooses how processes work together (strategy=ddp, fsdp, ...)",
    "parallelism_config": "the strategy group chooses how processes work together (strategy=ddp, fsdp, ...)",
    "dataloader_multiprocessing_context": "data loader workers use torch's default start method",
    "dataloader_in_order": "each rank reads its own shard in order",
    "length_column_name": "lengths for data.group_by_length are the tokenized lengths",
    "ddp_backend": "Lightning picks gloo on CPU and NCCL on GPU",
    "ddp_timeout": "Lightning's default process-group timeout applies",
    "debug": "trainer=debug runs a few checked steps (anomaly detection, validation every 2 steps)",
    "skip_memory_metrics": "no memory metrics are logged",
    "do_train": "python -m hf_lightning.train trains; python -m hf_lightning.evaluate only evaluates",
    "do_eval": "python -m hf_lightning.train validates; python -m hf_lightning.evaluate only evaluates",
    "do_predict": "python -m hf_lightning.evaluate writes predictions.jsonl",
    "local_rank": "set for each process by the launcher (Lightning)",
}


# names older transformers had in TrainingArguments and a user still writes (not in the installed one, so
# not in OURS, whose every name is a field): our key for each
GONE: dict[str, _Key] = {
    # transformers 5 dropped it: its warmup_steps below 1 is the ratio
    "warmup_ratio": lambda v: f"scheduler.warmup_steps=0 scheduler.warmup_ratio={_value(v)}",
}

# TRL config names (``SFTConfig``, beyond ``TrainingArguments``) that have a key here
TRL_OURS: dict[str, _Key] = {
    "dataset_num_proc": "data.num_proc={value}",
}


def hf_name_error(key: str, value: Any) -> str | None:
    """The one-line refusal of a top-level ``key`` that is an HF ``TrainingArguments`` (or TRL) name, else
    ``None``."""
    if key in TRL_OURS:
        ours = TRL_OURS[key]
        return (
            f"{key} is TRL's name: use "
            f"{ours(value) if callable(ours) else ours.replace('{value}', _value(value))}"
        )
    if key in OURS:
        ours = OURS[key]
        use = ours(value) if callable(ours) else ours.replace("{value}", _value(value))
        return f"{key} is HF's name: use {use}"
    if key in NOT_HONOURED:
        return f"{key} is an HF TrainingArguments name not honoured here: {NOT_HONOURED[key]}"
    if key in GONE:
        ours = GONE[key]
        return (
            f"{key} is not a top-level key: use "
            f"{ours(value) if callable(ours) else ours.replace('{value}', _value(value))} (the name older "
            "transformers gave it in TrainingArguments)"
        )
    return None
