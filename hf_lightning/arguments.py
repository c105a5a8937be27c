"""The argument facts more than one part of the project needs, defined once: the precisions this project
supports, how ``trainer.devices`` counts processes, and the dotted-key lookup in nested settings.

The schema pass (:mod:`hf_lightning.config.schema`), the DeepSpeed config (:mod:`hf_lightning.strategies.deepspeed`)
and the run-folder identity check (:mod:`hf_lightning.run_folder`) all read these; none keeps its own copy.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

# the precisions this project supports (Lightning accepts a few more that no path here is tested with)
PRECISIONS = ("32", "32-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true", "64-true")
ACCELERATORS = ("cpu", "gpu", "cuda", "mps", "tpu", "auto")

# a key that is not in a mapping (``None`` is a value)
MISSING = object()


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def device_count(devices: Any) -> int | None:
    """Processes per node for ``trainer.devices``: an integer >= 1, ``"N"``, ``"0,1"`` (indices), a list of
    indices; ``None`` for ``"auto"`` / ``-1`` (only known once Lightning has looked at the machine).

    Raises:
        ValueError: anything else (``0``, ``"0"``, ``[]``, ``-2``, ``True``, ``"a,b"``).
    """
    if devices in ("auto", -1, "-1") and not isinstance(devices, bool):
        return None
    if _int(devices) and devices >= 1:
        return devices
    if isinstance(devices, str):
        text = devices.strip()
        if "," in text:  # "0,1": device indices
            parts = [p.strip() for p in text.split(",") if p.strip()]
            if parts and all(p.isdigit() for p in parts):
                return len(parts)
        elif text.isdigit() and int(text) >= 1:
            return int(text)
    elif isinstance(devices, Sequence) and devices and all(_int(v) and v >= 0 for v in devices):
        return len(devices)
    raise ValueError(f"not a device count: {devices!r}")


def devices_ok(devices: Any) -> bool:
    """Whether ``trainer.devices`` is a value :func:`device_count` accepts."""
    try:
        device_count(devices)
    except ValueError:
        return False
    return True


def world_size(devices: Any, num_nodes: int = 1) -> int | None:
    """Processes in the job for ``trainer.devices`` x ``trainer.num_nodes``; ``None`` when ``devices`` is
    ``"auto"`` / ``-1``.

    Raises:
        ValueError: ``devices`` is not a device count (see :func:`device_count`).
    """
    count = device_count(devices)
    return None if count is None else count * int(num_nodes)


def get_dotted(mapping: Mapping[str, Any], dotted: str) -> Any:
    """``mapping["a"]["b"]`` for ``"a.b"``; :data:`MISSING` when a part is absent or not a mapping."""
    node: Any = mapping
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return MISSING
        node = node[part]
    return node


def set_dotted(mapping: dict[str, Any], dotted: str, value: Any) -> None:
    """``mapping["a"]["b"] = value`` for ``"a.b"``, creating the parent dicts that are missing."""
    *parents, last = dotted.split(".")
    node = mapping
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value


def flatten(value: Any, prefix: str, leaf: Callable[[Any], Any] = lambda v: v) -> dict[str, Any]:
    """``{"prefix.a.b": leaf(v)}`` for every leaf of nested dicts (a list is one leaf, its items mapped)."""
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(flatten(v, f"{prefix}.{k}", leaf))
        return out
    if isinstance(value, list):
        return {prefix: [leaf(v) for v in value]}
    return {prefix: leaf(value)}
