"""HF's ``load_best_model_at_end``: ``hf_model/`` holds the best saved checkpoint's weights."""

from __future__ import annotations

import logging
import math
import os
from typing import Any

import lightning as L

from hf_lightning.core.errors import ConfigError

log = logging.getLogger(__name__)


class LoadBestModel(L.Callback):
    """Keep the best saved model by ``monitor`` as HF ``Trainer`` does, and load it before the export.

    HF's rule (``Trainer._determine_best_metric`` and ``_save_checkpoint``): after every
    evaluation the metric is compared strictly (``<`` for ``mode="min"``, ``>`` for ``"max"``) with the best
    so far; at every save, the best evaluation's checkpoint becomes the best model *if that step was saved*. A
    best evaluation at a step without a checkpoint (``eval_steps=10, save_steps=20``, best at step 30)
    therefore leaves the previous best model in place. The final step is evaluated and saved like any other,
    so it competes.

    Here: the best evaluation at a save step writes ``dirpath/best.ckpt`` (a whole Lightning checkpoint, never
    rotated out) at the end of that validation; at the end of training, its model weights are loaded into the
    module before :class:`~hf_lightning.callbacks.HFExport` writes ``hf_model/`` (put this callback before
    it). ``checkpoints/last.ckpt`` keeps the final state, so a resume continues the run, not the best model.

    Args:
        monitor: the logged metric (``val/loss``), from
        :func:`~hf_lightning.callbacks.best_model.resolve_monitor`. mode: ``min`` or ``max``.
        dirpath: the checkpoint folder.
        steps: the :class:`~hf_lightning.callbacks.hf_steps.HFSteps` of the run, which knows the save steps.

    Attributes:
        best_metric, best_global_step: the best evaluation so far (HF ``TrainerState``'s names).
        best_model_step, best_model_metric: the step and metric of ``best.ckpt`` (``None`` until one is
        saved).
    """

    def __init__(self, monitor: str, mode: str, dirpath: str, steps: Any) -> None:
        self.monitor, self.mode, self.dirpath, self.steps = monitor, mode, dirpath, steps
        self.best_metric: float | None = None
        self.best_global_step: int | None = None
        self.best_model_step: int | None = None
        self.best_model_metric: float | None = None

    @property
    def path(self) -> str:
        return os.path.join(self.dirpath, "best.ckpt")

    def _better(self, value: float) -> bool:
        if self.best_metric is None:
            return not math.isnan(value)
        return value < self.best_metric if self.mode == "min" else value > self.best_metric

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != "fit":  # a validate() after fit does not compete
            return
        metrics = trainer.callback_metrics
        if self.monitor not in metrics:
            names = ", ".join(sorted(k for k in metrics if k.startswith("val/"))) or "none"
            raise ConfigError(
                f"metric_for_best_model names {self.monitor}, which the validation did not log (it logged: "
                f"{names})"
            )
        value, step = float(metrics[self.monitor]), trainer.global_step
        if self._better(value):
            self.best_metric, self.best_global_step = value, step
        if self.best_global_step == step and self.steps.is_save_step(step):
            self.best_model_step, self.best_model_metric = step, value
            trainer.save_checkpoint(self.path, weights_only=False)  # explicit: Lightning logs its default
            if trainer.is_global_zero:
                log.info("best model so far: step %d, %s=%.6g (%s)", step, self.monitor, value, self.path)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if getattr(pl_module, "preempted", False):
            return
        from hf_lightning.checkpointing.weights import load_model_weights

        if self.best_model_step is None:
            if trainer.is_global_zero:
                log.warning(
                    "load_best_model_at_end: no evaluation at a save step was the best (best evaluation: "
                    "step %s), so hf_model/ holds the final weights, as HF Trainer keeps them",
                    self.best_global_step,
                )
            return
        if self.best_model_step != trainer.global_step:
            load_model_weights(pl_module, self.path, None)
        if trainer.is_global_zero:
            log.info(
                "load_best_model_at_end: hf_model/ gets the weights of step %d (%s=%.6g, %s); "
                "checkpoints/last.ckpt keeps the final step %d",
                self.best_model_step,
                self.monitor,
                self.best_model_metric,
                self.path,
                trainer.global_step,
            )

    def final_metrics(self) -> dict[str, float]:
        """``best_model_step`` and ``best_metric`` (the exported weights' step and metric) for
        ``final_metrics.json``; empty when no best model was saved."""
        if self.best_model_step is None:
            return {}
        return {"best_model_step": int(self.best_model_step), "best_metric": float(self.best_model_metric)}

    def state_dict(self) -> dict[str, Any]:
        return {
            "best_metric": self.best_metric,
            "best_global_step": self.best_global_step,
            "best_model_step": self.best_model_step,
            "best_model_metric": self.best_model_metric,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for key in ("best_metric", "best_global_step", "best_model_step", "best_model_metric"):
            setattr(self, key, state_dict.get(key))
