"""Whether a backward inside an accumulation window reduces gradients across ranks.

``HFLightningModule.training_step`` runs every micro-batch's backward but the window's last one inside
:func:`gradient_sync` with ``sync=False``: the strategy's own switch (``block_backward_sync``: DDP's
``no_sync``, :class:`~hf_lightning.strategies.fsdp.HFFSDPStrategy`'s FSDP2
``set_requires_gradient_sync(False)``, :class:`~hf_lightning.strategies.deepspeed.HFDeepSpeedStrategy`'s
engine boundary), the context Lightning's automatic loop enters for the same purpose. A module sharded with
FSDP2 under a strategy without that switch (Lightning's own ``ModelParallelStrategy``, whose
``block_backward_sync`` does nothing for FSDP2) gets FSDP2's switch directly. One process, or a strategy
without a switch: nothing to skip.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from lightning.pytorch.strategies import ModelParallelStrategy, ParallelStrategy
from torch import nn


def fsdp_units(module: Any) -> list[nn.Module]:
    """The FSDP2 units in ``module`` (``torch.distributed.fsdp.FSDPModule``s: modules that ``fully_shard``
    was applied to, ``module`` itself included), outermost first; ``[]`` when nothing is sharded."""
    from torch.distributed.fsdp import FSDPModule

    if not isinstance(module, nn.Module):
        return []
    return [sub for sub in module.modules() if isinstance(sub, FSDPModule)]


@contextmanager
def no_gradient_sync(units: list[nn.Module]) -> Iterator[None]:
    """FSDP2's ``no_sync``: the backwards inside keep the gradients of every unit in ``units`` local
    (unsharded, accumulated); the first backward after the context reduce-scatters them."""
    for unit in units:
        unit.set_requires_gradient_sync(False, recurse=False)
    try:
        yield
    finally:
        for unit in units:
            unit.set_requires_gradient_sync(True, recurse=False)


@contextmanager
def gradient_sync(strategy: Any, sync: bool) -> Iterator[None]:
    """Context for one micro-batch's backward: gradients reduced across ranks when ``sync`` (the last
    micro-batch of a window), accumulated locally otherwise."""
    if sync or not isinstance(strategy, ParallelStrategy):
        yield
        return
    # Lightning's own ModelParallelStrategy switch does nothing for FSDP2: FSDP2's, on every unit (the module
    # tree is walked only for that strategy; HFFSDPStrategy's switch holds its units)
    if type(strategy).block_backward_sync is ModelParallelStrategy.block_backward_sync:
        units = fsdp_units(strategy.model)
        if units:
            with no_gradient_sync(units):
                yield
            return
    with strategy.block_backward_sync():
        yield
