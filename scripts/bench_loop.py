"""Benchmark 1, loop overhead: the same training run by (a) a hand-written PyTorch loop, (b) hf_lightning and
(c) HF ``transformers.Trainer``; median optimizer-step time and the ratios b/a and b/c.

    python scripts/bench_loop.py [--rounds 5] [--steps N] [--warmup 2] [--models overhead compute]
        [--json OUT]
    python scripts/bench_loop.py --lean-sweep 64 256 1024 4096 [--rounds 3] [--models overhead compute]

Every side trains the same seeded ``LlamaForCausalLM`` (fp32, CPU, one torch thread) on the same
``datasets.Dataset`` (random token rows of varying length, the first quarter of each masked with -100, so
micro-batches hold unequal numbers of targets), with micro-batch ``B``, gradient accumulation 4,
``torch.optim.AdamW`` with its fused kernel (lr 1e-4, no weight decay; HF's default ``adamw_torch_fused``, our
``adamw``), a constant rate, clipping at norm 1.0, a shuffled order, the
same collator (``PaddingCollator``) and a loss log line (a host read) every 10 optimizer steps:

(a) raw: ``DataLoader``; per window the label targets are counted on the host, each micro-batch adds
    ``sum(token CE) / count`` and calls ``backward``; then clip, step, zero_grad.
(b) hf_lightning: ``HFLightningModule`` + ``HFDataModule(gradient_accumulation_steps=4)`` +
    ``lightning.Trainer`` in process (the module steps each window itself, on Lightning's manual
    optimization, and clips at ``max_grad_norm=1.0``), with what a user of ``python -m hf_lightning.train``
    sees: the progress bar of ``conf/callbacks/default.yaml`` (tqdm, redrawn once per optimizer step),
    Lightning's model summary, the TensorBoard logger and checkpointing; ``log_every_n_steps=10``.
    "b lean": the same without progress bar, logger and model summary.
    "b plain": "b lean" with ``module.lean_loss=false`` (the loss from the full logits, as (a) and (c) compute
    it). (b) and "b lean" take the module's default, ``module.lean_loss=null``: the lean loss where the head's
    vocabulary makes it pay.
    "b rich": (b) with Lightning's own default bar instead (with ``rich`` installed: ``RichProgressBar``,
    redrawn every training batch: each is one optimizer step here), what a plain ``lightning.Trainer`` user
    gets.
(c) HF ``Trainer``: ``TrainingArguments(optim="adamw_torch_fused", logging_steps=10,
    lr_scheduler_type="constant", save_strategy="no", report_to="none")`` and its defaults (tqdm bar); its
    model loss takes ``num_items_in_batch``.

Step time: between two consecutive optimizer-step ends (a callback on (b) and (c)), so it includes fetching
and collating the next window; the first ``--warmup`` steps are dropped. Both the process CPU time and the
wall time are given: on a machine shared with other jobs the wall time also counts the waits for a core, the
CPU time does not, so the CPU-time ratios are the steadier ones. Sides run interleaved ``--rounds`` times,
rotating the order; the tables give the median step time over the rounds and the median of the per-round
ratios. Progress bars write to ``/dev/null``.

Models: ``overhead`` (hidden 8, 1 layer, vocab 64, rows <= 16 tokens, B = 2: the framework's own work per step
dominates) and ``compute`` (hidden 128, 2 layers, vocab 4096, rows <= 128 tokens, B = 4: the model dominates).

``--device cuda`` runs every side on one GPU (fp32, same settings); a round's figure is then the mean wall
time of the timed steps, the stamps of the first and last of them taken after ``torch.cuda.synchronize()`` (no
other sync is added to any side, so each keeps the host syncs it has by itself).

``--lean-sweep V ...``: instead, only "b lean" with the lean loss forced on (``lean_loss=True``) and "b plain"
(``lean_loss=False``), each model's shape with each vocabulary ``V`` in place of its own: lean/plain per
vocabulary, where the lean loss starts to pay (``hf_lightning.module.lean_loss.LEAN_MIN_VOCAB``).

Also measured: the cost of the ``Throughput`` callback, as the CPU time spent inside its hooks over the step
time of the "b lean" run it is added to (goal < 1%).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import tempfile
import time
import warnings

import torch
from bench_support import clock, interleaved, machine_note, median, set_threads, step_times, table, tiny_llama

MODELS = {
    "overhead": {"vocab": 64, "hidden": 8, "layers": 1, "heads": 2, "max_len": 16, "batch": 2, "steps": 40},
    "compute": {
        "vocab": 4096,
        "hidden": 128,
        "layers": 2,
        "heads": 4,
        "max_len": 128,
        "batch": 4,
        "steps": 12,
    },
}
ACCUMULATION = 4
LR = 1e-4
LOG_EVERY = 10
DEVICE = "cpu"  # --device
SYNC_AT: set[int] = set()  # optimizer steps whose stamp waits for the GPU (the first and last timed ones)


def stamp(step: int) -> tuple[float, float]:
    """:func:`clock` after optimizer step ``step``; on CUDA it first waits for the queued work at the steps of
    ``SYNC_AT`` only, so that no side gets a host sync it does not have by itself."""
    if DEVICE == "cuda" and step in SYNC_AT:
        torch.cuda.synchronize()
    return clock()


class PadOnly:
    """The one tokenizer attribute pre-tokenized rows need (``HFDataModule`` and the collator read the pad
    id)."""

    pad_token_id = 0


def make_rows(spec: dict, n: int, seed: int = 0) -> list[dict[str, list[int]]]:
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        length = int(torch.randint(spec["max_len"] // 2, spec["max_len"] + 1, (), generator=g))
        ids = torch.randint(1, spec["vocab"], (length,), generator=g).tolist()
        rows.append({"input_ids": ids, "labels": [-100] * (length // 4) + ids[length // 4 :]})
    return rows


def run_raw(spec: dict, rows, steps: int) -> list[tuple[float, float]]:
    from torch.utils.data import DataLoader

    from hf_lightning.data.collators import PaddingCollator

    model = tiny_llama(spec["vocab"], spec["hidden"], spec["layers"], spec["heads"]).train().to(DEVICE)
    # the fused kernel, as HF's default optim and our adamw take it
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0, fused=DEVICE in ("cpu", "cuda"))
    loader = DataLoader(
        rows,
        batch_size=spec["batch"],
        shuffle=True,
        collate_fn=PaddingCollator(0),
        generator=torch.Generator().manual_seed(0),
    )
    it = iter(loader)
    stamps = [stamp(0)]
    for step in range(steps):
        host = [next(it) for _ in range(ACCUMULATION)]
        window = [{k: v.to(DEVICE, non_blocking=True) for k, v in b.items()} for b in host]
        # counted before the batches move, on the host (no device sync), as HFDataModule's window loader does
        count = sum(int((b["labels"][:, 1:] != -100).sum()) for b in host)
        total = torch.zeros((), device=DEVICE)
        for b in window:
            logits = model(
                input_ids=b["input_ids"], attention_mask=b["attention_mask"], use_cache=False
            ).logits
            targets = torch.nn.functional.pad(b["labels"][:, 1:], (0, 1), value=-100)
            loss = (
                torch.nn.functional.cross_entropy(
                    logits.float().flatten(0, 1), targets.flatten(), ignore_index=-100, reduction="sum"
                )
                / count
            )
            loss.backward()
            total += loss.detach()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if (step + 1) % LOG_EVERY == 0:
            print(f"step {step + 1} loss {total.item():.4f}", file=sys.stderr)
        stamps.append(stamp(step + 1))
    return stamps


def run_ours(
    spec: dict,
    rows,
    steps: int,
    quiet: bool = False,
    meter=None,
    bar: str = "cli",
    lean_loss: bool | None = None,
) -> list[tuple[float, float]]:
    import lightning as L

    from hf_lightning import HFDataModule, HFLightningModule

    stamps: list[tuple[float, float]] = []

    class Stamp(L.Callback):
        def on_train_start(self, trainer, pl_module):
            stamps.append(stamp(0))

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if trainer.global_step > len(stamps) - 1:
                stamps.append(stamp(trainer.global_step))

    model = tiny_llama(spec["vocab"], spec["hidden"], spec["layers"], spec["heads"])
    module = HFLightningModule(
        model,
        optim={"name": "adamw", "lr": LR, "weight_decay": 0.0},
        scheduler={"name": "constant"},
        lean_loss=lean_loss,
        max_grad_norm=1.0,
    )
    dm = HFDataModule(
        PadOnly(),
        path=rows,
        validation_split=0.0,
        per_device_train_batch_size=spec["batch"],
        gradient_accumulation_steps=ACCUMULATION,
        max_length=spec["max_len"],
        seed=0,
    )
    with tempfile.TemporaryDirectory() as tmp:
        extra = (
            {"enable_progress_bar": False, "logger": False, "enable_model_summary": False} if quiet else {}
        )
        callbacks = [Stamp()] + ([meter] if meter is not None else [])
        if not quiet and bar == "cli":
            from lightning.pytorch.callbacks import TQDMProgressBar

            callbacks.append(TQDMProgressBar(refresh_rate=1))  # as conf/callbacks/default.yaml sets it
        trainer = L.Trainer(
            accelerator="gpu" if DEVICE == "cuda" else "cpu",
            devices=1,
            max_steps=steps,
            log_every_n_steps=LOG_EVERY,
            default_root_dir=tmp,
            num_sanity_val_steps=0,
            limit_val_batches=0,
            callbacks=callbacks,
            **extra,
        )
        trainer.fit(module, datamodule=dm)
    return stamps


def run_hf(spec: dict, rows, steps: int) -> list[tuple[float, float]]:
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from hf_lightning.data.collators import PaddingCollator

    stamps: list[tuple[float, float]] = []

    class Stamp(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            stamps.append(stamp(0))

        def on_step_end(self, args, state, control, **kw):
            stamps.append(stamp(state.global_step))

    model = tiny_llama(spec["vocab"], spec["hidden"], spec["layers"], spec["heads"])
    with tempfile.TemporaryDirectory() as tmp:
        args = TrainingArguments(
            output_dir=tmp,
            per_device_train_batch_size=spec["batch"],
            gradient_accumulation_steps=ACCUMULATION,
            max_steps=steps,
            learning_rate=LR,
            weight_decay=0.0,
            lr_scheduler_type="constant",
            optim="adamw_torch_fused",
            max_grad_norm=1.0,
            logging_steps=LOG_EVERY,
            save_strategy="no",
            report_to="none",
            use_cpu=DEVICE == "cpu",
            seed=0,
            dataloader_pin_memory=False,
        )
        trainer = Trainer(
            model=model, args=args, train_dataset=rows, data_collator=PaddingCollator(0), callbacks=[Stamp()]
        )
        trainer.train()
    return stamps


class TimedThroughput:
    """A ``Throughput`` callback that sums the CPU time spent in its hooks: its own cost, measured directly
    (on the CPU its device reductions run inside the hooks), since a < 1% difference drowns in step-time
    noise."""

    def __new__(cls):
        from hf_lightning.callbacks import Throughput

        class Timed(Throughput):
            spent = 0.0

            def on_train_batch_start(self, *args, **kwargs):
                t = time.process_time()
                super().on_train_batch_start(*args, **kwargs)
                self.spent += time.process_time() - t

            def on_train_batch_end(self, *args, **kwargs):
                t = time.process_time()
                super().on_train_batch_end(*args, **kwargs)
                self.spent += time.process_time() - t

        return Timed(pad_token_id=0)


def round_time(stamps, warmup: int, which: int) -> float:
    """One round's step time: the median step on the CPU; on CUDA the mean over the timed steps, whose first
    and last stamps waited for the device (the others only say when the host queued the step)."""
    if DEVICE == "cuda":
        return (stamps[-1][which] - stamps[warmup][which]) / (len(stamps) - 1 - warmup)
    return median(step_times(stamps, warmup, which))


def run_model(name: str, rounds: int, steps: int | None, warmup: int) -> tuple[dict[str, list], list[float]]:
    """Per side, the step-end stamps of every round; and the meter's share of the step time per round."""
    import datasets

    spec = MODELS[name]
    steps = steps or spec["steps"]
    SYNC_AT.clear()
    SYNC_AT.update({warmup, steps})
    rows = datasets.Dataset.from_list(make_rows(spec, steps * ACCUMULATION * spec["batch"] + spec["batch"]))
    meter_share: list[float] = []

    def lean_with_meter():
        meter = TimedThroughput()
        stamps = run_ours(spec, rows, steps, quiet=True, meter=meter)
        meter_share.append(meter.spent / (stamps[-1][1] - stamps[0][1]))
        return stamps

    runs = {
        "a_raw": lambda: run_raw(spec, rows, steps),
        "b_ours": lambda: run_ours(spec, rows, steps),
        "b_lean": lambda: run_ours(spec, rows, steps, quiet=True),
        "b_plain": lambda: run_ours(spec, rows, steps, quiet=True, lean_loss=False),
        "b_rich": lambda: run_ours(spec, rows, steps, bar="lightning"),
        "b_meter": lean_with_meter,
        "c_hf": lambda: run_hf(spec, rows, steps),
    }
    with open(os.devnull, "w") as null, contextlib.redirect_stderr(null), contextlib.redirect_stdout(null):
        return interleaved(runs, rounds), meter_share


def lean_sweep(models: list[str], vocabs: list[int], rounds: int, steps: int | None, warmup: int) -> list:
    """``[model, vocab, lean ms, plain ms, lean/plain]`` per model shape and vocabulary: median step CPU time
    of "b lean" with ``lean_loss=True`` and with ``lean_loss=False``, and the median of per-round ratios."""
    import datasets

    out = []
    for name in models:
        for vocab in vocabs:
            spec = {**MODELS[name], "vocab": vocab}
            n = steps or spec["steps"]
            rows = datasets.Dataset.from_list(
                make_rows(spec, n * ACCUMULATION * spec["batch"] + spec["batch"])
            )
            runs = {
                "lean": lambda spec=spec, rows=rows, n=n: run_ours(spec, rows, n, quiet=True, lean_loss=True),
                "plain": lambda spec=spec, rows=rows, n=n: run_ours(
                    spec, rows, n, quiet=True, lean_loss=False
                ),
            }
            with (
                open(os.devnull, "w") as null,
                contextlib.redirect_stderr(null),
                contextlib.redirect_stdout(null),
            ):
                stamps = interleaved(runs, rounds)
            per_round = {k: [round_time(s, warmup, 1) for s in v] for k, v in stamps.items()}
            ratio = median([a / b for a, b in zip(per_round["lean"], per_round["plain"])])
            out.append(
                [name, vocab, 1e3 * median(per_round["lean"]), 1e3 * median(per_round["plain"]), ratio]
            )
            print(table(["model", "vocab", "lean ms", "plain ms", "lean/plain"], out[-1:]), flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--steps", type=int, default=None, help="optimizer steps per run (default: per model)"
    )
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (see bench_support)")
    parser.add_argument("--json", help="write every step time here")
    parser.add_argument(
        "--lean-sweep",
        type=int,
        nargs="+",
        metavar="VOCAB",
        help="only lean (forced) against plain, each model's shape with these vocabularies",
    )
    parser.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default="cpu",
        help="cuda: every side on one GPU (fp32); per round, the mean wall time of the timed steps",
    )
    args = parser.parse_args()
    global DEVICE
    DEVICE = args.device
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("bench_loop: FAILED: --device cuda but torch.cuda.is_available() is False", file=sys.stderr)
        sys.exit(1)
    set_threads(args.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    warnings.filterwarnings("ignore")
    import lightning  # noqa: F401  (so that its loggers exist and can be silenced)
    import transformers  # noqa: F401

    for name in list(logging.root.manager.loggerDict):
        if name.split(".")[0] in ("lightning", "pytorch_lightning", "hf_lightning", "transformers"):
            logging.getLogger(name).setLevel(logging.ERROR)
    print(machine_note())
    if args.lean_sweep:
        rows = lean_sweep(args.models, args.lean_sweep, args.rounds, args.steps, args.warmup)
        print(
            f"\nmedian optimizer-step CPU time, lean loss forced on against off, {args.rounds} interleaved "
            "rounds; lean/plain: median of per-round ratios"
        )
        print(table(["model", "vocab", "lean ms", "plain ms", "lean/plain"], rows))
        return
    tables: dict[str, list] = {"cpu": [], "wall": []}
    meters, report = [], {}
    for model_name in args.models:
        stamps, meter_share = run_model(model_name, args.rounds, args.steps, args.warmup)
        report[model_name] = stamps
        spec = MODELS[model_name]
        params = sum(
            p.numel()
            for p in tiny_llama(spec["vocab"], spec["hidden"], spec["layers"], spec["heads"]).parameters()
        )
        for which, clock_name in ((1, "cpu"), (0, "wall")):
            if DEVICE == "cuda" and which == 1:
                continue  # the CPU time of a GPU run counts the host's waits for the device
            per_round = {k: [round_time(s, args.warmup, which) for s in v] for k, v in stamps.items()}
            med = {k: 1e3 * median(v) for k, v in per_round.items()}

            def ratio(x, y, pr=per_round):
                return median([a / b for a, b in zip(pr[x], pr[y])])

            sides = ("a_raw", "b_ours", "b_lean", "b_plain", "b_rich", "c_hf")
            pairs = [("b_ours", "a_raw"), ("b_ours", "c_hf"), ("b_lean", "a_raw"), ("b_lean", "c_hf")]
            pairs += [("b_plain", "a_raw"), ("b_plain", "c_hf"), ("b_rich", "a_raw"), ("c_hf", "a_raw")]
            row = [model_name, params] + [med[k] for k in sides] + [ratio(x, y) for x, y in pairs]
            tables[clock_name].append(row)
        meters.append([model_name, f"{100 * median(meter_share):.2f}%", f"{100 * max(meter_share):.2f}%"])
    header = ["model", "params", "a raw ms", "b ours ms", "b lean ms", "b plain ms", "b rich ms", "c HF ms"]
    header += ["b/a", "b/c", "lean/a", "lean/c", "plain/a", "plain/c", "rich/a", "c/a"]
    for clock_name, rows in tables.items():
        if not rows:
            continue
        print(
            f"\nmedian optimizer-step {clock_name.upper()} time, micro-batch x {ACCUMULATION} accumulation, "
            f"{args.rounds} interleaved rounds; ratios: median of per-round ratios"
        )
        print(table(header, rows))
    print("goals: b/a <= 1.10 (overhead model), <= 1.02 (compute model); b/c <= 0.95 on both")
    print(
        "\nThroughput callback: CPU time in its hooks / step CPU time (b lean + callback), median and max of "
        "rounds"
    )
    print(table(["model", "median", "max"], meters))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh)


if __name__ == "__main__":
    main()
