"""One owner per run folder: an OS lock that the kernel releases when the owner dies, even by SIGKILL.

Two processes writing one run folder interleave ``metrics.csv``, race on ``last.ckpt`` (Lightning's version
counter then writes ``last-v1.ckpt``) and leave ``.hydra/`` describing the other run. The first process to
start takes an exclusive ``fcntl.flock`` on ``RUN/.hf_lightning.lock`` and keeps it until it exits; a second
one is refused at once, naming the owner's PID. The lock file stays (removing it would let a third process
lock a new file while the second still holds the old one); only its lock matters.

The other ranks of a multi-process job (Lightning's DDP launcher re-runs the command line into the same
folder; SLURM and torchrun start one process per rank) are the owner's helpers, not competitors: they do not
lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import os

from hf_lightning.errors import ConfigError

LOCK_FILE = ".hf_lightning.lock"
_HELD: dict[str, int] = {}  # real path of the run folder -> the open lock file descriptor


def launched_as_other_rank() -> bool:
    """Whether this process is rank > 0 of a job that a launcher started (Lightning, torchrun, SLURM)."""
    for key in ("RANK", "LOCAL_RANK", "NODE_RANK", "SLURM_PROCID"):
        value = os.environ.get(key, "0")
        if value.isdigit() and int(value) > 0:
            return True
    return False


def _owner_pid(fd: int, path: str) -> str | None:
    """The PID holding the lock: the one the owner wrote into the file, else the kernel's ``/proc/locks``."""
    with contextlib.suppress(OSError, ValueError):
        with open(path) as fh:
            text = fh.read().strip()
        if text.isdigit():
            return text
    with contextlib.suppress(OSError):
        stat = os.fstat(fd)
        ident = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"
        with open("/proc/locks") as fh:
            for line in fh:
                parts = line.split()
                if "FLOCK" in parts and ident in parts:
                    return parts[parts.index(ident) - 1]
    return None


def hold_run_folder(run_dir: str) -> bool:
    """Take the run folder's lock for this process (created if needed); ``True`` if taken by this call,
    ``False`` if this process already holds it or is a helper rank.

    Raises:
        ConfigError: another live process holds it (the message names its PID).
    """
    key = os.path.realpath(run_dir)
    if key in _HELD or launched_as_other_rank():
        return False
    os.makedirs(run_dir, exist_ok=True)
    path = os.path.join(run_dir, LOCK_FILE)
    # held open read-only: a file open for writing would keep the filesystem from being remounted read-only
    fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = _owner_pid(fd, path)
        os.close(fd)
        raise ConfigError(
            f"hydra.run.dir={run_dir} is in use by another process (PID {pid or 'unknown'}), which is "
            "writing its run there; wait for it to end, or choose another hydra.run.dir"
        ) from None
    with contextlib.suppress(OSError), open(path, "w") as fh:  # a full disk leaves it empty: /proc/locks then
        fh.write(f"{os.getpid()}\n")
    _HELD[key] = fd
    return True


def release_run_folder(run_dir: str) -> None:
    """Give the lock back (the file stays). A no-op when this process does not hold it."""
    fd = _HELD.pop(os.path.realpath(run_dir), None)
    if fd is not None:
        with contextlib.suppress(OSError), open(os.path.join(run_dir, LOCK_FILE), "w"):
            pass  # no PID: nobody owns it
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
