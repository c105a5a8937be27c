"""The one builder (``hf_lightning.config.build``): every group names what it builds, ``evaluate`` and
``inspect`` get their objects the way ``train`` does, and a run saved before the groups had ``_target_``
resumes."""

from __future__ import annotations

import json

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from hf_lightning.config.compose import CONF_DIR
from hf_lightning.core.errors import ConfigError
from tests.conftest import SHRINK

EXPERIMENTS = ("clm", "sft", "seq2seq", "classification")


def compose_evaluate(tmp_path, *overrides):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("evaluate", overrides=[*SHRINK, *overrides])
    OmegaConf.set_struct(cfg, False)
    cfg.output_dir = str(tmp_path)
    return cfg


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "eval.jsonl"
    path.write_text("".join(json.dumps({"text": f"Sentence number {i} is here."}) + "\n" for i in range(6)))
    return path


@pytest.mark.parametrize("experiment", [None, *EXPERIMENTS])
def test_every_group_names_what_it_builds(compose_cfg, experiment):
    cfg = compose_cfg(*([f"+experiment={experiment}"] if experiment else []))
    expected = {
        "model": ("hf_lightning.models.loading.ModelLoader", False),
        "data": ("hf_lightning.HFDataModule", True),
        "optim": ("hf_lightning.module.optim.build_optimizer", True),
        "scheduler": ("hf_lightning.module.optim.build_scheduler", True),
        "module": ("hf_lightning.HFLightningModule", True),
        "trainer": ("lightning.Trainer", False),
    }
    for group, (target, partial) in expected.items():
        assert cfg[group].get("_target_") == target, group
        assert bool(cfg[group].get("_partial_", False)) is partial, group


def test_evaluate_builds_module_precision_and_accelerator_from_the_config(tmp_path, text_file):
    from hf_lightning.config.build import build

    cfg = compose_evaluate(
        tmp_path,
        "+experiment=clm",
        f"data.path={text_file}",
        "module.label_smoothing_factor=0.125",
        "module.average_tokens_across_devices=false",
        "trainer.precision=bf16-mixed",
        "data.packing=bfd",
        "data.group_by_length=true",
    )
    run = build(cfg, "evaluate")
    assert run.module.label_smoothing_factor == 0.125 and run.module.average_tokens_across_devices is False
    assert run.trainer.precision == "bf16-mixed" and run.trainer.num_devices == 1
    assert run.trainer.checkpoint_callback is None and run.trainer.loggers == []
    # evaluation reads the file as its validation data, in order, one example per row
    assert run.datamodule.validation_path == str(text_file)
    assert not run.datamodule.packing and run.datamodule.group_by_length is False


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (
            ["trainer.devices=2"],
            "trainer.devices=2 with trainer.num_nodes=1: python -m hf_lightning.evaluate runs",
        ),
        (["trainer.num_nodes=2"], "trainer.devices=1 with trainer.num_nodes=2"),
        (["trainer.precision=16-mixed"], "trainer.precision=16-mixed on trainer.accelerator=cpu"),
        (["+learning_rate=5e-5"], "learning_rate is HF's name: use optim.lr=5e-05"),
    ],
)
def test_evaluate_refuses_what_it_cannot_do_in_one_line(tmp_path, text_file, overrides, named):
    from hf_lightning.config.build import build

    cfg = compose_evaluate(tmp_path, "+experiment=clm", f"data.path={text_file}", *overrides)
    with pytest.raises(ConfigError) as err:
        build(cfg, "evaluate")
    assert named in str(err.value) and "\n" not in str(err.value)


def test_evaluate_without_trained_weights_is_refused_in_one_line(tmp_path, text_file):
    # the experiments' default model is randomly initialised: scoring it wrote eval_metrics.json, exit 0
    from hf_lightning.evaluate import evaluate

    cfg = compose_evaluate(tmp_path, "+experiment=clm", f"data.path={text_file}")
    with pytest.raises(ConfigError) as err:
        evaluate(cfg)
    assert str(err.value).startswith("nothing trained to evaluate: model.name_or_path is null and no ckpt")
    assert not (tmp_path / "eval_metrics.json").exists()


@pytest.mark.parametrize("override", ["generate=no", "generate=1", "max_new_tokens=0", "max_new_tokens=abc"])
def test_evaluate_switches_are_checked(tmp_path, text_file, override):
    # generate=no used to generate (a non-empty string is true)
    from hf_lightning.config.build import build

    cfg = compose_evaluate(tmp_path, "+experiment=clm", f"data.path={text_file}", override)
    with pytest.raises(ConfigError) as err:
        build(cfg, "evaluate")
    key = override.split("=")[0]
    assert f"{key}=" in str(err.value) and "allowed values: " in str(err.value)


def test_inspect_builds_one_cpu_process_whatever_the_trainer_says(compose_cfg, tmp_path, text_file):
    from hf_lightning.config.build import build

    cfg = compose_cfg("+experiment=clm", f"data.path={text_file}", "data.gradient_accumulation_steps=3")
    run = build(cfg, "inspect")
    assert run.trainer.num_devices == 1 and run.datamodule.gradient_accumulation_steps == 3
    assert run.datamodule.trainer is run.trainer and run.trainer.lightning_module is run.module


def test_a_run_saved_before_the_groups_had_targets_is_the_same_run():
    """``ckpt_path=last`` compares identity settings; ``_target_``/``_partial_`` say how a node is built, not
    what the run is, so a run folder written before they existed still resumes."""
    from hf_lightning.run.folder import config_differences

    settings = {
        "model": {"name_or_path": None, "task": "causal_lm"},
        "data": {"path": "a.jsonl", "max_length": 64},
        "optim": {"name": "adamw", "lr": 1e-3},
        "scheduler": {"name": "linear", "warmup_steps": 2},
        "module": {"label_smoothing_factor": 0.0},
        "seed": 1,
    }
    saved = OmegaConf.create(settings)
    current = OmegaConf.create(settings)
    current.model._target_ = "hf_lightning.models.loading.ModelLoader"
    for group, target in (("data", "hf_lightning.HFDataModule"), ("optim", "x.build_optimizer")):
        current[group]._target_ = target
        current[group]._partial_ = True
    assert config_differences(saved, current) == []
    current.optim.lr = 2e-3  # a real difference is still one
    assert config_differences(saved, current) == ["optim.lr: 0.001 -> 0.002"]


def test_train_builds_hf_steps_and_the_best_model_from_the_hf_keys(compose_cfg, text_file):
    """``eval_steps`` / ``save_steps`` / ``load_best_model_at_end`` reach the trainer as HF's step callback
    and the best-model keeper (the builder once dropped the schedule: the steps were ignored, and
    ``load_best_model_at_end=true`` died on an IndexError)."""
    from hf_lightning.callbacks.hf_steps import HFSteps
    from hf_lightning.callbacks.load_best import LoadBestModel
    from hf_lightning.config.build import build

    cfg = compose_cfg(
        "+experiment=clm",
        f"data.path={text_file}",
        "trainer.max_steps=12",
        "eval_steps=3",
        "save_steps=6",
        "load_best_model_at_end=true",
    )
    run = build(cfg, "train")
    kinds = [type(c) for c in run.trainer.callbacks]
    assert HFSteps in kinds and LoadBestModel in kinds
    assert kinds.index(LoadBestModel) < kinds.index(HFSteps)  # the best state is kept before HFSteps saves
