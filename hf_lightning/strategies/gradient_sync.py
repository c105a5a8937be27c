"""Whether a backward inside an accumulation window reduces gradients across ranks.

``HFLightningModule.training_step`` runs every micro-batch's backward but the window's last one inside
:func:`gradient_sync` with ``sync=False``: the strategy's own switch (``block_backward_sync``: DDP's and
FSDP's ``no_sync``, :class:`~hf_lightning.strategies.deepspeed.HFDeepSpeedStrategy`'s engine boundary), the
context Lightning's automatic loop enters for the same purpose. One process, or a strategy without a switch:
nothing to skip.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from lightning.pytorch.strategies import ParallelStrategy


@contextmanager
def gradient_sync(strategy: Any, sync: bool) -> Iterator[None]:
    """Context for one micro-batch's backward: gradients reduced across ranks when ``sync`` (the last
    micro-batch of a window), accumulated locally otherwise."""
    if not sync and isinstance(strategy, ParallelStrategy):
        with strategy.block_backward_sync():
            yield
    else:
        yield
