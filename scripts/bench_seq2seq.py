"""Benchmark 10, seq2seq end to end: real target tokens per second of a T5 trained on GSM8K question ->
answer, ours (``data.layout=auto``: padded rows sorted within each accumulation window, the lean loss on the
decoder's head) against HF ``Seq2SeqTrainer`` (its defaults: padded batches, ``adamw_torch_fused``), same
model, rows, batch and steps, and the eval loss each side reaches.

    python scripts/bench_seq2seq.py [--rounds 2] [--steps 12] [--warmup 2] [--rows 2000]
                                    [--micro-batch 8] [--accumulation 2] [--hidden 256]

Rows: the first ``--rows`` GSM8K training pairs, ``source`` = question, ``target`` = answer, tokenized with
the shared GPT-2 tokenizer as both sides tokenize seq2seq rows (``tokenizer(source)``,
``tokenizer(text_target=target)``, at most 256 tokens each). Model: a seeded ``T5ForConditionalGeneration``
(``--hidden`` 256, feed-forward 4x, 4 encoder + 4 decoder layers, GPT-2's 50,257-token vocabulary, its tied
head; fp32, CPU, one torch thread, no dropout). AdamW (lr 1e-3), constant rate, clipping at 1.0, shuffled
order. ``ours padded`` is ours with ``data.layout=null`` (the layout's share of the gain).

Time: process CPU time and wall time between optimizer-step ends after ``--warmup`` steps; target tokens are
counted from each side's collated labels (attributed to steps by batch index). Eval loss: after the run, the
mean token cross-entropy of each side's trained model on the 200 rows after the training rows, computed by
the same function for both. Sides run interleaved ``--rounds`` times; ratios per round, then the median.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
import warnings

import torch
from bench_support import (
    gpt2_tokenizer,
    gsm8k_prompt_completion,
    hf_stamps,
    interleaved,
    lightning_stamps,
    machine_note,
    median,
    quiet_libraries,
    set_threads,
    table,
)

MAX_LENGTH = 256
LR = 1e-3
EVAL_ROWS = 200


def model(tok, hidden: int):
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(0)
    config = T5Config(
        vocab_size=len(tok),
        d_model=hidden,
        d_ff=4 * hidden,
        d_kv=64,
        num_heads=max(1, hidden // 64),
        num_layers=4,
        num_decoder_layers=4,
        dropout_rate=0.0,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        decoder_start_token_id=tok.pad_token_id,
    )
    return T5ForConditionalGeneration(config)


class Counting:
    """Wraps a collator; records each batch's target tokens in collation order."""

    def __init__(self, collate) -> None:
        self.collate, self.counts = collate, []

    def __call__(self, examples):
        batch = self.collate(examples)
        self.counts.append(int((batch["labels"] != -100).sum()))
        return batch


def rate(stamps, counts, warmup: int, accumulation: int) -> tuple[float, float]:
    steps = len(stamps) - 1
    targets = sum(counts[warmup * accumulation : steps * accumulation])
    return targets / (stamps[-1][1] - stamps[warmup][1]), targets / (stamps[-1][0] - stamps[warmup][0])


def tokenized(tok, pairs):
    sources = tok(list(pairs["source"]), truncation=True, max_length=MAX_LENGTH)
    targets = tok(text_target=list(pairs["target"]), truncation=True, max_length=MAX_LENGTH)
    return [
        {"input_ids": s, "attention_mask": m, "labels": t}
        for s, m, t in zip(sources["input_ids"], sources["attention_mask"], targets["input_ids"])
    ]


@torch.no_grad()
def eval_loss(trained, tok, rows) -> float:
    """Mean token cross-entropy of ``trained`` on ``rows`` (batches of 16, the model's own loss summed)."""
    from transformers import DataCollatorForSeq2Seq

    collate = DataCollatorForSeq2Seq(tok, model=trained, label_pad_token_id=-100)
    trained.eval()
    total = count = 0.0
    for start in range(0, len(rows), 16):
        batch = collate(rows[start : start + 16])
        n = int((batch["labels"] != -100).sum())
        total += float(trained(**batch).loss) * n
        count += n
    return total / count


def run_hf(tok, train, held_out, args) -> tuple[float, float, float]:
    from transformers import (
        DataCollatorForSeq2Seq,
        Seq2SeqTrainer,
        Seq2SeqTrainingArguments,
    )

    stamps = []

    t5 = model(tok, args.hidden)
    collate = Counting(DataCollatorForSeq2Seq(tok, model=t5, label_pad_token_id=-100))
    with tempfile.TemporaryDirectory() as tmp:
        targs = Seq2SeqTrainingArguments(
            output_dir=tmp,
            per_device_train_batch_size=args.micro_batch,
            gradient_accumulation_steps=args.accumulation,
            max_steps=args.steps,
            learning_rate=LR,
            lr_scheduler_type="constant",
            max_grad_norm=1.0,
            logging_steps=10,
            save_strategy="no",
            report_to="none",
            use_cpu=True,
            seed=0,
            dataloader_pin_memory=False,
        )
        Seq2SeqTrainer(
            model=t5,
            args=targs,
            train_dataset=tokenized(tok, train),
            data_collator=collate,
            callbacks=[hf_stamps(stamps)],
        ).train()
    return (*rate(stamps, collate.counts, args.warmup, args.accumulation), eval_loss(t5, tok, held_out))


def run_ours(tok, train, held_out, args, layout) -> tuple[float, float, float]:
    from types import SimpleNamespace

    import lightning as L

    from hf_lightning import HFDataModule, HFLightningModule
    from hf_lightning.data.datamodule import binding_from_trainer

    stamps = []

    t5 = model(tok, args.hidden)
    module = HFLightningModule(
        t5, tokenizer=tok, optim={"lr": LR}, scheduler={"name": "constant"}, max_grad_norm=1.0
    )
    dm = HFDataModule(
        tok,
        path=train,
        validation_split=0.0,
        format="seq2seq",
        per_device_train_batch_size=args.micro_batch,
        gradient_accumulation_steps=args.accumulation,
        max_length=MAX_LENGTH,
        seed=0,
        layout=layout,
    )
    binding = binding_from_trainer(SimpleNamespace(lightning_module=module))
    dm.bind(binding.model, **{k: v for k, v in vars(binding).items() if k != "model"})
    dm.setup("fit")
    dm.train_collator = collate = Counting(dm.train_collator)
    with tempfile.TemporaryDirectory() as tmp:
        L.Trainer(
            accelerator="cpu",
            max_steps=args.steps,
            log_every_n_steps=10,
            default_root_dir=tmp,
            limit_val_batches=0,
            enable_checkpointing=False,
            callbacks=[lightning_stamps(stamps)],
        ).fit(module, datamodule=dm)
    return (*rate(stamps, collate.counts, args.warmup, args.accumulation), eval_loss(t5, tok, held_out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--accumulation", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=256)
    args = parser.parse_args()
    set_threads(1)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    warnings.filterwarnings("ignore")
    quiet_libraries()
    print(machine_note())
    tok = gpt2_tokenizer()
    pairs = gsm8k_prompt_completion(args.rows + EVAL_ROWS).rename_columns(
        {"prompt": "source", "completion": "target"}
    )
    train = pairs.select(range(args.rows))
    held_out = tokenized(tok, pairs.select(range(args.rows, args.rows + EVAL_ROWS)))
    runs = {
        "HF Seq2SeqTrainer": lambda: run_hf(tok, train, held_out, args),
        "ours (layout=auto)": lambda: run_ours(tok, train, held_out, args, "auto"),
        "ours padded": lambda: run_ours(tok, train, held_out, args, None),
    }
    with open(os.devnull, "w") as null, contextlib.redirect_stderr(null), contextlib.redirect_stdout(null):
        results = interleaved(runs, args.rounds)
    hf = results["HF Seq2SeqTrainer"]
    out = []
    for name, values in results.items():
        cpu, wall = [v[0] for v in values], [v[1] for v in values]
        out.append(
            [
                name,
                round(median(cpu)),
                f"{median([c / h[0] for c, h in zip(cpu, hf)]):.2f}x",
                round(median(wall)),
                f"{median([w / h[1] for w, h in zip(wall, hf)]):.2f}x",
                f"{median([v[2] for v in values]):.4f}",
            ]
        )
    print(
        f"target tokens/s, T5 hidden {args.hidden} (4+4 layers, GPT-2 vocabulary) on GSM8K question -> "
        f"answer ({args.rows} rows), micro-batch {args.micro_batch} x {args.accumulation}, "
        f"{args.steps - args.warmup} timed steps, {args.rounds} interleaved rounds"
    )
    print(
        table(
            [
                "run",
                "target tok/CPU-s",
                "vs HF",
                "target tok/wall-s",
                "vs HF (wall)",
                f"eval loss ({EVAL_ROWS} rows)",
            ],
            out,
        )
    )


if __name__ == "__main__":
    main()
