"""``python -m hf_lightning.migrate``: an HF ``TrainingArguments`` dump as our command line (the command in
:mod:`hf_lightning.migrate.__main__`, the field table in :mod:`hf_lightning.migrate.fields`).

A tool beside the library: nothing in ``hf_lightning`` imports it.
"""

from __future__ import annotations

import importlib
from typing import Any

#: the names of ``__main__`` importable from here, loaded on first use: importing ``__main__`` at package
#: import would make ``python -m hf_lightning.migrate`` find it already imported (runpy warns, runs it twice)
_FROM_MAIN = ("EXPERIMENTS", "command", "default_arguments", "load_arguments", "main")
__all__ = list(_FROM_MAIN)


def __getattr__(name: str) -> Any:
    if name in _FROM_MAIN:
        return getattr(importlib.import_module("hf_lightning.migrate.__main__"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
