"""The argument facts more than one part of the project needs, defined once: the precisions this project
supports, how ``trainer.devices`` counts processes, the dotted-key lookup in nested settings, and the value
rules (:class:`Allowed`) that constructor signatures carry in their annotations for the schema to read.

The schema pass (:mod:`hf_lightning.config.schema`), the DeepSpeed config
(:mod:`hf_lightning.strategies.deepspeed`) and the run-folder identity check (:mod:`hf_lightning.run.folder`)
all read these; none keeps its own copy.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# the precisions this project supports (Lightning accepts a few more that no path here is tested with)
PRECISIONS = ("32", "32-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true", "64-true")
ACCELERATORS = ("cpu", "gpu", "cuda", "mps", "tpu", "auto")

# a key that is not in a mapping (``None`` is a value)
MISSING = object()


def counted(n: float, noun: str) -> str:
    """``1 optimizer step``, ``2 optimizer steps``: a count and its noun, singular for one (the noun's plural
    adds an ``s``)."""
    return f"{n:g} {noun}" if n == 1 else f"{n:g} {noun}s"


def shown(value: Any) -> str:
    """A config value as a message to the user shows it: ``null``, ``true`` and ``false`` as Hydra and YAML
    spell them (never Python's ``None`` / ``True``), anything else as ``repr`` does (``'adamx'``, ``0.5``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


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


# ------------------------------------------------------------------------------------ value constraints
@dataclass(frozen=True)
class Allowed:
    """A value rule written in an argument's annotation (``lr: Annotated[float, FINITE_NON_NEGATIVE]``): the
    schema pass (:mod:`hf_lightning.config.schema`) reads it from the signature, so the rule sits beside the
    argument it is about and a config is refused before anything is built (``optim.lr=inf: allowed values: a
    finite number >= 0``)."""

    check: Callable[[Any], bool]
    text: str

    def __call__(self, value: Any) -> bool:
        try:
            return bool(self.check(value))
        except TypeError:  # a list or mapping where a name is expected (unhashable, not comparable)
            return False


def _num(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def one_of(names: Sequence[Any]) -> Allowed:
    """A value from ``names`` (the message lists them)."""
    return Allowed(lambda v: v in names, ", ".join(str(n) for n in names))


POSITIVE_INT = Allowed(lambda v: _int(v) and v >= 1, "an integer >= 1")
NON_NEGATIVE_INT = Allowed(lambda v: _int(v) and v >= 0, "an integer >= 0")
OPTIONAL_POSITIVE_INT = Allowed(lambda v: v is None or (_int(v) and v >= 1), "null or an integer >= 1")
FINITE_NON_NEGATIVE = Allowed(lambda v: _num(v) and math.isfinite(v) and v >= 0, "a finite number >= 0")
NON_NEGATIVE = Allowed(lambda v: _num(v) and v >= 0, "a number >= 0")
POSITIVE = Allowed(lambda v: _num(v) and v > 0, "a number > 0")
UNIT_INTERVAL = Allowed(lambda v: _num(v) and 0 <= v <= 1, "a number in [0, 1]")
BETAS = Allowed(
    lambda v: isinstance(v, Sequence) and len(v) == 2 and all(_num(b) and 0 <= b < 1 for b in v),
    "two numbers in [0, 1)",
)


def constraints(annotation: Any) -> list[Allowed]:
    """The :class:`Allowed` rules of an ``Annotated[...]`` annotation (none for a plain one)."""
    return [m for m in getattr(annotation, "__metadata__", ()) if isinstance(m, Allowed)]
