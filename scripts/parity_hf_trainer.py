"""Train the same tiny Llama on the same data with HF ``transformers.Trainer`` and with hf_lightning; compare.

    python scripts/parity_hf_trainer.py [--accumulation 4] [--micro-batch 2] [--rows 44]
                                        [--label-smoothing 0.1] [--mode exact|fallback] [--out DIR]

Both sides start from one random init (``LlamaConfig``, fp32, CPU) and see the same rows in the same order (no
shuffle: HF ``train_sampling_strategy="sequential"``, ``HFDataModule(shuffle=False)``), with AdamW, HF's
weight-decay groups, a linear schedule with warmup, gradient clipping at 1.0 and gradient accumulation. The
rows are real instruction data (``shared/data/alpaca-tiny``, rendered Alpaca prompts) tokenized with the GPT-2
BPE of ``shared/data/gpt2-tokenizer``; the prompt up to ``### Response:`` is masked with -100, so rows hold
different numbers of targets. 44 rows in micro-batches of 2 make 22 micro-batches: 5 full windows of 4 and a
last window of 2, which both trainers normalise by its own count.

``--mode exact`` (default): HF's model loss with ``num_items_in_batch`` (Llama's ``forward`` takes
``**kwargs``, so HF passes the count) against our built-in token loss. ``--mode fallback``: the HF model is
marked ``accepts_loss_kwargs = False`` (HF then divides each micro-batch mean by the window length) against
``HFLightningModule(use_model_loss=True, model_accepts_loss_kwargs=False)``, our documented HF fallback.

Compared per optimizer step: the logged loss (HF ``loss`` vs our ``train/loss``: both the mean of the step's
window loss), ``grad_norm`` (both before clipping) and the learning rate. transformers logs the rate used in
the step (read before ``lr_scheduler.step()``); older releases logged the next step's rate, so against
those only the rates shifted by one step would match. Then every final weight.

Prints both loss columns side by side and the maximum differences; ``--out DIR`` also writes ``report.json``
(every column) and both final state dicts (``hf_weights.pt``, ``ours_weights.pt``) for the parity test.
Exit status 1 if a relative difference exceeds ``--tolerance`` (default 1e-5).
"""

from __future__ import annotations

import argparse
import copy
import csv
import json
import os
import sys
import tempfile
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
RESPONSE_MARK = "### Response:"


def shared_data() -> Path:
    return Path(os.environ.get("HF_LIGHTNING_SHARED_DATA", REPO / ".." / "shared" / "data"))


def load_tokenizer():
    from transformers import PreTrainedTokenizerFast

    path = shared_data() / "gpt2-tokenizer" / "tokenizer.json"
    if not path.is_file():
        sys.exit(
            f"parity_hf_trainer: {path} not found (set HF_LIGHTNING_SHARED_DATA to the shared data folder)"
        )
    return PreTrainedTokenizerFast(
        tokenizer_file=str(path), eos_token="<|endoftext|>", pad_token="<|endoftext|>"
    )


def load_rows(tokenizer, n: int, max_length: int) -> list[dict[str, list[int]]]:
    """Alpaca prompts as ``input_ids`` with the prompt (through ``### Response:``) masked in ``labels``."""
    path = shared_data() / "alpaca-tiny" / "alpaca_tiny.json"
    if not path.is_file():
        sys.exit(
            f"parity_hf_trainer: {path} not found (set HF_LIGHTNING_SHARED_DATA to the shared data folder)"
        )
    rows = []
    for record in json.loads(path.read_text())[:n]:
        text = record["text"]
        prompt = text[: text.index(RESPONSE_MARK) + len(RESPONSE_MARK)]
        ids = tokenizer(text, truncation=True, max_length=max_length)["input_ids"]
        n_prompt = min(len(tokenizer(prompt)["input_ids"]), len(ids) - 2)
        rows.append({"input_ids": ids, "labels": [-100] * n_prompt + ids[n_prompt:]})
    return rows


def make_model(vocab_size: int, seed: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config).float()


def pad_collate(pad_id: int):
    """Right padding, labels -100 and attention 0 on padding: written here, independent of hf_lightning."""

    def collate(examples):
        length = max(len(e["input_ids"]) for e in examples)
        out = {"input_ids": [], "attention_mask": [], "labels": []}
        for e in examples:
            pad = length - len(e["input_ids"])
            out["input_ids"].append(list(e["input_ids"]) + [pad_id] * pad)
            out["attention_mask"].append([1] * len(e["input_ids"]) + [0] * pad)
            out["labels"].append(list(e["labels"]) + [-100] * pad)
        return {k: torch.tensor(v) for k, v in out.items()}

    return collate


def run_hf(model, rows, args, workdir) -> list[dict]:
    import datasets
    from transformers import Trainer, TrainingArguments

    if args.mode == "fallback":
        model.accepts_loss_kwargs = False  # HF then uses its per-micro-batch mean / window length
    training_args = TrainingArguments(
        output_dir=str(workdir / "hf"),
        per_device_train_batch_size=args.micro_batch,
        gradient_accumulation_steps=args.accumulation,
        num_train_epochs=1,
        learning_rate=args.lr,
        weight_decay=0.01,
        adam_beta1=0.9,
        adam_beta2=0.999,
        adam_epsilon=1e-8,
        max_grad_norm=1.0,
        lr_scheduler_type="linear",
        warmup_steps=args.warmup_steps,
        logging_steps=1,
        save_strategy="no",
        eval_strategy="no",
        report_to="none",
        train_sampling_strategy="sequential",
        optim="adamw_torch",
        use_cpu=True,
        seed=args.seed,
        dataloader_num_workers=0,
        disable_tqdm=True,
        label_smoothing_factor=args.label_smoothing,
    )
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=datasets.Dataset.from_list(rows),
        data_collator=pad_collate(args.pad_id),
    )
    trainer.train()
    return [h for h in trainer.state.log_history if "loss" in h]


def run_ours(model, rows, args, workdir) -> list[dict]:
    from types import SimpleNamespace

    import datasets
    import lightning as L
    from lightning.pytorch.loggers import CSVLogger

    from hf_lightning import HFDataModule, HFLightningModule

    extra = {"use_model_loss": True, "model_accepts_loss_kwargs": False} if args.mode == "fallback" else {}
    module = HFLightningModule(
        model,
        optim={"name": "adamw", "lr": args.lr, "weight_decay": 0.01},
        scheduler={"name": "linear", "warmup_steps": args.warmup_steps},
        label_smoothing_factor=args.label_smoothing,
        max_grad_norm=1.0,
        **extra,
    )
    data = HFDataModule(
        SimpleNamespace(pad_token_id=args.pad_id),
        path=datasets.Dataset.from_list(rows),
        format="tokenized",
        validation_split=0.0,
        per_device_train_batch_size=args.micro_batch,
        gradient_accumulation_steps=args.accumulation,
        shuffle=False,
        max_length=args.max_length,
    )
    logdir = workdir / "ours"
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        logger=CSVLogger(str(logdir), name="", version=""),
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        use_distributed_sampler=False,
        precision="32-true",
    )
    trainer.fit(module, datamodule=data)
    with open(logdir / "metrics.csv") as fh:
        return [r for r in csv.DictReader(fh) if r.get("train/loss")]


def rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=44)
    parser.add_argument("--micro-batch", type=int, default=2)
    parser.add_argument("--accumulation", type=int, default=4)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--warmup-steps", type=int, default=2)
    parser.add_argument("--label-smoothing", type=float, default=0.0)
    parser.add_argument("--mode", choices=("exact", "fallback"), default="exact")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tolerance", type=float, default=1e-5)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    tokenizer = load_tokenizer()
    args.pad_id = tokenizer.pad_token_id
    rows = load_rows(tokenizer, args.rows, args.max_length)
    init = make_model(len(tokenizer), args.seed)
    hf_model, our_model = copy.deepcopy(init), copy.deepcopy(init)

    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        hf_logs = run_hf(hf_model, rows, args, workdir)
        our_logs = run_ours(our_model, rows, args, workdir)

    steps = [int(h["step"]) for h in hf_logs]
    report = {
        "mode": args.mode,
        "label_smoothing": args.label_smoothing,
        "accumulation": args.accumulation,
        "micro_batch": args.micro_batch,
        "targets_per_row": [sum(t != -100 for t in r["labels"][1:]) for r in rows],
        "step": steps,
        "our_step": [int(r["step"]) for r in our_logs],
        "hf_loss": [float(h["loss"]) for h in hf_logs],
        "our_loss": [float(r["train/loss"]) for r in our_logs],
        "hf_grad_norm": [float(h["grad_norm"]) for h in hf_logs],
        "our_grad_norm": [float(r["grad_norm"]) for r in our_logs],
        "hf_lr": [float(h["learning_rate"]) for h in hf_logs],
        "our_lr": [float(r["lr"]) for r in our_logs],
    }
    hf_state = {k: v.detach().clone() for k, v in hf_model.state_dict().items()}
    our_state = {k: v.detach().clone() for k, v in our_model.state_dict().items()}
    weight_rel = {k: float((our_state[k] - hf_state[k]).norm() / hf_state[k].norm()) for k in hf_state}
    moved = {
        k: float((hf_state[k] - init.state_dict()[k]).norm() / init.state_dict()[k].norm()) for k in hf_state
    }

    print(
        f"mode={args.mode} label_smoothing={args.label_smoothing} micro_batch={args.micro_batch} "
        f"accumulation={args.accumulation} rows={len(rows)} targets/row={min(report['targets_per_row'])}.."
        f"{max(report['targets_per_row'])}"
    )
    print(
        f"{'step':>4}  {'HF Trainer loss':>16}  {'hf_lightning loss':>17}  {'rel diff':>9}  "
        f"{'HF grad_norm':>12}  {'our grad_norm':>13}  {'HF lr':>10}  {'our lr':>10}"
    )
    for i, step in enumerate(steps):
        if i >= len(our_logs):
            break
        print(
            f"{step:>4}  {report['hf_loss'][i]:>16.8f}  {report['our_loss'][i]:>17.8f}  "
            f"{rel(report['our_loss'][i], report['hf_loss'][i]):>9.2e}  {report['hf_grad_norm'][i]:>12.6f}  "
            f"{report['our_grad_norm'][i]:>13.6f}  {report['hf_lr'][i]:>10.3e}  {report['our_lr'][i]:>10.3e}"
        )
    same_steps = report["step"] == report["our_step"]
    maxima = {
        "loss": max(rel(a, b) for a, b in zip(report["our_loss"], report["hf_loss"])),
        "grad_norm": max(rel(a, b) for a, b in zip(report["our_grad_norm"], report["hf_grad_norm"])),
        "lr": max(rel(a, b) for a, b in zip(report["our_lr"], report["hf_lr"])),
        "weights": max(weight_rel.values()),
    }
    report["max_rel_diff"] = maxima
    report["weights_moved_rel"] = min(moved.values())
    print(
        f"steps logged: HF {report['step']}, ours {report['our_step']} "
        f"({'same' if same_steps else 'DIFFERENT'})"
    )
    print(
        "max relative differences: "
        + ", ".join(f"{k} {v:.2e}" for k, v in maxima.items())
        + f" (weights: max over tensors of ||ours - HF|| / ||HF||; every tensor moved by >= "
        f"{report['weights_moved_rel']:.1e} of its norm)"
    )
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "report.json").write_text(json.dumps(report, indent=1))
        torch.save(hf_state, args.out / "hf_weights.pt")
        torch.save(our_state, args.out / "ours_weights.pt")
    ok = same_steps and all(v <= args.tolerance for v in maxima.values())
    print("PARITY OK" if ok else f"PARITY FAILED (tolerance {args.tolerance})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
