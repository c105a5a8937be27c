"""One owner per run folder: a second process is refused in one line naming the first one's PID; the lock goes
with its owner, even when the owner is killed with SIGKILL.

The owner here is a real second process (``python -c`` taking the lock, then waiting on its stdin); the CLI
case (two ``python -m hf_lightning.train`` started together) is
``test_two_runs_started_together_one_is_refused``.
"""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from hf_lightning import ConfigError
from hf_lightning.run_lock import LOCK_FILE, hold_run_folder, release_run_folder
from tests.errors.support import one_line_error, run_train_cli

# another process holding the folder's lock, as an owner that has not written its PID yet (the refusal then
# reads the PID from the kernel's /proc/locks); the package is not imported, so the test stays fast
OWNER = (
    "import fcntl, os, sys; os.makedirs(sys.argv[1], exist_ok=True); "
    f"fd = os.open(os.path.join(sys.argv[1], {LOCK_FILE!r}), os.O_RDWR | os.O_CREAT); "
    "fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB); print('held', flush=True); sys.stdin.read()"
)


def start_owner(run_dir: Path) -> subprocess.Popen:
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(run_dir)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert owner.stdout.readline().strip() == "held"
    return owner


def test_a_second_process_is_refused_naming_the_owner(tmp_path):
    run_dir = tmp_path / "run"
    owner = start_owner(run_dir)
    try:
        with pytest.raises(ConfigError) as err:
            hold_run_folder(str(run_dir))
        assert str(err.value) == (
            f"hydra.run.dir={run_dir} is in use by another process (PID {owner.pid}), which is writing its "
            "run there; wait for it to end, or choose another hydra.run.dir"
        )
    finally:
        owner.stdin.close()
        owner.wait()
    # the owner ended (its lock with it): the folder is free
    assert hold_run_folder(str(run_dir)) is True
    release_run_folder(str(run_dir))


def test_the_lock_dies_with_a_killed_owner(tmp_path):
    run_dir = tmp_path / "run"
    owner = start_owner(run_dir)
    with pytest.raises(ConfigError, match=f"PID {owner.pid}"):
        hold_run_folder(str(run_dir))
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    assert (run_dir / LOCK_FILE).is_file()  # the file stays; only its lock matters
    assert hold_run_folder(str(run_dir)) is True
    assert hold_run_folder(str(run_dir)) is False  # held by this process already: no second lock
    release_run_folder(str(run_dir))


def test_the_other_ranks_of_a_job_do_not_compete(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    owner = start_owner(run_dir)
    try:
        monkeypatch.setenv(
            "LOCAL_RANK", "1"
        )  # what Lightning's DDP launcher sets for the processes it starts
        assert hold_run_folder(str(run_dir)) is False
    finally:
        owner.stdin.close()
        owner.wait()


# ------------------------------------------------------------------------------------------ the CLI
@pytest.mark.slow
@pytest.mark.parametrize("attempt", range(5))
def test_two_runs_started_together_one_is_refused(tmp_path, attempt):
    """Two identical commands started at once in one fresh folder: whichever takes the lock first runs (and
    waits, at its first step, for the other to have ended: the test then cannot depend on which is faster),
    the other is refused in one line naming it, before writing anything. The folder then holds one run
    only."""
    run_dir, release = tmp_path / "run", tmp_path / "release"
    args = (
        "trainer.max_steps=2",
        f"hydra.run.dir={run_dir}",
        "+callbacks.wait._target_=tests.kill_points.WaitForFile",
        f"+callbacks.wait.path={release}",
    )
    results: dict[int, subprocess.CompletedProcess] = {}

    def start(i: int) -> None:
        results[i] = run_train_cli("+experiment=sft", *args)

    threads = [threading.Thread(target=start, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    while len(results) < 1:  # the refused one ends on its own; the owner waits for `release`
        threads[0].join(0.2)
        threads[1].join(0.2)
    release.touch()
    for t in threads:
        t.join()
    refused = [p for p in results.values() if p.returncode != 0]
    finished = [p for p in results.values() if p.returncode == 0]
    assert len(refused) == 1 and len(finished) == 1, [p.stderr[-2000:] for p in results.values()]
    owner_pid = (tmp_path / "release.pid").read_text()
    assert one_line_error(refused[0]) == (
        f"hf_lightning: error: hydra.run.dir={run_dir} is in use by another process (PID {owner_pid}), which "
        "is writing its run there; wait for it to end, or choose another hydra.run.dir"
    )
    with open(run_dir / "metrics.csv") as fh:  # one run's rows, each step once
        rows = list(csv.DictReader(fh))
    steps = [r["step"] for r in rows if r.get("train/loss")]
    assert steps and len(steps) == len(set(steps))
    names = sorted(os.listdir(run_dir / "checkpoints"))
    assert "last.ckpt" in names and not [n for n in names if "-v1" in n]
    assert len(list((run_dir / ".hydra").glob("previous-*"))) == 0  # the refused start wrote nothing there
