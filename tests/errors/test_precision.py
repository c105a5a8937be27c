"""Precision faults: a float16 precision on the CPU, and HF's precision names, each refused in one line that
names ``trainer.precision`` and the CPU's choice (``bf16-mixed``) before anything is built. Without the
refusal Lightning swaps ``16-mixed`` for ``bf16-mixed`` behind a warning, and runs ``16-true``'s float16
weights on the CPU without a loss scaler."""

from __future__ import annotations

import pytest
import torch

from hf_lightning import ConfigError
from hf_lightning.config.schema import validate_config

CPU_CHOICE = (
    "float16 runs on a GPU only; on the CPU use trainer.precision=bf16-mixed (bfloat16 autocast, float32 "
    "weights; or 32-true, bf16-true), or trainer=gpu on a machine with a GPU"
)


def refusal(compose_cfg, *overrides) -> str:
    cfg = compose_cfg("+experiment=clm", "data.path=rows.jsonl", *overrides)
    with pytest.raises(ConfigError) as info:
        validate_config(cfg)
    message = str(info.value)
    assert "\n" not in message  # one line: the command line prints it as is
    return message


@pytest.mark.parametrize("precision", ["16-mixed", "16-true"])
def test_float16_on_the_cpu_is_refused_naming_bf16_mixed(compose_cfg, precision):
    assert refusal(compose_cfg, f"trainer.precision={precision}") == (
        f"trainer.precision={precision} on trainer.accelerator=cpu: {CPU_CHOICE}"
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="auto is a GPU on this machine")
def test_float16_on_auto_without_a_gpu_is_refused(compose_cfg):
    assert refusal(compose_cfg, "trainer.accelerator=auto", "trainer.precision=16-mixed") == (
        "trainer.precision=16-mixed on trainer.accelerator=auto, the CPU on this machine (no GPU found): "
        f"{CPU_CHOICE}"
    )


@pytest.mark.parametrize("precision", ["bf16-mixed", "bf16-true", "32-true"])
def test_the_cpu_precisions_pass(compose_cfg, precision):
    cfg = compose_cfg("+experiment=clm", "data.path=rows.jsonl", f"trainer.precision={precision}")
    validate_config(cfg)  # no error


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            ["+fp16=true"],
            "fp16 is HF's name: use trainer=gpu trainer.precision=16-mixed on a GPU (on the CPU: "
            "trainer.precision=bf16-mixed)",
        ),
        (
            ["trainer.precision=fp16"],
            "trainer.precision='fp16': allowed values: 32, 32-true, bf16-mixed, 16-mixed, bf16-true, "
            "16-true, 64-true (HF's bf16: bf16-mixed; HF's fp16: 16-mixed on a GPU, bf16-mixed on the CPU)",
        ),
    ],
    ids=["hf_fp16", "precision_fp16"],
)
def test_hfs_fp16_gets_the_cpus_precision_too(compose_cfg, overrides, expected):
    assert refusal(compose_cfg, *overrides) == expected
