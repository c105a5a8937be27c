"""The end of a run: ``final_metrics.json``, and finishing a run whose training ended but whose end did not.

A run's end writes, after its last optimizer step and checkpoint: the final ``train/loss`` row (when the last
step was not a log step), a validation of the final weights, ``hf_model/``, the test stage (with
``data.test_path`` / ``data.test_split_name``: :mod:`~hf_lightning.run.test_stage`), the model card
(``hf_model/README.md``, with the final metrics: :mod:`hf_lightning.run.model_card`), then
``final_metrics.json``. A process killed in between leaves a ``last.ckpt`` at the final step and an unfinished
end; ``ckpt_path=last`` then trains nothing, and :func:`finish_run` writes what is missing, in the same order
and with the same values as the run that never stopped (the final row's losses are in the checkpoint).
``final_metrics.json`` is written last: its ``global_step`` equal to the checkpoint's means the end was
complete.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from hf_lightning.checkpointing.files import write_json
from hf_lightning.core.arguments import shown

log = logging.getLogger(__name__)

METRICS_FILE = "final_metrics.json"


def write_final_metrics(output_dir: str, metrics: dict[str, float]) -> None:
    """``OUTPUT/final_metrics.json``, atomically.

    Raises:
        TrainingError: the disk refused the write (the previous file, if any, is intact).
    """
    os.makedirs(output_dir, exist_ok=True)
    write_json(
        os.path.join(output_dir, METRICS_FILE),
        metrics,
        "the final metrics",
        "then resume with ckpt_path=last to write them (the checkpoints and hf_model/ are kept)",
    )


def finished_metrics(output_dir: str, step: int) -> dict[str, float] | None:
    """The run's ``final_metrics.json`` if it was written at optimizer step ``step`` (its end is complete)."""
    path = os.path.join(output_dir, METRICS_FILE)
    try:
        with open(path) as fh:
            metrics = json.load(fh)
    except (OSError, ValueError):
        return None
    return metrics if isinstance(metrics, dict) and metrics.get("global_step") == step else None


def newest_logged(path: str) -> dict[str, float]:
    """The newest value of every column of ``metrics.csv`` (what the run that never stopped returns)."""
    from hf_lightning.run.loggers import read_rows

    if not os.path.isfile(path):
        return {}
    newest: dict[str, float] = {}
    for row in read_rows(path)[1]:
        newest.update({k: float(v) for k, v in row.items() if k != "step" and v not in ("", None)})
    return newest


def finish_run(
    output_dir: str, trainer: Any, module: Any, datamodule: Any, n_params: int, cfg: Any = None
) -> tuple[dict[str, float], list[str]]:
    """Complete the end of a run resumed at its final step: ``(final metrics, what was done)``.

    Call it on every rank after a ``fit`` that trained nothing (the validation and a sharded export are
    collectives); rank 0 writes. ``cfg``: the run's config, for the export's model card (none without it).
    """
    from hf_lightning.callbacks.hf_export import HFExport
    from hf_lightning.run.loggers import logged_at
    from hf_lightning.run.test_stage import run_test_stage

    step = trainer.global_step
    csv_path = os.path.join(output_dir, "metrics.csv")
    done = []
    logged = logged_at(csv_path, step) if trainer.is_global_zero else set()
    if trainer.world_size > 1:
        logged = trainer.strategy.broadcast(logged)
    if module.has_pending_train_log and "train/loss" not in logged:
        module.flush_train_log(progress_bar=False)
        done.append(f"the train/loss row of step {step}")
    validating = trainer.limit_val_batches and getattr(datamodule, "val_dataset", None) is not None
    if validating and not any(k.startswith("val/") for k in logged):
        trainer.validate(module, datamodule=datamodule, verbose=False)
        done.append(f"the validation of the final weights (step {step})")
    for callback in trainer.callbacks:
        if isinstance(callback, HFExport):
            callback.export(trainer, module)
            done.append(callback.dirpath)
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    metrics.update(newest_logged(csv_path) if trainer.is_global_zero else {})
    metrics.update(module.last_logged)
    if not any(k.startswith("test/") for k in logged):
        tested = run_test_stage(trainer, module, datamodule)
        metrics.update(tested)
        if tested:
            done.append(f"the test stage of the final weights (step {step})")
    metrics.update({"global_step": step, "parameters": n_params})  # counts, as integers
    if trainer.is_global_zero:
        if cfg is not None:
            from hf_lightning.run.model_card import write_model_card

            if write_model_card(cfg, trainer, module.model, metrics):
                done.append("the model card")
        write_final_metrics(output_dir, metrics)
    done.append(METRICS_FILE)
    return metrics, done


def finished_run_metrics(
    cfg: Any, output_dir: str, ckpt_path: str | None, ckpt_dir: str, weights_only: bool
) -> dict[str, float] | None:
    """The final metrics of a finished run that this resume (same run length) would not train: said, and the
    folder left exactly as it was (the run-folder guard kept Hydra from rewriting ``.hydra/`` and
    ``train.log``)."""
    from hf_lightning.run.folder import finished_resume, take_finished

    answered, finished = take_finished(output_dir)
    own = ckpt_path is not None and os.path.dirname(os.path.realpath(ckpt_path)) == os.path.realpath(ckpt_dir)
    if not answered and own and not weights_only:
        finished = finished_resume(output_dir, cfg, ckpt_path)
    if finished is None:
        return None
    log.warning(
        "nothing was trained: %s is at optimizer step %d, where this run's limits (trainer.max_steps=%s, "
        "trainer.max_epochs=%s) already end it, and the run had finished; raise one of them to continue. The "
        "run folder is unchanged",
        ckpt_path,
        int(finished.get("global_step", 0)),
        shown(cfg.trainer.get("max_steps")),
        shown(cfg.trainer.get("max_epochs")),
    )
    return {k: float(v) for k, v in finished.items()}


def run_tokens_per_s(trainer: Any) -> tuple[float, int] | None:
    """``(real tokens/s, real tokens)`` of this command's training, over all ranks, validation excluded: the
    definition of ``throughput/tokens_per_s`` over the whole run, from the
    :class:`~hf_lightning.callbacks.Throughput` callback, the one place tokens are counted. ``None`` when the
    run has no such callback (``callbacks.throughput=null``) or trained nothing."""
    from hf_lightning.callbacks.throughput import Throughput

    callback = next((c for c in trainer.callbacks if isinstance(c, Throughput)), None)
    if callback is None or callback.run_tokens_per_s() is None:
        return None
    return float(callback.run_tokens_per_s()), int(callback.run_real_tokens)
