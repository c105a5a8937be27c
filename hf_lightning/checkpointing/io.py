"""Checkpoint files that a kill cannot half-write and bit rot cannot pass off as intact.

Each checkpoint ``X.ckpt`` is written to a temporary file in its folder, fsync'd and renamed into place
(:mod:`hf_lightning.checkpointing.files`), and comes with ``X.ckpt.sha256``: the SHA-256 of its bytes,
computed while they were written, in ``sha256sum`` format (``sha256sum -c X.ckpt.sha256`` checks it by hand).
Every load through :class:`AtomicCheckpointIO` and every resume check
(:mod:`hf_lightning.checkpointing.resume`) verifies it.

Between the checkpoint's rename and the sidecar's rewrite the sidecar lists the old and the new hash, so a
kill there leaves a pair that still verifies; a file that matches neither was changed after it was written.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import tempfile
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from hf_lightning.checkpointing.files import (
    TMP_PREFIX,
    RecordingWriter,
    atomic_file,
    disk_error,
    fsync_folder,
    write_failure_message,
)
from hf_lightning.core.errors import ConfigError, TrainingError

CHECKSUM_SUFFIX = ".sha256"
_VERIFIED: dict[tuple[str, int, int], bool] = {}  # (path, size, mtime_ns) -> matched: each file hashed once


def save_failure_message(path: str, err: OSError) -> str:
    """``could not write checkpoint PATH: REASON (ERRNO); ...`` with the free space and what was kept."""
    previous = (
        "the previous version of that file is intact" if os.path.isfile(path) else "nothing was overwritten"
    )
    message = write_failure_message(
        "checkpoint", path, err, f"{previous} and every other checkpoint already written is kept"
    )
    if err.errno == errno.ENOSPC:
        message += ", and lower callbacks.model_checkpoint.save_top_k"
    return message


def checksum_path(path: str) -> str:
    return os.fspath(path) + CHECKSUM_SUFFIX


def _recorded_hashes(path: str) -> list[str] | None:
    """The hashes ``X.ckpt.sha256`` lists for ``X.ckpt`` (``None``: no sidecar)."""
    try:
        with open(checksum_path(path)) as fh:
            lines = fh.read().splitlines()
    except FileNotFoundError:
        return None
    name = os.path.basename(path)
    return [
        line.split()[0].lower()
        for line in lines
        if len(line.split()) == 2 and line.split()[1].lstrip("*") == name
    ]


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def checksum_problem(path: str) -> str | None:
    """Why ``path`` fails its checksum (``'is damaged: ...'``), or ``None`` when it matches or has no sidecar
    (a checkpoint written elsewhere: nothing to check it against)."""
    recorded = _recorded_hashes(path)
    if recorded is None:
        return None
    stat = os.stat(path)
    key = (os.path.abspath(path), stat.st_size, stat.st_mtime_ns)
    if key not in _VERIFIED:
        _VERIFIED[key] = file_sha256(path) in recorded
    if _VERIFIED[key]:
        return None
    return (
        "is damaged: its SHA-256 does not match the one written with it "
        f"({os.path.basename(checksum_path(path))}), so its bytes changed after it was saved (a failing disk "
        "or an incomplete copy)"
    )


def _write_checksums(path: str, hashes: list[str]) -> None:
    name = os.path.basename(path)
    with atomic_file(checksum_path(path)) as fh:
        fh.write("".join(f"{h}  {name}\n" for h in hashes))


def _storage_as_saved(storage: Any, location: str) -> Any:
    """``map_location`` that keeps each storage where it was saved (Lightning's default for a load)."""
    return storage


class AtomicCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` that writes atomically with a checksum and verifies the checksum on load.

    ``save_checkpoint``: a temporary file in the same folder, ``fsync``, ``os.replace`` (a reader or a resumed
    run sees the old complete file or the new one, never a truncated one), the folder fsync'd so the rename
    survives a power loss, and ``X.ckpt.sha256`` beside it. ``remove_checkpoint`` removes both.
    """

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> None:
        """Write ``checkpoint`` to ``path`` atomically, with its ``.sha256`` sidecar.

        Raises:
            TrainingError: the folder cannot be created or written, or the disk is full (an ``OSError``, or
                torch's ``RuntimeError`` over one); the message names the file, the reason and the free space,
                and says the previous file is intact.
        """
        path = os.fspath(path)
        folder = os.path.dirname(path) or "."
        try:
            os.makedirs(folder, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX + os.path.basename(path) + ".", dir=folder)
        except OSError as err:
            raise TrainingError(save_failure_message(path, err)) from err
        writer = None
        try:
            with os.fdopen(fd, "wb") as fh:
                writer = RecordingWriter(fh)
                torch.save(checkpoint, writer)
                fh.flush()
                os.fsync(fh.fileno())
            new = writer.sha256.hexdigest()
            old = _recorded_hashes(path) if os.path.isfile(path) else None
            _write_checksums(path, [*(old or []), new])  # both, until the rename below is done
            os.replace(tmp, path)
            fsync_folder(folder)
            _write_checksums(path, [new])
        except BaseException as err:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            cause = disk_error(err, writer)
            if cause is not None:
                raise TrainingError(save_failure_message(path, cause)) from err
            raise

    def load_checkpoint(
        self, path: Any, map_location: Any | None = None, weights_only: bool | None = None
    ) -> dict:
        """Lightning's load (``trainer.fit/validate/test(ckpt_path=...)``), after the checksum check, through
        :func:`~hf_lightning.checkpointing.safe_load.load_checkpoint_file`: ``weights_only=True`` with the
        allow-list of our checkpoints' types, whatever ``weights_only`` Lightning passes (a checkpoint that
        needs more than the weights-only unpickler allows is refused naming the type; nothing of it is
        unpickled).

        Raises:
            ConfigError: the file does not match its ``.sha256`` (damaged).
            UnsafeCheckpointError: the file names a pickled type outside the allow-list.
            FileNotFoundError: no such file (as Lightning's).
        """
        from lightning.fabric.utilities.cloud_io import get_filesystem

        from hf_lightning.checkpointing.safe_load import load_checkpoint_file

        local = os.fspath(path)
        problem = checksum_problem(local) if os.path.isfile(local) else None
        if problem:
            raise ConfigError(f"{local} {problem}")
        if map_location is None:
            map_location = _storage_as_saved
        if os.path.isfile(local):
            return load_checkpoint_file(local, map_location=map_location)
        fs = get_filesystem(path)  # a remote checkpoint (fsspec), as Lightning reads one
        if not fs.exists(path):
            raise FileNotFoundError(f"Checkpoint file not found: {path}")
        with fs.open(path, "rb") as fh:
            return load_checkpoint_file(fh, map_location=map_location)

    def remove_checkpoint(self, path: Any) -> None:
        super().remove_checkpoint(path)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(checksum_path(os.fspath(path)))
