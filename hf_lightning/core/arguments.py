"""The argument facts more than one part of the project needs, defined once: the precisions this project
supports, how ``trainer.devices`` counts processes, the dotted-key lookup in nested settings, and the value
rules (:class:`Allowed`) that constructor signatures carry in their annotations, read by the schema pass for a
config and by the constructors themselves for a Python call (:func:`argument_errors`, :func:`check_call`):
one rule, one message, whichever way the value came.

The schema pass (:mod:`hf_lightning.config.schema`), the DeepSpeed config
(:mod:`hf_lightning.strategies.deepspeed`) and the run-folder identity check (:mod:`hf_lightning.run.folder`)
all read these; none keeps its own copy.
"""

from __future__ import annotations

import inspect
import math
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# the precisions this project supports (Lightning accepts a few more that no path here is tested with)
PRECISIONS = ("32", "32-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true", "64-true")
# the float16 ones run on a GPU only: on the CPU Lightning would swap 16-mixed for bf16-mixed with a warning
# and run 16-true's float16 weights without a loss scaler
GPU_ONLY_PRECISIONS = ("16-mixed", "16-true")
ACCELERATORS = ("cpu", "gpu", "cuda", "mps", "tpu", "auto")

# a key that is not in a mapping (``None`` is a value)
MISSING = object()


def gpu_only_precision_error(precision: Any, accelerator: Any, cuda_available: bool) -> str | None:
    """The one-line refusal of a float16 ``trainer.precision`` (:data:`GPU_ONLY_PRECISIONS`) on the CPU:
    ``trainer.accelerator=cpu``, or ``auto`` on a machine without a GPU; ``None`` otherwise."""
    if str(precision) not in GPU_ONLY_PRECISIONS:
        return None
    if accelerator == "cpu":
        where = "trainer.accelerator=cpu"
    elif accelerator in (None, "auto") and not cuda_available:
        where = "trainer.accelerator=auto, the CPU on this machine (no GPU found)"
    else:
        return None
    return (
        f"trainer.precision={precision} on {where}: float16 runs on a GPU only; on the CPU use "
        "trainer.precision=bf16-mixed (bfloat16 autocast, float32 weights; or 32-true, bf16-true), or "
        "trainer=gpu on a machine with a GPU"
    )


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
OPTIONAL_NON_NEGATIVE = Allowed(lambda v: v is None or (_num(v) and v >= 0), "null or a number >= 0")
OPTIONAL_POSITIVE = Allowed(lambda v: v is None or (_num(v) and v > 0), "null or a number > 0")
FRACTION = Allowed(lambda v: _num(v) and 0 <= v < 1, "a number in [0, 1)")
NAMES = Allowed(
    lambda v: v is None or (isinstance(v, (list, tuple)) and all(isinstance(x, str) for x in v)),
    "null or a list of names",
)
RENAMES = Allowed(
    lambda v: (
        v is None
        or (isinstance(v, Mapping) and all(isinstance(k, str) and isinstance(x, str) for k, x in v.items()))
    ),
    "null or a mapping {source column: new name}",
)
UNIT_INTERVAL = Allowed(lambda v: _num(v) and 0 <= v <= 1, "a number in [0, 1]")
BETAS = Allowed(
    lambda v: isinstance(v, Sequence) and len(v) == 2 and all(_num(b) and 0 <= b < 1 for b in v),
    "two numbers in [0, 1)",
)


def constraints(annotation: Any) -> list[Allowed]:
    """The :class:`Allowed` rules of an ``Annotated[...]`` annotation (none for a plain one)."""
    return [m for m in getattr(annotation, "__metadata__", ()) if isinstance(m, Allowed)]


TYPE_WORDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def _describe(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(hint))
    if origin is typing.Literal:
        return ", ".join(repr(a) for a in typing.get_args(hint))
    if hint is type(None):
        return "null"
    return TYPE_WORDS.get(hint) or getattr(hint, "__name__", str(hint))


def type_ok(value: Any, hint: Any) -> bool | None:
    """Whether ``value`` fits the annotation ``hint`` (``bool`` is not an ``int`` here, an ``int`` is a
    ``float``); ``None`` when the annotation is not one judged here (a class, a mapping, ``Any``)."""
    if hint is Any:
        return None
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        results = [type_ok(value, a) for a in typing.get_args(hint)]
        if any(r is True for r in results):
            return True
        return None if any(r is None for r in results) else False
    if origin is typing.Literal:
        return value in typing.get_args(hint)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return _int(value)
    if hint is float:
        return _num(value)
    if hint is str:
        return isinstance(value, str)
    return None


def argument_errors(
    target: Callable, values: Mapping[str, Any], group: str, skip: Iterable[str] = ()
) -> list[str]:
    """``{group}.{name}={value}: allowed values: {rule}`` for each value in ``values`` that breaks the
    annotation of ``target``'s argument ``name``: its :class:`Allowed` rules first (their text is the clearer
    one), then its type (:func:`type_ok`). Names ``target`` does not take, names in ``skip``, arguments
    without an annotation judged here, and unresolved interpolations (``${...}``) are not checked.

    Args:
        target: a function or ``__init__`` whose annotations (``Annotated[T, Allowed(...)]``) state the rules.
        values: argument name -> value (a config node, or a constructor's ``locals()``).
        group: the config group the message names (``data`` gives ``data.max_length``).
    """
    try:
        hints = typing.get_type_hints(target, include_extras=True)
    except Exception:  # an annotation that does not evaluate here: nothing is judged
        return []
    params = inspect.signature(target).parameters
    skipped = set(skip)
    errors = []
    for name, value in values.items():
        if name not in params or name not in hints or name in skipped:
            continue
        if isinstance(value, str) and value.startswith("${"):
            continue
        rules = constraints(hints[name])
        broken = [rule for rule in rules if not rule(value)]
        hint = hints[name].__origin__ if rules else hints[name]  # Annotated[T, ...] -> T
        if broken:
            errors.append(f"{group}.{name}={shown(value)}: allowed values: {broken[0].text}")
        elif type_ok(value, hint) is False:
            errors.append(f"{group}.{name}={shown(value)}: allowed values: {_describe(hint)}")
    return errors


def check_call(target: Callable, values: Mapping[str, Any], group: str) -> None:
    """Refuse a Python call whose arguments break ``target``'s annotations, in the words the schema pass
    uses for a config (:func:`argument_errors`): a constructor calls it on its ``locals()``.

    Raises:
        ConfigError: every broken argument, joined by ``; ``.
    """
    from hf_lightning.core.errors import ConfigError

    errors = argument_errors(target, values, group)
    if errors:
        raise ConfigError("; ".join(errors))
