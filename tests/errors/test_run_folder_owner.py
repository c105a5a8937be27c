"""One owner per run folder and per checkpoint folder: a second process is refused in one line naming the
first one's PID (and, for a checkpoint folder, its run folder); the lock goes with its owner, even when the
owner is killed with SIGKILL.

The owner here is a real second process (``python -c`` taking the lock, then waiting on its stdin; a forked
child calling :func:`hold_checkpoint_folder`); the CLI cases (two ``python -m hf_lightning.train`` started
together, in one run folder or in two with one ``callbacks.model_checkpoint.dirpath``) are
``test_two_runs_started_together_one_is_refused`` and
``test_two_runs_sharing_a_checkpoint_folder_one_is_refused``.
"""

from __future__ import annotations

import csv
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from hf_lightning import ConfigError
from hf_lightning.run.folder import RunFolderGuard
from hf_lightning.run.lock import (
    LOCK_FILE,
    hold_checkpoint_folder,
    hold_run_folder,
    release_checkpoint_folder,
    release_run_folder,
)
from tests.errors.support import one_line_error, run_train_cli
from tests.errors.test_config import compose_train, guard_exit

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


# ---------------------------------------------------------------------------------------- checkpoint folders
def _own_a_run(run_dir: str, ckpt_dir: str, ready, done) -> None:
    """A forked child: the owner of a run folder and of its checkpoint folder, until ``done`` is set."""
    hold_run_folder(run_dir)
    hold_checkpoint_folder(ckpt_dir, run_dir)
    ready.set()
    done.wait(60)
    os._exit(0)


def start_run_owner(run_dir, ckpt_dir):
    fork = multiprocessing.get_context("fork")
    ready, done = fork.Event(), fork.Event()
    child = fork.Process(target=_own_a_run, args=(str(run_dir), str(ckpt_dir), ready, done))
    child.start()
    assert ready.wait(30)
    return child, done


def in_use(ckpt_dir, pid, run_dir) -> str:
    return (
        f"callbacks.model_checkpoint.dirpath={ckpt_dir} is in use by another process (PID {pid}, run folder "
        f"{run_dir}), which is writing its checkpoints there; wait for it to end, or give this run its own "
        "callbacks.model_checkpoint.dirpath"
    )


def test_a_checkpoint_folder_in_use_by_another_run_is_refused_naming_it(tmp_path, capsys):
    """Two runs with their own run folders and one ``callbacks.model_checkpoint.dirpath`` (before: both
    trained, writing last.ckpt / last-v1.ckpt into it). The refusal names the key, the owner's PID and its run
    folder; the lock dies with its owner, even by SIGKILL."""
    ckpt_dir, run_a, run_b = tmp_path / "ckpts", tmp_path / "a", tmp_path / "b"
    owner, done = start_run_owner(run_a, ckpt_dir)
    try:
        assert hold_run_folder(str(run_b)) is True  # another run folder: free
        with pytest.raises(ConfigError) as err:
            hold_checkpoint_folder(str(ckpt_dir), str(run_b), create=False)
        assert str(err.value) == in_use(ckpt_dir, owner.pid, run_a)
        # the CLI's guard, before anything is written: one line naming the key
        message = guard_exit(
            compose_train(
                f"hydra.run.dir={tmp_path / 'c'}", f"callbacks.model_checkpoint.dirpath={ckpt_dir}"
            ),
            capsys,
        )
        assert message == in_use(ckpt_dir, owner.pid, run_a)
        assert sorted(os.listdir(ckpt_dir)) == [LOCK_FILE]
    finally:
        os.kill(owner.pid, signal.SIGKILL)
        owner.join()
        release_run_folder(str(run_b))
    assert hold_checkpoint_folder(str(ckpt_dir), str(run_b)) is True  # a dead owner's lock blocks nothing
    assert hold_checkpoint_folder(str(ckpt_dir), str(run_b)) is False  # held by this process already
    release_checkpoint_folder(str(ckpt_dir))


def _plant_checkpoints(ckpt_dir, run_dir) -> None:
    """What a finished run in ``run_dir`` leaves in its checkpoint folder ``ckpt_dir``."""
    assert hold_checkpoint_folder(str(ckpt_dir), str(run_dir)) is True
    state = {
        "state_dict": {},
        "optimizer_states": [{}],
        "lr_schedulers": [{}],
        "loops": {"fit_loop": {}},
        "global_step": 2,
    }
    for name in ("step000002.ckpt", "last.ckpt"):
        torch.save(state, ckpt_dir / name)
    release_checkpoint_folder(str(ckpt_dir))


def test_a_fresh_run_is_refused_naming_the_checkpoint_folder_not_its_own_run_folder(tmp_path, capsys):
    """A later fresh run with another hydra.run.dir and the same dirpath (before: refused with a line blaming
    its own, empty hydra.run.dir, listing ``../ckpts/last.ckpt``): the line names
    callbacks.model_checkpoint.dirpath, whose run wrote the checkpoints, and the command that resumes it,
    which the guard accepts."""
    ckpt_dir, run_a, run_b = tmp_path / "ckpts", tmp_path / "a", tmp_path / "b"
    ckpt_dir.mkdir()
    _plant_checkpoints(ckpt_dir, run_a)
    where = f"callbacks.model_checkpoint.dirpath={ckpt_dir}"
    before = {p.name: p.read_bytes() for p in ckpt_dir.glob("*.ckpt")}
    message = guard_exit(compose_train(f"hydra.run.dir={run_b}", where), capsys)
    assert message == (
        f"{where} already holds the checkpoints of a run (last.ckpt, step000002.ckpt; written by the run in "
        f"{run_a}); a fresh run would overwrite them. Give this run its own "
        f"callbacks.model_checkpoint.dirpath, or resume that run with hydra.run.dir={run_a} ckpt_path=last"
    )
    weights = ckpt_dir / "last.ckpt"
    message = guard_exit(
        compose_train(
            f"hydra.run.dir={tmp_path / 'c'}", where, f"ckpt_path={weights}", "resume_weights_only=true"
        ),
        capsys,
    )
    assert message == (
        f"resume_weights_only=true starts a new run at step 0 from the weights of {weights}, and {where} "
        f"already holds the checkpoints of a run (last.ckpt, step000002.ckpt; written by the run in {run_a}) "
        "whose history it would overwrite. Give the new run its own folder "
        f"(callbacks.model_checkpoint.dirpath=NEW ckpt_path={weights} resume_weights_only=true), or drop "
        "resume_weights_only to continue that run"
    )
    assert {p.name: p.read_bytes() for p in ckpt_dir.glob("*.ckpt")} == before
    assert not run_b.exists()  # the refused run's folder, which it made, is gone (nothing was written there)
    # the resume the message names passes the guard and reads last.ckpt from the configured folder
    RunFolderGuard().on_run_start(compose_train(f"hydra.run.dir={run_a}", where, "ckpt_path=last"))
    assert capsys.readouterr().err == (
        f"hf_lightning: note: resuming from {ckpt_dir / 'last.ckpt'} at optimizer step 2\n"
    )


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


@pytest.mark.slow
def test_two_runs_sharing_a_checkpoint_folder_one_is_refused(tmp_path):
    """Two commands started at once with their own hydra.run.dir and one callbacks.model_checkpoint.dirpath
    (before: both trained into it, ``last.ckpt`` and ``last-v1.ckpt``): the one that takes the folder first
    trains (waiting at its first step until the other has ended), the other is refused in one line naming
    the key, the owner's PID and run folder."""
    ckpt_dir, release = tmp_path / "ckpts", tmp_path / "release"
    common = (
        "trainer.max_steps=2",
        "trainer.limit_val_batches=1",
        f"callbacks.model_checkpoint.dirpath={ckpt_dir}",
        "+callbacks.wait._target_=tests.kill_points.WaitForFile",
        f"+callbacks.wait.path={release}",
    )
    results: dict[str, subprocess.CompletedProcess] = {}

    def start(name: str) -> None:
        results[name] = run_train_cli("+experiment=sft", f"hydra.run.dir={tmp_path / name}", *common)

    threads = [threading.Thread(target=start, args=(name,)) for name in ("a", "b")]
    for t in threads:
        t.start()
    while not results:  # the refused one ends on its own; the owner waits for `release`
        threads[0].join(0.2)
        threads[1].join(0.2)
    release.touch()
    for t in threads:
        t.join()
    refused = {n: p for n, p in results.items() if p.returncode != 0}
    finished = {n: p for n, p in results.items() if p.returncode == 0}
    assert len(refused) == 1 and len(finished) == 1, [p.stderr[-2000:] for p in results.values()]
    (owner,) = finished
    owner_pid = (tmp_path / "release.pid").read_text()
    assert one_line_error(next(iter(refused.values()))) == (
        f"hf_lightning: error: {in_use(ckpt_dir, owner_pid, tmp_path / owner)}"
    )
    names = sorted(os.listdir(ckpt_dir))
    assert "last.ckpt" in names and not [n for n in names if "-v1" in n]


def test_a_checkpoint_folder_that_cannot_be_a_folder_is_refused_naming_the_key(tmp_path, capsys):
    """``callbacks.model_checkpoint.dirpath`` naming a file, or a folder under a file (before: the run trained
    and failed at its first save). Refused by the guard before anything is written; the file is untouched."""
    a_file = tmp_path / "notes.txt"
    a_file.write_text("keep me\n")
    key = "callbacks.model_checkpoint.dirpath"
    message = guard_exit(compose_train(f"hydra.run.dir={tmp_path / 'run'}", f"{key}={a_file}"), capsys)
    assert message == (
        f"{key}={a_file} is a file, not a folder: the run could not save its checkpoints there; choose "
        f"another {key}"
    )
    under = a_file / "checkpoints"
    with pytest.raises(ConfigError) as err:
        hold_checkpoint_folder(str(under), str(tmp_path / "run"))
    assert str(err.value) == (
        f"{key}={under} cannot be written (Not a directory): the run could not save its checkpoints there; "
        f"choose another {key}"
    )
    assert a_file.read_text() == "keep me\n"
