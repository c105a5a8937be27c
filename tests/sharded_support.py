"""The CLI overrides of a sharded (FSDP2) run on CPU ranks, for the checkpoint tests: ``strategy=fsdp``
(:class:`~hf_lightning.strategies.fsdp.HFFSDPStrategy`, whose checkpoints are atomic, checksummed DCP
folders)."""

from __future__ import annotations


def sharded(ranks: int) -> tuple[str, ...]:
    """``strategy=fsdp`` over ``ranks`` gloo CPU processes."""
    return ("strategy=fsdp", f"trainer.devices={ranks}", "trainer.accelerator=cpu")
