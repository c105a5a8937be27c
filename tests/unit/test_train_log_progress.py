"""The train log line's progress: HF ``Trainer``'s ``state.epoch`` (the fraction of epochs done) and the
elapsed / remaining time its tqdm bar shows (``elapsed<remaining``)."""

from __future__ import annotations

import logging
import re

import pytest

from hf_lightning.module.train_log import StepClock, clock, epoch_fraction, say_row


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        # 4 windows of one micro-batch per epoch: the 6th step is the 2nd of epoch 1, 1 + 2/4
        ((1, 2, 4), 1.5),
        ((0, 4, 4), 1.0),  # an epoch's last step ends it exactly
        # 10 micro-batches, accumulation 4 (windows 4, 4, 2): HF's epoch + (step + 1) / steps_in_epoch with
        # step the window's last micro-batch: (3 + 1) / 10, then (7 + 1) / 10, then 1
        ((0, 1, 3, 10, 4), 0.4),
        ((0, 2, 3, 10, 4), 0.8),
        ((2, 3, 3, 10, 4), 3.0),
        # an epoch cut to 2 of its 3 windows (limit_train_batches): counted in its own windows
        ((0, 1, 2, 10, 4), 0.5),
        ((5, 7, float("inf")), 5.0),  # an epoch of unknown length: the epoch count
    ],
)
def test_epoch_fraction_is_hf_state_epoch(args, expected):
    assert epoch_fraction(*args) == pytest.approx(expected)


def test_clock_reads_as_tqdm():
    assert [clock(s) for s in (0, 59.6, 61, 3599, 3600, 3 * 3600 + 62)] == [
        "00:00",
        "01:00",
        "01:01",
        "59:59",
        "1:00:00",
        "3:01:02",
    ]


class FakeTimer:
    """A monotonic clock the test moves: each optimizer step takes 3 s, the first 30 s (the warm-up)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_log_line_shows_elapsed_and_a_falling_remaining_time(caplog):
    """``step N of T [elapsed<remaining]``: the time left is unknown (``?``) until a step after the first
    has ended, then the steps left times the mean step after the first (3 s), falling as the steps go."""
    timer = FakeTimer()
    steps = StepClock(timer)
    assert steps.text(1, 10) is None  # not started
    steps.start()
    with caplog.at_level(logging.INFO, logger="hf_lightning.module.train_log"):
        for step in range(1, 10):
            timer.now += 30.0 if step == 1 else 3.0
            steps.step_ended(step)
            say_row({"train/loss": 2.0, "lr": 1e-3, "epoch": step / 4}, step, 10, steps.text(step, 10))
    lines = [r.getMessage() for r in caplog.records]
    pattern = re.compile(
        r"^step (\d) of 10 \[(\d\d:\d\d)<(\d\d:\d\d|\?)\]: train/loss=2 lr=0.001 epoch=(\S+)$"
    )
    parsed = [pattern.match(line) for line in lines]
    assert len(lines) == 9 and all(parsed), lines
    # by hand: elapsed 30 + 3 (s - 1) s; left (10 - s) x 3 s from step 2 on
    assert [m[2] for m in parsed] == [clock(30 + 3 * (s - 1)) for s in range(1, 10)]
    assert [m[3] for m in parsed] == ["?"] + [clock(3 * (10 - s)) for s in range(2, 10)]
    assert [m[3] for m in parsed][1:] == [
        "00:24",
        "00:21",
        "00:18",
        "00:15",
        "00:12",
        "00:09",
        "00:06",
        "00:03",
    ]
    assert [float(m[4]) for m in parsed] == [s / 4 for s in range(1, 10)]
