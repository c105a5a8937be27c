"""Benchmark 1b, Lightning's own share of the loop: what a window-sized step saves.

    python scripts/bench_window_step.py [--rounds 3] [--models overhead compute] [--steps N] [--warmup 2]

The models, rows, micro-batch, accumulation (4), AdamW, clipping and step clock of ``bench_loop.py``, four
sides:

(a) raw: ``bench_loop.run_raw``, the hand-written loop.
(m) minimal Lightning, per micro-batch: a ``LightningModule`` of a few lines (the token loss from the logits,
    divided by the window count that the loader counted on the host, times ``k`` against Lightning's
    division), automatic optimization with Lightning's own ``accumulate_grad_batches=4``: what Lightning
    itself costs per micro-batch.
(w) minimal Lightning, per window: the same loss in ONE ``training_step`` per optimizer step (manual
    optimization, the loader yields the window's 4 micro-batches; ``manual_backward`` each, then clipping and
    the step). A minimal prototype, for the measurement only: no DDP ``no_sync``, no resume, no logging.
    Since 2026-12 ``HFLightningModule`` ships this design (docs/benchmarks.md, "A window-sized step").
(b) hf_lightning: ``bench_loop``'s "b lean" (``HFLightningModule`` + ``HFDataModule``, no bar/logger/summary;
    one window per training step, as (w)), and "b plain" the same with ``lean_loss=False`` (the loss from the
    logits, as (a), (m) and (w) compute it).

Process CPU time per optimizer step, medians over interleaved rounds and medians of per-round ratios.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import tempfile
import warnings

import bench_loop as bl
import torch
from bench_support import clock, interleaved, machine_note, median, set_threads, step_times, table, tiny_llama


def _loss_sum(model, batch) -> torch.Tensor:
    logits = model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False
    ).logits
    targets = torch.nn.functional.pad(batch["labels"][:, 1:], (0, 1), value=-100)
    return torch.nn.functional.cross_entropy(
        logits.float().flatten(0, 1), targets.flatten(), ignore_index=-100, reduction="sum"
    )


def _count(batches) -> int:
    return sum(int((b["labels"][:, 1:] != -100).sum()) for b in batches)


class _Windows:
    """The shuffled micro-batches of ``bench_loop`` grouped by window: per window one item (``windows=True``:
    the list and its count) or its micro-batches each carrying the window count."""

    def __init__(self, spec: dict, rows, windows: bool) -> None:
        from hf_lightning.data.collators import PaddingCollator

        self.windows = windows
        self.loader = torch.utils.data.DataLoader(
            rows,
            batch_size=spec["batch"],
            shuffle=True,
            collate_fn=PaddingCollator(0),
            generator=torch.Generator().manual_seed(0),
        )

    def __len__(self) -> int:
        n = len(self.loader) // bl.ACCUMULATION
        return n if self.windows else n * bl.ACCUMULATION

    def __iter__(self):
        it = iter(self.loader)
        for _ in range(len(self.loader) // bl.ACCUMULATION):
            window = [next(it) for _ in range(bl.ACCUMULATION)]
            count = _count(window)
            if self.windows:
                yield {"micro_batches": window, "count": count}
            else:
                yield from (dict(b, count=count) for b in window)


def _modules(spec: dict):
    import lightning as L

    class PerMicroBatch(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = tiny_llama(spec["vocab"], spec["hidden"], spec["layers"], spec["heads"])

        def training_step(self, batch, batch_idx):
            count = batch.pop("count")
            return _loss_sum(self.model, batch) / count * self.trainer.accumulate_grad_batches

        def configure_optimizers(self):
            return torch.optim.AdamW(self.model.parameters(), lr=bl.LR, weight_decay=0.0)

    class PerWindow(PerMicroBatch):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False

        def training_step(self, window, batch_idx):
            optimizer = self.optimizers()
            for batch in window["micro_batches"]:
                self.manual_backward(_loss_sum(self.model, batch) / window["count"])
            self.clip_gradients(optimizer, gradient_clip_val=1.0, gradient_clip_algorithm="norm")
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    return PerMicroBatch, PerWindow


def run_minimal(spec: dict, rows, steps: int, per_window: bool) -> list[tuple[float, float]]:
    import lightning as L

    per_micro_batch, window = _modules(spec)
    stamps: list[tuple[float, float]] = []

    class Stamp(L.Callback):
        def on_train_start(self, trainer, pl_module):
            stamps.append(clock())

        def on_train_batch_end(self, trainer, pl_module, *args):
            if trainer.global_step > len(stamps) - 1:
                stamps.append(clock())

    with tempfile.TemporaryDirectory() as tmp:
        trainer = L.Trainer(
            accelerator="cpu",
            devices=1,
            max_steps=steps,
            accumulate_grad_batches=1 if per_window else bl.ACCUMULATION,
            gradient_clip_val=None if per_window else 1.0,  # manual optimization clips in its step
            log_every_n_steps=bl.LOG_EVERY,
            default_root_dir=tmp,
            num_sanity_val_steps=0,
            limit_val_batches=0,
            callbacks=[Stamp()],
            enable_progress_bar=False,
            logger=False,
            enable_model_summary=False,
            enable_checkpointing=False,
        )
        module = window() if per_window else per_micro_batch()
        trainer.fit(module, train_dataloaders=_Windows(spec, rows, per_window))
    return stamps


def measure(model_name: str, rounds: int, steps: int | None, warmup: int) -> list:
    """One table row: the medians of every side and their ratios."""
    import datasets

    spec = bl.MODELS[model_name]
    steps = steps or spec["steps"]
    rows = datasets.Dataset.from_list(
        bl.make_rows(spec, steps * bl.ACCUMULATION * spec["batch"] + spec["batch"])
    )
    runs = {
        "a": lambda: bl.run_raw(spec, rows, steps),
        "m": lambda: run_minimal(spec, rows, steps, per_window=False),
        "w": lambda: run_minimal(spec, rows, steps, per_window=True),
        "b_lean": lambda: bl.run_ours(spec, rows, steps, quiet=True),
        "b_plain": lambda: bl.run_ours(spec, rows, steps, quiet=True, lean_loss=False),
    }
    with open(os.devnull, "w") as null, contextlib.redirect_stderr(null), contextlib.redirect_stdout(null):
        stamps = interleaved(runs, rounds)
    per_round = {k: [median(step_times(s, warmup, 1)) for s in v] for k, v in stamps.items()}

    def ratio(x: str, y: str) -> float:
        return median([p / q for p, q in zip(per_round[x], per_round[y])])

    med = {k: 1e3 * median(v) for k, v in per_round.items()}
    return [model_name, med["a"], med["m"], med["w"], med["b_lean"], med["b_plain"]] + [
        ratio("m", "a"),
        ratio("w", "a"),
        ratio("w", "m"),
        ratio("b_plain", "m"),
        ratio("b_lean", "m"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--steps", type=int, default=None, help="optimizer steps per run (default: per model)"
    )
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--models", nargs="+", default=list(bl.MODELS), choices=list(bl.MODELS))
    args = parser.parse_args()
    set_threads(1)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    warnings.filterwarnings("ignore")
    import lightning  # noqa: F401  (so that its loggers exist and can be silenced)

    for name in list(logging.root.manager.loggerDict):
        if name.split(".")[0] in ("lightning", "pytorch_lightning", "hf_lightning", "transformers"):
            logging.getLogger(name).setLevel(logging.ERROR)
    print(machine_note())
    rows_out = [measure(name, args.rounds, args.steps, args.warmup) for name in args.models]
    print(
        f"\nmedian optimizer-step CPU time (ms), micro-batch x {bl.ACCUMULATION} accumulation, {args.rounds} "
        "interleaved rounds; ratios: median of per-round ratios"
    )
    header = ["model", "a raw", "m per micro-batch", "w per window", "b lean", "b plain"]
    header += ["m/a", "w/a", "w/m", "plain/m", "lean/m"]
    print(table(header, rows_out))


if __name__ == "__main__":
    main()
