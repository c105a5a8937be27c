"""The lean loss over whole optimizer steps: the same gradient and logged loss as the plain path.

One optimizer step of ``HFLightningModule`` through a real ``lightning.Trainer`` on the rows of the tiny-Llama
case (unequal target counts), micro-batch 2 x accumulation 4 in one process and 2 gloo DDP ranks x 2 x 2, with
the lean loss (a few tokens per chunk) and with ``lean_loss=False``: every captured gradient (after
accumulation and DDP's all-reduce) and the logged ``train/loss`` agree to relative 1e-6 (fp32), for an untied
Llama, GPT-2 (tied head) and Gemma-2 (logit soft-capping). A peak-RSS check in fresh processes shows the
memory it saves.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.parity.lean_cases import make_arch_model
from tests.parity.tiny_llama_case import make_rows, read_logged_losses, relative_error, run_lightning_step

TOL = 1e-6
REPO = Path(__file__).resolve().parents[2]


def _state(arch):
    return {k: v.clone() for k, v in make_arch_model(arch).state_dict().items()}


def _step(tmp_path, arch, lean, label_smoothing=0.0):
    out = tmp_path / ("lean" if lean else "plain")
    out.mkdir()
    run_lightning_step(
        _state(arch),
        make_rows(),
        micro_batch=2,
        accumulation=4,
        outdir=out,
        model_factory=functools.partial(make_arch_model, arch),
        chunk_size=5 if lean else None,
        lean_loss=lean,
        label_smoothing_factor=label_smoothing,
    )
    return torch.load(out / "grads_rank0.pt"), read_logged_losses(out)


def _assert_same(grads, losses, ref_grads, ref_losses):
    whole, worst = relative_error(grads, ref_grads)
    print(f"lean vs plain: rel. gradient difference {whole:.2e} (worst tensor {worst:.2e})")
    assert whole <= TOL and worst <= TOL
    assert len(losses) == 1 and losses == pytest.approx(ref_losses, rel=TOL)


@pytest.mark.parametrize(
    "arch,label_smoothing",
    [
        ("llama", 0.0),
        pytest.param("llama", 0.1, marks=pytest.mark.slow),
        pytest.param("gpt2", 0.0, marks=pytest.mark.slow),
        pytest.param("gemma2", 0.0, marks=pytest.mark.slow),
    ],
)
def test_an_accumulated_step_equals_the_plain_path(tmp_path, arch, label_smoothing):
    grads, losses = _step(tmp_path, arch, lean=True, label_smoothing=label_smoothing)
    ref_grads, ref_losses = _step(tmp_path, arch, lean=False, label_smoothing=label_smoothing)
    _assert_same(grads, losses, ref_grads, ref_losses)


def _ddp(tmp_path, arch, lean):
    out = tmp_path / ("lean" if lean else "plain")
    out.mkdir()
    torch.save(_state(arch), out / "state.pt")
    (out / "rows.json").write_text(json.dumps(make_rows()))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    flags = ["--arch", arch] + (["--chunk", "3"] if lean else ["--plain"])
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "tests" / "parity" / "ddp_gradient_worker.py"),
            str(out / "state.pt"),
            str(out / "rows.json"),
            str(out),
            *flags,
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    if lean:
        assert "lean loss: on" in proc.stderr  # the INFO line of rank 0: the lean path ran
    return [torch.load(out / f"grads_rank{r}.pt") for r in (0, 1)], read_logged_losses(out)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("arch", ["llama", "gpt2", "gemma2"])
def test_two_ddp_ranks_equal_the_plain_path(tmp_path, arch):
    grads, losses = _ddp(tmp_path, arch, lean=True)
    ref_grads, ref_losses = _ddp(tmp_path, arch, lean=False)
    for rank in (0, 1):
        _assert_same(grads[rank], losses, ref_grads[rank], ref_losses)


def _probe(side: str) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "bench_memory.py"), "--probe", side, "llama32k", "2"],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_peak_memory_above_the_imports_drops_below_a_third():
    """Two optimizer steps of a tiny Llama with a 32,000-token vocabulary at 2,048 tokens per step, each side
    in a fresh process (``scripts/bench_memory.py --probe``): the plain path holds 250 MB logits, their
    log-softmax and their gradient; the lean path a few chunks of 32 x 32,000."""
    lean, plain = _probe("lean"), _probe("plain")
    print(
        f"peak RSS above the imports: lean {lean['above_kib'] // 1024} MiB, plain "
        f"{plain['above_kib'] // 1024} MiB"
    )
    assert plain["above_kib"] > 600 * 1024  # the control: the logits are there to save
    assert lean["above_kib"] < plain["above_kib"] / 3
