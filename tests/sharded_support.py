"""A sharded (FSDP2) run through the CLI, for the checkpoint tests: Lightning's ``ModelParallelStrategy``
with our checkpoint folders, and ``HFLightningModule`` whose ``configure_model`` applies ``fully_shard`` per
decoder block and the root.

The overrides :data:`SHARDED` select them (``trainer.strategy`` and ``module._target_``). ``strategy=fsdp``
builds the same pieces in the library; these tests need only what the checkpoints see: parameters that are
DTensors sharded over the ranks, and a strategy that writes DCP folders.
"""

from __future__ import annotations

from lightning.pytorch.strategies import ModelParallelStrategy

from hf_lightning import HFLightningModule
from hf_lightning.checkpointing import AtomicShardedCheckpoints


class ShardedCheckpointStrategy(AtomicShardedCheckpoints, ModelParallelStrategy):
    """``ModelParallelStrategy`` (pure data parallel, gloo on CPU) with atomic, checksummed folders."""


def sharded_strategy(data_parallel_size: int) -> ShardedCheckpointStrategy:
    return ShardedCheckpointStrategy(
        data_parallel_size=data_parallel_size, tensor_parallel_size=1, process_group_backend="gloo"
    )


class ShardedModule(HFLightningModule):
    """``HFLightningModule`` sharded with ``fully_shard``: one unit per ``_no_split_modules`` block, then the
    root."""

    def configure_model(self) -> None:
        from torch.distributed.fsdp import FSDPModule, fully_shard

        if isinstance(self.model, FSDPModule):
            return
        mesh = self.device_mesh["data_parallel"]
        blocks = set(getattr(self.model, "_no_split_modules", None) or [])
        for module in list(self.model.modules()):
            if type(module).__name__ in blocks:
                fully_shard(module, mesh=mesh)
        fully_shard(self.model, mesh=mesh)


def sharded(ranks: int) -> tuple[str, ...]:
    """The CLI overrides of a sharded run over ``ranks`` CPU processes (the non-finite guard off: its
    gradient norm is not read from DTensors until ``strategy=fsdp`` is FSDP2)."""
    return (
        "~callbacks.nonfinite_guard",
        f"trainer.devices={ranks}",
        "trainer.accelerator=cpu",
        f"trainer.strategy={{_target_:tests.sharded_support.sharded_strategy,data_parallel_size:{ranks}}}",
        "module._target_=tests.sharded_support.ShardedModule",
    )
