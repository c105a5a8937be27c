"""Atomic checkpoint writes: a process killed during a save leaves the previous file loadable."""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from hf_lightning.errors import TrainingError


def _free_space(folder: str) -> str:
    while folder and not os.path.isdir(folder):
        folder = os.path.dirname(folder)
    try:
        free = shutil.disk_usage(folder or ".").free
    except OSError:
        return "unknown"
    return f"{free / 2**20:.1f} MiB"


def save_failure_message(path: str, err: OSError) -> str:
    """``could not write checkpoint PATH: REASON (ERRNO); ...`` with the free space and what was kept."""
    reason = err.strerror or str(err)
    code = errno.errorcode.get(err.errno, "") if err.errno is not None else ""
    previous = "the previous version of that file is intact" if os.path.isfile(path) else "nothing was overwritten"
    hint = {
        errno.ENOSPC: "free space on that disk or write checkpoints elsewhere (hydra.run.dir=...), and lower "
        "callbacks.model_checkpoint.save_top_k",
        errno.EDQUOT: "the disk quota is exhausted: free space or write checkpoints elsewhere (hydra.run.dir=...)",
        errno.EACCES: "the folder is not writable by this user: fix its permissions or choose another hydra.run.dir",
        errno.EROFS: "the filesystem is read-only: choose another hydra.run.dir",
    }.get(err.errno, "check the folder and the disk")
    return (
        f"could not write checkpoint {path}: {reason}{f' ({code})' if code else ''}; {previous} and every other "
        f"checkpoint already written is kept; free space there: {_free_space(os.path.dirname(path))}. {hint}"
    )


class AtomicCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` that writes to a temporary file in the same folder, ``fsync``s it, then renames.

    ``os.replace`` is atomic on POSIX within one filesystem, so a reader (or a resumed run) sees either the
    old complete file or the new complete file, never a truncated one. The folder is fsynced too so the
    rename itself survives a power loss.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        """Write ``checkpoint`` to ``path`` atomically.

        Raises:
            TrainingError: the folder cannot be created or written, or the disk is full (an ``OSError``); the
                message names the file, the reason and the free space, and says the previous file is intact.
        """
        path = os.fspath(path)
        folder = os.path.dirname(path) or "."
        try:
            os.makedirs(folder, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".tmp-" + os.path.basename(path) + ".", dir=folder)
        except OSError as err:
            raise TrainingError(save_failure_message(path, err)) from err
        try:
            with os.fdopen(fd, "wb") as fh:
                torch.save(checkpoint, fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException as err:
            if os.path.exists(tmp):
                os.unlink(tmp)
            if isinstance(err, OSError):
                raise TrainingError(save_failure_message(path, err)) from err
            raise
        dir_fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
