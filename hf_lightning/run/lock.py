"""One owner per run folder and per checkpoint folder: an OS lock that the kernel releases when the owner
dies, even by SIGKILL.

Two processes writing one run folder interleave ``metrics.csv``, race on ``last.ckpt`` (Lightning's version
counter then writes ``last-v1.ckpt``) and leave ``.hydra/`` describing the other run. The first process to
start takes an exclusive ``fcntl.flock`` on ``RUN/.hf_lightning.lock`` and keeps it until it exits; a second
one is refused at once, naming the owner's PID. The lock file stays (removing it would let a third process
lock a new file while the second still holds the old one); only its lock matters.

The checkpoint folder (``callbacks.model_checkpoint.dirpath``, default ``RUN/checkpoints``) has its own
lock, ``DIRPATH/.hf_lightning.lock``, by the same rule: two runs with different run folders and one
``dirpath`` would otherwise both write ``last.ckpt`` there (``last-v1.ckpt``, ``step000012-v1.ckpt``). That
file holds the owner's PID and run folder; the run folder stays in it after the owner ends, so a later
refusal can say whose
checkpoints the folder holds (:func:`checkpoint_folder_writer`).

The other ranks of a multi-process job (Lightning's DDP launcher re-runs the command line into the same
folder; SLURM and torchrun start one process per rank) are the owner's helpers, not competitors: they do not
lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil

from hf_lightning.core.errors import ConfigError

LOCK_FILE = ".hf_lightning.lock"
_HELD: dict[str, int] = {}  # real path of a locked folder -> the open lock file descriptor
_CREATED: set[str] = set()  # real paths of checkpoint folders this process created to lock them
# real path of a run folder this process created -> the outermost folder that call created (a dated
# outputs/DAY/TIME makes both)
_NEW_RUN_FOLDERS: dict[str, str] = {}
# what Hydra writes into a run folder before any work, besides the log file: its output_subdir (.hydra,
# evaluate's .hydra-evaluate) with these files
_HYDRA_FILES = {"config.yaml", "hydra.yaml", "overrides.yaml"}


def launched_as_other_rank() -> bool:
    """Whether this process is rank > 0 of a job that a launcher started (Lightning, torchrun, SLURM)."""
    for key in ("RANK", "LOCAL_RANK", "NODE_RANK", "SLURM_PROCID"):
        value = os.environ.get(key, "0")
        if value.isdigit() and int(value) > 0:
            return True
    return False


def _record(path: str) -> list[str]:
    """The lines of a lock file: ``[PID, run folder]``, either possibly empty or absent."""
    with contextlib.suppress(OSError, ValueError), open(path) as fh:
        return fh.read().split("\n")
    return []


def _owner_pid(fd: int, path: str) -> str | None:
    """The PID holding the lock: the one the owner wrote into the file, else the kernel's ``/proc/locks``."""
    lines = _record(path)
    if lines and lines[0].strip().isdigit():
        return lines[0].strip()
    with contextlib.suppress(OSError):
        stat = os.fstat(fd)
        ident = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"
        with open("/proc/locks") as fh:
            for line in fh:
                parts = line.split()
                if "FLOCK" in parts and ident in parts:
                    return parts[parts.index(ident) - 1]
    return None


def _lock(folder: str) -> tuple[int | None, str, str | None]:
    """``(fd, lock file, owner PID)``: ``fd`` holds the folder's lock, or is ``None`` when another process
    holds it (then its PID, if known). Raises ``OSError`` as the filesystem does."""
    path = os.path.join(folder, LOCK_FILE)
    # held open read-only: a file open for writing would keep the filesystem from being remounted read-only
    fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = _owner_pid(fd, path)
        os.close(fd)
        return None, path, pid
    except BaseException:
        os.close(fd)
        raise
    return fd, path, None


def _write_record(path: str, pid: str, run_dir: str | None) -> None:
    with contextlib.suppress(OSError), open(path, "w") as fh:  # a full disk leaves it empty: /proc/locks then
        fh.write(f"{pid}\n" + (f"{run_dir}\n" if run_dir else ""))


def hold_run_folder(run_dir: str) -> bool:
    """Take the run folder's lock for this process (created if needed); ``True`` if taken by this call,
    ``False`` if this process already holds it or is a helper rank.

    Raises:
        ConfigError: another live process holds it (the message names its PID).
    """
    key = os.path.realpath(run_dir)
    if key in _HELD or launched_as_other_rank():
        return False
    remember_new_run_folder(run_dir)
    os.makedirs(run_dir, exist_ok=True)
    fd, path, pid = _lock(run_dir)
    if fd is None:
        raise ConfigError(
            f"hydra.run.dir={run_dir} is in use by another process (PID {pid or 'unknown'}), which is "
            "writing its run there; wait for it to end, or choose another hydra.run.dir"
        )
    _write_record(path, str(os.getpid()), None)
    _HELD[key] = fd
    return True


def hold_checkpoint_folder(ckpt_dir: str, run_dir: str, create: bool = True) -> bool:
    """Take the lock of the run's checkpoint folder ``ckpt_dir`` (``callbacks.model_checkpoint.dirpath``) for
    the run in ``run_dir``; ``True`` if taken by this call, ``False`` if this process already holds it, is a
    helper rank, or (``create=False``) the folder does not exist yet.

    ``create=False`` is the check before the folder is read: an existing folder is locked, and its record of
    the run that wrote there is kept. ``create=True`` (once the run is going to write there) creates the
    folder if needed, locks it, and records ``run_dir`` as its writer.

    Raises:
        ConfigError: another live process holds it (names ``callbacks.model_checkpoint.dirpath``, the owner's
            PID and its run folder); the folder cannot be created or its lock file written (names the OS
            reason).
    """
    if launched_as_other_rank():
        return False
    key = os.path.realpath(ckpt_dir)
    taken = False
    if key not in _HELD:
        if not create and not os.path.isdir(ckpt_dir):
            blocked = _file_in_the_way(ckpt_dir)
            if blocked is not None:
                what = (
                    "is a file, not a folder"
                    if blocked == os.path.abspath(ckpt_dir)
                    else f"cannot be a folder ({blocked} is a file)"
                )
                raise ConfigError(
                    f"callbacks.model_checkpoint.dirpath={ckpt_dir} {what}: the run could not save its "
                    "checkpoints there; choose another callbacks.model_checkpoint.dirpath"
                )
            return False
        try:
            if not os.path.lexists(ckpt_dir):
                os.makedirs(ckpt_dir)
                _CREATED.add(key)
            fd, path, pid = _lock(ckpt_dir)
        except OSError as err:
            what = (
                "is a file, not a folder"
                if os.path.lexists(ckpt_dir) and not os.path.isdir(ckpt_dir)
                else f"cannot be written ({err.strerror or err})"
            )
            raise ConfigError(
                f"callbacks.model_checkpoint.dirpath={ckpt_dir} {what}: the run could not save its "
                "checkpoints there; choose another callbacks.model_checkpoint.dirpath"
            ) from err
        if fd is None:
            owner_run = checkpoint_folder_writer(ckpt_dir)
            owner = f"PID {pid or 'unknown'}" + (f", run folder {owner_run}" if owner_run else "")
            raise ConfigError(
                f"callbacks.model_checkpoint.dirpath={ckpt_dir} is in use by another process ({owner}), "
                "which is writing its checkpoints there; wait for it to end, or give this run its own "
                "callbacks.model_checkpoint.dirpath"
            )
        _HELD[key] = fd
        taken = True
    writer = os.path.abspath(run_dir) if create else checkpoint_folder_writer(ckpt_dir)
    _write_record(os.path.join(ckpt_dir, LOCK_FILE), str(os.getpid()), writer)
    return taken


def _file_in_the_way(folder: str) -> str | None:
    """``folder`` itself or the nearest of its parents that exists, when that is not a folder (a file, a
    dangling link); ``None`` when the folder can be created."""
    path = os.path.abspath(folder)
    while not os.path.lexists(path):
        parent = os.path.dirname(path)
        if parent == path:
            return None
        path = parent
    return None if os.path.isdir(path) else path


def checkpoint_folder_writer(ckpt_dir: str) -> str | None:
    """The run folder of the run that held ``ckpt_dir``'s lock last (running or ended), if it is recorded."""
    lines = _record(os.path.join(ckpt_dir, LOCK_FILE))
    return lines[1].strip() if len(lines) > 1 and lines[1].strip() else None


def _release(folder: str, keep_run: bool) -> None:
    key = os.path.realpath(folder)
    fd = _HELD.pop(key, None)
    if fd is None:
        return
    path = os.path.join(folder, LOCK_FILE)
    if key in _CREATED:
        _CREATED.discard(key)
        if os.listdir(folder) == [LOCK_FILE]:  # created for the lock, and the run wrote nothing there
            os.unlink(path)
            os.rmdir(folder)
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
            return
    lines = _record(path)
    run_dir = lines[1].strip() if keep_run and len(lines) > 1 else None
    _write_record(path, "", run_dir)  # no PID: nobody owns it
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)


def release_run_folder(run_dir: str) -> None:
    """Give the run folder's lock back (the file stays). A no-op when this process does not hold it."""
    _release(run_dir, keep_run=False)


def release_checkpoint_folder(ckpt_dir: str) -> None:
    """Give the checkpoint folder's lock back; its file keeps the run folder of the run that wrote there. A
    folder this process created and wrote nothing into (a run refused or stopped before its first checkpoint)
    is removed with its lock file. A no-op when this process does not hold it."""
    _release(ckpt_dir, keep_run=True)


def remember_new_run_folder(run_dir: str) -> None:
    """Note that ``run_dir`` does not exist yet (call it before creating it), so that
    :func:`discard_new_run_folder` may remove it and the folders created with it."""
    outermost = None
    parent = os.path.abspath(run_dir)
    while not os.path.exists(parent):
        outermost, parent = parent, os.path.dirname(parent)
    if outermost is not None:
        _NEW_RUN_FOLDERS[os.path.realpath(run_dir)] = outermost


def discard_new_run_folder(run_dir: str) -> bool:
    """Remove ``run_dir`` after a refused command when this process created it and it holds nothing but
    what Hydra and the run's start wrote (``.hydra*/``'s three files, ``*.log`` files, the lock file), with
    the empty folders that creating it made (``outputs/DAY/``). A folder that existed before, or holds
    anything else (a checkpoint, ``metrics.csv``), is left as it is. Returns whether it removed it."""
    key = os.path.realpath(run_dir)
    outermost = _NEW_RUN_FOLDERS.pop(key, None)
    if outermost is None or not os.path.isdir(run_dir):
        return False
    for name in os.listdir(run_dir):
        path = os.path.join(run_dir, name)
        if name.startswith(".hydra") and os.path.isdir(path) and not os.path.islink(path):
            if not set(os.listdir(path)) <= _HYDRA_FILES:
                return False
        elif not (os.path.isfile(path) and (name == LOCK_FILE or name.endswith(".log"))):
            return False
    _release(run_dir, keep_run=False)
    shutil.rmtree(run_dir, ignore_errors=True)
    outermost = os.path.abspath(outermost)
    parent = os.path.dirname(os.path.abspath(run_dir))
    while parent == outermost or parent.startswith(outermost + os.sep):
        with contextlib.suppress(OSError):
            os.rmdir(parent)  # an empty one only
        parent = os.path.dirname(parent)
    return not os.path.exists(run_dir)
