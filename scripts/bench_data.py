"""Benchmark 2, data path: collator examples/s against HF's collators, and the real-token share of each
layout.

    python scripts/bench_data.py [--rounds 5] [--batch-size 16] [--max-length 512] [--skip-layouts]

Rows: GSM8K train (7,473 question/answer pairs), tokenized once with the shared GPT-2 tokenizer as
``question + " " + answer + eos`` (question masked with -100 in ``labels``), as Python lists of ints (what a
``datasets`` row gives a collator). Each collator collates the whole set in batches of ``--batch-size``; the
pairs run interleaved ``--rounds`` times and the table gives the median examples/s and the median per-round
ratio ours / HF (goal >= 1.0):

- causal LM rows ``{input_ids, attention_mask}``: ``PaddingCollator`` vs
  ``DataCollatorForLanguageModeling(mlm=False)``
- SFT rows ``{input_ids, labels}``: ``PaddingCollator`` vs ``DataCollatorForSeq2Seq(label_pad_token_id=-100)``
  (the HF collator that pads given labels)
- padding-free ``{input_ids, labels}``: ``PaddingFreeCollator`` vs ``DataCollatorWithFlattening``

The outputs are checked equal before timing. GPT-2's pad id is its EOS and HF's LM collator masks every
pad-id position in ``labels`` (ours masks padding by position only), so the causal-LM rows are taken without
their trailing EOS, where the two agree.

Then the real-token share at ``--batch-size`` for random batches, ``group_by_length`` (goal >= 0.97), BFD
packing, BFD packing + padding-free and padding-free (goal 1.00), from ``padding_efficiency.measure``.
"""

from __future__ import annotations

import argparse
import time
import warnings

import torch
from bench_support import (
    gpt2_tokenizer,
    gsm8k_tokenized,
    interleaved,
    machine_note,
    median,
    set_threads,
    table,
)
from padding_efficiency import measure

from hf_lightning.data.collators import PaddingCollator, PaddingFreeCollator


def examples_per_s(collate, rows: list[dict], batch_size: int) -> float:
    start = time.perf_counter()
    for i in range(0, len(rows), batch_size):
        collate(rows[i : i + batch_size])
    return len(rows) / (time.perf_counter() - start)


def same(a: dict, b: dict, keys) -> bool:
    return all(torch.equal(torch.as_tensor(a[k]), torch.as_tensor(b[k])) for k in keys)


def pairs(tok, rows: list[dict]) -> dict[str, tuple]:
    """``{name: (ours, hf, rows, keys compared)}``."""
    from transformers import (
        DataCollatorForLanguageModeling,
        DataCollatorForSeq2Seq,
        DataCollatorWithFlattening,
    )

    eos = tok.eos_token_id
    clm = [
        {"input_ids": r["input_ids"][:-1], "attention_mask": [1] * (len(r["input_ids"]) - 1)} for r in rows
    ]
    sft = [{"input_ids": r["input_ids"], "labels": r["labels"]} for r in rows]
    assert all(eos not in r["input_ids"] for r in clm[:200]), (
        "an inner EOS would make the two LM collators differ"
    )
    return {
        "causal LM (input_ids, attention_mask)": (
            PaddingCollator(tok.pad_token_id),
            DataCollatorForLanguageModeling(tok, mlm=False),
            clm,
            ("input_ids", "attention_mask", "labels"),
        ),
        "SFT (input_ids, labels)": (
            PaddingCollator(tok.pad_token_id),
            DataCollatorForSeq2Seq(tok, label_pad_token_id=-100),
            sft,
            ("input_ids", "labels"),
        ),
        "padding-free (input_ids, labels)": (
            PaddingFreeCollator(),
            DataCollatorWithFlattening(),
            sft,
            ("input_ids", "labels", "position_ids"),
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--skip-layouts", action="store_true", help="only the collator table")
    args = parser.parse_args()
    set_threads(args.threads)
    warnings.filterwarnings("ignore")
    print(machine_note())
    tok = gpt2_tokenizer()
    rows = gsm8k_tokenized(tok, args.max_length)
    results = []
    for name, (ours, hf, data, keys) in pairs(tok, rows).items():
        batch = data[: args.batch_size]
        if not same(ours(batch), hf(batch), keys):
            raise SystemExit(f"{name}: our batch differs from HF's on {keys}")
        speeds = interleaved(
            {
                "ours": lambda o=ours, d=data: examples_per_s(o, d, args.batch_size),
                "hf": lambda h=hf, d=data: examples_per_s(h, d, args.batch_size),
            },
            args.rounds,
        )
        ratio = median([o / h for o, h in zip(speeds["ours"], speeds["hf"])])
        results.append(
            [
                name,
                type(ours).__name__,
                median(speeds["ours"]),
                type(hf).__name__,
                median(speeds["hf"]),
                ratio,
            ]
        )
    print(
        f"collator examples/s, GSM8K ({len(rows)} rows), batch {args.batch_size}, {args.rounds} interleaved "
        "rounds"
    )
    print(table(["rows", "ours", "ours ex/s", "HF", "HF ex/s", "ours / HF"], results))
    print("goal: ours / HF >= 1.0")
    if args.skip_layouts:
        return
    layouts = measure(args.batch_size, args.max_length)
    print(f"\nreal tokens / slots, batch {args.batch_size}, max_length {args.max_length}")
    print(table(["layout", "real tokens / slots"], [[n, f"{s:.3f}"] for n, s, _, _ in layouts]))
    print("goals: group_by_length >= 0.97; packing and padding-free 1.00")


if __name__ == "__main__":
    main()
