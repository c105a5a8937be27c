"""``TrainingArguments`` fields -> our overrides, or the reason a field cannot be honoured.

:func:`convert` reads a ``TrainingArguments.to_dict()`` (what ``to_json_string()`` writes) and compares it
with the dict of a default ``TrainingArguments`` of the installed transformers. The core numbers (batch sizes,
accumulation, learning rate, schedule, run length, evaluation / save / logging schedule, seed) are always
written, since several of our defaults are not HF's (docs/migration.md, "Defaults that are not HF's"); any
other field is written when it is away from HF's default and we have its equivalent, or listed with why when
we do not.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

Overrides = list[str]
Dropped = list[tuple[str, Any, str]]

# fields that HF Trainer itself does not read (script flags, the launcher's rank): never listed
NOT_READ_BY_TRAINER = {"do_train", "do_eval", "do_predict", "local_rank", "output_dir"}
# fields honoured by what hf_lightning always does
ALWAYS_SO = {
    "use_cache": "no KV cache in training",
    "prediction_loss_only": "evaluation keeps sums and counts, never the logits, unless compute_metrics asks",
    "use_liger_kernel": "module.lean_loss=true (the default) is the memory-lean loss",
    "enable_jit_checkpoint": "SIGTERM / SIGINT checkpoint at the next optimizer step (callbacks.preemption)",
    "save_safetensors": "hf_model/ is written with safetensors",
}
# fields we have no equivalent for, with the reason or the way to get it
REASONS = {
    "optim_args": "not carried over: give the same string as optim.kwargs='k=v,...'",
    "optim_target_modules": "GaLore / APOLLO optimizers are not built in",
    "lr_scheduler_kwargs": "not carried over: give each as +scheduler.kwargs.KEY=VALUE",
    "bf16_full_eval": "evaluation runs in trainer.precision",
    "fp16_full_eval": "evaluation runs in trainer.precision",
    "tf32": "not set by hf_lightning: torch.backends.cuda.matmul.allow_tf32 in your own launcher",
    "activation_checkpointing": "FSDP's activation checkpointing: strategy=fsdp "
    "trainer.strategy.activation_checkpointing=true (the default under strategy=fsdp)",
    "activation_checkpointing_kwargs": "not supported",
    "gradient_checkpointing_kwargs": "model.gradient_checkpointing=true uses the model's default kwargs",
    "torch_compile_backend": "model.compile=true uses torch.compile's default backend",
    "torch_compile_mode": "model.compile=true uses torch.compile's default mode",
    "liger_kernel_config": "Liger kernels are not used (the lean loss is plain PyTorch)",
    "neftune_noise_alpha": "NEFTune noise is not supported",
    "torch_empty_cache_steps": "not supported",
    "auto_find_batch_size": "not supported: set data.per_device_train_batch_size and "
    "data.gradient_accumulation_steps",
    "log_on_each_node": "rank 0 logs for the run",
    "logging_nan_inf_filter": "non-finite losses stop the run "
    "(callbacks.nonfinite_guard.on_nonfinite=stop|skip)",
    "include_num_input_tokens_seen": "the log reports real tokens per second at the end, not a running count",
    "log_level": "Python logging levels are not set from the config",
    "log_level_replica": "Python logging levels are not set from the config",
    "run_name": "the run folder (hydra.run.dir) names the run",
    "project": "logger=wandb: logger.wandb.project=NAME",
    "trackio_space_id": "Trackio is not a logger here",
    "trackio_bucket_id": "Trackio is not a logger here",
    "trackio_static_space_id": "Trackio is not a logger here",
    "eval_delay": "not supported: evaluations start at the first eval step",
    "eval_on_start": "not supported (trainer.num_sanity_val_steps=-1 validates first but does not log it)",
    "eval_do_concat_batches": "not supported",
    "eval_use_gather_object": "not supported",
    "include_for_metrics": "compute_metrics receives predictions and labels only",
    "batch_eval_metrics": "Python only: HFLightningModule(batch_eval_metrics=True)",
    "save_on_each_node": "rank 0 saves",
    "push_to_hub": "not supported (everything runs offline): push hf_model/ with huggingface_hub yourself",
    "hub_private_repo": "no hub push",
    "hub_model_id": "no hub push",
    "hub_strategy": "no hub push",
    "hub_always_push": "no hub push",
    "hub_revision": "no hub push",
    "hub_token": "no hub push",
    "ignore_data_skip": "not supported: a resume always continues the data where it stopped",
    "restore_callback_states_from_checkpoint": "callback states are always restored on resume",
    "accelerator_config": "accelerate is not used: Lightning strategies split the data",
    "parallelism_config": "not supported",
    "dataloader_multiprocessing_context": "not supported",
    "dataloader_in_order": "not supported",
    "length_column_name": "lengths are measured from input_ids",
    "ddp_find_unused_parameters": "strategy=ddp trainer.strategy.find_unused_parameters=true",
    "ddp_bucket_cap_mb": "strategy=ddp trainer.strategy.bucket_cap_mb=N",
    "ddp_broadcast_buffers": "strategy=ddp trainer.strategy.broadcast_buffers=BOOL",
    "ddp_static_graph": "strategy=ddp trainer.strategy.static_graph=true",
    "ddp_backend": "the DDP strategy picks nccl on GPUs, gloo on CPUs",
    "ddp_timeout": "not carried over (Lightning's default timeout)",
    "fsdp": "strategy=fsdp (FSDP2, one unit per transformer block; full_shard: "
    "trainer.strategy.reshard_after_forward=true, shard_grad_op: false, offload: "
    "trainer.strategy.offload=true; hybrid_shard and no_shard are not built in)",
    "fsdp_config": "strategy=fsdp with trainer.strategy.* keys (transformer_layer_cls_to_wrap: "
    "layer_classes, reshard_after_forward, activation_checkpointing, state_dict_type: sharded or full)",
    "deepspeed": "strategy=deepspeed_zero2 (or deepspeed_zero3) trainer.strategy.config=ds.json",
    "debug": "not supported",
    "skip_memory_metrics": "memory metrics are not reported",
    "resume_from_checkpoint": "an HF checkpoint folder cannot be resumed: ckpt_path=last resumes one of our "
    "runs",
}
LOGGERS = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}


def _num(value: Any) -> str:
    """A number as Hydra reads it back (``5e-05``, ``3``)."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


def convert(args: dict[str, Any], defaults: dict[str, Any]) -> tuple[Overrides, Dropped, list[str]]:
    """``(overrides, dropped, notes)`` for the ``TrainingArguments`` dict ``args`` (HF's ``defaults`` beside
    it).

    ``dropped`` holds ``(field, value, why)`` for each field away from its default that hf_lightning cannot
    honour (fields not in ``defaults`` too: a subclass's, such as TRL's); ``notes`` are lines for the user to
    read.
    """
    out: Overrides = []
    dropped: Dropped = []
    notes: list[str] = []
    handled: set[str] = set()

    def take(*fields: str) -> list[Any]:
        handled.update(fields)
        return [args.get(f, defaults.get(f)) for f in fields]

    def changed(field: str) -> bool:
        return field in args and args[field] != defaults.get(field)

    for convert_part in PARTS:
        convert_part(take, changed, out, dropped, notes)
    for field, value in args.items():
        if field in handled or field in NOT_READ_BY_TRAINER or field in ALWAYS_SO:
            continue
        if field not in defaults:
            dropped.append(
                (field, value, "not a TrainingArguments field (a subclass's, e.g. TRL's): not converted")
            )
        elif changed(field):
            dropped.append((field, value, REASONS.get(field) or "no equivalent in hf_lightning"))
    out.append(
        f"hydra.run.dir=outputs/{os.path.basename(os.path.normpath(str(args.get('output_dir') or 'run')))}"
    )
    return out, dropped, notes


def _length(take, changed, out, dropped, notes) -> None:
    epochs, max_steps = take("num_train_epochs", "max_steps")
    if max_steps and max_steps > 0:
        out += [f"trainer.max_steps={max_steps}", "trainer.max_epochs=null"]  # HF: max_steps overrides epochs
        return
    whole = math.ceil(epochs)
    if whole != epochs:
        dropped.append(
            ("num_train_epochs", epochs, f"whole epochs only: {whole} are run; trainer.max_steps for less")
        )
    out += [f"trainer.max_epochs={whole}", "trainer.max_steps=-1"]


def _batches(take, changed, out, dropped, notes) -> None:
    train, evaluation, accumulation = take(
        "per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps"
    )
    out += [
        f"data.per_device_train_batch_size={train}",
        f"data.per_device_eval_batch_size={evaluation}",
        f"data.gradient_accumulation_steps={accumulation}",
    ]


def _optimizer(take, changed, out, dropped, notes) -> None:
    from hf_lightning.module.optim import SPECS

    (name,) = take("optim")
    if name in ("adamw_torch_fused", "adamw_torch"):
        out.append("optim.name=adamw")
        if name == "adamw_torch":
            out.append("optim.fused=false")
    elif name in SPECS:
        out.append(f"optim.name={name}")
    else:
        dropped.append(
            (
                "optim",
                name,
                "not built in: adamw is used (optim=custom optim.optimizer._target_=CLASS for another)",
            )
        )
        out.append("optim.name=adamw")
    knobs = SPECS.get(name, SPECS["adamw"]).knobs  # HF reads adam_beta1/2, adam_epsilon for these only
    lr, wd, b1, b2, eps = take("learning_rate", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon")
    out += [f"optim.lr={_num(lr)}", f"optim.weight_decay={_num(wd)}"]
    if (changed("adam_beta1") or changed("adam_beta2")) and "betas" in knobs:
        out.append(f"optim.betas=[{_num(b1)},{_num(b2)}]")
    if changed("adam_epsilon") and "eps" in knobs:
        out.append(f"optim.eps={_num(eps)}")
    (clip,) = take("max_grad_norm")
    out.append(f"module.max_grad_norm={_num(clip) if clip else 'null'}")


def _schedule(take, changed, out, dropped, notes) -> None:
    from hf_lightning.module.optim import SCHEDULERS

    name, warmup = take("lr_scheduler_type", "warmup_steps")
    if name in SCHEDULERS:
        out.append(f"scheduler.name={name}")
    else:
        dropped.append(("lr_scheduler_type", name, f"not built in ({', '.join(SCHEDULERS)}): linear is used"))
        out.append("scheduler.name=linear")
    if 0 < warmup < 1:
        out += ["scheduler.warmup_steps=0", f"scheduler.warmup_ratio={_num(warmup)}"]
    else:
        out.append(f"scheduler.warmup_steps={int(warmup)}")


def _flow(take, changed, out, dropped, notes) -> None:
    """Evaluation, saving, logging and the best model: our top-level keys of the same names."""
    strategy, every = take("eval_strategy", "eval_steps")
    out.append(f"eval_steps={_num(every)}" if strategy == "steps" else f"eval_strategy={strategy}")
    strategy, every, limit = take("save_strategy", "save_steps", "save_total_limit")
    if strategy == "best":
        dropped.append(
            ("save_strategy", strategy, "not supported: checkpoints follow the evaluations instead")
        )
    else:
        out.append(f"save_steps={_num(every)}" if strategy == "steps" else f"save_strategy={strategy}")
    out.append(f"callbacks.model_checkpoint.save_top_k={limit if limit else -1}")
    strategy, every, first = take("logging_strategy", "logging_steps", "logging_first_step")
    if strategy == "steps":
        out.append(f"logging_steps={_num(every)}")
    else:
        dropped.append(("logging_strategy", strategy, "logs every logging_steps optimizer steps only"))
    if first:
        out.append("logging_first_step=true")
    best, metric, greater = take("load_best_model_at_end", "metric_for_best_model", "greater_is_better")
    if best:
        out.append("load_best_model_at_end=true")
    if metric:
        out += [f"metric_for_best_model={metric}", f"greater_is_better={str(bool(greater)).lower()}"]


def _model_and_data(take, changed, out, dropped, notes) -> None:
    pairs = (
        ("gradient_checkpointing", "model.gradient_checkpointing=true"),
        ("torch_compile", "model.compile=true"),
        ("full_determinism", "trainer.deterministic=true"),
        ("save_only_model", "+callbacks.model_checkpoint.save_weights_only=true"),
        ("dataloader_drop_last", "data.drop_last=true"),
        ("dataloader_persistent_workers", "data.persistent_workers=true"),
        ("disable_tqdm", "trainer.enable_progress_bar=false"),
    )
    for field, override in pairs:
        if take(field)[0]:
            out.append(override)
    for field, key in (
        ("data_seed", "data.seed"),
        ("dataloader_num_workers", "data.num_workers"),
        ("dataloader_prefetch_factor", "data.prefetch_factor"),
        ("eval_accumulation_steps", "+module.eval_accumulation_steps"),
        ("dataset_num_proc", "data.num_proc"),  # TRL's SFTConfig
    ):
        (value,) = take(field)
        if changed(field) and value is not None:
            out.append(f"{key}={_num(value)}")
    (seed,) = take("seed")
    out.append(f"seed={seed}")
    for field, key in (
        ("dataloader_pin_memory", "data.pin_memory"),
        ("remove_unused_columns", "data.remove_unused_columns"),
        ("average_tokens_across_devices", "module.average_tokens_across_devices"),
    ):
        (value,) = take(field)
        if changed(field):
            out.append(f"{key}={str(bool(value)).lower()}")
    (smoothing,) = take("label_smoothing_factor")
    if smoothing:
        out.append(f"module.label_smoothing_factor={_num(smoothing)}")
    (labels,) = take("label_names")
    if labels:
        out.append(f"data.label_names=[{','.join(labels)}]")
    (sampling,) = take("train_sampling_strategy")
    if sampling == "sequential":
        out.append("data.shuffle=false")
    elif sampling == "group_by_length":
        out.append("data.group_by_length=true")
    elif sampling != "random":
        dropped.append(("train_sampling_strategy", sampling, "random, sequential and group_by_length only"))


def _devices(take, changed, out, dropped, notes) -> None:
    bf16, fp16, cpu = take("bf16", "fp16", "use_cpu")
    if bf16:
        out.append("trainer.precision=bf16-mixed")
    elif fp16:
        out += ["trainer.accelerator=gpu", "trainer.precision=16-mixed"]
    if not cpu:
        notes.append(
            "HF Trainer takes a GPU when it finds one; hf_lightning runs on the CPU unless you add "
            "trainer=gpu"
        )
    (report,) = take("report_to")
    report = [report] if isinstance(report, str) else list(report or [])
    report = [r for r in report if r != "none"]
    loggers = [LOGGERS[r] for r in report if r in LOGGERS]
    if len(loggers) == 1:
        out.append(f"logger={loggers[0]}")
    elif loggers:
        dropped.append(("report_to", report, "one logger per run (or logger=many: csv and tensorboard)"))
    for name in report:
        if name not in LOGGERS:
            dropped.append(("report_to", name, "not a logger here (csv, tensorboard, mlflow, wandb)"))


PARTS: tuple[Callable[..., None], ...] = (
    _length,
    _batches,
    _optimizer,
    _schedule,
    _flow,
    _model_and_data,
    _devices,
)
