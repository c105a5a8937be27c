"""GPU throughput: real tokens/s and MFU of a ~160M-parameter Llama in bf16 on one CUDA device, padded rows,
the default layout (``data.layout=auto``) and packed rows, with and without ``torch.compile``. Exits 1 at once
without CUDA.

    python scripts/gpu_bench.py [--steps 40] [--batch-size 16] [--max-length 1024] [--size 160m|460m]
        [--json OUT]

Data: GSM8K train tokenized with the shared GPT-2 tokenizer (question masked), through ``HFDataModule``:
padded (``pad_to_multiple_of=64``, so that compiled graphs see few shapes), the layout ``data.layout=auto``
chooses on this device (with SDPA: each batch's documents packed into rows of its longest one; with
flash-attention: padding-free), or BFD-packed into rows of ``--max-length``. Model: ``LlamaForCausalLM`` from
a config (SDPA attention; 160m: hidden 768, 12 layers; 460m: hidden 1024, 24 layers; GPT-2's vocabulary),
``HFLightningModule`` with fused AdamW, bf16 autocast (``BF16MixedPrecision``), ``lightning.Trainer`` on one
device. ``torch.compile``: ``model.compile()`` before
training. Figures are the ``Throughput`` callback's for the last ``log_every_n_steps = steps / 4`` steps
(after compilation and warm-up): real tokens/s, padding share, and MFU against the device's dense bf16 peak
(``hf_lightning.callbacks.throughput.DENSE_BF16_PEAK``). Goal: MFU >= 45% packed + compiled.

Two more runs: bf16 + compile on padding-free rows (``padding_free=True``) under flash-attention 2 when the
``flash_attn`` package is installed, else SDPA (printed); and ``strategy=fsdp`` through the command line
(``python -m hf_lightning.train``, the same model, data and layout) on the GPUs present, its figures read from
the run's ``metrics.csv``. Two MFU columns: ``MFU 6ND`` (``6 x parameters x real tokens / s / peak``,
:func:`gpu_support.mfu`) and ``MFU PaLM`` (the ``Throughput`` callback's, which adds the attention term).
A device missing from the peak table: ``--peak-tflops``, else its measured bf16 matmul rate (said in the
output).
Exits 1 at once, with one line, without CUDA.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import torch
from gpu_support import attention_kernel, mfu, peak_flops, require_cuda

SIZES = {"160m": (768, 12, 12, 2048), "460m": (1024, 24, 16, 2816)}  # hidden, layers, heads, intermediate


def llama_config(args, vocab_size: int, pad_token_id: int | None, attn: str = "sdpa"):
    """The benchmark's ``LlamaConfig`` (``--size``), untied head."""
    from transformers import LlamaConfig

    hidden, layers, heads, inter = SIZES[args.size]
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        intermediate_size=inter,
        max_position_embeddings=args.max_length,
        use_cache=False,
        attn_implementation=attn,
        pad_token_id=pad_token_id,
        tie_word_embeddings=False,
    )


def parameter_count(config) -> int:
    """Parameters of ``LlamaForCausalLM(config)``, counted on the meta device (nothing allocated)."""
    from transformers import LlamaForCausalLM

    with torch.device("meta"):
        return sum(p.numel() for p in LlamaForCausalLM(config).parameters())


def fsdp_cli_overrides(args, data_path: str, tokenizer_dir: str, devices: int, attn: str, out: str) -> list:
    """The ``python -m hf_lightning.train`` overrides of the FSDP run: the benchmark's model (``--size``, from
    a config), GSM8K as prompt/completion rows, bf16, compile, padding-free rows under ``attn``."""
    hidden, layers, heads, inter = SIZES[args.size]
    return [
        "+experiment=clm",
        "trainer=gpu",
        "strategy=fsdp",
        f"trainer.devices={devices}",
        f"trainer.max_steps={args.steps}",
        f"trainer.log_every_n_steps={max(args.steps // 4, 1)}",
        "trainer.limit_val_batches=0",
        "trainer.enable_progress_bar=false",
        f"data.path={data_path}",
        "data.validation_split=0.0",
        f"data.max_length={args.max_length}",
        f"data.per_device_train_batch_size={args.batch_size}",
        "data.layout=null",
        "data.padding_free=true",
        f"model.tokenizer_name_or_path={tokenizer_dir}",
        f"model.attn_implementation={attn}",
        "model.compile=true",
        f"model.config.hidden_size={hidden}",
        f"model.config.num_hidden_layers={layers}",
        f"model.config.num_attention_heads={heads}",
        f"model.config.num_key_value_heads={heads}",
        f"model.config.intermediate_size={inter}",
        f"model.config.max_position_embeddings={args.max_length}",
        "model.config.tie_word_embeddings=false",
        "optim.lr=1e-4",
        "scheduler=constant",
        f"hydra.run.dir={out}",
    ]


def run_fsdp_cli(args, tok, attn: str) -> dict[str, float]:
    """The FSDP run through the command line on the GPUs present; the last ``metrics.csv`` row's
    throughput columns."""
    from bench_support import gsm8k_prompt_completion

    work = Path(args.out).resolve()
    work.mkdir(parents=True, exist_ok=True)
    data_path = work / "gsm8k_prompt_completion.jsonl"
    gsm8k_prompt_completion().to_json(str(data_path), lines=True)
    tok.save_pretrained(str(work / "gpt2_tokenizer"))
    run_dir = work / "fsdp_run"
    devices = torch.cuda.device_count()
    cmd = [
        sys.executable,
        "-m",
        "hf_lightning.train",
        *fsdp_cli_overrides(args, str(data_path), str(work / "gpt2_tokenizer"), devices, attn, str(run_dir)),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if proc.returncode != 0:
        raise RuntimeError(f"fsdp run: exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}")
    with open(run_dir / "metrics.csv") as fh:
        rows = [r for r in csv.DictReader(fh) if r.get("throughput/tokens_per_s")]
    last = {k: float(v) for k, v in rows[-1].items() if k.startswith("throughput/") and v}
    return {**last, "devices": devices, "peak_memory_gib": float("nan")}


def run(args, tok, rows, layout: str, compiled: bool, attn: str = "sdpa") -> dict[str, float]:
    import lightning as L
    from transformers import LlamaForCausalLM

    from hf_lightning import HFDataModule, HFLightningModule
    from hf_lightning.callbacks import Throughput
    from hf_lightning.strategies.precision import BF16MixedPrecision

    torch.manual_seed(0)
    model = LlamaForCausalLM(llama_config(args, len(tok), tok.pad_token_id, attn))
    if compiled:
        torch._dynamo.reset()
        model.compile()
    layout_kw = {
        "padded": {"pad_to_multiple_of": 64},
        "auto": {"layout": "auto"},
        "packed": {"packing": "bfd"},
        "padding-free": {"padding_free": True},
    }[layout]
    dm = HFDataModule(
        tok,
        path=rows,
        validation_split=0.0,
        per_device_train_batch_size=args.batch_size,
        max_length=args.max_length,
        seed=0,
        **layout_kw,
    )
    module = HFLightningModule(
        model,
        tokenizer=tok,
        optim={"lr": 1e-4, "fused": True},
        scheduler={"name": "constant"},
        max_grad_norm=1.0,
    )
    meter = Throughput(peak_flops=args.peak)
    trainer = L.Trainer(
        accelerator="gpu",
        devices=1,
        plugins=[BF16MixedPrecision("cuda")],
        max_steps=args.steps,
        log_every_n_steps=max(args.steps // 4, 1),
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        callbacks=[meter],
    )
    trainer.fit(module, datamodule=dm)
    return {**meter.last_metrics, "devices": 1, "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-length", type=int, default=1024)
    parser.add_argument("--size", choices=list(SIZES), default="160m")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument(
        "--peak-tflops", type=float, help="one device's dense bf16 peak (default: the table, else measured)"
    )
    parser.add_argument("--out", default="gpu_bench_runs", help="folder of the FSDP run and its data")
    parser.add_argument("--skip-fsdp", action="store_true", help="leave out the FSDP command-line run")
    return parser


def main() -> int:
    args = build_parser().parse_args()
    if not require_cuda("gpu_bench"):
        return 1
    import datasets
    from bench_support import gpt2_tokenizer, gsm8k_tokenized, table

    warnings.filterwarnings("ignore")
    torch.backends.cuda.matmul.allow_tf32 = True
    tok = gpt2_tokenizer()
    rows = datasets.Dataset.from_list(gsm8k_tokenized(tok, args.max_length))
    device = torch.cuda.get_device_name()
    args.peak, peak_source = peak_flops(device, args.peak_tflops)
    attn = attention_kernel()
    params = parameter_count(llama_config(args, len(tok), tok.pad_token_id))
    print(
        f"gpu_bench: {device} x {torch.cuda.device_count()}, torch {torch.__version__}, model {args.size} "
        f"({params / 1e6:.1f}M parameters), batch {args.batch_size} x {args.max_length}, {args.steps} steps; "
        f"peak {args.peak / 1e12:.0f} TFLOP/s per device ({peak_source}); padding-free attention: {attn}"
    )
    results = {}
    for layout in ("padded", "auto", "packed"):
        for compiled in (False, True):
            torch.cuda.reset_peak_memory_stats()
            results[f"{layout} {'compiled' if compiled else 'eager'}"] = run(
                args, tok, rows, layout, compiled
            )
    torch.cuda.reset_peak_memory_stats()
    results[f"padding-free compiled {attn}"] = run(args, tok, rows, "padding-free", True, attn)
    if not args.skip_fsdp:
        results[f"fsdp x{torch.cuda.device_count()} padding-free compiled {attn}"] = run_fsdp_cli(
            args, tok, attn
        )
    for r in results.values():
        r["mfu_6nd"] = mfu(params, r["throughput/tokens_per_s"], 1.0, args.peak, int(r["devices"]))
    print(
        table(
            ["run", "real tokens/s", "padded tokens/s", "padding share", "MFU 6ND", "MFU PaLM", "peak GiB"],
            [
                [
                    name,
                    round(r["throughput/tokens_per_s"]),
                    round(r["throughput/padded_tokens_per_s"]),
                    f"{r['throughput/padding_share']:.3f}",
                    f"{100 * r['mfu_6nd']:.1f}%",
                    f"{100 * r['throughput/mfu']:.1f}%" if "throughput/mfu" in r else "-",
                    f"{r['peak_memory_gib']:.1f}",
                ]
                for name, r in results.items()
            ],
        )
    )
    print("goal: MFU >= 45% packed + compiled")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
