"""The one builder: a composed config in, the objects of a run out, for ``train``, ``evaluate`` and
``inspect_batch`` alike.

Every group names what it builds with ``_target_`` (``model``:
:class:`~hf_lightning.models.loading.ModelLoader`; ``data``, ``module``, ``optim``, ``scheduler``: partials,
completed here with what only the builder has: the tokenizer, the model, the optimizer). Order, cheapest
checks first: :func:`check` (the schema pass, HF's ``max_steps`` rule, missing packages, the paths and
``model.config`` keys), the seed, the
Trainer (a multirun that would relaunch the command line is refused here), then tokenizer, data, model and
module. What differs between the purposes is only the Trainer:

========== =================================================================================================
train      ``trainer`` as configured, with the ``callbacks``, ``logger`` and the best-model checkpoint
evaluate   ``trainer``'s accelerator, precision and limits on one device; no callbacks, logger or checkpoints
inspect    one CPU process, never fitted (so the data side reads the model)
========== =================================================================================================
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Literal

from omegaconf import DictConfig, OmegaConf

from hf_lightning.config.instantiate import instantiate, lightning_object, resolve_function
from hf_lightning.core.errors import ConfigError

log = logging.getLogger("hf_lightning.build")

Purpose = Literal["train", "evaluate", "inspect"]
PURPOSES = ("train", "evaluate", "inspect")
# the DataModule settings evaluation fixes: predictions follow the file's order, one example per row
EVALUATE_DATA = {"group_by_length": False, "packing": False, "layout": None}


@dataclass
class Run:
    """The objects :func:`build` made from one config."""

    trainer: Any
    datamodule: Any
    module: Any
    model: Any
    tokenizer: Any


def in_multirun() -> bool:
    """Whether this process is a job of a Hydra multirun."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def check(cfg: DictConfig, purpose: Purpose = "train") -> Any:
    """Everything about ``cfg`` that can be refused before anything is built; returns the HF step schedule
    (``eval_steps``, ``save_steps``, ``logging_steps``: :func:`~hf_lightning.config.hf_args.prepare_schedule`,
    training only, ``None`` when none is given). Call it once per config (the schedule is applied to ``cfg``).

    Raises:
        ConfigError: the schema pass (:func:`~hf_lightning.config.schema.validate_config`), a bad HF step key,
            a fraction of a stream's length, a missing package, or a ``model.config`` key that cannot take
            effect.
        DataError / ModelError: a data path or model folder that does not exist
            (:func:`~hf_lightning.config.inputs.check_inputs`).
    """
    from hf_lightning.config.choices import apply_group_precedence, say
    from hf_lightning.config.cross_fields import stream_length_errors
    from hf_lightning.config.hf_args import prepare_schedule
    from hf_lightning.config.inputs import check_inputs
    from hf_lightning.config.optional import check_config as check_optional_packages
    from hf_lightning.config.run_length import (
        apply_max_steps_precedence,
        command_line_overrides,
        given_keys,
    )
    from hf_lightning.config.schema import validate_config

    overrides = command_line_overrides()
    say(apply_group_precedence(cfg, overrides))  # a group named on the command line wins over the experiment
    validate_config(cfg, purpose)
    schedule = None
    if purpose == "train":
        apply_max_steps_precedence(cfg, overrides)  # HF: a given max_steps overrides the epochs
        schedule = prepare_schedule(cfg)  # eval_steps, save_steps, logging_steps: HF's steps, not Lightning's
    stream_errors = stream_length_errors(OmegaConf.to_container(cfg, resolve=True), purpose)
    if stream_errors:  # after the schedule: eval_steps replaces trainer.val_check_interval
        raise ConfigError("; ".join(stream_errors))
    check_optional_packages(cfg)  # a logger, strategy or model package that is not installed: one line, now
    # the files, folders and model.config keys it names: before the tokenizer, data or model is loaded
    check_inputs(
        OmegaConf.to_container(cfg, resolve=True), given_keys(overrides) if overrides is not None else None
    )
    return schedule


def build(cfg: DictConfig, purpose: Purpose = "train", checked: bool = False, schedule: Any = None) -> Run:
    """The trainer, DataModule, LightningModule, model and tokenizer of ``cfg`` for ``purpose``.

    Args:
        cfg: a composed ``train`` (or ``evaluate``) config.
        purpose: ``train``, ``evaluate`` or ``inspect`` (see the module docstring).
        checked: :func:`check` already ran on ``cfg`` (``train`` runs it before taking the run folder) and
            ``schedule`` is what it returned.

    Raises:
        HFLightningError: bad config, data or model (the message names the key, file or field).
    """
    import lightning as L

    if purpose not in PURPOSES:
        raise ValueError(f"purpose={purpose!r}; expected one of {PURPOSES}")
    if not checked:
        schedule = check(cfg, purpose)
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    if purpose == "train":
        trainer = _train_trainer(cfg, schedule)  # HF's eval/save/log steps (HFSteps) need the schedule
    elif purpose == "evaluate":
        trainer = _evaluate_trainer(cfg)
    else:
        trainer = _inspect_trainer(cfg)

    loader = instantiate(cfg.model, _convert_="all")
    tokenizer = loader.tokenizer()
    data_kwargs: dict[str, Any] = {}
    if purpose == "evaluate":
        data_kwargs = _evaluate_data(cfg)
    elif purpose == "train":
        data_kwargs = _overfit_data(trainer)
    datamodule = instantiate(cfg.data, _convert_="all")(tokenizer=tokenizer, **data_kwargs)
    id2label = None
    classes_first = loader.task == "sequence_classification" and not loader.settings.get("id2label")
    if classes_first:  # the head's size comes from the data
        id2label = _class_names(datamodule, loader.settings.get("num_labels"))
    model = _model_with_adapters(cfg, loader, tokenizer, id2label)

    module_node = cfg.module
    extra: dict[str, Any] = {}
    if isinstance(module_node.get("compute_loss_func"), str):
        extra["compute_loss_func"] = resolve_function(
            module_node.compute_loss_func, "module.compute_loss_func"
        )
    module = instantiate(module_node, _convert_="all")(
        model,
        tokenizer=tokenizer,
        optim=_optimizer_partial(cfg, trainer),
        scheduler=instantiate(cfg.scheduler, _convert_="all"),
        metric_for_best_model=cfg.get("metric_for_best_model"),  # drives reduce_lr_on_plateau / greedy, as HF
        **extra,
    )
    if classes_first:  # bad rows stop the build, as the labels did; the rows are pruned for this model
        datamodule.bind(**module.data_binding())
        datamodule.setup("fit")
    if purpose == "inspect":
        trainer.strategy.connect(module)
        datamodule.trainer = trainer
    return Run(trainer=trainer, datamodule=datamodule, module=module, model=model, tokenizer=tokenizer)


# ----------------------------------------------------------------------------------------------- the trainer
def _train_trainer(cfg: DictConfig, schedule: Any = None) -> Any:
    from hf_lightning.callbacks.final_validation import FinalValidation
    from hf_lightning.checkpointing import AtomicCheckpointIO
    from hf_lightning.cli.output import progress_bar
    from hf_lightning.strategies import refuse_multirun_relaunch

    callbacks = [
        lightning_object(c, f"callbacks.{name}")
        for name, c in (cfg.get("callbacks") or {}).items()
        if c is not None
    ]
    bar = progress_bar(cfg.trainer, log)  # off when the output is not a terminal
    if not bar:
        from lightning.pytorch.callbacks import ProgressBar

        # Lightning refuses a progress-bar callback when the bar is off; off wins
        callbacks = [c for c in callbacks if not isinstance(c, ProgressBar)]
    callbacks = with_best_model(cfg, callbacks, schedule)
    callbacks.append(FinalValidation())  # the final weights' validation competes for best.ckpt like any other
    loggers = [instantiate(c) for c in (cfg.get("logger") or {}).values() if c is not None]
    extra = _precision(cfg)
    extra["plugins"] = [*extra.get("plugins", []), AtomicCheckpointIO()]
    extra["enable_progress_bar"] = bar
    trainer = lightning_object(cfg.trainer, "trainer", callbacks=callbacks, logger=loggers or False, **extra)
    refuse_multirun_relaunch(trainer, in_multirun())
    return trainer


def _overfit_data(trainer: Any) -> dict[str, Any]:
    """``trainer.overfit_batches=N`` as Lightning means it, on our loaders: the first N training batches of
    every epoch, in order (``data.shuffle=false``), and N validation batches (``limit_train_batches`` /
    ``limit_val_batches``, which Lightning set from it). Lightning's own way, swapping each loader's sampler
    for a ``SequentialSampler`` at fit, would drop our samplers (one global order, ranks, resume) and fails
    on the accumulation-window loader; so the Trainer keeps the limits and leaves the loaders to the
    DataModule. Said in one INFO line."""
    n = getattr(trainer, "overfit_batches", 0)
    if not n:
        return {}
    some = ("the first batch" if n == 1 else f"the first {n} batches") if isinstance(n, int) else f"{n:g}"
    log.info(
        "trainer.overfit_batches=%s: every epoch trains on %s of the training data, the same ones in order "
        "(data.shuffle=false, as Lightning's overfit_batches turns shuffling off), and validates on %s of "
        "the validation data",
        n,
        some,
        some,
    )
    trainer.overfit_batches = 0  # the limits above stay: only Lightning's sampler swap is left out
    return {"shuffle": False}


def _evaluate_trainer(cfg: DictConfig) -> Any:
    from hf_lightning.cli.output import progress_bar
    from hf_lightning.core.arguments import world_size

    devices, nodes = cfg.trainer.get("devices", 1), cfg.trainer.get("num_nodes", 1)
    processes = world_size(devices, nodes)
    if processes is None:  # "auto": Lightning would take every device of the machine
        log.info("evaluating on one device (trainer.devices=%s)", devices)
        devices = 1
    elif processes > 1:
        raise ConfigError(
            f"trainer.devices={devices} with trainer.num_nodes={nodes}: python -m hf_lightning.evaluate runs "
            "on one device (its predictions are not yet gathered across processes in dataset order); set "
            "trainer.devices=1 trainer.num_nodes=1"
        )
    strategy = cfg.trainer.get("strategy", "auto")
    if strategy not in (None, "auto"):
        name = strategy.get("_target_") if isinstance(strategy, DictConfig) else strategy
        log.info("evaluating on one device: trainer.strategy=%s is not used", name)
    extra = _precision(cfg, strategy="auto")
    return lightning_object(
        cfg.trainer,
        "trainer",
        devices=devices,
        strategy="auto",
        callbacks=[],
        logger=False,
        enable_checkpointing=False,
        limit_predict_batches=cfg.trainer.get("limit_val_batches"),
        enable_progress_bar=progress_bar(cfg.trainer, log),  # off when the output is not a terminal
        use_distributed_sampler=False,
        **extra,
    )


def _inspect_trainer(cfg: DictConfig) -> Any:
    return lightning_object(
        cfg.trainer,
        "trainer",
        accelerator="cpu",
        devices=1,
        num_nodes=1,
        strategy="auto",
        precision="32-true",
        callbacks=[],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        default_root_dir=None,
    )


def _precision(cfg: DictConfig, strategy: Any = None) -> dict[str, Any]:
    """``{"precision": None, "plugins": [bf16 plugin]}`` where our bf16 plugin replaces Lightning's, else
    ``{}``."""
    from hf_lightning.strategies.precision import precision_plugin

    trainer_cfg = OmegaConf.to_container(cfg.trainer, resolve=True)
    plugin = precision_plugin(
        trainer_cfg.get("precision"),
        trainer_cfg.get("accelerator"),
        trainer_cfg.get("strategy") if strategy is None else strategy,
    )
    return {"precision": None, "plugins": [plugin]} if plugin is not None else {}


# --------------------------------------------------------------------------------------- data, model, module
def _evaluate_data(cfg: DictConfig) -> dict[str, Any]:
    """Evaluation reads ``data.path`` (all of it) as its validation data, in order, one example per row."""
    path = cfg.data.get("path")
    if path == "???" or OmegaConf.is_missing(cfg.data, "path"):
        raise ConfigError("data.path is required by this experiment: the file to evaluate on")
    changed = [
        f"data.{k}={cfg.data.get(k)}" for k, v in EVALUATE_DATA.items() if cfg.data.get(k) not in (v, None)
    ]
    if changed:
        log.info("evaluating without %s: predictions follow the data's order", ", ".join(changed))
    return {**EVALUATE_DATA, **({"validation_path": path} if path is not None else {})}


def _model_with_adapters(cfg: DictConfig, loader: Any, tokenizer: Any, id2label: Any) -> Any:
    """The ``model`` node's model; with a ``peft`` group, quantized as it asks (QLoRA) and wrapped in its
    adapters (:func:`~hf_lightning.adapters.apply_adapters`)."""
    from hf_lightning.adapters import apply_adapters
    from hf_lightning.adapters.quantization import quantization_config
    from hf_lightning.adapters.settings import adapter_settings

    adapters = adapter_settings(OmegaConf.to_container(cfg.peft, resolve=True) if cfg.get("peft") else None)
    model = loader.model(tokenizer, id2label=id2label, quantization_config=quantization_config(adapters))
    if adapters is not None:
        model = apply_adapters(
            model, adapters, loader.task, bool(loader.settings.get("gradient_checkpointing", False))
        )
    return model


def _class_names(datamodule: Any, num_labels: int | None) -> dict[int, str] | None:
    """A classifier's ``{id: name}`` read from its training data (HF: ``id2label`` from the dataset's labels).

    Raises:
        ConfigError: ``model.num_labels`` disagrees with the number of classes in the data.
        DataError: float labels (regression targets), integer ids without ``model.num_labels``
            (:func:`~hf_lightning.data.class_labels.check_head`).
    """
    from hf_lightning.data.class_labels import check_head

    # the labels alone: setup tokenizes and prunes later, for the model the module binds by then
    id2label = datamodule.read_classes()
    check_head(datamodule.class_labels, num_labels, regression=False)
    names = dict(id2label) if id2label else None
    if names and num_labels not in (None, len(names)):
        raise ConfigError(
            f"model.num_labels={num_labels} but data.path has {len(names)} classes; "
            "set model.num_labels=null to take them from the data"
        )
    return names


def _optimizer_partial(cfg: DictConfig, trainer: Any) -> Any:
    """The ``optim`` node as a partial taking the model; AdamW's ``fused=null`` becomes HF's default
    (``adamw_torch_fused`` on torch >= 2.8: fused kernels, which need CUDA tensors here)."""
    from hf_lightning.module.optim import build_optimizer

    extra = {}
    node = cfg.optim
    ours = node.get("_target_") in (None, f"{build_optimizer.__module__}.{build_optimizer.__name__}")
    if ours and node.get("name") == "adamw" and node.get("fused") is None:
        extra["fused"] = trainer.strategy.root_device.type == "cuda" or None
    return instantiate(node, _convert_="all", **extra)


def with_best_model(cfg: DictConfig, callbacks: list[Any], schedule: Any = None) -> list[Any]:
    """HF's ``metric_for_best_model``: add a ``best`` checkpoint (never rotated out) and point early stopping
    at it. With HF step keys (``schedule``), :class:`~hf_lightning.callbacks.hf_steps.HFSteps` goes first;
    with ``load_best_model_at_end``, :class:`~hf_lightning.callbacks.load_best.LoadBestModel` keeps
    ``best.ckpt`` by HF's rule (metric ``loss`` when none is named, as HF) and ``hf_model/`` gets its weights.

    Raises:
        ConfigError: a metric not ending in ``loss`` without ``greater_is_better``.
    """
    from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint

    from hf_lightning.callbacks.best_model import resolve_monitor
    from hf_lightning.callbacks.hf_steps import HFSteps
    from hf_lightning.callbacks.load_best import LoadBestModel

    steps = [HFSteps(schedule)] if schedule is not None else []
    load_best = bool(cfg.get("load_best_model_at_end"))
    if not cfg.get("metric_for_best_model") and not load_best:
        return [*steps, *callbacks]
    monitor, mode = resolve_monitor(cfg.get("metric_for_best_model") or "loss", cfg.get("greater_is_better"))
    if load_best and not steps:  # check() refuses it first; a caller that skipped check() gets the same words
        raise ConfigError(
            "load_best_model_at_end=true needs an evaluation schedule: give eval_steps=N (or "
            "eval_strategy=epoch)"
        )
    if load_best:
        # before HFSteps (the save at an evaluation step stores the best state) and before HFExport (it loads)
        best = LoadBestModel(monitor, mode, os.path.join(cfg.output_dir, "checkpoints"), steps[0])
        callbacks = [best, *steps, *callbacks]
    else:
        callbacks = [*steps, *callbacks]
    callbacks = [
        EarlyStopping(monitor=monitor, mode=mode, patience=cb.patience, min_delta=abs(cb.min_delta))
        if isinstance(cb, EarlyStopping)
        else cb
        for cb in callbacks
    ]
    if load_best:
        return callbacks
    return [
        *callbacks,
        ModelCheckpoint(
            dirpath=os.path.join(cfg.output_dir, "checkpoints"),
            filename="best",
            monitor=monitor,
            mode=mode,
            save_top_k=1,
            save_last=False,
            auto_insert_metric_name=False,
            enable_version_counter=False,
        ),
    ]
