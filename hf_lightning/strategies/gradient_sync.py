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


def fsdp_root(module: Any) -> nn.Module | None:
    """``module`` or its outermost FSDP2 submodule (``torch.distributed.fsdp.FSDPModule``), or ``None`` when
    nothing in it is sharded with ``fully_shard``."""
    from torch.distributed.fsdp import FSDPModule

    if not isinstance(module, nn.Module):
        return None
    for sub in module.modules():  # pre-order: the outermost first
        if isinstance(sub, FSDPModule):
            return sub
    return None


@contextmanager
def no_gradient_sync(root: nn.Module) -> Iterator[None]:
    """FSDP2's ``no_sync``: the backwards inside keep their gradients local (unsharded, accumulated) for
    every FSDP unit under ``root``; the first backward after the context reduce-scatters them."""
    root.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        root.set_requires_gradient_sync(True)


@contextmanager
def gradient_sync(strategy: Any, sync: bool) -> Iterator[None]:
    """Context for one micro-batch's backward: gradients reduced across ranks when ``sync`` (the last
    micro-batch of a window), accumulated locally otherwise."""
    if sync or not isinstance(strategy, ParallelStrategy):
        yield
        return
    root = fsdp_root(strategy.model) if isinstance(strategy, ModelParallelStrategy) else None
    if root is not None and type(strategy).block_backward_sync is ModelParallelStrategy.block_backward_sync:
        with no_gradient_sync(root):
            yield
        return
    with strategy.block_backward_sync():
        yield
