"""Writes into a run folder that a kill, a full disk or a read-only remount cannot half-do.

Every file the run writes (checkpoints, ``hf_model/``, ``final_metrics.json``, a rewrite of ``metrics.csv``)
is written under a temporary name beginning with :data:`TMP_PREFIX` in the same folder, flushed, ``fsync``'d
and renamed over its final name (``os.replace``, atomic on POSIX within one filesystem), so a reader sees the
old version or the new one, never a mix. A folder (``hf_model/``) is written whole under a temporary name and
renamed into place. A process killed half-way leaves only a temporary entry, which the next start in that
folder removes (:func:`remove_leftovers`); the folder's owner lock (:mod:`hf_lightning.run.lock`) guarantees
no other live process is writing it.

A write that fails on the disk (full, quota, read-only, permissions) becomes one
:class:`~hf_lightning.core.errors.TrainingError` naming the path, the reason and the free space
(:func:`write_failure_message`). torch's zip writer reports such a failure as a ``RuntimeError`` ("unexpected
pos"): :class:`RecordingWriter` keeps the ``OSError`` underneath it.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

TMP_PREFIX = ".tmp-"


def free_space(folder: str) -> str:
    """Free space of the filesystem holding ``folder`` (or its nearest existing parent), e.g. ``'12.5
    MiB'``."""
    while folder and not os.path.isdir(folder):
        folder = os.path.dirname(folder)
    try:
        free = shutil.disk_usage(folder or ".").free
    except OSError:
        return "unknown"
    return f"{free / 2**20:.1f} MiB"


def write_failure_message(what: str, path: str, err: OSError, kept: str, then: str = "") -> str:
    """``could not write WHAT PATH: REASON (ERRNO); KEPT; free space there: N MiB. FIX[; THEN]`` on one
    line."""
    reason = err.strerror or str(err)
    code = errno.errorcode.get(err.errno, "") if err.errno is not None else ""
    hint = {
        errno.ENOSPC: "free space on that disk or write the run elsewhere (hydra.run.dir=...)",
        errno.EDQUOT: (
            "the disk quota is exhausted: free space or write the run elsewhere (hydra.run.dir=...)"
        ),
        errno.EACCES: "the folder is not writable by this user: fix its permissions or choose another "
        "hydra.run.dir",
        errno.EPERM: "the folder is not writable by this user: fix its permissions or choose another "
        "hydra.run.dir",
        errno.EROFS: "the filesystem is read-only: make it writable again, or choose another hydra.run.dir",
    }.get(err.errno, "check the folder and the disk")
    return (
        f"could not write {what} {path}: {reason}{f' ({code})' if code else ''}; {kept}; free space there: "
        f"{free_space(os.path.dirname(path))}. {hint}{f'; {then}' if then else ''}"
    )


class RecordingWriter:
    """A binary file wrapper for ``torch.save``: hashes what is written (SHA-256) and keeps the first
    ``OSError`` (torch re-raises it as a ``RuntimeError`` without the errno)."""

    def __init__(self, fh: Any) -> None:
        self.fh = fh
        self.sha256 = hashlib.sha256()
        self.error: OSError | None = None

    def write(self, data: Any) -> int:
        try:
            n = self.fh.write(data)
        except OSError as err:
            self.error = self.error or err
            raise
        self.sha256.update(data)
        return n

    def flush(self) -> None:
        self.fh.flush()


_OS_CODE = re.compile(r"(?:os error |code: )(\d+)")


def disk_error(err: BaseException, writer: RecordingWriter | None = None) -> OSError | None:
    """The ``OSError`` behind a failed write: ``err`` itself or one in its cause chain, the one a
    :class:`RecordingWriter` saw under torch's ``RuntimeError``, or the errno that a Rust writer (safetensors)
    prints in its message (``... Os { code: 28, ... }``); ``None`` when the failure was not the disk's."""
    if writer is not None and writer.error is not None:
        return writer.error
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, OSError):
            return seen
        match = _OS_CODE.search(str(seen))
        if match:
            code = int(match.group(1))
            return OSError(code, os.strerror(code))
        seen = seen.__cause__ or seen.__context__
    return None


def fsync_folder(folder: str) -> None:
    """Make a rename in ``folder`` durable (best effort: some filesystems refuse to fsync a folder)."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def atomic_file(path: str, mode: str = "w") -> Iterator[Any]:
    """Open a temporary file beside ``path``; on a clean exit it is fsync'd and renamed to ``path``; on any
    exception it is removed and ``path`` is untouched. Raises ``OSError`` as the filesystem does."""
    folder = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX + os.path.basename(path) + ".", dir=folder)
    os.close(fd)
    try:
        with open(tmp, mode) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_folder(folder)


def write_json(path: str, value: Any, what: str, then: str = "") -> None:
    """``json.dump(value)`` to ``path`` atomically.

    Raises:
        TrainingError: the disk refused the write (:func:`write_failure_message`; the previous file is
        intact).
    """
    from hf_lightning.core.errors import TrainingError

    try:
        with atomic_file(path) as fh:
            json.dump(value, fh, indent=1, sort_keys=True)
    except OSError as err:
        kept = (
            "the previous version of that file is intact" if os.path.exists(path) else "nothing was written"
        )
        raise TrainingError(write_failure_message(what, path, err, kept, then)) from err


@contextlib.contextmanager
def atomic_folder(path: str) -> Iterator[str]:
    """Yield a temporary folder beside ``path`` to fill; on a clean exit it replaces ``path`` (an existing
    ``path`` is first renamed aside, then removed), on an exception it is removed and ``path`` is untouched.

    A kill between the two renames leaves no ``path`` and the previous version under a temporary name: the
    next start removes it, and a resume writes ``path`` again (:func:`hf_lightning.train` completes a finished
    run). A missing parent folder is created (as Lightning's ``CheckpointIO`` creates a checkpoint's)."""
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=TMP_PREFIX + os.path.basename(path) + ".", dir=parent)
    try:
        yield tmp
        for root, _, files in os.walk(tmp):
            for name in files:
                with open(os.path.join(root, name), "rb") as fh:
                    os.fsync(fh.fileno())
        os.chmod(tmp, 0o755)
        old = None
        if os.path.lexists(path):
            old = tempfile.mkdtemp(prefix=TMP_PREFIX + os.path.basename(path) + ".old.", dir=parent)
            os.rmdir(old)
            os.replace(path, old)
        os.replace(tmp, path)
        fsync_folder(parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def remove_leftovers(*folders: str) -> list[str]:
    """Remove the temporary entries (:data:`TMP_PREFIX`) a killed process left in ``folders``; returns them.
    Only safe while this process owns the run folder (:mod:`hf_lightning.run.lock`)."""
    removed = []
    for folder in folders:
        if not os.path.isdir(folder):
            continue
        for name in sorted(os.listdir(folder)):
            if not name.startswith((TMP_PREFIX, ".write-probe-")):  # the run-folder guard's probe too
                continue
            path = os.path.join(folder, name)
            with contextlib.suppress(OSError):
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path)
                else:
                    os.unlink(path)
                removed.append(path)
    return removed
