"""The argument facts defined once (``hf_lightning.core.arguments``): the schema and the DeepSpeed config read
the same device count and the same precisions, so a value one accepts the other cannot refuse or misread."""

from __future__ import annotations

import pytest

from hf_lightning.core import arguments
from hf_lightning.core.errors import ConfigError
from hf_lightning.strategies import deepspeed

DEVICES = [1, 2, "2", "0,1", " 3 ", [0], [0, 2], "auto", -1, "-1", 0, "0", [], "", "a,b", -2, True, 1.5, [-1]]


@pytest.mark.parametrize(
    ("devices", "count"),
    [(1, 1), (2, 2), ("2", 2), ("0,1", 2), (" 3 ", 3), ([0], 1), ([0, 2], 2), ("auto", None), (-1, None)],
)
def test_device_count(devices, count):
    assert arguments.device_count(devices) == count


@pytest.mark.parametrize("devices", [0, "0", [], "", "a,b", -2, True, 1.5, [-1]])
def test_what_is_not_a_device_count(devices):
    with pytest.raises(ValueError):
        arguments.device_count(devices)


@pytest.mark.parametrize("devices", DEVICES, ids=repr)
def test_the_schema_and_deepspeed_agree_on_devices(devices):
    """Before: the schema refused ``"0"`` and ``[]`` while DeepSpeed's own parser read them as 0 devices
    (``train_batch_size=0``)."""
    args = dict(
        stage=2, micro_batch_size=2, gradient_accumulation_steps=3, max_grad_norm=1.0, precision="bf16-mixed"
    )
    try:
        config = deepspeed.deepspeed_config(**args, devices=devices, num_nodes=2)
    except ConfigError as err:
        assert not arguments.devices_ok(devices) and str(err).startswith(f"trainer.devices={devices!r}")
        return
    assert arguments.devices_ok(devices)
    count = arguments.device_count(devices)
    assert config.get("train_batch_size") == (None if count is None else 2 * 3 * count * 2)


def test_deepspeed_runs_the_projects_precisions_but_float64():
    assert tuple(p for p in arguments.PRECISIONS if p != "64-true") == deepspeed.PRECISIONS
