"""scripts/gpu_smoke.py and scripts/gpu_bench.py: they run on a CUDA machine, and stop with one line anywhere
else. On the CPU: that line, their arguments, the runs they compose (FSDP on the GPUs present, bf16 + compile
on padding-free rows), and the MFU arithmetic of scripts/gpu_support.py against numbers worked by hand."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
NEEDS_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def run_script(name, *args, cwd):
    return subprocess.run(
        [sys.executable, str(SCRIPTS / f"{name}.py"), *args],
        capture_output=True,
        text=True,
        timeout=1800,
        cwd=cwd,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )


@pytest.fixture
def scripts_on_path(monkeypatch):
    """The scripts import their sibling ``gpu_support`` (``sys.path[0]`` when run as scripts)."""
    monkeypatch.syspath_prepend(str(SCRIPTS))
    for name in ("gpu_support", "bench_support"):
        sys.modules.pop(name, None)


def script(name):
    import runpy

    return runpy.run_path(str(SCRIPTS / f"{name}.py"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without CUDA")
@pytest.mark.parametrize("name", ["gpu_smoke", "gpu_bench"])
def test_one_line_without_cuda(name, tmp_path):
    proc = run_script(name, cwd=tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        f"{name}: FAILED: no CUDA device (torch.cuda.is_available() is False); run it on a GPU machine"
    ]
    assert proc.stdout == ""


def test_gpu_smoke_runs_compose_here(compose_cfg, scripts_on_path):
    """Each run of gpu_smoke.py composes (the GPU-only ones are refused by the schema on this CPU, not
    here), its placeholders filled as the script fills them."""
    smoke = script("gpu_smoke")
    assert set(smoke["NEEDS"]) <= set(smoke["RUNS"])
    for name, overrides in smoke["RUNS"].items():
        overrides = smoke["fill"](overrides, "/tmp/cpu_fp32/hf_model", "flash_attention_2", 2, 2)
        assert not any("{" in o for o in overrides), overrides
        cfg = compose_cfg(*smoke["COMMON"], *overrides, shrink=False)
        assert cfg.trainer.accelerator == ("cpu" if name.endswith("cpu_fp32") else "gpu"), name
    assert compose_cfg(*smoke["RUNS"]["gpu_adamw_8bit"], shrink=False).optim.name == "adamw_8bit"
    fsdp = compose_cfg(
        *smoke["COMMON"], *smoke["fill"](smoke["RUNS"]["fsdp"], "", "sdpa", 2, 2), shrink=False
    )
    assert "fsdp" in fsdp.trainer.strategy._target_.lower()
    assert (fsdp.trainer.devices, fsdp.data.per_device_train_batch_size) == (2, 2)  # 4 rows, as the reference
    fast = compose_cfg(
        *smoke["COMMON"],
        *smoke["fill"](smoke["RUNS"]["gpu_bf16_compiled_padding_free"], "", "flash_attention_2", 1, 4),
        shrink=False,
    )
    assert fast.model.compile and fast.data.padding_free and fast.trainer.precision == "bf16-mixed"
    assert fast.model.attn_implementation == "flash_attention_2"


def test_gpu_bench_fsdp_run_composes_here(compose_cfg, scripts_on_path):
    bench = script("gpu_bench")
    args = bench["build_parser"]().parse_args(["--size", "160m", "--steps", "8", "--max-length", "512"])
    overrides = bench["fsdp_cli_overrides"](args, "/tmp/rows.jsonl", "/tmp/tok", 2, "sdpa", "/tmp/run")
    cfg = compose_cfg(*[o for o in overrides if not o.startswith("hydra.")], shrink=False)
    assert "fsdp" in cfg.trainer.strategy._target_.lower()
    assert cfg.trainer.devices == 2 and cfg.trainer.precision == "bf16-mixed" and cfg.trainer.max_steps == 8
    assert cfg.model.compile and cfg.data.padding_free and cfg.data.layout is None
    assert (cfg.model.config.hidden_size, cfg.model.config.num_hidden_layers) == (768, 12)
    assert cfg.model.config.tie_word_embeddings is False


def test_arguments(scripts_on_path):
    bench = script("gpu_bench")["build_parser"]()
    args = bench.parse_args([])
    assert (args.steps, args.batch_size, args.max_length, args.size, args.peak_tflops) == (
        40,
        16,
        1024,
        "160m",
        None,
    )
    assert bench.parse_args(["--peak-tflops", "500", "--skip-fsdp"]).peak_tflops == 500.0
    with pytest.raises(SystemExit):
        bench.parse_args(["--size", "7b"])
    smoke = script("gpu_smoke")["build_parser"]()
    args = smoke.parse_args(["--skip", "fsdp", "gpu_bf16_compiled_padding_free"])
    assert args.skip == ["fsdp", "gpu_bf16_compiled_padding_free"] and args.steps == 4
    with pytest.raises(SystemExit):
        smoke.parse_args(["--skip", "cpu_fp32"])  # the reference cannot be skipped


def test_mfu_by_hand(scripts_on_path):
    from gpu_support import mfu

    # 160M parameters, 1M real tokens in 10 s on one H100 (989 TFLOP/s dense bf16):
    # 6 x 1.6e8 x 1e6 = 9.6e14 FLOPs; / 10 s = 9.6e13 FLOP/s; / 9.89e14 = 96/989 = 0.09707
    assert mfu(160_000_000, 1_000_000, 10.0, 989e12) == pytest.approx(96 / 989, rel=1e-12)
    # the same tokens on 2 devices in the same time: half the utilization of each, 48/989
    assert mfu(160_000_000, 1_000_000, 10.0, 989e12, devices=2) == pytest.approx(48 / 989, rel=1e-12)
    # 1.2B parameters at 3,000 tokens/s on one A100 (312 TFLOP/s): 2.16e13 / 3.12e14 = 9/130 = 0.06923
    assert mfu(1_200_000_000, 3_000, 1.0, 312e12) == pytest.approx(9 / 130, rel=1e-12)
    with pytest.raises(ValueError):
        mfu(1, 1, 0.0, 1e12)


def test_peak_table_and_fallback(scripts_on_path):
    from gpu_support import peak_flops, table_peak_flops

    assert table_peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert table_peak_flops("NVIDIA H200") == 989e12
    assert table_peak_flops("NVIDIA A100-SXM4-80GB") == 312e12
    assert table_peak_flops("Tesla T4") is None  # the script then measures a bf16 matmul on the device
    assert peak_flops("Tesla T4", given_tflops=65.0) == (65e12, "--peak-tflops")
    assert peak_flops("NVIDIA H100 PCIe") == (756e12, "dense bf16 peak of NVIDIA H100 PCIe")


@pytest.mark.parametrize("count, expected", [(1, (1, 4)), (2, (2, 2)), (3, (2, 2)), (4, (4, 1)), (8, (4, 1))])
def test_fsdp_layout_keeps_the_global_micro_batch(count, expected, scripts_on_path):
    from gpu_support import fsdp_layout

    assert fsdp_layout(count) == expected
    devices, rows = expected
    assert devices * rows == 4 and devices <= count


@pytest.mark.gpu
@pytest.mark.slow
@NEEDS_CUDA
def test_gpu_smoke(tmp_path):
    import importlib.util

    skip = [] if _has_deepspeed() else ["deepspeed_zero2"]
    skip += [] if importlib.util.find_spec("bitsandbytes") else ["gpu_adamw_8bit"]
    proc = run_script("gpu_smoke", "--out", str(tmp_path), *(["--skip", *skip] if skip else []), cwd=tmp_path)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "gpu_smoke: OK" in proc.stdout


@pytest.mark.gpu
@pytest.mark.slow
@NEEDS_CUDA
def test_gpu_bench_reports_mfu(tmp_path):
    out = tmp_path / "gpu_bench.json"
    proc = run_script(
        "gpu_bench",
        "--steps",
        "8",
        "--batch-size",
        "4",
        "--max-length",
        "512",
        "--json",
        str(out),
        cwd=SCRIPTS.parent,
    )
    print(proc.stdout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(out.read_text())
    assert {"padded eager", "padded compiled", "packed eager", "packed compiled"} <= set(results)
    assert any(name.startswith("padding-free compiled") for name in results)
    assert any(name.startswith("fsdp x") for name in results)
    for r in results.values():
        assert 0 < r["mfu_6nd"] < 1
    # packing removes the padding a padded batch carries
    assert (
        results["packed eager"]["throughput/padding_share"]
        < results["padded eager"]["throughput/padding_share"]
    )


def _has_deepspeed() -> bool:
    from lightning.fabric.strategies.deepspeed import _DEEPSPEED_AVAILABLE

    return bool(_DEEPSPEED_AVAILABLE)
