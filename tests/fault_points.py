"""A test-only callback that makes one chosen optimizer step's loss and gradients NaN in a CLI run
(``+callbacks.nan._target_=tests.fault_points.NaNLossAt +callbacks.nan.step=N``).

The fault is the one of a real divergence: every activation of that step's micro-batches turns NaN at the
input embeddings (a forward hook), so the loss, the backward and the gradient norm are NaN, while the model,
the data and the loop are the real ones. The steps before and after are untouched.
"""

from __future__ import annotations

from typing import Any

import lightning as L


class NaNLossAt(L.Callback):
    """NaN activations in every micro-batch of optimizer step ``step`` (1-based, as HF counts steps)."""

    def __init__(self, step: int) -> None:
        self.step = int(step)
        self._hook: Any = None

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if trainer.global_step + 1 == self.step and self._hook is None:
            embeddings = pl_module.model.get_input_embeddings()
            self._hook = embeddings.register_forward_hook(lambda mod, inputs, output: output * float("nan"))

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if self._hook is not None and trainer.global_step >= self.step:
            self._hook.remove()
            self._hook = None
