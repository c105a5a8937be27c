"""Benchmark 5, evaluation with metrics: CPU time and peak memory of one evaluation pass with an HF-style
``compute_metrics`` that needs the argmax (``preprocess_logits_for_metrics=argmax``), ours against HF
``Trainer.evaluate``, same model and rows.

    python scripts/bench_eval_metrics.py [--rows 500] [--hidden 256] [--layers 4] [--batch 8] [--rounds 2]
    python scripts/bench_eval_metrics.py --probe MODE ...   # one measurement as JSON

Rows: the first ``--rows`` GSM8K training pairs tokenized with the shared GPT-2 tokenizer (question masked,
``bench_support.gsm8k_tokenized``, at most 256 tokens), the same ``datasets.Dataset`` for every side. Model: a
seeded ``LlamaForCausalLM`` (``--hidden`` 256, ``--layers`` 4, GPT-2's 50,257-token vocabulary, fp32, one
torch thread). ``compute_metrics`` is the token accuracy with the causal shift over the argmax predictions.
Evaluation batches of ``--batch``; both sides pad to the batch's longest row (labels with -100).

Modes, each in a fresh process (a process's peak only grows): ``hf`` (``Trainer.evaluate``), ``ours``
(``HFLightningModule`` + ``lightning.Trainer.validate``: the lean loss, ``preprocess_logits_for_metrics`` on
chunks of positions), ``ours-targets`` (the same with ``preprocess_logits_positions="targets"``: the head
and the argmax at the positions with a target only, -100 elsewhere; the metric reads only those),
``ours-full`` (the same with ``lean_loss=False``: each batch's whole logits, as HF), ``ours-loss``
(no ``compute_metrics``: loss and token accuracy only, the reference for what the metric adds).
Reported: process CPU time and wall time of the evaluation call, peak RSS above the peak before it
(``VmHWM``), the metric and the loss. Modes run interleaved ``--rounds`` times; ratios are per round, then the
median.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

MODES = ("ours", "hf", "ours-targets", "ours-full", "ours-loss")


def _accuracy(p) -> dict[str, float]:
    preds, labels = p.predictions, p.label_ids
    mask = labels[:, 1:] != -100
    return {"accuracy": float((preds[:, :-1] == labels[:, 1:])[mask].mean())}


def _argmax(logits, labels):
    return logits.argmax(-1)


def probe(mode: str, args: argparse.Namespace) -> dict[str, float]:
    """One evaluation pass in this process: ``cpu_s``, ``wall_s``, ``peak_above_mib``, ``accuracy``,
    ``loss``."""
    import logging
    import warnings

    import datasets
    from bench_support import clock, gpt2_tokenizer, gsm8k_tokenized, proc_status_kib, set_threads, tiny_llama

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    set_threads(1)
    tokenizer = gpt2_tokenizer()
    rows = datasets.Dataset.from_list(gsm8k_tokenized(tokenizer, max_length=256, limit=args.rows))
    model = tiny_llama(len(tokenizer), args.hidden, args.layers, max(4, args.hidden // 64)).eval()
    if mode == "hf":
        from transformers import DataCollatorForSeq2Seq, Trainer, TrainingArguments

        trainer = Trainer(
            model=model,
            args=TrainingArguments(
                output_dir=tempfile.mkdtemp(),
                per_device_eval_batch_size=args.batch,
                report_to=[],
                use_cpu=True,
                disable_tqdm=True,
            ),
            eval_dataset=rows,
            data_collator=DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=-100),
            compute_metrics=_accuracy,
            preprocess_logits_for_metrics=_argmax,
        )
        before, start = proc_status_kib("VmHWM"), clock()
        out = trainer.evaluate()
        end = clock()
        accuracy, loss = out["eval_accuracy"], out["eval_loss"]
    else:
        import lightning as L

        from hf_lightning import HFDataModule, HFLightningModule

        dm = HFDataModule(tokenizer, path=rows, validation_path=rows, per_device_eval_batch_size=args.batch)
        dm.setup("validate")
        metrics = {} if mode == "ours-loss" else {"compute_metrics": _accuracy}
        module = HFLightningModule(
            model,
            preprocess_logits_for_metrics=_argmax,
            preprocess_logits_positions="targets" if mode == "ours-targets" else "all",
            lean_loss=False if mode == "ours-full" else None,
            **metrics,
        )
        trainer = L.Trainer(
            accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False
        )
        before, start = proc_status_kib("VmHWM"), clock()
        (out,) = trainer.validate(module, datamodule=dm, verbose=False)
        end = clock()
        accuracy, loss = out["val/accuracy"], out["val/loss"]
    return {
        "cpu_s": end[1] - start[1],
        "wall_s": end[0] - start[0],
        "peak_above_mib": (proc_status_kib("VmHWM") - before) / 1024,
        "accuracy": float(accuracy),
        "loss": float(loss),
    }


def run_probe(mode: str, args: argparse.Namespace) -> dict[str, float]:
    """:func:`probe` in a fresh Python process."""
    cmd = [sys.executable, __file__, "--probe", mode]
    for key in ("rows", "hidden", "layers", "batch"):
        cmd += [f"--{key}", str(getattr(args, key))]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise SystemExit(f"probe {mode} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=500)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--probe", choices=MODES)
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated; hf is always run")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.path.insert(1, str(Path(__file__).resolve().parents[1]))
    if args.probe:
        print(json.dumps(probe(args.probe, args)))
        return
    from bench_support import interleaved, machine_note, median, table

    print(machine_note())
    modes = ["hf"] + [m for m in args.modes.split(",") if m in MODES and m != "hf"]
    results = interleaved({m: (lambda m=m: run_probe(m, args)) for m in modes}, args.rounds)
    rows = []
    for mode in modes:
        runs = results[mode]
        cpu_ratio = [r["cpu_s"] / h["cpu_s"] for r, h in zip(runs, results["hf"])]
        peak_ratio = [r["peak_above_mib"] / h["peak_above_mib"] for r, h in zip(runs, results["hf"])]
        rows.append(
            [
                mode,
                median([r["cpu_s"] for r in runs]),
                median([r["wall_s"] for r in runs]),
                median(cpu_ratio),
                median([r["peak_above_mib"] for r in runs]),
                median(peak_ratio),
                f"{runs[0]['accuracy']:.6f}",
                f"{runs[0]['loss']:.5f}",
            ]
        )
    print(
        f"{args.rows} GSM8K rows, Llama hidden {args.hidden} x {args.layers} layers, GPT-2 vocabulary, "
        f"eval batch {args.batch}, {args.rounds} interleaved rounds (medians)"
    )
    print(
        table(
            ["side", "CPU s", "wall s", "CPU / HF", "peak above MiB", "peak / HF", "accuracy", "loss"],
            rows,
        )
    )


if __name__ == "__main__":
    main()
