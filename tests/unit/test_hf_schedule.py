"""The HF run-level keys (``eval_steps``, ``save_steps``, ...): HF's rules, worked by hand.

Expected step lists follow ``DefaultFlowCallback.on_step_end`` / ``on_epoch_end`` of transformers, read by
hand: multiples of the interval over the whole run, plus the final step; ``epoch``: each epoch's last step
plus the final step; a ratio ``r < 1`` is ``ceil(max_steps * r)`` (``TrainerState.compute_steps``).
"""

from __future__ import annotations

import pytest

from hf_lightning.callbacks.hf_steps import fires
from hf_lightning.config.hf_args import StepSchedule, load_best_problem, resolve_schedule
from hf_lightning.core.errors import ConfigError


def schedule_steps(strategy, every, steps_per_epoch, max_steps):
    """The steps at which ``fires`` says yes over a run of ``max_steps`` with epochs of
    ``steps_per_epoch``."""
    return [
        s
        for s in range(1, max_steps + 1)
        if fires(strategy, every, s, epoch_end=s % steps_per_epoch == 0, final=s == max_steps)
    ]


def test_steps_count_over_the_whole_run_and_the_final_step_fires():
    # 8 steps per epoch, 19 steps: 5, 10, 15 cross epoch ends; 19 is not a multiple of 5 and still fires
    assert schedule_steps("steps", 5, 8, 19) == [5, 10, 15, 19]
    assert schedule_steps("steps", 10, 8, 20) == [10, 20]  # a multiple at the end fires once
    assert schedule_steps("epoch", None, 8, 19) == [8, 16, 19]
    assert schedule_steps("no", None, 8, 19) == []
    assert schedule_steps(None, 5, 8, 19) == []


def test_a_ratio_is_a_share_of_the_run_rounded_up():
    schedule = StepSchedule(eval_strategy="steps", eval_steps=0.25, logging_steps=0.1, save_steps=7)
    assert schedule.steps("eval", 19) == 5  # ceil(4.75)
    assert schedule.steps("logging", 19) == 2  # ceil(1.9)
    assert schedule.steps("save", 19) == 7
    assert schedule.steps("eval", 20) == 5


def test_defaults_resolve_as_hf():
    assert resolve_schedule({"eval_steps": 10}) == StepSchedule(
        "steps", 10, "steps", 10
    )  # saves follow evals
    assert resolve_schedule({"eval_strategy": "steps", "logging_steps": 4}) == StepSchedule(
        "steps", 4, "steps", 4, 4
    )  # HF: eval_steps falls back to logging_steps
    assert resolve_schedule({"eval_strategy": "epoch", "save_steps": 30}) == StepSchedule(
        "epoch", None, "steps", 30
    )
    assert resolve_schedule({}) == StepSchedule()


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        ({"eval_steps": 2.5}, r"eval_steps=2\.5: a value above 1 must be a whole number"),
        ({"eval_steps": 0}, r"eval_steps=0: allowed values"),
        ({"save_strategy": "best"}, r"save_strategy='best' is not supported"),
        (
            {"eval_strategy": "sometimes"},
            r"eval_strategy='sometimes': allowed values: null, steps, epoch, no",
        ),
        ({"eval_strategy": "steps"}, r"eval_strategy=steps needs eval_steps"),
        (
            {"eval_strategy": "epoch", "eval_steps": 5},
            r"eval_steps=5 with eval_strategy=epoch: the steps would",
        ),
        ({"load_best_model_at_end": True}, r"load_best_model_at_end=true needs evaluations"),
        (
            {"load_best_model_at_end": True, "eval_steps": 10, "save_steps": 15},
            r"save_steps=15 to be a multiple of eval_steps=10",
        ),
        (
            {"load_best_model_at_end": True, "eval_strategy": "epoch", "save_steps": 10},
            r"save_strategy equal to eval_strategy \(got steps and epoch\)",
        ),
    ],
)
def test_refusals_name_the_key(cfg, message):
    with pytest.raises(ConfigError, match=message):
        resolve_schedule(cfg)


def test_an_hf_key_and_the_lightning_knob_it_replaces_are_refused_together():
    with pytest.raises(ConfigError, match=r"eval_steps=10 and trainer.val_check_interval are both given"):
        resolve_schedule({"eval_steps": 10}, given={"eval_steps", "trainer.val_check_interval"})
    with pytest.raises(ConfigError, match=r"logging_steps=5 and trainer.log_every_n_steps are both given"):
        resolve_schedule({"logging_steps": 5}, given={"logging_steps", "trainer.log_every_n_steps"})
    # the experiment's val_check_interval is not the user's: the HF key simply wins
    assert resolve_schedule({"eval_steps": 10}, given={"eval_steps"}).eval_steps == 10


def test_load_best_model_at_end_runs_under_fsdp2_with_sharded_checkpoints_only():
    from omegaconf import OmegaConf

    def node(target, **kw):
        return OmegaConf.create({"_target_": target, **kw})

    assert load_best_problem(node("hf_lightning.strategies.fsdp_strategy", state_dict_type="sharded")) is None
    assert load_best_problem("ddp") is None
    assert load_best_problem(node("hf_lightning.strategies.fsdp_strategy", state_dict_type="full")) == (
        "load_best_model_at_end=true with strategy.state_dict_type=full: the best checkpoint would be one "
        "gathered file, which is not loaded back into the sharded model; use strategy.state_dict_type=sharded"
    )
    assert load_best_problem("deepspeed_stage_3") == (
        "load_best_model_at_end=true with trainer.strategy=deepspeed_stage_3: not supported yet (its "
        "checkpoints are sharded); use strategy=fsdp (FSDP2), or drop load_best_model_at_end and export "
        "checkpoints/best.ckpt yourself"
    )
    assert load_best_problem("fsdp").startswith("load_best_model_at_end=true with trainer.strategy=fsdp: ")
