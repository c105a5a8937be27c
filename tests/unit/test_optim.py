"""``optim.name`` / ``scheduler.name``: what each HF name builds, and the one-line refusals.

The expected objects are HF's own: ``Trainer.get_optimizer_cls_and_kwargs`` (class and keyword arguments) and
``transformers.get_scheduler`` (the rate of every step), called here side by side.
"""

from __future__ import annotations

import logging
import math

import pytest
import torch
from transformers import Trainer, TrainingArguments, get_scheduler

from hf_lightning.core.errors import ConfigError
from hf_lightning.module.optim import build_optimizer, parse_optim_args
from hf_lightning.module.schedules import build_scheduler, metric_key, step_on_validation
from tests.data_support import tiny_llama

CPU_NAMES = ("adamw_torch", "adamw_torch_fused", "adafactor", "sgd", "adagrad", "rmsprop")


@pytest.fixture(scope="module")
def model():
    return tiny_llama(
        vocab_size=40,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
    ).train()


@pytest.mark.parametrize(
    ("name", "optim_args"),
    [(n, None) for n in CPU_NAMES]
    + [
        ("sgd", "momentum=0.9,nesterov=True,dampening=0.0"),
        ("adagrad", "lr_decay=0.01,eps=1e-9"),
        ("rmsprop", "momentum=0.5,alpha=0.9,centered=True"),
    ],
)
def test_each_name_builds_what_hf_trainer_builds(model, tmp_path, name, optim_args):
    args = TrainingArguments(
        output_dir=str(tmp_path), optim=name, optim_args=optim_args, learning_rate=2e-3, use_cpu=True
    )
    hf_cls, hf_kwargs = Trainer.get_optimizer_cls_and_kwargs(args, model)
    ours = build_optimizer(model, name=name, lr=2e-3, weight_decay=0.1, kwargs=optim_args)
    assert type(ours) is hf_cls
    for key, value in hf_kwargs.items():
        got = ours.defaults[key]
        assert (tuple(got) if isinstance(got, (list, tuple)) else got) == value, key


def test_the_default_adamw_is_hf_trainers_default_optimizer_where_the_kernel_applies(model, tmp_path):
    """``adamw`` builds what HF ``Trainer`` builds with its default ``optim`` (``adamw_torch_fused``) for a
    CPU model; on parameters the fused kernel does not take (the meta device here) torch chooses."""
    args = TrainingArguments(output_dir=str(tmp_path), learning_rate=2e-3, use_cpu=True)
    assert args.optim == "adamw_torch_fused"
    hf_cls, hf_kwargs = Trainer.get_optimizer_cls_and_kwargs(args, model)
    ours = build_optimizer(model, lr=2e-3)
    assert type(ours) is hf_cls and ours.defaults["fused"] is hf_kwargs["fused"] is True
    with torch.device("meta"):
        elsewhere = torch.nn.Linear(4, 4)
    assert build_optimizer(elsewhere, lr=2e-3).defaults["fused"] is False
    assert build_optimizer(model, lr=2e-3, fused=False).defaults["fused"] is False


def test_hf_optim_args_string_is_read_with_types():
    assert parse_optim_args("momentum=0.9, nesterov=true,steps=3,mode=max") == {
        "momentum": 0.9,
        "nesterov": True,
        "steps": 3,
        "mode": "max",
    }
    with pytest.raises(ConfigError, match="optim.kwargs='momentum': 'momentum' is not key=value"):
        parse_optim_args("momentum")


def test_any_optimizer_class_by_target_with_partial(model):
    node = {"_target_": "torch.optim.NAdam", "_partial_": True, "momentum_decay": 0.005}
    optimizer = build_optimizer(model, name=None, lr=1e-3, weight_decay=0.1, optimizer=node)
    assert type(optimizer) is torch.optim.NAdam
    assert optimizer.defaults["momentum_decay"] == 0.005 and optimizer.defaults["lr"] == 1e-3
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.1, 0.0]  # HF's decay groups


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"name": "sgd", "betas": [0.9, 0.95]},
            r"optim.betas=\[0.9, 0.95\] does not apply to optim.name=sgd",
        ),
        ({"name": "adafactor", "eps": 1e-6}, "optim.eps=1e-06 does not apply to optim.name=adafactor"),
        ({"name": "adamw", "momentum": 0.9}, "optim.momentum=0.9 does not apply to optim.name=adamw"),
        (
            {"name": "adamw", "kwargs": {"nesterov": True}},
            "optim.kwargs.nesterov=true: optim.name=adamw takes no",
        ),
        ({"name": "sgd", "kwargs": {"lr": 1.0}}, "optim.kwargs.lr: set by optim.lr"),
        (
            {"name": "sgd", "kwargs": "weight_decay=0.1"},
            "optim.kwargs.weight_decay: set by optim.weight_decay",
        ),
        (
            {"name": "sgd", "momentum": 0.9, "kwargs": {"momentum": 0.5}},
            "optim.kwargs.momentum is given twice",
        ),
        ({"name": "adamw_8bit"}, "optim.name=adamw_8bit is a bitsandbytes optimizer and runs on CUDA only"),
        ({"name": "lion_8bit"}, "optim.name=lion_8bit is a bitsandbytes optimizer and runs on CUDA only"),
        (
            {"name": "adamw", "optimizer": {"_target_": "torch.optim.NAdam"}},
            "optim.name='adamw' and optim.optimizer both choose the optimizer; set optim.name=null",
        ),
        (
            {"name": None, "optimizer": {"_target_": "torch.optim.Nope"}},
            "optim.optimizer._target_='torch.optim.Nope'",
        ),
        (
            {"name": None, "optimizer": {"_target_": "torch.optim.NAdam", "lr": 1.0}},
            "optim.optimizer.lr: set by optim.lr",
        ),
        ({"name": None}, r"optim.name=null needs optim.optimizer._target_=<an optimizer class>"),
    ],
)
def test_optimizer_refusals_are_one_line(model, kwargs, message):
    with pytest.raises(ConfigError, match=message) as err:
        build_optimizer(model, lr=1e-3, **kwargs)
    assert "\n" not in str(err.value)


SCHEDULE_KWARGS = {
    "cosine_with_restarts": {"num_cycles": 3},
    "polynomial": {"power": 2.0, "lr_end": 1e-5},
    "inverse_sqrt": {"timescale": 4},
    "cosine_with_min_lr": {"min_lr_rate": 0.1},
    "cosine_warmup_with_min_lr": {"min_lr": 1e-4},
    "warmup_stable_decay": {"num_decay_steps": 5, "decay_type": "linear"},
}


@pytest.mark.parametrize(
    "name",
    ["linear", "cosine", "constant_with_warmup", *SCHEDULE_KWARGS],
)
def test_every_schedule_gives_get_schedulers_rates(model, name):
    """20 steps, 3 of warmup: the rate of every step equals ``transformers.get_scheduler``'s with the same
    kwargs."""

    def rates(make):
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
        scheduler = make(optimizer)
        out = []
        for _ in range(20):
            out.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            scheduler.step()
        return out

    kwargs = SCHEDULE_KWARGS.get(name, {})
    ours = rates(lambda o: build_scheduler(o, 20, name=name, warmup_steps=3, kwargs=dict(kwargs)))
    hf = rates(
        lambda o: get_scheduler(
            name, o, num_warmup_steps=3, num_training_steps=20, scheduler_specific_kwargs=dict(kwargs)
        )
    )
    assert ours == hf
    assert len(set(ours)) > 3


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"name": "cosine_with_min_lr"},
            "scheduler.name=cosine_with_min_lr with scheduler.kwargs={}: One of min_lr",
        ),
        ({"name": "warmup_stable_decay"}, "missing 1 required positional argument: 'num_decay_steps'"),
        (
            {"name": "linear", "kwargs": {"power": 2}},
            "scheduler.kwargs.power: scheduler.name=linear takes no 'power'",
        ),
        ({"name": "polynomial", "kwargs": {"pow": 2}}, r"takes no 'pow' \(it takes: lr_end, power\)"),
        ({"name": "constant_with_warmup", "kwargs": {"x": 1}}, "this schedule takes none"),
        ({"name": "reduce_lr_on_plateau", "kwargs": {"patiense": 1}}, "takes no 'patiense'"),
        ({"name": "exponential"}, "scheduler.name='exponential': allowed values: linear,"),
    ],
)
def test_schedule_refusals_are_one_line(model, kwargs, message):
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    with pytest.raises(ConfigError, match=message) as err:
        build_scheduler(optimizer, 10, **kwargs)
    assert "\n" not in str(err.value)


def test_a_warmup_that_cannot_apply_is_said(model, caplog):
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    with caplog.at_level(logging.WARNING):
        scheduler = build_scheduler(optimizer, 10, name="reduce_lr_on_plateau", warmup_steps=4)
    assert isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
    assert "scheduler.name=reduce_lr_on_plateau has no warmup" in caplog.text and "(4 steps)" in caplog.text


@pytest.mark.parametrize("warmup", [{"warmup_steps": 20}, {"warmup_steps": 30}, {"warmup_ratio": 1.0}])
def test_a_warmup_as_long_as_the_run_is_said(model, caplog, warmup):
    """20 optimizer steps, 20 of them warm-up (sft's default warmup under trainer.max_steps=20): the rate
    rises to the end and never reaches optim.lr (by HF's linear warm-up, step s runs at lr * s / 20)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    with caplog.at_level(logging.WARNING):
        scheduler = build_scheduler(optimizer, 20, name="linear", **warmup)
    rates = []
    for _ in range(20):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert max(rates) < 1e-3
    lines = [r.getMessage() for r in caplog.records if "warm-up steps, the whole run" in r.getMessage()]
    assert len(lines) == 1 and "of 20 optimizer steps: the learning rate rises to the end" in lines[0]


def test_a_one_step_run_all_warm_up_is_said_in_the_singular(model, caplog):
    """Before: ``give 1 warm-up steps, the whole run of 1 optimizer steps``."""
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    with caplog.at_level(logging.WARNING):
        build_scheduler(optimizer, 1, name="linear", warmup_steps=1)
    assert (
        "scheduler.warmup_steps / warmup_ratio give 1 warm-up step, the whole run of 1 optimizer step: the "
        "learning rate rises to the end and never reaches optim.lr"
    ) in caplog.text


def test_a_warmup_shorter_than_the_run_says_nothing(model, caplog):
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    with caplog.at_level(logging.WARNING):
        build_scheduler(optimizer, 20, name="linear", warmup_steps=19)
    assert "warm-up" not in caplog.text


def test_the_plateau_metric_is_hfs_metric_for_best_model():
    assert metric_key(None) == "val/loss"  # HF: metric_for_best_model defaults to "loss" for this schedule
    assert metric_key("eval_accuracy") == "val/accuracy" and metric_key("loss") == "val/loss"
    assert metric_key("val/f1") == "val/f1"


def test_the_plateau_steps_on_the_named_metric_and_refuses_a_missing_one(model):
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    plateau = build_scheduler(
        optimizer, 10, name="reduce_lr_on_plateau", kwargs={"factor": 0.5, "patience": 0}
    )
    step_on_validation(plateau, {"val/loss": 2.0, "train/loss": 9.0}, "val/loss")
    step_on_validation(plateau, {"val/loss": 3.0}, "val/loss")  # worse: a plateau with patience 0
    assert optimizer.param_groups[0]["lr"] == 0.5
    with pytest.raises(
        ConfigError, match=r"val/bleu drives the learning-rate schedule but validation logged only"
    ):
        step_on_validation(plateau, {"val/loss": 1.0, "val/accuracy": 0.5}, "val/bleu")


@pytest.mark.parametrize("experiment", ["sft", "seq2seq", "classification"])
@pytest.mark.parametrize("choice", ["cosine", "reduce_lr_on_plateau", "cosine_with_min_lr"])
def test_a_scheduler_group_choice_wins_over_the_experiment(compose_cfg, experiment, choice):
    """Before: every experiment set ``scheduler.name: linear`` after the group choice, so ``scheduler=cosine``
    trained with ``linear``, silently."""
    cfg = compose_cfg(f"+experiment={experiment}", f"scheduler={choice}")
    assert cfg.scheduler.name == choice


@pytest.mark.parametrize("name", ["adafactor", "rmsprop", "sgd"])
def test_migrate_carries_every_optim_name_over(tmp_path, capsys, name):
    """Before: every HF name but adamw_torch(_fused) and sgd became adamw ("not carried over"); HF reads the
    Adam betas for the AdamW names only, so they are not written for these."""
    from hf_lightning.migrate import main

    args = TrainingArguments(output_dir=str(tmp_path / "o"), optim=name, adam_beta2=0.95)
    path = tmp_path / "args.json"
    path.write_text(args.to_json_string())
    assert main([str(path)]) == 0
    out = capsys.readouterr().out
    assert f"optim.name={name}" in out and "not carried over" not in out and "optim.betas" not in out


def test_a_decay_longer_than_the_run_is_said_with_the_rate_it_gives(model, caplog):
    """warmup_stable_decay, 20 steps, 2 of warm-up, num_decay_steps=100: HF's stable phase is
    20 - 2 - 100 = -82 steps, so right after the warm-up the cosine decay is already at
    (2 - 2 + 82) / 100 = 0.82 of its way: 0.5 * (1 + cos(pi * 0.82)) of optim.lr, never optim.lr itself."""
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    with caplog.at_level(logging.WARNING):
        scheduler = build_scheduler(
            optimizer, 20, name="warmup_stable_decay", warmup_steps=2, kwargs={"num_decay_steps": 100}
        )
    rates = []
    for _ in range(20):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    expected = 0.5 * (1 + math.cos(math.pi * 0.82))
    assert rates[2] == pytest.approx(1e-3 * expected, rel=1e-6)
    lines = [r.getMessage() for r in caplog.records if "does not fit the run" in r.getMessage()]
    assert lines == [
        "scheduler.kwargs.num_decay_steps=100 does not fit the run: 2 warm-up and 100 decay steps are more "
        "than its 20 optimizer steps, so the decay starts part-way through and the rate after the warm-up "
        f"is {expected:.3g} of optim.lr; set scheduler.kwargs.num_decay_steps=18 or lower"
    ]


def test_a_decay_that_fits_the_run_says_nothing(model, caplog):
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    with caplog.at_level(logging.WARNING):
        build_scheduler(
            optimizer, 20, name="warmup_stable_decay", warmup_steps=2, kwargs={"num_decay_steps": 18}
        )
    assert "does not fit" not in caplog.text
