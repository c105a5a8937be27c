"""The run's step counts and the lines that report what it does not get as configured: short accumulation
windows (one WARNING with the configured and effective lengths and how many steps are short),
``max_epochs`` ending a run before ``max_steps``, and a command-line ``max_steps`` winning over an epoch count
nobody gave."""

from __future__ import annotations

import logging

import datasets
import lightning as L
import pytest

from hf_lightning import HFDataModule, HFLightningModule
from hf_lightning.config.run_length import apply_max_steps_precedence
from hf_lightning.module.run_plan import plan_run
from tests.data_support import PadOnly, tiny_llama


@pytest.mark.parametrize(
    "batches,accumulation,max_epochs,max_steps,expected",
    [
        # 5 micro-batches, windows 2+2+1: 3 steps per epoch, 6 in 2 epochs, the 3rd and 6th short
        (5, 2, 2, -1, (3, 6, 1, 2)),
        # an epoch shorter than the window: every step is short, its window holds 3
        (3, 4, 3, -1, (1, 3, 3, 3)),
        # windows 4x5 + 1: steps 6 and 12 are short; max_steps=13 ends in the 3rd epoch
        (21, 4, None, 13, (6, 13, 1, 2)),
        # max_steps=4 ends before the first short window
        (21, 4, 1, 4, (6, 4, 1, 0)),
        # no short window
        (20, 2, -1, 7, (10, 7, 0, 0)),
        # a stream of unknown length: max_steps is the run
        (float("inf"), 4, -1, 10, (float("inf"), 10, 0, 0)),
    ],
)
def test_plan_by_hand(batches, accumulation, max_epochs, max_steps, expected):
    plan = plan_run(batches, accumulation, max_epochs, max_steps)
    assert (plan.steps_per_epoch, plan.total_steps, plan.short_window, plan.short_steps) == expected


class WindowLengths(L.Callback):
    def __init__(self) -> None:
        self.lengths: list[int] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.lengths.append(len(batch))


def fit(tmp_path, rows: int, accumulation: int, **limits):
    """Rows of 4 tokens in micro-batches of 2 (``rows / 2`` micro-batches per epoch); the window lengths
    seen."""
    source = datasets.Dataset.from_list([{"input_ids": [4 + i % 20, 5, 6, 7]} for i in range(rows)])
    data = HFDataModule(
        PadOnly(),
        path=source,
        format="tokenized",
        validation_split=0.0,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=accumulation,
    )
    seen = WindowLengths()
    trainer = L.Trainer(
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[seen],
        default_root_dir=tmp_path,
        **limits,
    )
    module = HFLightningModule(
        tiny_llama().train(), optim={"name": "sgd", "lr": 0.01}, scheduler={"name": "constant"}
    )
    trainer.fit(module, datamodule=data)
    return trainer, seen.lengths  # the window lengths as the loader cut them


def warnings_of(caplog, text):
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and text in r.getMessage()]


@pytest.mark.parametrize("rows,accumulation,epochs", [(10, 2, 2), (6, 4, 2)])
def test_short_windows_are_one_warning_with_their_count(tmp_path, caplog, rows, accumulation, epochs):
    with caplog.at_level(logging.WARNING):
        trainer, windows = fit(tmp_path, rows, accumulation, max_epochs=epochs)
    short = [n for n in windows if n < accumulation]
    assert short and len(set(short)) == 1  # observed: the last window of each epoch
    lines = warnings_of(caplog, "gradient-accumulation windows")
    assert len(lines) == 1, lines
    assert f"data.gradient_accumulation_steps={accumulation}" in lines[0]
    assert f"its last window holds {short[0]}" in lines[0]
    assert f"{len(short)} of this run's {trainer.global_step} optimizer steps are short" in lines[0]


def test_full_windows_say_nothing(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        _, windows = fit(tmp_path, 8, 2, max_epochs=2)
    assert windows == [2] * 4
    assert not warnings_of(caplog, "gradient-accumulation windows")


def test_epochs_ending_before_max_steps_warn_once(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        trainer, _ = fit(tmp_path, 12, 2, max_epochs=1, max_steps=5)
    assert trainer.global_step == 3  # 6 micro-batches, windows of 2: the epoch ends it
    lines = warnings_of(caplog, "trainer.max_epochs=1")
    assert lines == [
        "trainer.max_epochs=1 ends this run after 3 optimizer steps, before trainer.max_steps=5 "
        "(Lightning stops at the first limit reached); set trainer.max_epochs=null to run 5 steps"
    ]


@pytest.mark.parametrize(
    "overrides,max_epochs",
    [
        (
            ["+experiment=clm", "data.path=x.jsonl", "trainer.max_steps=12"],
            None,
        ),  # given steps, epochs from clm
        (["+experiment=sft", "++trainer.max_steps=12"], None),
        (
            ["+experiment=clm", "data.path=x.jsonl", "trainer.max_steps=12", "trainer.max_epochs=1"],
            1,
        ),  # both given
        (["+experiment=sft", "trainer.max_steps=-1"], 4),  # -1 is no limit
        # a group's file, not the command line, set max_steps=4; debug's own max_epochs=1 wins over sft's 4
        (["+experiment=sft", "trainer=debug"], 1),
    ],
)
def test_a_given_max_steps_unsets_an_epoch_count_not_given(compose_cfg, overrides, max_epochs):
    cfg = compose_cfg(*overrides, shrink=False)
    changed = apply_max_steps_precedence(cfg, overrides)
    assert cfg.trainer.max_epochs == max_epochs
    assert changed == (max_epochs is None)


def test_without_a_command_line_nothing_changes(compose_cfg):
    cfg = compose_cfg("+experiment=sft", "trainer.max_steps=12", shrink=False)
    assert not apply_max_steps_precedence(cfg, None)
    assert cfg.trainer.max_epochs == 4


def test_a_validation_interval_longer_than_the_epoch_is_one_config_error_before_any_step(tmp_path):
    """8 rows in micro-batches of 2: 4 batches per epoch (by hand). Lightning counts a
    ``val_check_interval`` within each epoch and raises a ``ValueError`` at the start of ``fit`` for 5; here
    it is one ConfigError with what works instead, before any step. 4 runs."""
    from hf_lightning.core.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        fit(tmp_path, 8, 1, max_steps=3, val_check_interval=5)
    assert str(err.value) == (
        "trainer.val_check_interval=5 is more than the 4 optimizer steps of an epoch on this process, and "
        "Lightning counts it within each epoch; use at most 4, a fraction of the epoch (0.5), "
        "trainer.check_val_every_n_epoch=null to count steps across epochs, or eval_steps=5 (optimizer "
        "steps over the whole run, HF's)"
    )
    trainer, _ = fit(tmp_path, 8, 1, max_steps=3, val_check_interval=4)
    assert trainer.global_step == 3
    # across epochs, or with validation off, Lightning takes it
    assert (
        fit(tmp_path, 8, 1, max_steps=3, val_check_interval=5, check_val_every_n_epoch=None)[0].global_step
        == 3
    )
    assert fit(tmp_path, 8, 1, max_steps=3, val_check_interval=5, limit_val_batches=0)[0].global_step == 3
    # a time-based interval is Lightning's to schedule (it sets no val_check_interval attribute then)
    assert fit(tmp_path, 8, 1, max_steps=3, val_check_interval="00:00:00:05")[0].global_step == 3
