"""A config group named on the command line wins over what ``+experiment=...`` sets for the same keys:
Hydra merges the experiment last, so without this ``trainer=debug`` would lose to sft silently."""

from __future__ import annotations


def trainer_of(compose_cfg, *overrides):
    return compose_cfg(*overrides, shrink=False).trainer


def test_the_named_group_wins_where_the_experiment_sets_the_same_keys(compose_cfg, capsys):
    trainer = trainer_of(compose_cfg, "+experiment=sft", "trainer=debug")
    # debug.yaml: max_epochs 1, max_steps 4, val_check_interval 2, log_every_n_steps 1; sft: 4, -, 0.5, 5
    assert (trainer.max_epochs, trainer.max_steps, trainer.val_check_interval, trainer.log_every_n_steps) == (
        1,
        4,
        2,
        1,
    )
    note = capsys.readouterr().err
    assert note.startswith("hf_lightning: note: a group named on the command line wins over the experiment: ")
    assert "trainer.log_every_n_steps: 5 -> 1 (trainer=debug over +experiment=sft)" in note


def test_a_key_on_the_command_line_wins_over_both(compose_cfg):
    trainer = trainer_of(compose_cfg, "+experiment=sft", "trainer=debug", "trainer.val_check_interval=3")
    assert trainer.val_check_interval == 3 and trainer.log_every_n_steps == 1


def test_keys_the_named_group_does_not_set_stay_the_experiments(compose_cfg):
    # gpu.yaml sets the accelerator, devices and precision only (the rest comes from cpu.yaml, its default)
    trainer = trainer_of(compose_cfg, "+experiment=sft", "trainer=gpu")
    assert (trainer.accelerator, trainer.precision) == ("gpu", "bf16-mixed")
    assert (trainer.max_epochs, trainer.val_check_interval, trainer.log_every_n_steps) == (4, 0.5, 5)


def test_without_an_experiment_nothing_changes(compose_cfg, capsys):
    trainer = trainer_of(compose_cfg, "trainer=debug")
    assert (trainer.val_check_interval, trainer.log_every_n_steps) == (2, 1)
    assert capsys.readouterr().err == ""
