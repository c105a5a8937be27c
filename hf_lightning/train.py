"""``python -m hf_lightning.train +experiment=sft [overrides]``: fine-tune, evaluate, checkpoint, export.

``train(cfg)`` is a plain function (returns the final metrics and the objects it built); ``main`` is the thin
Hydra wrapper that turns input errors into one-line messages and returns the optimized metric to sweepers.

Order of work, cheapest checks first: :func:`hf_lightning.config.build.check` (the schema pass, missing
packages, the paths and ``model.config`` keys), the run folder (one process, no previous run overwritten),
then :func:`hf_lightning.config.build.build` (Trainer, tokenizer, data, model, module: the same builder
``evaluate`` and ``inspect_batch`` use), and ``fit``.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from typing import Any

import hydra
from omegaconf import DictConfig

from hf_lightning.cli.process import hide_library_warnings
from hf_lightning.config.build import in_multirun
from hf_lightning.core.arguments import counted, shown
from hf_lightning.core.errors import ConfigError, HFLightningError

log = logging.getLogger("hf_lightning.train")


def train(cfg: DictConfig) -> tuple[dict[str, float], dict[str, Any]]:
    """Run one training job described by ``cfg``.

    Returns:
        ``(metrics, objects)``: the newest value of every logged metric as floats, and the run's counts as
        integers (``global_step``, ``parameters``, ``best_model_step``), also written to
        ``<output_dir>/final_metrics.json`` on rank 0; and the built ``trainer``, ``module``, ``datamodule``.

    Raises:
        HFLightningError: bad config, data or model (the message names the key, file or field).
    """
    from hf_lightning.checkpointing import find_resume_checkpoint
    from hf_lightning.checkpointing.files import remove_leftovers
    from hf_lightning.cli.output import begin_job
    from hf_lightning.config.build import check
    from hf_lightning.run.decision import RunDecision, agreed_decision, hand_on
    from hf_lightning.run.end import finished_run_metrics
    from hf_lightning.run.folder import check_run_folder, check_steps_left, checkpoint_dir
    from hf_lightning.run.lock import (
        hold_checkpoint_folder,
        hold_run_folder,
        release_checkpoint_folder,
        release_run_folder,
    )

    begin_job()  # the clock of the done line's wall time
    schedule = check(cfg, "train")  # schema, HF step keys, missing packages: before the run folder is touched
    weights_only = bool(cfg.get("resume_weights_only"))
    output_dir = os.path.abspath(cfg.output_dir)
    ckpt_dir = checkpoint_dir(cfg, output_dir)
    acquired = hold_run_folder(output_dir)  # one process per run folder (the CLI's guard took it already)
    held: list[bool] = []
    try:
        # a rank that rank 0 launched takes rank 0's decision: the folder may already hold this command's
        # .hydra/ and checkpoint folder, so deciding again from it could decide otherwise
        decision = agreed_decision(output_dir, cfg.get("ckpt_path"), weights_only)
        if decision is None:
            # and per checkpoint folder: an existing one before it is read, a new one once the checks passed
            held.append(hold_checkpoint_folder(ckpt_dir, output_dir, create=False))
            # a run that starts at step 0 never overwrites a previous one
            check_run_folder(output_dir, cfg.get("ckpt_path"), ckpt_dir, weights_only)
            ckpt_path = find_resume_checkpoint(cfg.get("ckpt_path"), output_dir, weights_only, ckpt_dir)
            if not weights_only:
                check_steps_left(cfg, ckpt_path)
            finished = finished_run_metrics(cfg, output_dir, ckpt_path, ckpt_dir, weights_only)
            if finished is not None:
                return finished, {}
            held.append(hold_checkpoint_folder(ckpt_dir, output_dir))
            for path in remove_leftovers(
                output_dir, ckpt_dir
            ):  # this process owns the folder: they are a dead one's
                log.info("removed %s, left by a process that was stopped while writing it", path)
            decision = RunDecision(output_dir, cfg.get("ckpt_path"), ckpt_path, weights_only)
        with hand_on(decision):  # for the ranks fit launches
            return _train(cfg, decision.resolved, weights_only, schedule)
    finally:
        if any(held):
            release_checkpoint_folder(ckpt_dir)
        if acquired:
            release_run_folder(output_dir)


def _train(
    cfg: DictConfig, ckpt_path: str | None, weights_only: bool, schedule: Any = None
) -> tuple[dict[str, float], dict[str, Any]]:
    """The objects (:func:`~hf_lightning.config.build.build`), then :func:`_fit`."""
    from hf_lightning.config.build import build

    try:
        run = build(cfg, "train", checked=True, schedule=schedule)
        metrics, objects = _fit(
            cfg, run, None if weights_only else ckpt_path, ckpt_path if weights_only else None
        )
    finally:
        _close_wandb()
    return metrics, objects


def _load_weights(module: Any, path: str, model_path: Any) -> None:
    """``resume_weights_only``: the model weights of a checkpoint, nothing else (refused when they do not
    fit)."""
    from hf_lightning.checkpointing.weights import load_model_weights

    load_model_weights(module, path, model_path)
    log.warning("loaded only the weights of %s: optimizer, scheduler and step start fresh", path)


def _fit(
    cfg: DictConfig, run: Any, ckpt_path: str | None, weights_path: str | None = None
) -> tuple[dict[str, float], dict[str, Any]]:
    """``fit`` the built objects; the final metrics."""
    from hf_lightning.checkpointing.weights import summarize_load_error, weights_mismatch_message
    from hf_lightning.cli.output import job_seconds
    from hf_lightning.core.errors import ModelError
    from hf_lightning.run.end import (
        finish_run,
        finished_metrics,
        newest_logged,
        run_tokens_per_s,
        write_final_metrics,
    )
    from hf_lightning.run.faults import explain_faults
    from hf_lightning.run.folder import checkpoint_dir
    from hf_lightning.run.model_card import write_model_card
    from hf_lightning.run.test_stage import prepare_test_data, run_test_stage

    trainer, datamodule, module, model = run.trainer, run.datamodule, run.module, run.model
    model_path = cfg.model.get("name_or_path")
    prepare_test_data(datamodule, module)  # data.test_path / test_split_name: checked before training
    if weights_path is not None:
        _load_weights(module, weights_path, model_path)
    n_params = sum(p.numel() for p in model.parameters())
    log.info("model: %s, %.2fM parameters", type(model).__name__, n_params / 1e6)
    with explain_faults(
        trainer, datamodule, os.path.abspath(cfg.output_dir)
    ):  # out of memory -> TrainingError with the batch/accumulation trade
        try:
            trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path)
        except RuntimeError as err:
            # Lightning's strict restore of a checkpoint written by another architecture
            if ckpt_path is None or not str(err).startswith("Error(s) in loading state_dict"):
                raise
            details = summarize_load_error(err)
            raise ModelError(weights_mismatch_message(ckpt_path, model_path, details)) from None
    objects = {"trainer": trainer, "module": module, "datamodule": datamodule}
    if module.fit_start_step in (None, trainer.global_step) and ckpt_path is not None:
        previous = finished_metrics(cfg.output_dir, trainer.global_step)
        if previous is None:  # the training had ended, its end (row, validation, export, metrics) had not
            metrics, done = finish_run(cfg.output_dir, trainer, module, datamodule, n_params, cfg)
            log.warning(
                "%s is at the end of this run (optimizer step %d), whose end was cut short: wrote %s",
                ckpt_path,
                trainer.global_step,
                ", ".join(done),
            )
            return metrics, objects
        log.warning(
            "nothing was trained: %s is at optimizer step %d, where this run's limits (trainer.max_steps=%s, "
            "trainer.max_epochs=%s) already end it; raise one of them to continue. Its checkpoints, "
            "metrics.csv, hf_model/ and final_metrics.json are unchanged",
            ckpt_path,
            trainer.global_step,
            shown(cfg.trainer.get("max_steps")),
            shown(cfg.trainer.get("max_epochs")),
        )
        return previous, objects  # the finished run's own final metrics stay (and are what a sweep reads)
    _validate_final_weights(trainer, module, datamodule)

    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    # the rows written last win: the final flush of train/loss after the last log step never reaches
    # callback_metrics (Lightning allows no self.log in on_train_end); a resumed run's rows before the stop
    # too
    metrics.update(
        newest_logged(os.path.join(cfg.output_dir, "metrics.csv")) if trainer.is_global_zero else {}
    )
    metrics.update(module.last_logged)
    metrics.update(run_test_stage(trainer, module, datamodule))  # the weights the run ends with
    from hf_lightning.callbacks.load_best import LoadBestModel

    for callback in trainer.callbacks:  # load_best_model_at_end: the exported weights' step and metric
        if isinstance(callback, LoadBestModel):
            metrics.update(callback.final_metrics())
    rate = run_tokens_per_s(trainer)
    wall = job_seconds()  # the whole job: start-up (the command's first), data, training, validations, export
    metrics.update({"global_step": trainer.global_step, "parameters": n_params, "wall_time_s": wall})
    if rate is not None:
        metrics["train_tokens_per_s"] = rate[0]
    stopped = getattr(module, "preempted", None)
    if trainer.is_global_zero and not stopped:  # a stopped run has no final metrics yet
        write_model_card(cfg, trainer, model, metrics)  # hf_model/README.md, HF's create_model_card
        write_final_metrics(cfg.output_dir, metrics)
    if stopped:
        log.warning(
            "stopped by %s at optimizer step %d: %s holds it, no hf_model/ yet. "
            "Continue with the same overrides plus ckpt_path=last hydra.run.dir=%s (the overrides are in "
            ".hydra/overrides.yaml)",
            signal.Signals(stopped).name,
            trainer.global_step,
            os.path.join(checkpoint_dir(cfg, cfg.output_dir), "last.ckpt"),
            cfg.output_dir,
        )
        return metrics, objects
    tokens = (
        f"{rate[1]} real tokens trained at {rate[0]:.0f} real tokens/s (all ranks, validation excluded)"
        if rate is not None
        else "real tokens not counted (callbacks.throughput is off)"
    )
    start = module.fit_start_step or 0
    steps = (
        counted(trainer.global_step, "optimizer step")
        if not start
        else f"optimizer steps {start} -> {trainer.global_step} (a resume: {trainer.global_step - start} "
        "in this command, whose time and tokens follow)"
    )
    skipped = int(metrics.get("train/skipped_steps", 0))
    if skipped:
        steps += f", {skipped} of them skipped (a non-finite loss or gradient: no update)"
    log.info(
        "done: %s in %.1f s (wall time, start-up included), %s, final %s",
        steps,
        wall,
        tokens,
        # the last row's throughput/* rates cover one log interval: the run's rate is the one above; the
        # skipped steps are counted with the steps
        ", ".join(
            f"{k}={v:.4f}"
            for k, v in metrics.items()
            if "/" in k and not k.startswith("throughput/") and k != "train/skipped_steps"
        ),
    )
    return metrics, objects


def _validate_final_weights(trainer: Any, module: Any, datamodule: Any) -> None:
    """One more validation when the newest one measured earlier weights than the exported ones.

    A run's validations fall where ``val_check_interval`` puts them, which need not be its last step (``0.5``
    of a 121-batch epoch validates after batches 60 and 120, never after 121), so the last ``val/loss`` would
    describe an earlier model than ``hf_model/``.
    :class:`~hf_lightning.callbacks.final_validation.FinalValidation` runs that validation inside ``fit``
    (where it competes for ``best.ckpt``); this is the fallback for an epoch in which Lightning allows none
    (``check_val_every_n_epoch`` > 1), logged at the final step after ``fit``, so ``final_metrics.json``
    describes the exported weights. Skipped when validation is off (``trainer.limit_val_batches=0`` or no
    validation data) or the run stopped on a signal.
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
        " (no validation was allowed in the last epoch, e.g. by trainer.check_val_every_n_epoch; after fit "
        "this one does not compete for the best checkpoint)"
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
                    f"hf_lightning: warning: could not write the log file {handler.baseFilename} ({err}); "
                    "log lines go to the terminal only from here",
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
    from hf_lightning.cli.output import begin_job, log_early_notes, report_error, speak_for_the_run

    hide_library_warnings()
    begin_job(cli=True)
    speak_for_the_run()
    _report_log_file_errors()
    log_early_notes(log)  # the run-folder guard's notes (a resume's), said before train.log existed
    try:
        metrics, objects = train(cfg)
        stopped = getattr(objects.get("module"), "preempted", None)
        if stopped:
            sys.exit(
                128 + int(stopped)
            )  # a stopped run is not a finished one: say so to scripts and schedulers
        return optimized_value(metrics, cfg.get("optimized_metric"), required=in_multirun())
    except HFLightningError as err:
        from hf_lightning.run.lock import discard_new_run_folder

        report_error(err, log)  # once on stderr, and in train.log
        discard_new_run_folder(cfg.output_dir)  # a refused command leaves no folder it made
        sys.exit(2)


def check_command_line(args: list[str]) -> list[str]:
    """Before Hydra composes: a choice whose Hydra plugin is missing, an override that does not compose, or
    the SLURM launcher off a SLURM machine, exits with one line and status 2; returns the command line to
    give Hydra (a new key of a mapping setting spelled as Hydra takes it:
    :func:`~hf_lightning.config.typos.mapping_spellings`)."""
    import shutil

    from hf_lightning.config.optional import check_command_line as check_plugins
    from hf_lightning.config.typos import checked_command_line

    try:
        check_plugins(args)
        # Hydra would say 'Could not override' and advise adding the key
        args = checked_command_line(args, "train", "train")
        if any(a.lstrip("+") == "hydra/launcher=slurm" for a in args) and shutil.which("sbatch") is None:
            # submitit's own refusal is a traceback ('Could not detect "srun"') after the sweep has started
            raise ConfigError(
                "hydra/launcher=slurm submits the jobs to SLURM, and this machine has no sbatch command: run "
                "the command on a SLURM login node, or drop hydra/launcher=slurm to run the jobs here"
            )
    except HFLightningError as err:
        print(f"hf_lightning: error: {err}", file=sys.stderr)
        sys.exit(2)
    return args


if __name__ == "__main__":
    from hf_lightning.cli.output import quiet_known_noise

    quiet_known_noise()
    sys.argv[1:] = check_command_line(sys.argv[1:])
    from hf_lightning.strategies.launch import other_rank_overrides

    sys.argv += other_rank_overrides(
        sys.argv[1:]
    )  # torchrun / SLURM ranks > 0: their own log file, as Lightning's
    main()
