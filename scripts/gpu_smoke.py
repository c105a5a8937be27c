"""GPU smoke test: a few optimizer steps each of bf16 single-GPU (with the lean loss, the default, and with
the loss from the full logits, ``module.lean_loss=false``; in the default layout, ``data.layout=auto``, and
padded, ``data.layout=null``), bitsandbytes' 8-bit AdamW
(``optim.name=adamw_8bit``: its checkpoint must hold uint8 optimizer state), FSDP and DeepSpeed ZeRO-2 (one
GPU is enough), with their per-step train/loss compared to the fp32 CPU run of the same data and init, within
bf16 tolerance, and their pre-clip ``grad_norm`` too (norm clipping at 1.0 is on, as HF's ``max_grad_norm``:
under FSDP2 the norm is reduced over every rank's gradient shards); each run's HF export
must load. Exits 1 on any failure, and at once, with one line, without CUDA.

``strategy=fsdp`` runs on the GPUs present (``trainer.devices``: the most of them that split the global
micro-batch of 4 rows evenly, so the losses stay comparable with the one-process reference); bf16 with
``model.compile=true`` runs padding-free batches (``data.padding_free=true``) under flash-attention 2 when the
``flash_attn`` package is installed, else SDPA (the script prints which).

Adapters: the fp32 CPU run's export is the pretrained base of LoRA in fp32 on CPU (the reference), LoRA in
bf16 on the GPU, and QLoRA (``peft=qlora``: the base in 4-bit NF4 with bitsandbytes), whose losses are
compared to the reference within ``--qlora-rtol`` (the 4-bit base is not the base); the QLoRA adapter export
must load with ``AutoPeftModelForCausalLM`` and its merged export (``export.merge_adapters=true``) with
``AutoModelForCausalLM``.

    python scripts/gpu_smoke.py [--steps 4] [--rtol 0.03] [--norm-rtol 0.1] [--qlora-rtol 0.15]
        [--out gpu_smoke]
        [--skip deepspeed_zero2 qlora]

Placeholders in :data:`RUNS`, filled by :func:`fill`: ``{base}`` (the cpu_fp32 run's export), ``{attn}``
(the attention kernel), ``{devices}`` / ``{micro}`` (the FSDP run's devices and rows per device).
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
from pathlib import Path

import torch
from gpu_support import attention_kernel, fsdp_layout, require_cuda

COMMON = [
    "+experiment=sft",
    "trainer.log_every_n_steps=1",
    "trainer.limit_val_batches=0",
    "data.shuffle=false",
    "scheduler.warmup_steps=0",
    "optim.lr=1e-3",
    "trainer.enable_progress_bar=false",
    # accumulation 2: the windows HFLightningModule steps (DDP no_sync, FSDP2's gradient sync switch,
    # DeepSpeed's boundary and loss scaling) are exercised, not just one micro-batch
    "data.per_device_train_batch_size=4",
    "data.gradient_accumulation_steps=2",
]
RUNS = {
    "cpu_fp32": ["trainer.accelerator=cpu", "trainer.precision=32-true"],
    # the lean loss (the default; DeepSpeed falls back to the logits) and the loss from the full
    # logits
    "gpu_bf16": ["trainer=gpu"],
    "gpu_bf16_logits": ["trainer=gpu", "module.lean_loss=false"],
    # +experiment=sft trains with data.layout=auto (packed per batch under SDPA): the padded batches of HF's
    # default layout must give the same losses
    "gpu_bf16_padded": ["trainer=gpu", "data.layout=null"],
    # HF's optim="adamw_8bit" (bitsandbytes): 8-bit state, so the losses track fp32 AdamW's within bf16
    # tolerance
    "gpu_adamw_8bit": ["trainer=gpu", "optim.name=adamw_8bit"],
    # bf16 + torch.compile on padding-free rows (one row per micro-batch, position_ids restarting per
    # document)
    "gpu_bf16_compiled_padding_free": [
        "trainer=gpu",
        "model.compile=true",
        "data.layout=null",
        "data.padding_free=true",
        "model.attn_implementation={attn}",
    ],
    # on the GPUs present, the same global micro-batch of 4 rows
    "fsdp": [
        "trainer=gpu",
        "strategy=fsdp",
        "trainer.devices={devices}",
        "data.per_device_train_batch_size={micro}",
    ],
    "deepspeed_zero2": ["trainer=gpu", "strategy=deepspeed_zero2"],
    # {base}: the cpu_fp32 run's export, a pretrained folder (QLoRA quantizes pretrained weights)
    "lora_cpu_fp32": [
        "trainer.accelerator=cpu",
        "trainer.precision=32-true",
        "peft=lora",
        "model.name_or_path={base}",
    ],
    "lora_gpu_bf16": ["trainer=gpu", "peft=lora", "model.name_or_path={base}"],
    "qlora": ["trainer=gpu", "peft=qlora", "model.name_or_path={base}"],
    "qlora_merged": ["trainer=gpu", "peft=qlora", "model.name_or_path={base}", "export.merge_adapters=true"],
}
# the run each is compared to (default: cpu_fp32)
REFERENCE = {"lora_gpu_bf16": "lora_cpu_fp32", "qlora": "lora_cpu_fp32", "qlora_merged": "lora_cpu_fp32"}


def fill(overrides: list[str], base: Path | str, attn: str, devices: int, micro: int) -> list[str]:
    """``overrides`` with the placeholders of :data:`RUNS` filled in."""
    values = {"{base}": str(base), "{attn}": attn, "{devices}": str(devices), "{micro}": str(micro)}
    out = []
    for override in overrides:
        for key, value in values.items():
            override = override.replace(key, value)
        out.append(override)
    return out


def load_export(name: str, folder: Path):
    """The run's ``hf_model/`` loaded as a user would: an adapter with ``AutoPeftModelForCausalLM``, a full or
    merged model with ``AutoModelForCausalLM``."""
    if (folder / "adapter_config.json").is_file():
        from peft import AutoPeftModelForCausalLM

        return AutoPeftModelForCausalLM.from_pretrained(folder)
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder)


def logged(run_dir: Path, column: str) -> dict[int, float]:
    with open(run_dir / "metrics.csv") as fh:
        return {int(r["step"]): float(r[column]) for r in csv.DictReader(fh) if r.get(column)}


def compare(
    name: str, column: str, got: dict[int, float], reference: dict[int, float], rtol: float
) -> list[str]:
    """The failures of one run's ``column`` against the fp32 CPU run's, step by step (printed as it goes)."""
    if not reference or sorted(got) != sorted(reference):
        return [f"{name}: {column} logged at steps {sorted(got)}, fp32 CPU at {sorted(reference)}"]
    worst = max(abs(got[s] - reference[s]) / abs(reference[s]) for s in reference)
    print(f"{name}: max relative {column} difference to fp32 CPU {worst:.2e} (tolerance {rtol:g})")
    return [f"{name}: relative {column} difference {worst:.2e} > {rtol:g}"] if worst > rtol else []


#: runs that need an optional package (``--skip`` them where it is not installed)
NEEDS = {"gpu_adamw_8bit": "bitsandbytes", "deepspeed_zero2": "deepspeed"}


def eight_bit_state(run_dir: Path) -> int:
    """How many uint8 tensors the optimizer state of ``last.ckpt`` holds (bitsandbytes' quantized moments)."""
    from hf_lightning.checkpointing.safe_load import load_checkpoint_file

    state = load_checkpoint_file(str(run_dir / "checkpoints" / "last.ckpt"))
    count = 0
    for optimizer in state.get("optimizer_states", []):
        for per_param in optimizer.get("state", {}).values():
            count += sum(1 for v in per_param.values() if torch.is_tensor(v) and v.dtype == torch.uint8)
    return count


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--rtol", type=float, default=0.03, help="bf16 vs fp32 relative tolerance per step")
    parser.add_argument(
        "--norm-rtol", type=float, default=0.1, help="bf16 vs fp32 relative grad_norm tolerance"
    )
    parser.add_argument(
        "--qlora-rtol",
        type=float,
        default=0.15,
        help="QLoRA (4-bit base) vs fp32 LoRA relative loss tolerance",
    )
    parser.add_argument("--out", default="gpu_smoke")
    parser.add_argument("--skip", nargs="*", default=[], choices=list(RUNS)[1:])
    return parser


def main() -> int:
    args = build_parser().parse_args()
    if not require_cuda("gpu_smoke"):
        return 1
    attn = attention_kernel()
    devices, micro = fsdp_layout(torch.cuda.device_count())
    print(
        f"gpu_smoke: {torch.cuda.get_device_name(0)} x {torch.cuda.device_count()}, "
        f"torch {torch.__version__}, {args.steps} steps per run; attention for padding-free: {attn}; "
        f"fsdp: {devices} device(s) x {micro} row(s)"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}  # every model here is local: never wait on the network
    base = Path(args.out).resolve() / "cpu_fp32" / "hf_model"
    results, norms, failures = {}, {}, []
    for name, overrides in RUNS.items():
        if name in args.skip:
            continue
        run_dir = Path(args.out).resolve() / name
        cmd = [
            sys.executable,
            "-m",
            "hf_lightning.train",
            *COMMON,
            f"trainer.max_steps={args.steps}",
            *fill(overrides, base, attn, devices, micro),
            f"hydra.run.dir={run_dir}",
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            hint = (
                f" (needs {NEEDS[name]}: pip install {NEEDS[name]}, or --skip {name})"
                if name in NEEDS
                else ""
            )
            failures.append(f"{name}: exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}{hint}")
            continue
        if name == "gpu_adamw_8bit" and not eight_bit_state(run_dir):
            failures.append(
                f"{name}: last.ckpt holds no uint8 optimizer state: the 8-bit optimizer did not run"
            )
        results[name] = logged(run_dir, "train/loss")
        norms[name] = logged(run_dir, "grad_norm")
        exported = load_export(name, run_dir / "hf_model")
        if not all(torch.isfinite(p).all() for p in exported.parameters() if p.is_floating_point()):
            failures.append(f"{name}: the HF export holds non-finite weights")
    reference = results.get("cpu_fp32")
    if reference is None:
        failures.append("cpu_fp32: the reference run failed")
    else:
        print(f"{'step':>4} " + " ".join(f"{n:>16}" for n in results))
        for step in sorted(reference):
            print(f"{step:>4} " + " ".join(f"{results[n].get(step, float('nan')):>16.6f}" for n in results))
        for name, got in results.items():
            against = REFERENCE.get(name, "cpu_fp32")
            if against not in results:
                failures.append(f"{name}: its reference run {against} failed")
                continue
            rtol = args.qlora_rtol if name.startswith("qlora") else args.rtol
            failures += compare(name, "train/loss", got, results[against], rtol)
            # DeepSpeed keeps its gradients outside p.grad (no grad_norm); a 4-bit base changes the gradients
            if not name.startswith(("deepspeed", "qlora")):
                failures += compare(name, "grad_norm", norms[name], norms[against], args.norm_rtol)
    for failure in failures:
        print(f"gpu_smoke: FAILED: {failure}", file=sys.stderr)
    print("gpu_smoke: OK" if not failures else f"gpu_smoke: {len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
