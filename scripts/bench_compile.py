"""``model.compile=true`` against eager on the CPU: step time of the same training run, process CPU time
beside wall time, and the compilations each run made.

    python scripts/bench_compile.py [--rounds 3] [--steps 14] [--warmup 4] [--layouts padded padding_free]
        [--threads 1] [--json OUT]

Both sides train the same seeded ``LlamaForCausalLM`` (hidden 256, 4 layers, 4 heads, the GPT-2 vocabulary
of 50,257, untied head; fp32, CPU) with ``HFLightningModule`` + ``HFDataModule`` + ``lightning.Trainer`` in
process, on GSM8K rows tokenized with the shared GPT-2 tokenizer (question masked, at most 256 tokens, so
every batch has its own length), micro-batch 4, accumulation 2, AdamW, clipping at 1.0, the lean loss (the
module's default for this vocabulary; its chunked head runs eagerly on both sides). "compiled" is the same
model after ``model.compile()`` (inductor), what ``model.compile=true`` does; the module marks its inputs'
batch and sequence dimensions dynamic (one compilation for all lengths). Layouts: ``padded`` (rows padded to
the longest of each batch) and ``padding_free`` (one row of the batch's documents).

Step time: between consecutive optimizer-step ends; the first ``--warmup`` steps (the compilation, on the
compiled side) are dropped, and the first step's wall time is given apart (``first step``: the compilation's
cost). Sides run interleaved ``--rounds`` times, rotating the order; the table gives medians over rounds and
the median of the per-round ratios compiled / eager. The inductor cache (``/tmp/torchinductor_$USER``) is kept
between rounds, as between the runs of one user: after the first round a compilation reads it.
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile

from bench_support import (
    clock,
    gpt2_tokenizer,
    gsm8k_tokenized,
    interleaved,
    machine_note,
    median,
    set_threads,
    step_times,
    table,
    tiny_llama,
)

HIDDEN, LAYERS, HEADS, VOCAB = 256, 4, 4, 50257
BATCH, ACCUMULATION, MAX_LEN = 4, 2, 256


class PadOnly:
    pad_token_id = 0


def run(rows, layout: str, compiled: bool, steps: int) -> dict:
    import lightning as L
    import torch

    from hf_lightning import HFDataModule, HFLightningModule
    from hf_lightning.module.compiled import CompileReport

    stamps: list[tuple[float, float]] = []

    class Stamp(L.Callback):
        def on_train_start(self, trainer, pl_module):
            stamps.append(clock())

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            stamps.append(clock())

    torch.compiler.reset()  # each run compiles its own model (the inductor cache on disk stays)
    model = tiny_llama(VOCAB, HIDDEN, LAYERS, HEADS)
    if compiled:
        model.compile()
    module = HFLightningModule(
        model,
        optim={"name": "adamw", "lr": 1e-4, "weight_decay": 0.0},
        scheduler={"name": "constant"},
        max_grad_norm=1.0,
    )
    dm = HFDataModule(
        PadOnly(),
        path=rows,
        validation_split=0.0,
        per_device_train_batch_size=BATCH,
        gradient_accumulation_steps=ACCUMULATION,
        max_length=MAX_LEN,
        padding_free=layout == "padding_free",
        seed=0,
    )
    report = CompileReport()
    with tempfile.TemporaryDirectory() as tmp:
        trainer = L.Trainer(
            accelerator="cpu",
            devices=1,
            max_steps=steps,
            default_root_dir=tmp,
            num_sanity_val_steps=0,
            limit_val_batches=0,
            enable_progress_bar=False,
            enable_model_summary=False,
            logger=False,
            enable_checkpointing=False,
            callbacks=[Stamp()],
        )
        report.start()
        trainer.fit(module, datamodule=dm)
    firsts, reasons, failures = report.counts()
    return {"stamps": stamps, "compilations": firsts + len(reasons), "recompilations": len(reasons)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=14)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--layouts", nargs="+", default=["padded", "padding_free"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    set_threads(args.threads)
    import datasets

    rows = datasets.Dataset.from_list(gsm8k_tokenized(gpt2_tokenizer(), max_length=MAX_LEN, limit=400))
    print(machine_note())
    table_rows, out = [], {}
    for layout in args.layouts:
        results = interleaved(
            {
                side: (lambda s=side, lay=layout: run(rows, lay, s == "compiled", args.steps))
                for side in ("eager", "compiled")
            },
            args.rounds,
        )
        per = {}
        for side, runs in results.items():
            per[side] = {
                "cpu": [median(step_times(r["stamps"], args.warmup, 1)) for r in runs],
                "wall": [median(step_times(r["stamps"], args.warmup, 0)) for r in runs],
                "first": [r["stamps"][1][0] - r["stamps"][0][0] for r in runs],
                "compilations": [r["compilations"] for r in runs],
                "recompilations": [r["recompilations"] for r in runs],
            }
        ratio_cpu = median([c / e for c, e in zip(per["compiled"]["cpu"], per["eager"]["cpu"])])
        ratio_wall = median([c / e for c, e in zip(per["compiled"]["wall"], per["eager"]["wall"])])
        for side in ("eager", "compiled"):
            p = per[side]
            table_rows.append(
                [
                    layout,
                    side,
                    1000 * median(p["cpu"]),
                    1000 * median(p["wall"]),
                    median(p["first"]),
                    f"{max(p['compilations'])} / {max(p['recompilations'])}",
                    f"{ratio_cpu:.3f}" if side == "compiled" else "",
                    f"{ratio_wall:.3f}" if side == "compiled" else "",
                ]
            )
        out[layout] = {**per, "ratio_cpu": ratio_cpu, "ratio_wall": ratio_wall}
    print(
        table(
            [
                "layout",
                "side",
                "CPU ms/step",
                "wall ms/step",
                "first step s (wall)",
                "compilations / recompilations",
                "compiled/eager CPU",
                "compiled/eager wall",
            ],
            table_rows,
        )
    )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
