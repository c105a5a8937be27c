"""A run ended by ``trainer.max_steps`` in the middle of an epoch and continued with a larger ``max_steps``
goes on with the rest of that epoch, and a ``trainer.max_steps`` given on the command line
wins over an epoch count the command line did not give.

The job: 40 rows in micro-batches of 2 with accumulation 2, so an epoch is 20 micro-batches, 10
optimizer steps; shuffled. The reference is the run that never stopped (12 steps straight); the stopped run
ends at step 7 (14 micro-batches into epoch 0) and is continued with ``trainer.max_steps=12 ckpt_path=last``:
the weights must be bit-identical and every step logged once, steps 1-10 in epoch 0. HF ``Trainer`` does the
same: its checkpoint at ``max_steps`` records the step, and a resume skips the batches of the epoch already
trained.
"""

from __future__ import annotations

import csv

import pytest
import torch

from tests.integration.test_resume import cli, text_file, train_rows, weights  # noqa: F401 (text_file: fixture)

pytestmark = pytest.mark.slow

JOB = ("data.gradient_accumulation_steps=2", "callbacks.model_checkpoint.every_n_train_steps=null")


def run(run_dir, data, *overrides):
    proc = cli(run_dir, data, *JOB, *overrides)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def epochs(run_dir):
    """``{step: epoch}`` of the train rows of ``metrics.csv`` (HF's ``state.epoch``, the epochs done)."""
    with open(run_dir / "metrics.csv") as fh:
        return {int(r["step"]): float(r["epoch"]) for r in csv.DictReader(fh) if r.get("train/loss")}


def max_difference(a_dir, b_dir) -> float:
    a, b = weights(a_dir), weights(b_dir)
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.fixture(scope="module")
def straight12(text_file, tmp_path_factory):  # noqa: F811
    """12 steps without a stop; ``max_epochs=null``, so no epoch count ends it (the command-line
    ``max_steps`` rule not involved)."""
    folder = tmp_path_factory.mktemp("straight12") / "run"
    run(folder, text_file, "trainer.max_epochs=null")
    return folder


def stop_at_7_then_12(folder, data, *overrides):
    run(folder, data, "trainer.max_steps=7", *overrides)
    assert torch.load(folder / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 7
    return run(folder, data, "trainer.max_steps=12", "ckpt_path=last", *overrides)


CONTINUED = {
    # the command: checkpoints at the epoch end Lightning runs when max_steps stops it
    "max_epochs_null": ("trainer.max_epochs=null",),
    # checkpoints every 3 steps: step 7's last.ckpt is written when training ends
    "max_epochs_null_ckpt_every_3": (
        "trainer.max_epochs=null",
        "callbacks.model_checkpoint.every_n_train_steps=3",
    ),
    # the clm experiment's max_epochs=1: the command line's max_steps wins over it
    "clm_default_max_epochs": (),
}


@pytest.mark.parametrize("case", sorted(CONTINUED))
def test_max_steps_continued_mid_epoch_equals_straight(case, text_file, straight12, tmp_path):  # noqa: F811
    folder = tmp_path / "run"
    stop_at_7_then_12(folder, text_file, *CONTINUED[case])
    assert max_difference(straight12, folder) == 0.0  # bit-identical
    rows = train_rows(folder)
    assert sorted(step for step, _ in rows) == list(range(1, 13))  # each step once, none skipped
    straight = dict(train_rows(straight12))
    assert [loss for step, loss in rows if step > 7] == [straight[s] for s in range(8, 13)]
    # 10 steps per epoch of one micro-batch each: HF's state.epoch after step s is s / 10, across the resume
    assert epochs(folder) == pytest.approx({s: s / 10 for s in range(1, 13)})


def test_given_max_epochs_still_ends_the_continued_epoch(text_file, tmp_path):  # noqa: F811
    """Both limits given, ``max_epochs=1`` ending first: the straight run stops at the epoch's end, and so
    must the continued one; before, its checkpoint said the epoch was over and the resume trained nothing.
    Validation at each epoch end is on here (10% held out: 36 training rows, 9 steps per epoch), so the stop
    at step 7 also validates its final weights there."""
    both = ("trainer.max_epochs=1", "data.validation_split=0.1", "trainer.limit_val_batches=2")
    straight, folder = tmp_path / "straight", tmp_path / "run"
    run(straight, text_file, "trainer.max_steps=12", *both)
    proc = stop_at_7_then_12(folder, text_file, *both)
    assert "nothing was trained" not in proc.stdout + proc.stderr
    # 36 training rows: 18 micro-batches, 9 steps per epoch
    assert sorted(step for step, _ in train_rows(folder)) == list(range(1, 10))
    assert max_difference(straight, folder) == 0.0


def test_given_max_steps_wins_over_the_experiments_epoch_count(text_file, straight12, tmp_path):  # noqa: F811
    """``+experiment=clm`` sets ``max_epochs=1``; ``trainer.max_steps=12`` on the command line runs 12 steps
    (HF: ``max_steps`` "overrides num_train_epochs"), the same 12 as the run with
    ``trainer.max_epochs=null``."""
    folder = tmp_path / "run"
    proc = run(folder, text_file)  # cli() gives trainer.max_steps=12
    assert sorted(step for step, _ in train_rows(folder)) == list(range(1, 13))
    assert max_difference(straight12, folder) == 0.0
    log = proc.stdout + proc.stderr
    assert "trainer.max_steps=12 (given) overrides trainer.max_epochs=1 (not given)" in log


def test_both_given_and_the_epochs_end_first_warns_once(text_file, tmp_path):  # noqa: F811
    folder = tmp_path / "run"
    proc = run(folder, text_file, "trainer.max_epochs=1")
    assert sorted(step for step, _ in train_rows(folder)) == list(
        range(1, 11)
    )  # the epoch ends it, at step 10
    log = (folder / "train.log").read_text()
    warnings = [line for line in log.splitlines() if "[WARNING]" in line and "trainer.max_epochs=1" in line]
    assert len(warnings) == 1, log
    assert "trainer.max_steps=12" in warnings[0] and "10 optimizer steps" in warnings[0]
    assert proc.returncode == 0
