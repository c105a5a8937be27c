"""One gradient-norm pass per optimizer step, shared by the log line, the clipping and the non-finite guard.

Three readers want the total gradient 2-norm of a step: the ``grad_norm`` log column (HF logs the value
``clip_grad_norm_`` returns: the norm before clipping), norm clipping (``torch.nn.utils.clip_grad_norm_`` on
every step at ``module.max_grad_norm``, HF's ``max_grad_norm=1.0`` default) and
:class:`~hf_lightning.callbacks.NonFiniteGuard`. Each computing its own is
up to three passes over every gradient per step (and, on a GPU, one reduction kernel chain each).
:class:`StepGradNorm` computes it once, on the first request of the step, and clips with that value
(``torch.nn.utils.clip_grads_with_norm_``: the second half of ``clip_grad_norm_``, so the result is
identical).

Under FSDP2 (``strategy=fsdp``) the gradients are ``DTensor`` shards: ``get_total_norm`` over them gives a
``DTensor`` of per-rank partial norms, reduced over the ranks here (:func:`whole`), and the clipping
multiplies each shard by the same global factor. Under FSDP1 the gradients are flat shards: the norm is FSDP's
own ``clip_grad_norm_`` of the root module
(all-reduced over ranks; Lightning's FSDP precision plugin refuses norm clipping and its docs point to that
method), which clips in the same call. Under DeepSpeed the gradients are not in ``p.grad`` (the engine clips
itself): the norm is the engine's own, read after its step (:func:`engine_grad_norm`, DeepSpeed's public
``get_global_grad_norm``: the norm before clipping, as HF ``Trainer`` logs it under DeepSpeed).
"""

from __future__ import annotations

import math

import lightning as L
import torch
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import DeepSpeedStrategy, FSDPStrategy

from hf_lightning.compat import unscales_gradients_itself


def params_with_grad(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The optimizer's parameters that hold a gradient."""
    return [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]


def gradients_outside_params(trainer: L.Trainer) -> bool:
    """DeepSpeed keeps gradients in its engine, not in ``p.grad`` (any ``DeepSpeedStrategy``, ours
    included)."""
    return isinstance(trainer.strategy, DeepSpeedStrategy)


def engine_grad_norm(trainer: L.Trainer) -> torch.Tensor | None:
    """The total gradient 2-norm of the DeepSpeed engine's newest step (``DeepSpeedEngine
    .get_global_grad_norm()``, the norm over every rank's gradients before the engine clipped them), as a
    0-dim float tensor; ``None`` outside DeepSpeed, or when the engine computed none (ZeRO's norm computation
    turned off)."""
    engine = (
        getattr(trainer.strategy, "deepspeed_engine", None) if gradients_outside_params(trainer) else None
    )
    norm = engine.get_global_grad_norm() if engine is not None else None
    if norm is None:
        return None
    return norm.detach().float().reshape(()) if torch.is_tensor(norm) else torch.tensor(float(norm))


def whole(norm: torch.Tensor) -> torch.Tensor:
    """The global norm from ``get_total_norm`` over FSDP2's gradients: those are ``DTensor`` shards, and their
    norm is a ``DTensor`` holding each rank's partial result; its ``full_tensor()`` reduces it over the ranks
    (one all-reduce). A plain tensor is returned as it is."""
    from torch.distributed.tensor import DTensor

    return norm.full_tensor() if isinstance(norm, DTensor) else norm


class StepGradNorm:
    """The total gradient 2-norm of the current optimizer step, computed at most once.

    Call :meth:`reset` when a step has been taken; :meth:`get` between ``backward`` and ``optimizer.step`` (in
    ``on_before_optimizer_step`` or the clipping hook); :meth:`clip` from ``configure_gradient_clipping``.
    """

    def __init__(self) -> None:
        self._norm: torch.Tensor | None = None
        self._done = False  # computed for this step (the value may be None: no gradients)
        self._clipped = False  # FSDP's clip_grad_norm_ clipped while computing it

    def reset(self) -> None:
        self._norm, self._done, self._clipped = None, False, False

    def get(
        self, trainer: L.Trainer, optimizer: torch.optim.Optimizer, max_norm: float | None = None
    ) -> torch.Tensor | None:
        """The step's total 2-norm over the optimizer's gradients: a 0-dim float tensor on their device, or
        ``None`` when there is none to read (no gradient, or DeepSpeed). No host sync. ``max_norm``: the
        step's clipping norm (FSDP clips while it computes the norm)."""
        if not self._done:
            self._done = True
            if gradients_outside_params(trainer):
                self._norm = None
            elif isinstance(trainer.strategy, FSDPStrategy):
                # FSDP computes the global norm only while clipping: clip to the configured norm (or to inf,
                # which multiplies by 1) so that the gradients are in their final state once the norm exists
                self._norm = trainer.strategy.model.clip_grad_norm_(max_norm or math.inf)
                self._clipped = True
            else:
                grads = [p.grad for p in params_with_grad(optimizer)]
                self._norm = whole(torch.nn.utils.get_total_norm(grads)) if grads else None
        return self._norm

    def clip(self, trainer: L.Trainer, optimizer: torch.optim.Optimizer, max_norm: float) -> bool:
        """Clip the gradients to total norm ``max_norm`` with the shared norm, exactly as
        ``torch.nn.utils.clip_grad_norm_(params, max_norm)``. Returns ``False`` (nothing done) where the
        shared norm cannot stand in for the precision plugin's own clipping (DeepSpeed; a plugin with its own
        ``clip_grad_by_norm``, except FSDP's; an optimizer that unscales AMP gradients itself, which Lightning
        refuses to clip): the caller then defers to Lightning."""
        plugin = trainer.precision_plugin
        fsdp = isinstance(trainer.strategy, FSDPStrategy)
        if gradients_outside_params(trainer) or (
            not fsdp and type(plugin).clip_grad_by_norm is not Precision.clip_grad_by_norm
        ):
            return False
        if getattr(plugin, "scaler", None) is not None and unscales_gradients_itself(optimizer):
            return False
        norm = self.get(trainer, optimizer, max_norm)
        params = params_with_grad(optimizer)  # none left when NonFiniteGuard dropped this step's gradients
        if norm is not None and params and not self._clipped:
            torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
        return True
