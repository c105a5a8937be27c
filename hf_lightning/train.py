"""``python -m hf_lightning.train +experiment=sft [overrides]``: fine-tune, evaluate, checkpoint, export.

``train(cfg)`` is a plain function (returns the final metrics and the objects it built); ``main`` is the thin
Hydra wrapper that turns input errors into one-line messages and returns the optimized metric to sweepers.

Order of work, cheapest checks first: the schema pass (:func:`hf_lightning.config.validate_config`), the
Trainer and its strategy (a multirun that would relaunch the command line is refused here), then the
tokenizer, data, model, and ``fit``.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from hf_lightning.errors import ConfigError, HFLightningError

log = logging.getLogger("hf_lightning.train")


def _in_multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def _class_names(datamodule: Any) -> dict[int, str] | None:
    """``{id: name}`` of a classification DataModule after setup (its ``id2label``), if it reports one."""
    id2label = getattr(datamodule, "id2label", None)
    return dict(id2label) if id2label else None


def resolve_function(path: str, key: str) -> Any:
    """The function at a dotted ``path`` (``package.module.function``).

    Raises:
        ConfigError: the path does not name an importable callable (the message names ``key``).
    """
    from hydra.utils import get_method

    try:
        return get_method(path)
    except Exception as err:
        raise ConfigError(f"{key}={path}: not an importable function ({err})") from err


def train(cfg: DictConfig) -> tuple[dict[str, float], dict[str, Any]]:
    """Run one training job described by ``cfg``.

    Returns:
        ``(metrics, objects)``: the newest value of every logged metric as floats (also written to
        ``<output_dir>/final_metrics.json`` on rank 0), and the built ``trainer``, ``module``, ``datamodule``.

    Raises:
        HFLightningError: bad config, data or model (the message names the key, file or field).
    """
    from hf_lightning.checkpointing import find_resume_checkpoint
    from hf_lightning.checkpointing.files import remove_leftovers
    from hf_lightning.cli_output import begin_job
    from hf_lightning.config import validate_config
    from hf_lightning.config.hf_args import prepare_schedule
    from hf_lightning.config.run_length import apply_max_steps_precedence, command_line_overrides
    from hf_lightning.optional import check_config as check_optional_packages
    from hf_lightning.run_end import finished_run_metrics
    from hf_lightning.run_folder import check_run_folder, checkpoint_dir
    from hf_lightning.run_lock import hold_run_folder, release_run_folder

    begin_job()  # the clock of the done line's wall time
    validate_config(cfg)
    apply_max_steps_precedence(cfg, command_line_overrides())  # HF: a given max_steps overrides the epochs
    schedule = prepare_schedule(cfg)  # eval_steps, save_steps, logging_steps: HF's steps, not Lightning's
    check_optional_packages(cfg)  # a logger, strategy or model package that is not installed: one line, now
    weights_only = bool(cfg.get("resume_weights_only"))
    output_dir = os.path.abspath(cfg.output_dir)
    ckpt_dir = checkpoint_dir(cfg, output_dir)
    acquired = hold_run_folder(output_dir)  # one process per run folder (the CLI's guard took it already)
    try:
        # a run that starts at step 0 never overwrites a previous one
        check_run_folder(output_dir, cfg.get("ckpt_path"), ckpt_dir, weights_only)
        ckpt_path = find_resume_checkpoint(cfg.get("ckpt_path"), output_dir, weights_only, ckpt_dir)
        finished = finished_run_metrics(cfg, output_dir, ckpt_path, ckpt_dir, weights_only)
        if finished is not None:
            return finished, {}
        for path in remove_leftovers(
            output_dir, ckpt_dir
        ):  # this process owns the folder: they are a dead one's
            log.info("removed %s, left by a process that was stopped while writing it", path)
        return _train(cfg, ckpt_path, weights_only, schedule)
    finally:
        if acquired:
            release_run_folder(output_dir)


def _train(
    cfg: DictConfig, ckpt_path: str | None, weights_only: bool, schedule: Any = None
) -> tuple[dict[str, float], dict[str, Any]]:
    """The Trainer and its callbacks, then :func:`_fit`."""
    import lightning as L

    from hf_lightning.callbacks.final_validation import FinalValidation
    from hf_lightning.checkpointing import AtomicCheckpointIO
    from hf_lightning.cli_output import progress_bar
    from hf_lightning.strategies import refuse_multirun_relaunch
    from hf_lightning.strategies.precision import precision_plugin

    L.seed_everything(cfg.seed, workers=True, verbose=False)
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
    trainer_cfg = OmegaConf.to_container(cfg.trainer, resolve=True)
    plugin = precision_plugin(
        trainer_cfg.get("precision"), trainer_cfg.get("accelerator"), trainer_cfg.get("strategy")
    )
    extra = {"precision": None, "plugins": [plugin]} if plugin is not None else {}
    extra["plugins"] = [*extra.get("plugins", []), AtomicCheckpointIO()]
    extra["enable_progress_bar"] = bar
    trainer = lightning_object(cfg.trainer, "trainer", callbacks=callbacks, logger=loggers or False, **extra)
    refuse_multirun_relaunch(trainer, _in_multirun())
    try:
        metrics, objects = _fit(
            cfg, trainer, None if weights_only else ckpt_path, ckpt_path if weights_only else None
        )
    finally:
        _close_wandb()
    return metrics, objects


def instantiate(node: Any, **kwargs: Any) -> Any:
    """``hydra.utils.instantiate``, with our own errors (and missing packages) raised inside a ``_target_`` as one
    line instead of Hydra's multi-line "Error in call to target" (exit status 1)."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate as hydra_instantiate

    from hf_lightning.optional import explain_instantiation_error

    try:
        return hydra_instantiate(node, **kwargs)
    except InstantiationException as err:
        ours = explain_instantiation_error(err)
        if ours is None:
            raise
        raise ours from err


def lightning_object(node: DictConfig, key: str, **kwargs: Any) -> Any:
    """``hydra.utils.instantiate(node, **kwargs)``, with the constructor's refusal as one :class:`ConfigError`
    naming ``key`` (Lightning raises ``MisconfigurationException`` / ``ValueError``, which Hydra wraps in a
    multi-line ``InstantiationException``).

    Raises:
        ConfigError: the constructor refused a value (``key``, the value where the message names it, and the
            constructor's own first line).
        HFLightningError: raised by one of our constructors, as it is.
    """
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate as hydra_instantiate

    from hf_lightning.optional import explain_instantiation_error

    try:
        return hydra_instantiate(node, **kwargs)
    except InstantiationException as err:
        ours = explain_instantiation_error(err)  # our own errors, a missing package
        if ours is not None:
            raise ours from None
        cause = err.__cause__
        if (
            not isinstance(cause, (ValueError, TypeError, RuntimeError))
            and type(cause).__name__ != "MisconfigurationException"
        ):
            raise
        text = " ".join(str(cause).split())
        keys = [k for k in node if isinstance(k, str) and not k.startswith("_")]
        # the key the message names, else the one whose (string) value it quotes ("No supported gpu backend")
        named = next((k for k in keys if k in text), None) or next(
            (
                k
                for k in keys
                if isinstance(node.get(k), str) and len(node.get(k)) >= 3 and node.get(k) in text
            ),
            None,
        )
        where = f"{key}.{named}={node.get(named)}" if named else key
        raise ConfigError(f"{where}: {text} (refused by {node.get('_target_', key)})") from None


def with_best_model(cfg: DictConfig, callbacks: list[Any], schedule: Any = None) -> list[Any]:
    """HF's ``metric_for_best_model``: add a ``best`` checkpoint (never rotated out) and point early stopping at it.
    With HF step keys (``schedule``), :class:`~hf_lightning.callbacks.hf_steps.HFSteps` goes first; with
    ``load_best_model_at_end``, :class:`~hf_lightning.callbacks.load_best.LoadBestModel` keeps ``best.ckpt`` by
    HF's rule (metric ``loss`` when none is named, as HF) and ``hf_model/`` gets its weights.

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


def _load_weights(module: Any, path: str, model_path: Any) -> None:
    """``resume_weights_only``: the model weights of a checkpoint, nothing else (refused when they do not fit)."""
    from hf_lightning.checkpointing.weights import load_model_weights

    load_model_weights(module, path, model_path)
    log.warning("loaded only the weights of %s: optimizer, scheduler and step start fresh", path)


def _fit(
    cfg: DictConfig, trainer: Any, ckpt_path: str | None, weights_path: str | None = None
) -> tuple[dict[str, float], dict[str, Any]]:
    """Tokenizer, data, model, module, ``fit``; the final metrics."""
    from hf_lightning.checkpointing.weights import summarize_load_error, weights_mismatch_message
    from hf_lightning.cli_output import job_seconds
    from hf_lightning.data import HFDataModule
    from hf_lightning.errors import ModelError
    from hf_lightning.faults import explain_faults
    from hf_lightning.models import build_model, load_tokenizer
    from hf_lightning.module import HFLightningModule
    from hf_lightning.run_end import (
        finish_run,
        finished_metrics,
        newest_logged,
        run_tokens_per_s,
        write_final_metrics,
    )

    model_cfg = OmegaConf.to_container(cfg.model, resolve=True)
    tokenizer = load_tokenizer(model_cfg.get("name_or_path"), model_cfg.pop("tokenizer_vocab_size", 2048))
    datamodule = HFDataModule(tokenizer=tokenizer, **OmegaConf.to_container(cfg.data, resolve=True))
    if model_cfg.get("task") == "sequence_classification" and not model_cfg.get("id2label"):
        datamodule.setup("fit")  # the class names come from the data (idempotent: fit does not redo it)
        names = _class_names(datamodule)
        if names and model_cfg.get("num_labels") not in (None, len(names)):
            raise ConfigError(
                f"model.num_labels={model_cfg['num_labels']} but data.path has {len(names)} classes; "
                "set model.num_labels=null to take them from the data"
            )
        model_cfg["id2label"] = names
    model = build_model(tokenizer, **model_cfg)
    if datamodule.train_dataset is not None:  # set up before the model existed (classification): check it now
        datamodule.check_positions(model)

    optim = OmegaConf.to_container(cfg.optim, resolve=True)
    if optim.get("name") == "adamw" and optim.get("fused") is None:
        # HF's default optimizer on torch >= 2.8 is adamw_torch_fused; fused kernels need CUDA tensors here
        optim["fused"] = trainer.strategy.root_device.type == "cuda" or None
    module_kwargs = OmegaConf.to_container(cfg.module, resolve=True)
    if isinstance(module_kwargs.get("compute_loss_func"), str):
        module_kwargs["compute_loss_func"] = resolve_function(
            module_kwargs["compute_loss_func"], "module.compute_loss_func"
        )
    module = HFLightningModule(
        model,
        tokenizer=tokenizer,
        optim=optim,
        scheduler=OmegaConf.to_container(cfg.scheduler, resolve=True),
        **module_kwargs,
    )

    if weights_path is not None:
        _load_weights(module, weights_path, model_cfg.get("name_or_path"))
    n_params = sum(p.numel() for p in model.parameters())
    log.info("model: %s, %.2fM parameters", type(model).__name__, n_params / 1e6)
    start = time.perf_counter()
    with explain_faults(
        trainer, datamodule
    ):  # out of memory -> TrainingError with the batch/accumulation trade
        try:
            trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path)
        except RuntimeError as err:
            # Lightning's strict restore of a checkpoint written by another architecture
            if ckpt_path is None or not str(err).startswith("Error(s) in loading state_dict"):
                raise
            details = summarize_load_error(err)
            raise ModelError(
                weights_mismatch_message(ckpt_path, model_cfg.get("name_or_path"), details)
            ) from None
    fit_seconds = time.perf_counter() - start
    objects = {"trainer": trainer, "module": module, "datamodule": datamodule}
    if module.fit_start_step in (None, trainer.global_step) and ckpt_path is not None:
        previous = finished_metrics(cfg.output_dir, trainer.global_step)
        if previous is None:  # the training had ended, its end (row, validation, export, metrics) had not
            metrics, done = finish_run(cfg.output_dir, trainer, module, datamodule, n_params)
            log.warning(
                "%s is at the end of this run (optimizer step %d), whose end was cut short: wrote %s",
                ckpt_path,
                trainer.global_step,
                ", ".join(done),
            )
            return metrics, objects
        log.warning(
            "nothing was trained: %s is at optimizer step %d, where this run's limits (trainer.max_steps=%s, "
            "trainer.max_epochs=%s) already end it; raise one of them to continue. Its checkpoints, metrics.csv, "
            "hf_model/ and final_metrics.json are unchanged",
            ckpt_path,
            trainer.global_step,
            cfg.trainer.get("max_steps"),
            cfg.trainer.get("max_epochs"),
        )
        return previous, objects  # the finished run's own final metrics stay (and are what a sweep reads)
    _validate_final_weights(trainer, module, datamodule)

    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    # the rows written last win: the final flush of train/loss after the last log step never reaches
    # callback_metrics (Lightning allows no self.log in on_train_end); a resumed run's rows before the stop too
    metrics.update(
        newest_logged(os.path.join(cfg.output_dir, "metrics.csv")) if trainer.is_global_zero else {}
    )
    metrics.update(module.last_logged)
    from hf_lightning.callbacks.load_best import LoadBestModel

    for callback in trainer.callbacks:  # load_best_model_at_end: the exported weights' step and metric
        if isinstance(callback, LoadBestModel):
            metrics.update(callback.final_metrics())
    tokens_per_s, tokens = run_tokens_per_s(trainer, module, fit_seconds)
    wall = job_seconds()  # the whole job: start-up (the command's first), data, training, validations, export
    metrics.update(
        {
            "global_step": float(trainer.global_step),
            "parameters": float(n_params),
            "wall_time_s": wall,
            "train_tokens_per_s": tokens_per_s,
        }
    )
    stopped = getattr(module, "preempted", None)
    if trainer.is_global_zero and not stopped:  # a stopped run has no final metrics yet
        write_final_metrics(cfg.output_dir, metrics)
    if stopped:
        log.warning(
            "stopped by %s at optimizer step %d: %s/checkpoints/last.ckpt holds it, no hf_model/ yet. Continue with "
            "the same overrides plus ckpt_path=last hydra.run.dir=%s (the overrides are in .hydra/overrides.yaml)",
            signal.Signals(stopped).name,
            trainer.global_step,
            cfg.output_dir,
            cfg.output_dir,
        )
        return metrics, objects
    log.info(
        "done: %d optimizer steps in %.1f s (wall time, start-up included), %d real tokens trained at %.0f real tokens/s "
        "(all ranks, validation excluded), final %s",
        trainer.global_step,
        wall,
        tokens,
        tokens_per_s,
        # the last row's throughput/* rates cover one log interval: the run's rate is the one above
        ", ".join(f"{k}={v:.4f}" for k, v in metrics.items() if "/" in k and not k.startswith("throughput/")),
    )
    return metrics, objects


def _validate_final_weights(trainer: Any, module: Any, datamodule: Any) -> None:
    """One more validation when the newest one measured earlier weights than the exported ones.

    A run's validations fall where ``val_check_interval`` puts them, which need not be its last step (``0.5`` of a
    121-batch epoch validates after batches 60 and 120, never after 121), so the last ``val/loss`` would describe
    an earlier model than ``hf_model/``. :class:`~hf_lightning.callbacks.final_validation.FinalValidation` runs
    that validation inside ``fit`` (where it competes for ``best.ckpt``); this is the fallback for an epoch in
    which Lightning allows none (``check_val_every_n_epoch`` > 1), logged at the final step after ``fit``, so
    ``final_metrics.json`` describes the exported weights. Skipped when validation is off
    (``trainer.limit_val_batches=0`` or no validation data) or the run stopped on a signal.
    """
    if not trainer.global_step or getattr(module, "preempted", False) or trainer.interrupted:
        return
    if not trainer.limit_val_batches or datamodule.val_dataset is None:
        return
    if module.last_validated_step == trainer.global_step:
        return
    best = [cb for cb in trainer.checkpoint_callbacks if getattr(cb, "monitor", None) not in (None, "step")]
    log.info(
        "validating the final weights (step %d) after training: %s%s",
        trainer.global_step,
        "no validation had run"
        if module.last_validated_step is None
        else f"the last validation was at step {module.last_validated_step}",
        " (no validation was allowed in the last epoch, e.g. by trainer.check_val_every_n_epoch; after fit this one "
        "does not compete for the best checkpoint)"
        if best
        else "",
    )
    trainer.validate(module, datamodule=datamodule, verbose=False)


def _close_wandb() -> None:
    """Finish a W&B run even when the job failed, so the next job of a multirun starts a fresh one."""
    wandb = sys.modules.get("wandb")
    if wandb is not None and getattr(wandb, "run", None) is not None:
        wandb.finish()


def optimized_value(metrics: dict[str, float], name: str | None, required: bool) -> float | None:
    """The metric a sweeper optimizes.

    Raises:
        ConfigError: ``required`` (a multirun) and the run did not produce ``name``; lists what it produced.
    """
    if not name:
        return None
    if name not in metrics:
        msg = (
            f"optimized_metric={name} was not produced by this run (metrics: {', '.join(sorted(metrics))}); "
            "validation may be off (trainer.limit_val_batches=0)"
        )
        if required:
            raise ConfigError(msg)
        log.debug("%s", msg)  # a single run does not need it
        return None
    return metrics[name]


def _report_log_file_errors() -> None:
    """A log file that cannot be written (a full disk, a read-only remount) is said once on stderr; Python's
    ``logging`` would print a traceback for every line logged from then on."""
    for handler in logging.getLogger().handlers:
        if not isinstance(handler, logging.FileHandler):
            continue
        said: list[bool] = []

        def report(
            err: BaseException | None, handler: logging.FileHandler = handler, said: list = said
        ) -> None:
            if not said:
                said.append(True)
                print(
                    f"hf_lightning: warning: could not write the log file {handler.baseFilename} ({err}); log "
                    "lines go to the terminal only from here",
                    file=sys.stderr,
                )

        def emit(record: logging.LogRecord, real: Any = handler.emit, report: Any = report) -> None:
            try:
                real(record)
            except OSError as err:  # reopening a closed log file fails outside logging's own error handling
                report(err)

        handler.emit = emit  # type: ignore[method-assign]
        handler.handleError = lambda record, report=report: report(sys.exc_info()[1])  # type: ignore[method-assign]


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    from hf_lightning.cli_output import begin_job, report_error, speak_for_the_run

    begin_job(cli=True)
    speak_for_the_run()
    _report_log_file_errors()
    try:
        metrics, objects = train(cfg)
        stopped = getattr(objects.get("module"), "preempted", None)
        if stopped:
            sys.exit(
                128 + int(stopped)
            )  # a stopped run is not a finished one: say so to scripts and schedulers
        return optimized_value(metrics, cfg.get("optimized_metric"), required=_in_multirun())
    except HFLightningError as err:
        report_error(err, log)  # once on stderr, and in train.log
        sys.exit(2)


def check_command_line(args: list[str]) -> None:
    """Before Hydra composes: a choice whose Hydra plugin is missing, or the SLURM launcher off a SLURM machine,
    exits with one line and status 2."""
    import shutil

    from hf_lightning.optional import check_command_line as check_plugins

    try:
        check_plugins(args)
        if any(a.lstrip("+") == "hydra/launcher=slurm" for a in args) and shutil.which("sbatch") is None:
            # submitit's own refusal is a traceback ('Could not detect "srun"') after the sweep has started
            raise ConfigError(
                "hydra/launcher=slurm submits the jobs to SLURM, and this machine has no sbatch command: run the "
                "command on a SLURM login node, or drop hydra/launcher=slurm to run the jobs here"
            )
    except HFLightningError as err:
        print(f"hf_lightning: error: {err}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from hf_lightning.cli_output import quiet_known_noise

    quiet_known_noise()
    check_command_line(sys.argv[1:])
    main()
