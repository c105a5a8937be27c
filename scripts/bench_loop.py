"""Benchmark 1, loop overhead: the same training run by (a) a hand-written PyTorch loop, (b) hf_lightning and (c) HF
``transformers.Trainer``; median optimizer-step time and the ratios b/a and b/c.

    python scripts/bench_loop.py [--rounds 5] [--steps 30] [--warmup 5] [--models overhead compute]
                                 [--ours-quiet] [--json OUT.json]

Every side trains the same seeded ``LlamaForCausalLM`` (fp32, CPU) on the same rows (random token rows of
varying length, first quarter of each masked with -100, so micro-batches hold unequal numbers of targets), with
micro-batch ``B``, gradient accumulation 4, ``torch.optim.AdamW`` (foreach, lr 1e-4, no weight decay), a constant
rate, gradient clipping at 1.0, a shuffled order, and a log line (a host sync) every 10 optimizer steps:

(a) raw: ``DataLoader`` + ``PaddingCollator``; per window the label targets are counted on the host, each
    micro-batch adds ``sum(token CE) / count`` and calls ``backward``, then clip, step, zero_grad.
(b) hf_lightning: ``HFLightningModule`` + ``HFDataModule`` + ``lightning.Trainer`` in process, with Lightning's
    defaults as a user gets them (TQDM progress bar, model summary, default logger, checkpointing), plus
    ``log_every_n_steps=10``. ``--ours-quiet`` adds a second column without the progress bar and logger.
(c) HF ``Trainer``: ``TrainingArguments(optim="adamw_torch", logging_steps=10, lr_scheduler_type="constant",
    save_strategy="no", report_to="none")``, the same collator; its model loss takes ``num_items_in_batch``.

Step time: the wall time between two consecutive optimizer-step ends (taken in a callback on (b) and (c)),
so it includes fetching and collating the next window. The first ``--warmup`` steps are dropped. Sides run
interleaved, ``--rounds`` times each, rotating the order; the table gives the median over all rounds' steps and
the median of the per-round ratios. Progress bars write to ``/dev/null``.

Models: ``overhead`` (hidden 32, 2 layers, vocab 512, rows <= 64 tokens, B = 4: a few ms of compute per
micro-batch, so loop overhead shows) and ``compute`` (hidden 256, 4 layers, vocab 8192, rows <= 256, B = 8).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import tempfile
import warnings

import torch

from bench_support import clock, interleaved, machine_note, median, set_threads, step_times, table, tiny_llama

MODELS = {
    "micro": {"vocab": 64, "hidden": 8, "layers": 1, "heads": 2, "max_len": 16, "batch": 2},
    "overhead": {"vocab": 512, "hidden": 32, "layers": 2, "heads": 4, "max_len": 64, "batch": 4},
    "compute": {"vocab": 8192, "hidden": 256, "layers": 4, "heads": 4, "max_len": 256, "batch": 8},
}
ACCUMULATION = 4
LR = 1e-4
LOG_EVERY = 10


class PadOnly:
    """The one tokenizer attribute pre-tokenized rows need (``HFDataModule`` and the collator read the pad id)."""

    pad_token_id = 0


def make_rows(spec: dict, n: int, seed: int = 0) -> list[dict[str, list[int]]]:
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        length = int(torch.randint(spec["max_len"] // 2, spec["max_len"] + 1, (), generator=g))
        ids = torch.randint(1, spec["vocab"], (length,), generator=g).tolist()
        rows.append({"input_ids": ids, "labels": [-100] * (length // 4) + ids[length // 4:]})
    return rows


def run_raw(spec: dict, rows: list, steps: int) -> list[float]:


    from torch.utils.data import DataLoader

    from hf_lightning.data.collators import PaddingCollator

    model = tiny_llama(spec["vocab"], spec["hidden"], spec["layers"], spec["heads"]).train()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    loader = DataLoader(rows, batch_size=spec["batch"], shuffle=True, collate_fn=PaddingCollator(0),
                        generator=torch.Generator().manual_seed(0))
    it = iter(loader)
    stamps = [clock()]
    for step in range(steps):
        window = [next(it) for _ in range(ACCUMULATION)]
        count = sum(int((b["labels"][:, 1:] != -100).sum()) for b in window)  # host side, before any forward
        total = torch.zeros(())
        for b in window:
            logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], use_cache=False).logits
            targets = torch.nn.functional.pad(b["labels"][:, 1:], (0, 1), value=-100)
            loss = torch.nn.functional.cross_entropy(
                logits.float().flatten(0, 1), targets.flatten(), ignore_index=-100, reduction="sum") / count
            loss.backward()
            total += loss.detach()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if (step + 1) % LOG_EVERY == 0:
            print(f"step {step + 1} loss {total.item():.4f}", file=sys.stderr)
        stamps.append(clock())
    return stamps


def run_ours(spec: dict, rows: list, steps: int, quiet: bool = False) -> list[float]:


    import datasets
    import lightning as L

    from hf_lightning import HFDataModule, HFLightningModule

    stamps: list[float] = []

    class Stamp(L.Callback):
        def on_train_start(self, trainer, pl_module):
            stamps.append(clock())

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if trainer.global_step > len(stamps) - 1:
                stamps.append(clock())

    model = tiny_llama(spec["vocab"], spec["hidden"], spec["layers"], spec["heads"])
    module = HFLightningModule(model, optim={"name": "adamw", "lr": LR, "weight_decay": 0.0},
                               scheduler={"name": "constant"})
    dm = HFDataModule(PadOnly(), path=datasets.Dataset.from_list(rows), validation_split=0.0,
                      per_device_train_batch_size=spec["batch"], max_length=spec["max_len"], seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        extra = {"enable_progress_bar": False, "logger": False} if quiet else {}
        trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=steps, accumulate_grad_batches=ACCUMULATION,
                            gradient_clip_val=1.0, log_every_n_steps=LOG_EVERY, default_root_dir=tmp,
                            num_sanity_val_steps=0, limit_val_batches=0, callbacks=[Stamp()], **extra)
        trainer.fit(module, datamodule=dm)
    return stamps


def run_hf(spec: dict, rows: list, steps: int) -> list[float]:


    import datasets
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from hf_lightning.data.collators import PaddingCollator

    stamps: list[float] = []

    class Stamp(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            stamps.append(clock())

        def on_step_end(self, args, state, control, **kw):
            stamps.append(clock())

    model = tiny_llama(spec["vocab"], spec["hidden"], spec["layers"], spec["heads"])
    with tempfile.TemporaryDirectory() as tmp:
        args = TrainingArguments(
            output_dir=tmp, per_device_train_batch_size=spec["batch"], gradient_accumulation_steps=ACCUMULATION,
            max_steps=steps, learning_rate=LR, weight_decay=0.0, lr_scheduler_type="constant", optim="adamw_torch",
            max_grad_norm=1.0, logging_steps=LOG_EVERY, save_strategy="no", report_to="none", use_cpu=True, seed=0,
            dataloader_pin_memory=False,
        )
        trainer = Trainer(model=model, args=args, train_dataset=datasets.Dataset.from_list(rows),
                          data_collator=PaddingCollator(0), callbacks=[Stamp()])
        trainer.train()
    return stamps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--ours-quiet", action="store_true", help="also run (b) without progress bar and logger")
    parser.add_argument("--json", help="write every step time here")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (see bench_support)")
    args = parser.parse_args()
    set_threads(args.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    warnings.filterwarnings("ignore")
    import lightning  # noqa: F401  (so that its loggers exist and can be silenced)
    import transformers  # noqa: F401
    for name in list(logging.root.manager.loggerDict):
        if name.split(".")[0] in ("lightning", "pytorch_lightning", "hf_lightning", "transformers"):
            logging.getLogger(name).setLevel(logging.ERROR)
    print(machine_note())
    results, report = [], {}
    for model_name in args.models:
        spec = MODELS[model_name]
        rows = make_rows(spec, args.steps * ACCUMULATION * spec["batch"] + spec["batch"])
        runs = {
            "a_raw": lambda: run_raw(spec, rows, args.steps),
            "b_ours": lambda: run_ours(spec, rows, args.steps),
            "c_hf": lambda: run_hf(spec, rows, args.steps),
        }
        if args.ours_quiet:
            runs["b_quiet"] = lambda: run_ours(spec, rows, args.steps, quiet=True)
        with open(os.devnull, "w") as null, contextlib.redirect_stderr(null), contextlib.redirect_stdout(null):
            stamps = interleaved(runs, args.rounds)
        times = {k: [step_times(s, args.warmup) for s in v] for k, v in stamps.items()}
        report[model_name] = times
        med = {k: median([t for r in v for t in r]) for k, v in times.items()}
        per_round = {k: [median(r) for r in v] for k, v in times.items()}
        ratio_ba = median([b / a for a, b in zip(per_round["a_raw"], per_round["b_ours"])])
        ratio_bc = median([b / c for b, c in zip(per_round["b_ours"], per_round["c_hf"])])
        row = [model_name, sum(p.numel() for p in tiny_llama(spec["vocab"], spec["hidden"], spec["layers"],
                                                             spec["heads"]).parameters()),
               1e3 * med["a_raw"], 1e3 * med["b_ours"], 1e3 * med["c_hf"], ratio_ba, ratio_bc]
        if args.ours_quiet:
            row += [1e3 * med["b_quiet"], median([q / a for a, q in zip(per_round["a_raw"], per_round["b_quiet"])])]
        results.append(row)
    header = ["model", "params", "a raw ms", "b ours ms", "c HF ms", "b/a", "b/c"]
    if args.ours_quiet:
        header += ["b quiet ms", "b quiet/a"]
    print(f"median optimizer-step time (micro-batch x {ACCUMULATION} accumulation), {args.rounds} interleaved rounds "
          f"x {args.steps - args.warmup - 1} timed steps; ratios: median of per-round ratios")
    print(table(header, results))
    print("goals: b/a <= 1.03, b/c <= 0.90")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh)


if __name__ == "__main__":
    main()
