"""The schema pass stops a bad config with one message that names the key and the allowed values, before any
model is built."""

from __future__ import annotations

import json

import pytest

from hf_lightning.config import validate_config
from hf_lightning.core.errors import ConfigError


def rejected(compose_cfg, *overrides) -> str:
    cfg = compose_cfg("+experiment=sft", *overrides)
    with pytest.raises(ConfigError) as info:
        validate_config(cfg)
    message = str(info.value)
    assert "\n" not in message  # one line: the CLI prints it as is
    return message


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            ["data.per_device_train_batch_size=-4"],
            "data.per_device_train_batch_size=-4: allowed values: an integer >= 1",
        ),
        (
            ["data.per_device_eval_batch_size=0"],
            "data.per_device_eval_batch_size=0: allowed values: an integer >= 1",
        ),
        (
            ["data.gradient_accumulation_steps=0"],
            "data.gradient_accumulation_steps=0: allowed values: an integer >= 1",
        ),
        (
            ["optim.name=adam"],
            "optim.name='adam': allowed values: adamw, adamw_torch, adamw_torch_fused, adafactor, sgd, "
            "adagrad",
        ),
        (
            ["optim.name=adamw_8bit"],
            "optim.name=adamw_8bit is a bitsandbytes optimizer and runs on CUDA only "
            "(trainer.accelerator=cpu)",
        ),
        (
            ["scheduler=reduce_lr_on_plateau", "trainer.limit_val_batches=0"],
            "scheduler.name=reduce_lr_on_plateau steps on a validation metric after each validation, but "
            "validation is off (trainer.limit_val_batches=0)",
        ),
        (
            ["scheduler.name=greedy", "data.validation_split=0"],
            "scheduler.name=greedy steps on a validation metric after each validation, but validation is off "
            "(data.validation_split=0)",
        ),
        (["optim.betas=[0.9,1.5]"], "optim.betas=[0.9, 1.5]: allowed values: null or two numbers in [0, 1)"),
        (
            ["scheduler.name=step"],
            "scheduler.name='step': allowed values: linear, cosine, cosine_with_restarts, polynomial, "
            "constant",
        ),
        (["optim.lr=-0.1"], "optim.lr=-0.1: allowed values: a finite number >= 0"),
        (["optim.lr=inf"], "optim.lr=inf: allowed values: a finite number >= 0"),
        (["optim.lr=nan"], "optim.lr=nan: allowed values: a finite number >= 0"),
        (
            ["trainer.limit_train_batches=0"],
            "trainer.limit_train_batches=0: allowed values: null (every batch), a "
            "fraction in (0, 1] or a count >= 1: 0 trains nothing (to only evaluate, use python -m "
            "hf_lightning.evaluate)",
        ),
        (
            ["trainer.limit_train_batches=0.0"],
            "trainer.limit_train_batches=0.0: allowed values: null (every batch)",
        ),
        (
            ["trainer.precision=8-mixed"],
            "trainer.precision='8-mixed': allowed values: 32, 32-true, bf16-mixed",
        ),
        (["trainer.precision=16-mixed"], "trainer.precision=16-mixed on trainer.accelerator=cpu"),
        (["data.shuffle=maybe"], "data.shuffle='maybe': allowed values: true or false"),
        (["trainer.max_steps=0"], "trainer.max_steps=0: allowed values: -1 (no limit) or an integer >= 1"),
        (["trainer.devices=0"], "trainer.devices=0: allowed values: an integer >= 1, -1, 'auto'"),
        (
            ["strategy=fsdp", "trainer.strategy.offload=true"],
            "strategy.offload=true with trainer.accelerator=cpu: the parameters live on the CPU already",
        ),
        (
            ["strategy=fsdp", "trainer.strategy.state_dict_type=local"],
            "strategy.state_dict_type='local'; allowed values: ['sharded', 'full']",
        ),
    ],
    ids=lambda v: v[0] if isinstance(v, list) else None,
)
def test_bad_value_names_key_and_allowed_values(compose_cfg, overrides, expected):
    assert expected in rejected(compose_cfg, *overrides)


def test_unknown_keys_are_listed_with_the_allowed_keys(compose_cfg):
    message = rejected(compose_cfg, "+data.batch_size=4", "+trainer.max_step=3", "+optim.momentun=0.9")
    assert "unknown config key data.batch_size; allowed keys of data: path," in message
    assert "per_device_train_batch_size" in message
    # a single unknown key of a node names the closest allowed one
    for key, closest in (("trainer.max_step", "trainer.max_steps"), ("optim.momentun", "optim.momentum")):
        group = key.split(".")[0]
        assert f"unknown config key {key} (did you mean {closest}?); allowed keys of {group}:" in message


def test_unknown_key_of_a_target_node(compose_cfg):
    message = rejected(compose_cfg, "+callbacks.model_checkpoint.every_n_steps=5")
    assert "unknown config key callbacks.model_checkpoint.every_n_steps" in message
    assert "every_n_train_steps" in message


def test_every_problem_in_one_message(compose_cfg):
    message = rejected(
        compose_cfg,
        "data.per_device_train_batch_size=-1",
        "data.gradient_accumulation_steps=0",
        "optim.name=lion",
    )
    assert message.count("; ") == 2
    for key in (
        "data.per_device_train_batch_size=-1",
        "data.gradient_accumulation_steps=0",
        "optim.name='lion'",
    ):
        assert key in message


@pytest.mark.parametrize("packing", ["true", "bfd", "wrapped"])
def test_packing_with_an_encoder_decoder_is_refused(compose_cfg, packing):
    cfg = compose_cfg("+experiment=seq2seq", "data.path=pairs.jsonl", f"data.packing={packing}")
    with pytest.raises(
        ConfigError,
        match=r"data\.packing=.* with an encoder-decoder model \(model\.task=seq2seq_lm\)"
        r".*allowed values: false",
    ):
        validate_config(cfg)


def test_packing_with_an_encoder_decoder_folder_is_refused(compose_cfg, tmp_path):
    """The model type is read from the folder's config.json, without loading the model."""
    folder = tmp_path / "t5"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "t5", "is_encoder_decoder": True}))
    cfg = compose_cfg(
        "+experiment=clm", "data.path=x.jsonl", f"model.name_or_path={folder}", "data.packing=bfd"
    )
    with pytest.raises(ConfigError, match="with an encoder-decoder model"):
        validate_config(cfg)


def test_required_data_path_of_an_experiment(compose_cfg):
    for experiment in ("clm", "classification", "seq2seq"):
        with pytest.raises(ConfigError, match=r"data.path is required by this experiment \(set data.path="):
            validate_config(compose_cfg(f"+experiment={experiment}"))
    validate_config(compose_cfg("+experiment=clm", "data.path=corpus.jsonl"))


def test_a_conflicting_deepspeed_json_is_refused_at_config_time(compose_cfg, tmp_path):
    user = tmp_path / "ds.json"
    user.write_text(json.dumps({"train_micro_batch_size_per_gpu": 16, "zero_optimization": {"stage": 2}}))
    cfg = compose_cfg(
        "+experiment=sft",
        "trainer=gpu",
        "trainer.accelerator=gpu",
        "strategy=deepspeed_zero2",
        f"trainer.strategy.config={user}",
    )
    with pytest.raises(
        ConfigError,
        match=r"train_micro_batch_size_per_gpu=16 conflicts with "
        r"data.per_device_train_batch_size \(which gives 4\)",
    ):
        validate_config(cfg)


def test_the_schema_runs_before_the_model_is_built(compose_cfg, tmp_path):
    """A bad value and a model folder that does not exist: the value is reported, so nothing was loaded."""
    from hf_lightning.train import train

    cfg = compose_cfg(
        "+experiment=sft", f"model.name_or_path={tmp_path / 'absent'}", "data.gradient_accumulation_steps=0"
    )
    with pytest.raises(ConfigError, match="data.gradient_accumulation_steps=0") as info:
        train(cfg)
    assert "absent" not in str(info.value)
    assert not any(tmp_path.iterdir())  # no run folder content: not even a checkpoint directory


def test_valid_configs_pass(compose_cfg):
    validate_config(compose_cfg("+experiment=sft"))
    validate_config(
        compose_cfg(
            "+experiment=sft",
            "strategy=ddp",
            "trainer.devices=2",
            "trainer.precision=bf16-mixed",
            "optim=sgd",
            "scheduler=cosine",
            "logger=many",
            "trainer=debug",
        )
    )
    validate_config(
        compose_cfg(
            "+experiment=sft",
            "trainer=gpu",
            "trainer.accelerator=gpu",
            "strategy=fsdp",
            "trainer.precision=bf16-mixed",
        )
    )
    # float16 under FSDP2 is refused (a per-rank gradient scaler could skip a step on one rank only)
    message = rejected(
        compose_cfg, "trainer=gpu", "trainer.accelerator=gpu", "strategy=fsdp", "trainer.precision=16-mixed"
    )
    assert "float16 needs a gradient scaler" in message


def test_a_packing_value_outside_its_annotation_is_refused_before_anything_is_built(compose_cfg):
    """``HFDataModule``'s ``packing: bool | Literal["bfd", "wrapped"]`` is the allowed set the schema
    reads."""
    message = rejected(compose_cfg, "data.packing=greedy")
    assert "data.packing='greedy'" in message
    assert "allowed values: false, true (= bfd), bfd, wrapped" in message


# Lightning's numeric knobs and the seed: values Lightning takes at construction and then fails on (a
# ZeroDivisionError at the end of the first step, numpy's ValueError in seed_everything) or runs silently
# otherwise than asked (validating or logging at every step). Each is refused by the schema pass, before the
# run folder is touched. The texts are written by hand from Lightning's and numpy's rules.
LIGHTNING_KNOBS = [
    ("seed=-1", "seed=-1: allowed values: an integer in [0, 4294967295] (numpy's seed range"),
    ("seed=4294967296", "seed=4294967296: allowed values: an integer in [0, 4294967295]"),
    ("data.seed=-3", "data.seed=-3: allowed values: an integer >= 0"),
    (
        "trainer.val_check_interval=0",
        "trainer.val_check_interval=0: allowed values: null (once per epoch), an integer >= 1 (optimizer "
        "steps: each training batch is one; eval_steps counts them over the whole run), a fraction of the "
        "epoch in (0, 1], or a time ('DD:HH:MM:SS'); no validation: trainer.limit_val_batches=0",
    ),
    (
        "trainer.val_check_interval=0.0",
        "trainer.val_check_interval=0.0: allowed values: null (once per epoch)",
    ),
    ("trainer.val_check_interval=-2", "trainer.val_check_interval=-2: allowed values: null (once per epoch)"),
    (
        "trainer.val_check_interval=1.5",
        "trainer.val_check_interval=1.5: allowed values: null (once per epoch)",
    ),
    (
        "trainer.check_val_every_n_epoch=0",
        "trainer.check_val_every_n_epoch=0: allowed values: null "
        "(trainer.val_check_interval counts optimizer steps across epochs) or an integer >= 1",
    ),
    ("trainer.check_val_every_n_epoch=-1", "trainer.check_val_every_n_epoch=-1: allowed values: null"),
    ("trainer.log_every_n_steps=0", "trainer.log_every_n_steps=0: allowed values: an integer >= 1"),
    ("trainer.log_every_n_steps=-1", "trainer.log_every_n_steps=-1: allowed values: an integer >= 1"),
    ("trainer.max_steps=-2", "trainer.max_steps=-2: allowed values: -1 (no limit) or an integer >= 1"),
    ("trainer.min_steps=-1", "trainer.min_steps=-1: allowed values: null or an integer >= 0"),
    ("+trainer.min_epochs=-1", "trainer.min_epochs=-1: allowed values: null or an integer >= 0"),
    (
        "trainer.num_sanity_val_steps=-2",
        "trainer.num_sanity_val_steps=-2: allowed values: -1 (every validation batch) or an integer >= 0",
    ),
    (
        "trainer.limit_val_batches=-1",
        "trainer.limit_val_batches=-1: allowed values: null (every batch), a "
        "fraction in [0, 1] or a count >= 0",
    ),
    ("trainer.limit_val_batches=1.5", "trainer.limit_val_batches=1.5: allowed values: null (every batch)"),
    ("+trainer.limit_test_batches=-1", "trainer.limit_test_batches=-1: allowed values: null (every batch)"),
    ("+trainer.overfit_batches=-1", "trainer.overfit_batches=-1: allowed values: null (every batch)"),
    ("+trainer.max_time=-1", "trainer.max_time=-1: allowed values: null, 'DD:HH:MM:SS' or a mapping"),
    (
        "callbacks.model_checkpoint.every_n_train_steps=-1",
        "callbacks.model_checkpoint.every_n_train_steps=-1: "
        "allowed values: null or an integer >= 0 (0: no step-based saves)",
    ),
    (
        "callbacks.model_checkpoint.save_top_k=-2",
        "callbacks.model_checkpoint.save_top_k=-2: allowed values: -1 "
        "(every checkpoint), 0 (none but last.ckpt) or an integer >= 1",
    ),
    (
        "callbacks.early_stopping.patience=-1",
        "callbacks.early_stopping.patience=-1: allowed values: an integer >= 0",
    ),
]


@pytest.mark.parametrize(("override", "expected"), LIGHTNING_KNOBS, ids=[k for k, _ in LIGHTNING_KNOBS])
def test_a_lightning_knob_it_would_fail_on_is_refused_by_the_schema(compose_cfg, override, expected):
    extra = ["callbacks=early_stopping"] if override.startswith("callbacks.early_stopping") else []
    assert expected in rejected(compose_cfg, *extra, override)


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("trainer.max_steps=null", "trainer.max_steps=null: allowed values: -1 (no limit) or an integer"),
        ("optim.lr=null", "optim.lr=null: allowed values: a finite number >= 0"),
        ("data.max_length=null", "data.max_length=null: allowed values: an integer >= 1"),
        ("data.shuffle=null", "data.shuffle=null: allowed values: true or false"),
    ],
)
def test_a_null_value_is_said_as_the_command_line_spells_it(compose_cfg, override, expected):
    """Before: ``trainer.max_steps=None: ...``, Python's spelling of what the user typed as null."""
    message = rejected(compose_cfg, override)
    assert expected in message and "None" not in message


@pytest.mark.parametrize(
    "override",
    [
        "trainer.val_check_interval=2",
        "trainer.val_check_interval=2.0",  # a whole float: Lightning reads it as 2 batches
        "trainer.val_check_interval=0.25",
        "trainer.val_check_interval=1.0",
        "trainer.val_check_interval=null",
        "trainer.val_check_interval='00:00:05:00'",  # Lightning's time-based validation
        "trainer.check_val_every_n_epoch=null",
        "trainer.log_every_n_steps=1",
        "trainer.num_sanity_val_steps=-1",
        "trainer.limit_val_batches=0",
        "trainer.limit_val_batches=0.5",
        "+trainer.max_time='00:01:00:00'",
        "+trainer.max_time={hours: 1}",
        "trainer.min_steps=0",
        "seed=0",
        "seed=4294967295",
        "callbacks.model_checkpoint.save_top_k=-1",
        "callbacks.model_checkpoint.every_n_train_steps=0",
    ],
)
def test_what_lightning_takes_passes_the_schema(compose_cfg, override, tmp_path):
    """The rules refuse nothing Lightning runs as asked: each value passes the schema, and Lightning's own
    constructors (the oracle) take it."""
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint
    from omegaconf import OmegaConf

    cfg = compose_cfg("+experiment=sft", override)
    validate_config(cfg)
    L.seed_everything(cfg.seed, verbose=False)
    node = OmegaConf.to_container(cfg.trainer, resolve=True)
    knobs = {k: node[k] for k in node if k in override}
    L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, default_root_dir=tmp_path, **knobs)
    ModelCheckpoint(**{k: v for k, v in cfg.callbacks.model_checkpoint.items() if k in override})


def test_a_bad_seed_is_said_once_not_again_for_the_keys_that_repeat_it(compose_cfg):
    # data.seed is ${seed}: its own rule (>= 0) would repeat the refusal in other words
    assert rejected(compose_cfg, "seed=-1") == (
        "seed=-1: allowed values: an integer in [0, 4294967295] (numpy's seed range, which Lightning's "
        "seed_everything takes)"
    )
