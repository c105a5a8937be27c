"""``python -m hf_lightning.migrate ARGS [OVERRIDE ...]``: an HF ``TrainingArguments`` dump as our command
line.

``ARGS`` is either the JSON that ``TrainingArguments.to_json_string()`` writes, or the ``training_args.bin``
that HF ``Trainer`` saves beside its checkpoints. Prints, on stdout, the ``python -m hf_lightning.train``
command that runs the same schedule (see :mod:`hf_lightning.migrate.fields` for each field), then, as ``#``
comment lines, every field away from HF's default that hf_lightning cannot honour, with why. ``OVERRIDE``
words (the model and data, which ``TrainingArguments`` does not hold: ``model.name_or_path=DIR
data.path=FILE``) are appended to the command. ``--experiment NAME`` picks the experiment (default ``clm``).

Loading ``training_args.bin`` safely: it is a pickle. It is read with ``torch.load(weights_only=True)``, whose
unpickler builds only the classes it is given: here ``TrainingArguments`` (and transformers' own subclasses),
its enums, ``AcceleratorConfig``, and the accelerate state it caches (``PartialState``, ``DistributedType``);
their objects are built without running their code (``__new__`` and a ``__dict__`` update). A file naming any
other class is refused: dump the arguments as JSON instead.

Bad input (a missing file, neither JSON nor a ``TrainingArguments`` pickle): one line, exit status 2.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from typing import Any

from hf_lightning.core.errors import ConfigError, HFLightningError

EXPERIMENTS = ("clm", "sft", "seq2seq", "classification")


def _safe_classes() -> list[Any]:
    from accelerate.state import PartialState
    from accelerate.utils.dataclasses import DistributedType
    from transformers import Seq2SeqTrainingArguments, TrainingArguments
    from transformers.trainer_pt_utils import AcceleratorConfig
    from transformers.trainer_utils import HubStrategy, IntervalStrategy, SaveStrategy, SchedulerType
    from transformers.training_args import OptimizerNames

    classes = [TrainingArguments, Seq2SeqTrainingArguments, OptimizerNames, SchedulerType, IntervalStrategy]
    return [*classes, SaveStrategy, HubStrategy, AcceleratorConfig, PartialState, DistributedType]


def load_arguments(path: str) -> dict[str, Any]:
    """The ``TrainingArguments.to_dict()`` of a JSON dump or a ``training_args.bin`` (see the module doc).

    Raises:
        ConfigError: no such file, not JSON or an object of fields, or a pickle holding other classes.
    """
    if not os.path.isfile(path):
        raise ConfigError(f"{path}: no such file (give a TrainingArguments JSON dump or a training_args.bin)")
    with open(path, "rb") as fh:
        head = fh.read(4)
    if head.startswith(b"PK") or head[:1] == b"\x80":  # a torch zip archive, or a plain pickle
        return _load_pickle(path)
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(
            f"{path}: neither JSON nor a training_args.bin ({err}); write one with "
            "open('args.json', 'w').write(args.to_json_string())"
        ) from None
    if not isinstance(data, dict) or "learning_rate" not in data:
        raise ConfigError(
            f"{path}: not a TrainingArguments dump (a JSON object with its fields, e.g. learning_rate)"
        )
    return data


def _load_pickle(path: str) -> dict[str, Any]:
    import pickle

    import torch
    from transformers import TrainingArguments

    from hf_lightning.checkpointing.safe_load import unsafe_globals

    classes = _safe_classes()
    try:
        # scanned first (nothing unpickled): names the first other class as Python spells it
        unsafe = unsafe_globals(path, [f"{c.__module__}.{c.__qualname__}" for c in classes])
        if unsafe:
            raise pickle.UnpicklingError(f"GLOBAL {unsafe[0]}")
        with torch.serialization.safe_globals(classes):
            args = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError) as err:
        import re

        # torch names the class it refused: "Unsupported global: GLOBAL a.b" or "unsupported GLOBAL a.b whose
        # ..."
        found = re.search(r"GLOBAL ([\w.]+)", str(err))
        what = found.group(1) if found else "content that is not a TrainingArguments pickle"
        raise ConfigError(
            f"{path}: holds {what}, which migrate does not unpickle (only TrainingArguments and its enums); "
            "dump the arguments as JSON instead: open('args.json', 'w').write(args.to_json_string())"
        ) from None
    if not isinstance(args, TrainingArguments):
        raise ConfigError(f"{path}: holds a {type(args).__name__}, not TrainingArguments")
    return args.to_dict()


def default_arguments(output_dir: str) -> dict[str, Any]:
    """``TrainingArguments(output_dir).to_dict()`` of the installed transformers: HF's defaults."""
    from transformers import TrainingArguments

    return TrainingArguments(output_dir=output_dir).to_dict()


def command(path: str, experiment: str = "clm", extra: list[str] | None = None) -> str:
    """The text ``python -m hf_lightning.migrate`` prints for the dump at ``path``.

    Raises:
        ConfigError: bad input (see :func:`load_arguments`).
    """
    from hf_lightning.migrate.fields import convert

    args = load_arguments(path)
    overrides, dropped, notes = convert(args, default_arguments(str(args.get("output_dir") or "run")))
    words = [f"+experiment={experiment}", *overrides, *(extra or [])]
    lines = [" \\\n    ".join(["python -m hf_lightning.train " + words[0], *map(shlex.quote, words[1:])])]
    given = " ".join(extra or [])
    if "model.name_or_path=" not in given or "data.path=" not in given:
        lines.append(
            "# add the model and data, which TrainingArguments does not hold: model.name_or_path=DIR "
            "data.path=FILE data.validation_path=FILE (without data.validation_path, "
            "data.validation_split=0.05 holds out 5% of data.path)"
        )
    lines += [f"# {note}" for note in notes]
    if dropped:
        lines.append("# not carried over (away from HF's default, no equivalent here):")
        lines += [f"#   {field}={value!r}: {why}" for field, value, why in dropped]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """The command line; returns the exit status (2 on bad input, with one ``hf_lightning: error:`` line)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    experiment = "clm"
    try:
        if "--experiment" in argv:
            i = argv.index("--experiment")
            if i + 1 >= len(argv) or argv[i + 1] not in EXPERIMENTS:
                raise ConfigError(f"--experiment needs one of {', '.join(EXPERIMENTS)}")
            experiment = argv[i + 1]
            del argv[i : i + 2]
        if not argv or argv[0].startswith("-"):
            raise ConfigError(
                "usage: python -m hf_lightning.migrate ARGS.json|training_args.bin [--experiment NAME] "
                "[OVERRIDE ...]"
            )
        print(command(argv[0], experiment, argv[1:]))
    except HFLightningError as err:
        print(f"hf_lightning: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
