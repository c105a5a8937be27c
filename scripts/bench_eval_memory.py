"""Benchmark 4, evaluation memory: peak RSS of ``Trainer.validate`` against the evaluation-set size.

    python scripts/bench_eval_memory.py [--sizes 50 100 200 400 800] [--plot docs/eval_memory.png]
    python scripts/bench_eval_memory.py --probe N MODE  # one measurement as JSON (for the tests)

Each measurement runs in a fresh process: ``N`` random rows of 64 tokens, a seeded ``LlamaForCausalLM``
(hidden 32, 2 layers, vocabulary 8,000: 2 MB of logits per row of 64), ``HFDataModule`` +
``HFLightningModule`` + ``lightning.Trainer.validate`` with evaluation batches of 8, and the peak RSS
(``VmHWM``) read before and after.

MODE ``default``: our evaluation path (token-weighted loss, perplexity and accuracy reduced per batch); goal:
flat. MODE ``keep``: the control, an HF-style ``compute_metrics`` without ``preprocess_logits_for_metrics``,
which must see every logit at the end (HF ``Trainer`` keeps them too): it grows by 2 MB per row.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

SEQ_LEN = 64
VOCAB = 8000


def probe(n: int, mode: str) -> dict[str, int]:
    """Peak RSS (KiB) of validating ``n`` rows in this process; ``before_kib``: the peak before
    ``validate``."""
    import warnings

    import datasets
    import lightning as L
    import torch
    from bench_support import proc_status_kib, tiny_llama

    from hf_lightning import HFDataModule, HFLightningModule

    class PadOnly:
        pad_token_id = 0

    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    rows = [{"input_ids": x, "labels": x} for x in torch.randint(1, VOCAB, (n, SEQ_LEN)).tolist()]
    ds = datasets.Dataset.from_list(rows)
    dm = HFDataModule(PadOnly(), path=ds, validation_path=ds, per_device_eval_batch_size=8)
    dm.setup("validate")
    kw = {"compute_metrics": lambda p: {"n": float(len(p.predictions))}} if mode == "keep" else {}
    module = HFLightningModule(tiny_llama(VOCAB, hidden_size=32, layers=2, heads=4), **kw)
    before = proc_status_kib("VmHWM")
    L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False).validate(
        module, datamodule=dm, verbose=False
    )
    return {"peak_kib": proc_status_kib("VmHWM"), "before_kib": before}


def peak_rss(n: int, mode: str) -> dict[str, int]:
    """:func:`probe` in a fresh Python process (a process's peak RSS only grows)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, __file__, "--probe", str(n), mode],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"probe {n} {mode} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[50, 100, 200, 400, 800])
    parser.add_argument("--plot", help="also draw peak RSS against rows into this PNG (needs matplotlib)")
    parser.add_argument("--probe", nargs=2, metavar=("N", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe:
        print(json.dumps(probe(int(args.probe[0]), args.probe[1])))
        return
    from bench_support import machine_note, table

    print(machine_note())
    results = {mode: [peak_rss(n, mode) for n in args.sizes] for mode in ("default", "keep")}
    mib = {mode: [r["peak_kib"] / 1024 for r in rs] for mode, rs in results.items()}
    rows = [
        [n, f"{n * SEQ_LEN * VOCAB * 4 / 2**20:.0f}", f"{d:.0f}", f"{d / mib['default'][0]:.3f}", f"{k:.0f}"]
        for n, d, k in zip(args.sizes, mib["default"], mib["keep"])
    ]
    print("peak RSS of Trainer.validate, each size in a fresh process")
    print(
        table(
            ["eval rows", "all logits MiB", "ours peak MiB", "ours / smallest", "keep-all control MiB"], rows
        )
    )
    print("goal: ours flat (ratio to the smallest set ~1.0)")
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(5, 3.2))
        ax.plot(args.sizes, mib["default"], "o-", label="hf_lightning (reduced per batch)")
        ax.plot(args.sizes, mib["keep"], "s--", label="compute_metrics keeping every logit")
        ax.set_xlabel("evaluation rows (64 tokens, vocabulary 8,000)")
        ax.set_ylabel("peak RSS (MiB)")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(args.plot, dpi=120)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
