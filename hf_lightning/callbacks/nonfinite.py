"""Never apply a NaN: check the loss and the gradient norm before every optimizer step.

HF ``Trainer`` applies whatever gradient the backward produced (``logging_nan_inf_filter`` only hides a NaN
loss from the log); one NaN step makes every weight NaN, and the checkpoints saved after it are worthless.
:class:`NonFiniteGuard` looks at the window before ``optimizer.step``:

- every micro-batch loss of the gradient-accumulation window (``on_before_backward`` keeps it on the device:
  no op and no host sync per micro-batch) and the total gradient norm, read together once per step
  (``on_before_optimizer_step``; with :class:`~hf_lightning.HFLightningModule` the norm is the same pass as
  the clipping's and the log line's);
- non-finite → ``on_nonfinite="stop"`` raises :class:`~hf_lightning.core.errors.TrainingError` before the
  update (the weights and the last checkpoint stay as they were), ``"skip"`` drops the window's gradients
  (every included), counts the step in ``skipped_steps`` and goes on; ``max_consecutive_skips`` skipped steps
  in a row stop the run. The skipped step's loss and gradient norm stay out of the train log (no NaN in a row:
  :meth:`~hf_lightning.HFLightningModule.skip_step_in_log`);
- after each update, before any callback can save it, the weights themselves (``on_train_batch_end``, one
  max-abs reduction per tensor and one host sync per step): an update that overflows a weight to inf/NaN while
  the loss and the gradient norm were finite (a learning rate far too high) raises :class:`TrainingError` in
  both modes, since an applied update cannot be skipped; no checkpoint ever holds such weights;
- a finite norm above ``grad_norm_threshold``, or ``grad_norm_spike`` times the median of the recent norms, is
  reported at WARNING (``exploding_steps`` counts them); the step itself runs (clipping, if set, bounds it).

With a ``GradScaler`` (``precision=16-mixed``) an inf gradient is the scaler's normal overflow signal and it
skips that step itself, so only the loss is checked. Under DDP the gradients are already all-reduced, and the
loss verdict is all-reduced too, so every rank takes the same decision. DeepSpeed keeps gradients outside
``p.grad``: there only the loss is checked and ``skip`` is refused.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections import deque
from typing import Annotated, Any

import lightning as L
import torch

from hf_lightning.compat import foreach_norm
from hf_lightning.core.arguments import OPTIONAL_POSITIVE, POSITIVE_INT, check_call, one_of
from hf_lightning.core.errors import ConfigError, TrainingError
from hf_lightning.module.grad_norm import gradients_outside_params, params_with_grad, whole

log = logging.getLogger(__name__)

ACTIONS = ("stop", "skip")


class NonFiniteGuard(L.Callback):
    """Stop or skip a step whose loss or gradient is NaN/inf; report exploding gradient norms.

    Args:
        on_nonfinite: ``"stop"`` (raise :class:`TrainingError` before the update) or ``"skip"`` (no update for
            that step, counted).
        max_consecutive_skips: with ``"skip"``, this many skipped steps in a row raise :class:`TrainingError`
            (a run that has diverged would otherwise skip forever).
        grad_norm_threshold: report a gradient norm above this value (``None``: no absolute threshold).
        grad_norm_spike: report a norm above this multiple of the median of the last ``history`` norms (after
            ``min_history`` steps); ``None`` disables it.
        history / min_history: the window of recent finite norms for the spike test.

    Attributes:
        skipped_steps: steps whose update was dropped (saved in checkpoints, restored on resume).
        exploding_steps: steps reported for their gradient norm.

    Logged to every logger (``step`` = optimizer steps done): with ``"skip"``, ``train/skipped_steps`` (the
    run's count so far, 0 before the first skip) in every train row of
    :class:`~hf_lightning.HFLightningModule` (with another module: a row at each skip);
    ``train/exploding_steps`` after each report.

    Raises:
        ConfigError: a bad argument (named).
        TrainingError: ``"stop"`` and a non-finite loss/gradient; or too many consecutive skips.
    """

    def __init__(
        self,
        on_nonfinite: Annotated[str, one_of(ACTIONS)] = "stop",
        max_consecutive_skips: Annotated[int, POSITIVE_INT] = 10,
        grad_norm_threshold: Annotated[float | None, OPTIONAL_POSITIVE] = None,
        grad_norm_spike: Annotated[float | None, OPTIONAL_POSITIVE] = 10.0,
        history: Annotated[int, POSITIVE_INT] = 50,
        min_history: Annotated[int, POSITIVE_INT] = 5,
    ) -> None:
        check_call(NonFiniteGuard.__init__, locals(), "callbacks.nonfinite_guard")
        if min_history > history:
            raise ConfigError(
                f"callbacks.nonfinite_guard: need history >= min_history >= 1, got history={history}, "
                f"min_history={min_history}"
            )
        self.on_nonfinite = on_nonfinite
        self.max_consecutive_skips = max_consecutive_skips
        self.grad_norm_threshold = grad_norm_threshold
        self.grad_norm_spike = grad_norm_spike
        self.min_history = min_history
        self.skipped_steps = 0
        self.exploding_steps = 0
        self._consecutive = 0
        self._norms: deque[float] = deque(maxlen=history)
        self._losses: list[
            torch.Tensor
        ] = []  # the losses of this window's micro-batches (detached, on the device)
        self._weights_checked = 0  # the optimizer step whose updated weights were checked last

    # ------------------------------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        return {
            "skipped_steps": self.skipped_steps,
            "exploding_steps": self.exploding_steps,
            "norms": list(self._norms),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.skipped_steps = int(state.get("skipped_steps", 0))
        self.exploding_steps = int(state.get("exploding_steps", 0))
        self._norms.extend(state.get("norms", []))

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # a resumed run's weights were checked before they were saved
        self._weights_checked = trainer.global_step
        self._losses = []

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.on_nonfinite == "skip" and gradients_outside_params(trainer):
            raise ConfigError(
                "callbacks.nonfinite_guard.on_nonfinite=skip cannot drop a step under DeepSpeed (its "
                "gradients are not in p.grad); use on_nonfinite=stop"
            )

    # ------------------------------------------------------------------------------------------ hooks
    def on_before_backward(
        self, trainer: L.Trainer, pl_module: L.LightningModule, loss: torch.Tensor
    ) -> None:
        # kept as it is (no op, no host sync per micro-batch): the window's losses are checked together, once
        # per optimizer step
        self._losses.append(loss.detach())

    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any
    ) -> None:
        losses, self._losses = self._losses, []
        check_grads = getattr(
            trainer.precision_plugin, "scaler", None
        ) is None and not gradients_outside_params(trainer)
        norm_t = _step_norm(pl_module, optimizer) if check_grads else None
        # one host sync per optimizer step: the norm and every loss value of the window together
        values = [norm_t.float().reshape(1) if norm_t is not None else torch.full((1,), float("nan"))]
        values += [v.float().reshape(-1) for v in losses]
        device = next((v.device for v in values if v.device.type != "cpu"), torch.device("cpu"))
        norm, *loss_values = torch.cat([v.to(device) for v in values]).tolist()
        # the first non-finite loss value of the window, for the message
        loss_value = next((v for v in loss_values if not math.isfinite(v)), None)
        loss_bad = loss_value is not None
        if trainer.world_size > 1:
            loss_bad = bool(trainer.strategy.reduce_boolean_decision(loss_bad, all=False))
        norm_bad = norm_t is not None and not math.isfinite(norm)
        step = trainer.global_step + 1  # the step about to be taken, counted as HF counts optimizer steps
        if loss_bad or norm_bad:
            parts = []
            if loss_bad:
                parts.append(
                    f"the loss is {loss_value}"
                    if loss_value is not None
                    else "a loss on another rank is not finite"
                )
            if norm_bad:
                parts.append(f"the gradient norm is {norm}")
            self._nonfinite(trainer, optimizer, step, " and ".join(parts))
            return
        self._consecutive = 0
        self._add_skipped_count(pl_module)
        if norm_t is not None:
            self._check_norm(trainer, step, norm)
            self._norms.append(norm)

    def _add_skipped_count(self, pl_module: L.LightningModule) -> bool:
        """With ``"skip"``: ``train/skipped_steps`` into the module's train row of this step (``False`` when
        the module has no :meth:`add_train_metrics`)."""
        add = getattr(pl_module, "add_train_metrics", None)
        if self.on_nonfinite != "skip" or not callable(add):
            return False
        add({"train/skipped_steps": float(self.skipped_steps)})
        return True

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        """After each optimizer update, before anything can save it: are the weights still finite?"""
        if trainer.global_step == self._weights_checked:
            return  # inside an accumulation window, or already checked
        self._weights_checked = trainer.global_step
        params = [p for opt in trainer.optimizers for g in opt.param_groups for p in g["params"] if p.numel()]
        if not params:
            return
        # max |w| per tensor (torch's foreach kernel, one launch per dtype/device group): NaN or inf exactly
        # when the tensor holds one; a 2-norm would overflow on large finite weights. Sharded weights (FSDP2's
        # DTensors) are read through this rank's shard, and the per-tensor verdicts are summed over the ranks
        # (one all-reduce), so every rank sees the global state and can name the tensor another rank holds
        finite = _finite_per_tensor(params)
        if trainer.world_size > 1:  # sharded weights (FSDP, DeepSpeed): another rank may hold the bad part
            bad_count = trainer.strategy.reduce((~finite).float(), reduce_op="sum")
            finite = bad_count == 0
        if bool(finite.all()):  # one host sync per optimizer step
            return
        names = {id(p): n for n, p in pl_module.named_parameters()}
        wrong = [names.get(id(p), "?") for p, ok in zip(params, finite.tolist()) if not ok]
        shown = f"{len(wrong)} of {len(params)} weight tensors, e.g. {wrong[:3]}"
        lr = trainer.optimizers[0].param_groups[0].get("lr")
        raise TrainingError(
            f"optimizer step {trainer.global_step} (epoch {trainer.current_epoch}): the update made {shown} "
            "non-finite (NaN/inf) while the loss and the gradient norm were finite, so training stopped "
            "before anything saved them; every checkpoint already written is intact and holds finite weights "
            "(an update cannot be undone, so on_nonfinite=skip stops here too). Usual cause: a learning rate "
            "too high" + (f" (lr={lr:g} now)" if lr is not None else "")
        )

    # ------------------------------------------------------------------------------------------ actions
    def _nonfinite(self, trainer: L.Trainer, optimizer: Any, step: int, what: str) -> None:
        lr = optimizer.param_groups[0].get("lr")
        where = f"optimizer step {step} (epoch {trainer.current_epoch})"
        causes = (
            f"usual causes: a learning rate too high (lr={lr:g} now), fp16 overflow (try "
            "trainer.precision=bf16-mixed), or a broken batch"
            if lr is not None
            else "usual causes: a learning rate too high, fp16 overflow, or a broken batch"
        )
        if self.on_nonfinite == "stop":
            raise TrainingError(
                f"{where}: {what}, so the update was not applied and training stopped; the weights are those "
                f"after step {step - 1} and every checkpoint already written is intact. {causes}. To skip "
                "such steps instead, set callbacks.nonfinite_guard.on_nonfinite=skip"
            )
        for group in optimizer.param_groups:
            for p in group["params"]:
                # torch optimizers skip parameters without a gradient: no update, no decay, no moments
                p.grad = None
        self.skipped_steps += 1
        self._consecutive += 1
        log.warning("%s: %s; the update was skipped (%d skipped so far)", where, what, self.skipped_steps)
        skip_in_log = getattr(trainer.lightning_module, "skip_step_in_log", None)
        if callable(skip_in_log):
            skip_in_log()  # its loss and gradient norm stay out of the train row
        if not self._add_skipped_count(trainer.lightning_module):
            _log_metric(trainer, "train/skipped_steps", self.skipped_steps, step)
        if self._consecutive >= self.max_consecutive_skips:
            skipped = (
                "1 optimizer step had a non-finite loss or gradient and was skipped "
                if self._consecutive == 1
                else f"{self._consecutive} optimizer steps in a row had a non-finite loss or gradient "
                "and were skipped "
            )
            raise TrainingError(
                f"{where}: {skipped}"
                f"(callbacks.nonfinite_guard.max_consecutive_skips={self.max_consecutive_skips}): the run "
                f"has diverged. {causes}"
            )

    def _check_norm(self, trainer: L.Trainer, step: int, norm: float) -> None:
        reasons = []
        if self.grad_norm_threshold is not None and norm > self.grad_norm_threshold:
            reasons.append(f"above grad_norm_threshold={self.grad_norm_threshold:g}")
        if self.grad_norm_spike is not None and len(self._norms) >= self.min_history:
            median = statistics.median(self._norms)
            if norm > self.grad_norm_spike * median:
                reasons.append(
                    f"{norm / median:.1f}x the median {median:.3g} of the last {len(self._norms)} steps"
                )
        if not reasons:
            return
        self.exploding_steps += 1
        clip = getattr(trainer.lightning_module, "max_grad_norm", None)
        after = (
            f"clipped to module.max_grad_norm={clip:g} before the update"
            if clip
            else ("not clipped (set module.max_grad_norm to bound such updates)")
        )
        log.warning(
            "optimizer step %d: gradient norm %.4g is %s; %s", step, norm, " and ".join(reasons), after
        )
        _log_metric(trainer, "train/exploding_steps", self.exploding_steps, step)


def _finite_per_tensor(params: list[torch.Tensor]) -> torch.Tensor:
    """Whether each tensor holds only finite values (a bool vector, one entry per tensor, on the tensors'
    device), read on this rank's part: a ``DTensor``'s local shard (which may be empty: then finite)."""
    from torch.distributed.tensor import DTensor

    local = [p.to_local() if isinstance(p, DTensor) else p for p in params]
    device = local[0].device
    finite = torch.ones(len(local), dtype=torch.bool, device=device)
    present = [i for i, t in enumerate(local) if t.numel()]
    if present:
        maxima = foreach_norm([local[i].detach() for i in present], float("inf"))
        finite[torch.tensor(present, device=device)] = torch.isfinite(
            torch.stack([m.float().to(device) for m in maxima])
        )
    return finite


def _step_norm(pl_module: L.LightningModule, optimizer: Any) -> torch.Tensor | None:
    """The step's total gradient norm: shared with the log line and the clipping when the module offers it
    (:meth:`HFLightningModule.step_gradient_norm`, one pass per step), else computed here."""
    shared = getattr(pl_module, "step_gradient_norm", None)
    if shared is not None:
        return shared(optimizer)
    grads = [p.grad for p in params_with_grad(optimizer)]
    return whole(torch.nn.utils.get_total_norm(grads)) if grads else None


def _log_metric(trainer: L.Trainer, key: str, value: float, step: int) -> None:
    """A row ``{key: value}`` at ``step`` (the step being taken, from ``on_before_optimizer_step``): through
    :meth:`~hf_lightning.HFLightningModule.log_to_loggers` (the one
    writer, which says why not ``self.log``), else written to the loggers directly (any other module)."""
    write = getattr(trainer.lightning_module, "log_to_loggers", None)
    if callable(write):
        write({key: float(value)}, step=step)
        return
    for logger in trainer.loggers:
        logger.log_metrics({key: float(value)}, step=step)
