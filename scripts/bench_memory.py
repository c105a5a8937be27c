"""Benchmark 6, training memory: peak RSS above the imports and step time of HF ``Trainer`` and hf_lightning.

    python scripts/bench_memory.py [--cases llama128k gpt2] [--steps 3] [--rounds 1] [--threads 1]
        [--json OUT]
    python scripts/bench_memory.py --probe SIDE CASE STEPS     # one measurement, printed as JSON

A step's memory in a causal LM with a large vocabulary is dominated by the ``(tokens x vocab)`` logits: in
float32 at 2,048 tokens x 128,256 (Llama 3's vocabulary) one copy is 1 GiB, and the plain loss holds the
logits, their log-softmax and their gradient. Cases (seeded random weights, fp32, CPU, rows of 512 random
tokens all labelled, micro-batch 4 = 2,048 tokens per optimizer step, no accumulation, AdamW lr 1e-4, clipping
at 1.0):

- ``llama128k``: ``LlamaForCausalLM`` hidden 64, 2 layers, vocabulary 128,256, untied head;
- ``llama128k-h256``: the same at hidden 256, 4 layers (a realistic small model; 70 M parameters, most in the
  embedding and the head);
- ``gpt2``: ``GPT2LMHeadModel`` hidden 64, 2 layers, vocabulary 50,257, head tied to the input embedding;
- ``llama32k`` (only when named): as ``llama128k`` with a 32,000 vocabulary (the test's smaller case).

Sides, each measurement in a fresh Python process (a peak RSS only grows):

- ``hf``: ``transformers.Trainer`` (its default ``optim``, ``adamw_torch_fused``, as our ``adamw``;
  ``save_strategy="no"``, ``report_to="none"``),
  whose model computes its own loss from the full logits;
- ``plain``: ``HFLightningModule(lean_loss=False)`` + ``HFDataModule`` + ``lightning.Trainer`` (no logger, no
  checkpoint, no bar): our loss from the full logits, as before the lean loss;
- ``lean``: the same with the lean loss (``lean_loss=True``, what the default takes for these vocabularies:
  :mod:`hf_lightning.module.lean_loss`).

Peak RSS above the imports: ``VmHWM`` (``/proc/self/status``) at the end minus the RSS once torch,
transformers, datasets, lightning and hf_lightning are imported (so it counts the model, the optimizer state,
the data and the steps). "Above state" subtracts what every side holds for training: 16 bytes per trainable
parameter (fp32 weight, gradient and AdamW's two moments). Step time: between consecutive optimizer-step
ends, the first step dropped (CPU time of the process and wall time; see ``bench_support``). ``--rounds``
repeats every probe, rotating the order of the sides; medians are reported. Goal: ``lean`` <= 0.2x ``hf`` in
peak memory above the training state, at equal or better step time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

CASES = {
    "llama128k": {"arch": "llama", "vocab": 128256, "hidden": 64, "layers": 2, "heads": 4},
    "gpt2": {"arch": "gpt2", "vocab": 50257, "hidden": 64, "layers": 2, "heads": 4},
    # a realistic small model: its layers are more than a rounding error beside the head
    "llama128k-h256": {"arch": "llama", "vocab": 128256, "hidden": 256, "layers": 4, "heads": 4},
    # not in the default run: the smaller case of tests/parity/test_lean_loss.py
    "llama32k": {"arch": "llama", "vocab": 32000, "hidden": 64, "layers": 2, "heads": 4},
}
DEFAULT_CASES = ("llama128k", "llama128k-h256", "gpt2")
SIDES = ("hf", "plain", "lean")
ROW_TOKENS = 512
BATCH = 4
LR = 1e-4


def make_model(spec: dict):
    import torch

    torch.manual_seed(0)
    if spec["arch"] == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(
            vocab_size=spec["vocab"],
            n_embd=spec["hidden"],
            n_layer=spec["layers"],
            n_head=spec["heads"],
            n_positions=ROW_TOKENS,
            use_cache=False,
        )
        return GPT2LMHeadModel(config)
    from bench_support import tiny_llama

    return tiny_llama(spec["vocab"], spec["hidden"], spec["layers"], spec["heads"], max_positions=ROW_TOKENS)


def make_rows(spec: dict, n: int):
    import datasets
    import torch

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, spec["vocab"], (n, ROW_TOKENS), generator=g).tolist()
    return datasets.Dataset.from_list([{"input_ids": x, "labels": x} for x in ids])


def probe(side: str, case: str, steps: int) -> dict:
    """One side on one case in this process: peak RSS above the imports (KiB) and the step-end clock
    stamps."""
    import warnings

    import datasets  # noqa: F401
    import lightning as L
    import torch  # noqa: F401
    import transformers
    from bench_support import clock, proc_status_kib

    from hf_lightning import HFDataModule, HFLightningModule

    warnings.filterwarnings("ignore")
    transformers.logging.set_verbosity_error()
    if os.environ.get("BENCH_CHUNK_MIB"):
        from hf_lightning.module import linear_cross_entropy

        linear_cross_entropy.CHUNK_BYTES["cpu"] = int(float(os.environ["BENCH_CHUNK_MIB"]) * 2**20)
    base = proc_status_kib("VmRSS")
    spec = CASES[case]
    rows = make_rows(spec, BATCH * steps)
    model = make_model(spec)
    stamps: list[tuple[float, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        if side == "hf":
            from transformers import Trainer, TrainerCallback, TrainingArguments

            from hf_lightning.data.collators import PaddingCollator

            class Stamp(TrainerCallback):
                def on_train_begin(self, args, state, control, **kw):
                    stamps.append(clock())

                def on_step_end(self, args, state, control, **kw):
                    stamps.append(clock())

            args = TrainingArguments(
                output_dir=tmp,
                per_device_train_batch_size=BATCH,
                max_steps=steps,
                learning_rate=LR,
                lr_scheduler_type="constant",
                max_grad_norm=1.0,
                logging_steps=steps,
                save_strategy="no",
                report_to="none",
                use_cpu=True,
                seed=0,
                dataloader_pin_memory=False,
                disable_tqdm=True,
            )
            Trainer(
                model=model,
                args=args,
                train_dataset=rows,
                data_collator=PaddingCollator(0),
                callbacks=[Stamp()],
            ).train()
        else:

            class StampL(L.Callback):
                def on_train_start(self, trainer, pl_module):
                    stamps.append(clock())

                def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
                    stamps.append(clock())

            class PadOnly:
                pad_token_id = 0

            module = HFLightningModule(
                model,
                optim={"name": "adamw", "lr": LR},
                scheduler={"name": "constant"},
                lean_loss=side == "lean",
                max_grad_norm=1.0,
            )
            dm = HFDataModule(
                PadOnly(),
                path=rows,
                validation_split=0.0,
                per_device_train_batch_size=BATCH,
                max_length=ROW_TOKENS,
                shuffle=False,
            )
            L.Trainer(
                accelerator="cpu",
                devices=1,
                max_steps=steps,
                logger=False,
                enable_checkpointing=False,
                enable_progress_bar=False,
                enable_model_summary=False,
                num_sanity_val_steps=0,
                limit_val_batches=0,
                default_root_dir=tmp,
                callbacks=[StampL()],
            ).fit(module, datamodule=dm)
    peak = proc_status_kib("VmHWM")
    return {
        "side": side,
        "case": case,
        "base_kib": base,
        "peak_kib": peak,
        "above_kib": peak - base,
        "params": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "stamps": stamps,
    }


def run_probe(side: str, case: str, steps: int, threads: int, chunk_mib: float | None = None) -> dict:
    """:func:`probe` in a fresh Python process."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "BENCH_THREADS": str(threads)}
    if chunk_mib:
        env["BENCH_CHUNK_MIB"] = str(chunk_mib)
    proc = subprocess.run(
        [sys.executable, __file__, "--probe", side, case, str(steps)],
        capture_output=True,
        text=True,
        timeout=1800,
        env=env,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"probe {side} {case} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=list(DEFAULT_CASES), choices=list(CASES))
    parser.add_argument(
        "--steps", type=int, default=3, help="optimizer steps per probe (the first is not timed)"
    )
    parser.add_argument("--rounds", type=int, default=1, help="probes per side and case, interleaved")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (see bench_support)")
    parser.add_argument("--json", help="write every probe's result here")
    parser.add_argument(
        "--chunk-mib",
        type=float,
        help="the lean loss's float32 logits per chunk on the CPU (MiB; "
        "default: hf_lightning.module.linear_cross_entropy.CHUNK_BYTES)",
    )
    parser.add_argument("--probe", nargs=3, metavar=("SIDE", "CASE", "STEPS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    from bench_support import set_threads

    set_threads(int(os.environ.get("BENCH_THREADS", args.threads)))
    if args.probe:
        side, case, steps = args.probe
        print(json.dumps(probe(side, case, int(steps))))
        return
    if args.steps < 2:
        parser.error("--steps must be >= 2 (the first step is not timed)")
    from bench_support import machine_note, median, step_times, table

    print(machine_note())
    results: dict[str, dict[str, list[dict]]] = {c: {s: [] for s in SIDES} for c in args.cases}
    for r in range(args.rounds):
        for case in args.cases:
            order = SIDES[r % len(SIDES) :] + SIDES[: r % len(SIDES)]
            for side in order:
                results[case][side].append(run_probe(side, case, args.steps, args.threads, args.chunk_mib))
    rows = []
    for case, by_side in results.items():
        mib = {s: median([p["above_kib"] for p in ps]) / 1024 for s, ps in by_side.items()}
        state = 16 * by_side["hf"][0]["params"] / 2**20  # weights, gradients, AdamW's two moments (fp32)
        cpu = {
            s: 1e3 * median([median(step_times(p["stamps"], 1, 1)) for p in ps]) for s, ps in by_side.items()
        }
        wall = {
            s: 1e3 * median([median(step_times(p["stamps"], 1, 0)) for p in ps]) for s, ps in by_side.items()
        }
        rows.append(
            [
                case,
                CASES[case]["vocab"],
                mib["hf"],
                mib["plain"],
                mib["lean"],
                f"{mib['lean'] / mib['hf']:.3f}",
                state,
                f"{(mib['lean'] - state) / (mib['hf'] - state):.3f}",
                cpu["hf"],
                cpu["plain"],
                cpu["lean"],
                f"{cpu['lean'] / cpu['hf']:.3f}",
                wall["hf"],
                wall["lean"],
                f"{wall['lean'] / wall['hf']:.3f}",
            ]
        )
    print(
        f"\none optimizer step of {BATCH} x {ROW_TOKENS} = {BATCH * ROW_TOKENS} tokens, fp32, CPU; peak RSS "
        f"above the imports (MiB) and step time (ms), medians of {args.rounds} round(s), each probe in a "
        "fresh process"
    )
    print(
        table(
            [
                "case",
                "vocab",
                "HF MiB",
                "plain MiB",
                "lean MiB",
                "lean/HF mem",
                "state MiB",
                "lean/HF above state",
                "HF cpu ms",
                "plain cpu ms",
                "lean cpu ms",
                "lean/HF cpu",
                "HF wall ms",
                "lean wall ms",
                "lean/HF wall",
            ],
            rows,
        )
    )
    print("goal: lean/HF above state <= 0.2 at lean/HF time <= 1.0")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh)


if __name__ == "__main__":
    main()
