"""The DeepSpeed config is derived from ours (HF Trainer's "auto" fields), without a GPU or deepspeed."""

from __future__ import annotations

import json

import pytest

from hf_lightning.core.errors import ConfigError
from hf_lightning.strategies.deepspeed import deepspeed_config, world_size


def derive(**overrides):
    args = dict(
        stage=2,
        micro_batch_size=4,
        gradient_accumulation_steps=8,
        max_grad_norm=1.0,
        precision="bf16-mixed",
        devices=2,
        num_nodes=2,
    )
    args.update(overrides)
    return deepspeed_config(**args)


def test_derived_fields():
    assert derive() == {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 8,
        "train_batch_size": 4 * 8 * 2 * 2,  # micro-batch x accumulation x devices x nodes = 128
        "gradient_clipping": 1.0,
        "bf16": {"enabled": True},
        "fp16": {"enabled": False},
        "zero_optimization": {"stage": 2},
        "zero_allow_untested_optimizer": True,
    }


@pytest.mark.parametrize(
    ("precision", "bf16", "fp16"),
    [
        ("bf16-mixed", True, False),
        ("bf16-true", True, False),
        ("16-mixed", False, True),
        ("32-true", False, False),
        ("32", False, False),
    ],
)
def test_precision_sections(precision, bf16, fp16):
    cfg = derive(precision=precision)
    assert cfg["bf16"] == {"enabled": bf16} and cfg["fp16"] == {"enabled": fp16}


def test_stage3_gathers_16bit_weights_for_the_export_and_offloads():
    zero = derive(stage=3, offload_optimizer=True, offload_parameters=True)["zero_optimization"]
    assert zero["stage"] == 3 and zero["stage3_gather_16bit_weights_on_model_save"] is True
    assert zero["offload_optimizer"]["device"] == "cpu" and zero["offload_param"]["device"] == "cpu"


def test_no_clipping_and_unknown_world_size():
    cfg = derive(max_grad_norm=None, devices="auto")
    assert cfg["gradient_clipping"] == 0.0
    assert "train_batch_size" not in cfg  # known only once Lightning has counted the devices


@pytest.mark.parametrize(
    ("devices", "nodes", "expected"),
    [
        (1, 1, 1),
        (4, 2, 8),
        ("2", 1, 2),
        ("0,1,3", 1, 3),
        ([0, 1], 3, 6),
        ("auto", 1, None),
        (-1, 1, None),
    ],
)
def test_world_size(devices, nodes, expected):
    assert world_size(devices, nodes) == expected


def test_user_json_auto_fields_are_filled_and_extra_fields_kept(tmp_path):
    user = {
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "bf16": {"enabled": "auto"},
        "steps_per_print": 50,
        "zero_optimization": {"stage": 2, "overlap_comm": False, "reduce_bucket_size": 5e7},
    }
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(user))
    cfg = derive(user_config=str(path))
    assert cfg["train_micro_batch_size_per_gpu"] == 4 and cfg["gradient_accumulation_steps"] == 8
    assert (
        cfg["gradient_clipping"] == 1.0
        and cfg["bf16"] == {"enabled": True}
        and cfg["fp16"] == {"enabled": False}
    )
    assert cfg["train_batch_size"] == 128 and cfg["steps_per_print"] == 50
    assert cfg["zero_optimization"] == {"stage": 2, "overlap_comm": False, "reduce_bucket_size": 5e7}


def test_user_mapping_is_not_modified():
    user = {"gradient_clipping": "auto"}
    derive(user_config=user)
    assert user == {"gradient_clipping": "auto"}


@pytest.mark.parametrize(
    ("field", "value", "owner"),
    [
        ({"train_micro_batch_size_per_gpu": 16}, 16, "data.per_device_train_batch_size"),
        ({"gradient_accumulation_steps": 2}, 2, "data.gradient_accumulation_steps"),
        (
            {"train_batch_size": 64},
            64,
            "data.per_device_train_batch_size x data.gradient_accumulation_steps x devices",
        ),
        ({"gradient_clipping": 0.5}, 0.5, "module.max_grad_norm"),
        ({"fp16": {"enabled": True}}, True, "trainer.precision"),
        ({"zero_optimization": {"stage": 3}}, 3, "strategy (deepspeed_zero2 / deepspeed_zero3)"),
    ],
)
def test_a_conflicting_user_field_is_refused(field, value, owner):
    with pytest.raises(ConfigError) as info:
        derive(user_config=field)
    message = str(info.value)
    assert f"={value!r} conflicts with {owner}" in message


def test_owned_sections_are_refused():
    with pytest.raises(ConfigError, match=r"'optimizer' section, but optim\.\* owns it"):
        derive(user_config={"optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}})
    with pytest.raises(ConfigError, match=r"'scheduler' section, but scheduler\.\* owns it"):
        derive(user_config={"scheduler": {"type": "WarmupLR"}})


def test_bad_inputs(tmp_path):
    with pytest.raises(ConfigError, match=r"strategy.stage=1; allowed values: \[2, 3\]"):
        derive(stage=1)
    with pytest.raises(
        ConfigError, match="data.gradient_accumulation_steps=0; allowed values: an integer >= 1"
    ):
        derive(gradient_accumulation_steps=0)
    with pytest.raises(ConfigError, match="needs ZeRO stage 3"):
        derive(offload_parameters=True)
    with pytest.raises(ConfigError, match="no such file"):
        derive(user_config=str(tmp_path / "absent.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="not readable as JSON"):
        derive(user_config=str(bad))
