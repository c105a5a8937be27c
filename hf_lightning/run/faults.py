"""Faults of the machine during ``fit``, turned into one message that says what to change.

A rank that stops (killed, out of host memory, its machine gone) closes its connections: every other rank's
next collective fails in the communication backend (gloo: ``Connection reset by peer``, ``Connection closed by
peer``). The survivors stop too; their message says which rank stopped, that the run folder is intact
(checkpoints are written whole or not at all) and the command that resumes the run.

Out of memory: the fix is almost always the same trade. Halving the micro-batch and doubling the gradient
accumulation keeps the examples per optimizer step, and because the loss of a step is normalised by the
target count of the whole accumulation window (HF's ``num_items_in_batch``), it keeps the loss and the
gradients too. The message computes that pair for the run at hand, then lists the other levers.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from hf_lightning.core.errors import TrainingError

_TRIED_GPU = re.compile(r"Tried to allocate ([\d.]+ [KMGT]?i?B)")
_TRIED_CPU = re.compile(r"you tried to allocate (\d+) bytes")


def is_out_of_memory(err: BaseException) -> bool:
    """``torch.OutOfMemoryError`` (CUDA/XPU/MPS) or the CPU allocator's ``can't allocate memory``."""
    if isinstance(err, torch.OutOfMemoryError):
        return True
    text = str(err)
    return isinstance(err, RuntimeError) and (
        "out of memory" in text.lower() or "can't allocate memory" in text
    )


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def out_of_memory_message(
    err: BaseException,
    per_device_batch_size: int | None,
    accumulate_grad_batches: int = 1,
    max_length: int | None = None,
    stage: str = "training",
    device: str | None = None,
    memory: dict[str, float] | None = None,
) -> str:
    """One paragraph: where memory ran out, how much was asked, and what to change, first the exact trade.

    Args:
        err: the allocator's exception (its message gives the size that failed).
        per_device_batch_size: the micro-batch of the failing stage (``data.per_device_train_batch_size`` in
            training, ``data.per_device_eval_batch_size`` in validation).
        accumulate_grad_batches / max_length: the current settings.
        stage: ``training``, ``validation`` or ``sanity check``.
        device: ``cuda:0``, ``cpu``, ... (``None``: not named).
        memory: optional ``{"allocated": bytes, "reserved": bytes, "total": bytes}`` of the device.
    """
    text = str(err)
    tried = _TRIED_GPU.search(text)
    asked = tried.group(1) if tried else None
    if asked is None and (cpu := _TRIED_CPU.search(text)):
        asked = _gib(int(cpu.group(1)))
    head = f"out of memory{f' on {device}' if device else ''} during {stage}"
    if asked:
        head += f" (an allocation of {asked} failed"
        if memory:
            head += (
                f"; {_gib(memory['allocated'])} allocated, {_gib(memory['reserved'])} reserved of "
                f"{_gib(memory['total'])}"
            )
        head += ")"
    fixes = []
    key = "data.per_device_train_batch_size" if stage == "training" else "data.per_device_eval_batch_size"
    b = per_device_batch_size
    if stage == "training" and b and b > 1:
        half, double = b // 2, accumulate_grad_batches * 2
        fixes.append(
            f"set {key}={half} and data.gradient_accumulation_steps={double}: "
            f"{half * double} examples per optimizer step per device"
            + (
                " as now"
                if half * double == b * accumulate_grad_batches
                else f" (now {b * accumulate_grad_batches})"
            )
            + ", and the same loss and gradients, because the loss is normalised over the whole accumulation "
            "window"
        )
    elif b and b > 1:
        fixes.append(f"lower {key} (now {b}); evaluation results do not depend on it")
    if max_length:
        fixes.append(
            f"lower data.max_length (now {max_length}) or set data.padding_free=true (no padding tokens)"
        )
    fixes.append("use trainer.precision=bf16-mixed")
    fixes.append(
        "enable gradient checkpointing on the model" if stage == "training" else "evaluate less often"
    )
    fixes.append("or shard the model across devices (strategy=fsdp)")
    return head + ". To fit: " + "; ".join(fixes)


def _device_memory(device: torch.device) -> dict[str, float] | None:
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    free, total = torch.cuda.mem_get_info(device)
    return {
        "allocated": torch.cuda.memory_allocated(device),
        "reserved": torch.cuda.memory_reserved(device),
        "total": total,
    }


#: what the communication backends say when the other end of a connection went away
PEER_LOST = (
    "Connection reset by peer",
    "Connection closed by peer",
    "Broken pipe",
    "NCCL communicator was aborted",
)


def is_peer_lost(err: BaseException) -> bool:
    """A collective that failed because another rank's process went away (``RuntimeError``, torch's
    ``DistBackendError`` included)."""
    return isinstance(err, RuntimeError) and any(text in str(err) for text in PEER_LOST)


def resume_command(run_dir: str) -> str:
    """The command that resumes the run in ``run_dir``: this segment's overrides (``.hydra/overrides.yaml``)
    plus ``ckpt_path=last hydra.run.dir=RUN``; a description of it when the file cannot be read."""
    import shlex

    from omegaconf import OmegaConf

    tail = f"ckpt_path=last hydra.run.dir={shlex.quote(run_dir)}"
    try:
        overrides = [str(o) for o in OmegaConf.load(os.path.join(run_dir, ".hydra", "overrides.yaml"))]
    except Exception:  # no Hydra (a train() call), or the file is gone
        return f"the run's own command with {tail}"
    kept = [o for o in overrides if not o.lstrip("+~").startswith(("ckpt_path=", "hydra."))]
    return f"python -m hf_lightning.train {shlex.join(kept)} {tail}".replace("  ", " ")


def peer_lost_message(err: BaseException, rank: int, world_size: int, step: int, run_dir: str | None) -> str:
    """One line for a rank whose peer went away during ``fit``: which rank stopped (the other one of two
    ranks, else "another rank"), that the run folder is intact, and the command that resumes it."""
    other = f"rank {1 - rank}" if world_size == 2 else "another rank"
    reason = next((text for text in PEER_LOST if text in str(err)), type(err).__name__)
    where = f"the run folder {run_dir}" if run_dir else "the run folder"
    resume = resume_command(run_dir) if run_dir else "the run's own command with ckpt_path=last"
    return (
        f"{other} stopped during training at optimizer step {step} (rank {rank} lost its connection: "
        f"{reason}), so rank {rank} stopped too; {where} is intact (a checkpoint is written whole or not at "
        f"all, so the newest one is complete). See {other}'s log for why it stopped, then resume with: "
        f"{resume}"
    )


@contextmanager
def explain_faults(trainer: Any, datamodule: Any = None, run_dir: str | None = None) -> Iterator[None]:
    """Wrap ``trainer.fit(...)``: an out-of-memory error leaves as a :class:`TrainingError` with
    :func:`out_of_memory_message`, a lost peer rank (:func:`is_peer_lost`) as one with
    :func:`peer_lost_message` (the original is chained as the cause)."""
    try:
        yield
    except RuntimeError as err:
        world_size = int(getattr(trainer, "world_size", 1) or 1)
        if world_size > 1 and is_peer_lost(err):
            raise TrainingError(
                peer_lost_message(
                    err, int(trainer.global_rank), world_size, int(trainer.global_step), run_dir
                )
            ) from err
        if not is_out_of_memory(err):
            raise
        running = getattr(getattr(trainer, "state", None), "stage", None)
        stage = str(getattr(running, "value", running) or "train")
        stage = {"train": "training", "validate": "validation", "sanity_check": "sanity check"}.get(
            stage, stage
        )
        training = stage == "training"
        device = getattr(getattr(trainer, "strategy", None), "root_device", None)
        raise TrainingError(
            out_of_memory_message(
                err,
                getattr(
                    datamodule,
                    "per_device_train_batch_size" if training else "per_device_eval_batch_size",
                    None,
                ),
                int(getattr(datamodule, "gradient_accumulation_steps", 1) or 1),
                getattr(datamodule, "max_length", None),
                stage=stage,
                device=str(device) if device is not None else None,
                memory=_device_memory(device) if device is not None else None,
            )
        ) from err
