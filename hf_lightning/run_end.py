"""The end of a run: ``final_metrics.json``, and finishing a run whose training ended but whose end did not.

A run's end writes, after its last optimizer step and checkpoint: the final ``train/loss`` row (when the last
step was not a log step), a validation of the final weights, ``hf_model/``, then ``final_metrics.json``. A
process killed in between leaves a ``last.ckpt`` at the final step and an unfinished end; ``ckpt_path=last``
then trains nothing, and :func:`finish_run` writes what is missing, in the same order and with the same values as
the run that never stopped (the final row's losses are in the checkpoint). ``final_metrics.json`` is written
last: its ``global_step`` equal to the checkpoint's means the end was complete.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from hf_lightning.checkpointing.files import write_json

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
    from hf_lightning.loggers import read_rows

    if not os.path.isfile(path):
        return {}
    newest: dict[str, float] = {}
    for row in read_rows(path)[1]:
        newest.update({k: float(v) for k, v in row.items() if k != "step" and v not in ("", None)})
    return newest


def finish_run(
    output_dir: str, trainer: Any, module: Any, datamodule: Any, n_params: int
) -> tuple[dict[str, float], list[str]]:
    """Complete the end of a run resumed at its final step: ``(final metrics, what was done)``.

    Call it on every rank after a ``fit`` that trained nothing (the validation and a sharded export are
    collectives); rank 0 writes.
    """
    from hf_lightning.callbacks.hf_export import HFExport
    from hf_lightning.loggers import logged_at

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
    metrics.update({"global_step": float(step), "parameters": float(n_params)})
    if trainer.is_global_zero:
        write_final_metrics(output_dir, metrics)
    done.append(METRICS_FILE)
    return metrics, done
