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
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings

import torch

SIZES = {"160m": (768, 12, 12, 2048), "460m": (1024, 24, 16, 2816)}  # hidden, layers, heads, intermediate


def run(args, tok, rows, layout: str, compiled: bool) -> dict[str, float]:
    import lightning as L
    from transformers import LlamaConfig, LlamaForCausalLM

    from hf_lightning import HFDataModule, HFLightningModule
    from hf_lightning.callbacks import Throughput
    from hf_lightning.strategies.precision import BF16MixedPrecision

    hidden, layers, heads, inter = SIZES[args.size]
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        intermediate_size=inter,
        max_position_embeddings=args.max_length,
        use_cache=False,
        attn_implementation="sdpa",
        pad_token_id=tok.pad_token_id,
    )
    model = LlamaForCausalLM(config)
    if compiled:
        torch._dynamo.reset()
        model.compile()
    layout_kw = {
        "padded": {"pad_to_multiple_of": 64},
        "auto": {"layout": "auto"},
        "packed": {"packing": "bfd"},
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
    meter = Throughput()
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
    if "throughput/mfu" not in meter.last_metrics:
        raise RuntimeError(
            f"no MFU for {torch.cuda.get_device_name()}: add its dense bf16 peak to DENSE_BF16_PEAK"
        )
    return {**meter.last_metrics, "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-length", type=int, default=1024)
    parser.add_argument("--size", choices=list(SIZES), default="160m")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print(
            "gpu_bench: FAILED: no CUDA device (torch.cuda.is_available() is False); run it on a GPU machine",
            file=sys.stderr,
        )
        return 1
    import datasets
    from bench_support import gpt2_tokenizer, gsm8k_tokenized, table

    warnings.filterwarnings("ignore")
    torch.backends.cuda.matmul.allow_tf32 = True
    tok = gpt2_tokenizer()
    rows = datasets.Dataset.from_list(gsm8k_tokenized(tok, args.max_length))
    print(
        f"gpu_bench: {torch.cuda.get_device_name()}, torch {torch.__version__}, model {args.size}, "
        f"batch {args.batch_size} x {args.max_length}, {args.steps} steps"
    )
    results = {}
    for layout in ("padded", "auto", "packed"):
        for compiled in (False, True):
            torch.cuda.reset_peak_memory_stats()
            results[f"{layout} {'compiled' if compiled else 'eager'}"] = run(
                args, tok, rows, layout, compiled
            )
    print(
        table(
            ["run", "real tokens/s", "padded tokens/s", "padding share", "MFU", "peak GiB"],
            [
                [
                    name,
                    round(r["throughput/tokens_per_s"]),
                    round(r["throughput/padded_tokens_per_s"]),
                    f"{r['throughput/padding_share']:.3f}",
                    f"{100 * r['throughput/mfu']:.1f}%",
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
