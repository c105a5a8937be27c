"""Where the embedded default keeps what it builds once (data files, tokenizer)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def cache_root() -> Path:
    """``$HF_LIGHTNING_CACHE`` if set, else ``~/.cache/hf_lightning``."""
    root = os.environ.get("HF_LIGHTNING_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "hf_lightning"
    )
    return Path(root)


def build_once(target: Path, build: Callable[[Path], None]) -> Path:
    """Build ``target`` (a folder) with ``build(tmp_dir)`` unless it exists; atomic across processes.

    Several processes (DDP ranks) may race: each builds into its own temporary folder and renames it into
    place; the loser discards its copy. A half-built folder is never visible under ``target``.
    """
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        build(tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            if not target.is_dir():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target
