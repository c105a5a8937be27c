"""Faults of the machine during ``fit``, turned into one message that says what to change.

Out of memory: the fix is almost always the same trade. Halving the micro-batch and doubling the gradient
accumulation keeps the examples per optimizer step, and because the loss of a step is normalised by the
target count of the whole accumulation window (HF's ``num_items_in_batch``), it keeps the loss and the
gradients too. The message computes that pair for the run at hand, then lists the other levers.
"""

from __future__ import annotations

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


@contextmanager
def explain_faults(trainer: Any, datamodule: Any = None) -> Iterator[None]:
    """Wrap ``trainer.fit(...)``: an out-of-memory error leaves as a :class:`TrainingError` with
    :func:`out_of_memory_message` (the original is chained as its cause)."""
    try:
        yield
    except RuntimeError as err:
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
