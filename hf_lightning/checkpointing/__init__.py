"""Checkpoints that survive a kill: atomic writes, validated loads, exact resume state."""

from hf_lightning.checkpointing.io import AtomicCheckpointIO
from hf_lightning.checkpointing.resume import find_resume_checkpoint
from hf_lightning.checkpointing.sharded import AtomicShardedCheckpoints

__all__ = ["AtomicCheckpointIO", "AtomicShardedCheckpoints", "find_resume_checkpoint"]
