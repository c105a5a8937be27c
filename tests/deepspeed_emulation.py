"""A stand-in for the ``deepspeed`` package that emulates the engine's accumulation and stepping on CPU.

deepspeed needs CUDA and is not installed here. Lightning's ``DeepSpeedStrategy`` only reaches the package
through ``deepspeed.initialize`` (the engine), ``deepspeed.init_distributed``, ``deepspeed.zero.Init`` and
``deepspeed.utils.logging``; everything else it does (config, the precision plugin that calls
``engine.backward`` and ``engine.step()``, the optimizer and scheduler set-up) runs for real.
:class:`EmulatedEngine` does what ``deepspeed/runtime/engine.py`` does with accumulation (read there,
paraphrased):

- ``backward(loss, scale_wrt_gas=True)``: divides the loss by ``gradient_accumulation_steps`` when
  ``scale_wrt_gas``, then back-propagates; gradients add up over micro-batches (ZeRO-2 adds them into its
  partitions: the same sums);
- ``is_gradient_accumulation_boundary()``: the value last given to ``set_gradient_accumulation_boundary``, or,
  when none was given, ``(micro_steps + 1) % gradient_accumulation_steps == 0`` with ``micro_steps`` counting
  every ``step()`` call since the engine was built (across epochs);
- ``step()``: at a boundary, clips to ``gradient_clipping`` (the global norm), steps the optimizer and zeroes
  the gradients; ``micro_steps`` grows by one on every call, boundary or not.

Each real update is recorded: which micro-batches (by backward call) it applied and the learning rate it used.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import logging
import sys
import types
from typing import Any

import torch


class EmulatedEngine(torch.nn.Module):
    def __init__(
        self, module: torch.nn.Module, optimizer: torch.optim.Optimizer, lr_scheduler: Any, config: dict
    ):
        super().__init__()
        self.module = module
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler  # Lightning takes it back and steps it itself
        self.gas = int(config["gradient_accumulation_steps"])
        self.clip = float(config.get("gradient_clipping") or 0.0)
        self.micro_steps = 0
        self.global_steps = 0
        self._boundary: bool | None = None
        self.backward_calls = 0
        self._pending: list[int] = []
        self.updates: list[tuple[list[int], float]] = []  # (backward calls applied, lr used)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def gradient_accumulation_steps(self) -> int:
        return self.gas

    def set_gradient_accumulation_boundary(self, is_boundary: bool) -> None:
        self._boundary = bool(is_boundary)

    def is_gradient_accumulation_boundary(self) -> bool:
        if self._boundary is None:
            return (self.micro_steps + 1) % self.gas == 0
        return self._boundary

    def backward(self, loss: torch.Tensor, scale_wrt_gas: bool = True, **kwargs: Any) -> torch.Tensor:
        if scale_wrt_gas and self.gas > 1:
            loss = loss / self.gas
        loss.backward()
        self._pending.append(self.backward_calls)
        self.backward_calls += 1
        return loss

    def step(self, **kwargs: Any) -> None:
        if self.is_gradient_accumulation_boundary():
            params = [p for g in self.optimizer.param_groups for p in g["params"] if p.grad is not None]
            if self.clip > 0:
                torch.nn.utils.clip_grad_norm_(params, self.clip)
            self.updates.append((self._pending, float(self.optimizer.param_groups[0]["lr"])))
            self._pending = []
            self.optimizer.step()
            self.optimizer.zero_grad()
            self.global_steps += 1
        self.micro_steps += 1


def fake_deepspeed() -> types.ModuleType:
    """A ``deepspeed`` module whose ``initialize`` returns an :class:`EmulatedEngine` (kept in
    ``.engines``)."""
    ds = types.ModuleType("deepspeed")
    # a spec, so that importlib.util.find_spec (hf_lightning.config.optional.is_missing) finds it as installed
    ds.__spec__ = importlib.machinery.ModuleSpec("deepspeed", None)
    ds.__version__ = "0.16.0"
    ds.engines = []

    def initialize(*, model, optimizer, lr_scheduler=None, config, **kwargs):
        engine = EmulatedEngine(model, optimizer, lr_scheduler, config)
        ds.engines.append(engine)
        return engine, optimizer, None, lr_scheduler

    ds.initialize = initialize
    ds.init_distributed = lambda *args, **kwargs: None
    ds.zero = types.SimpleNamespace(Init=lambda **kwargs: contextlib.nullcontext())
    ds.utils = types.SimpleNamespace(
        logging=types.SimpleNamespace(logger=logging.getLogger("deepspeed.emulated"))
    )
    return ds


def install(monkeypatch) -> types.ModuleType:
    """Put :func:`fake_deepspeed` in place for Lightning and hf_lightning; returns it.

    Also replaces ``DeepSpeedStrategy.setup_environment`` by the base ``Strategy``'s: Lightning's refuses a
    non-CUDA accelerator and starts DeepSpeed's process group, which one CPU process does not need.
    """
    import lightning.fabric.strategies.deepspeed as fabric_ds
    import lightning.pytorch.strategies.deepspeed as pl_ds
    from lightning.pytorch.strategies import Strategy

    ds = fake_deepspeed()
    monkeypatch.setitem(sys.modules, "deepspeed", ds)
    for module in (fabric_ds, pl_ds):
        monkeypatch.setattr(module, "_DEEPSPEED_AVAILABLE", True, raising=False)
        monkeypatch.setattr(module, "_DEEPSPEED_GREATER_EQUAL_0_16", True, raising=False)
    monkeypatch.setattr(pl_ds.DeepSpeedStrategy, "setup_environment", Strategy.setup_environment)
    return ds
