"""Share of real tokens per batch slot on gsm8k for random batches, group_by_length and packing.

    python scripts/padding_efficiency.py [--batch-size 8] [--max-length 512]

gsm8k rows become prompt/completion (question / answer), tokenized with the shared GPT-2 tokenizer; one epoch of
the training loader is read and real tokens are divided by the slots of the batches (B x padded length).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import datasets
from transformers import PreTrainedTokenizerFast

from hf_lightning import HFDataModule
from hf_lightning.data.describe import padding_mask

SHARED = Path(os.environ.get("HF_LIGHTNING_SHARED_DATA", Path(__file__).resolve().parents[1] / ".." / "shared" / "data"))


def efficiency(dm: HFDataModule) -> tuple[float, int]:
    real = slots = 0
    for batch in dm.train_dataloader():
        pad = padding_mask(batch, dm.tokenizer.pad_token_id)
        slots += pad.numel()
        real += int((~pad).sum())
    return real / slots, slots


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-length", type=int, default=512)
    args = parser.parse_args()
    tok = PreTrainedTokenizerFast(tokenizer_file=str(SHARED / "gpt2-tokenizer" / "tokenizer.json"),
                                  eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    rows = datasets.load_dataset("json", data_files=str(SHARED / "gsm8k" / "train.jsonl"), split="train")
    rows = rows.rename_columns({"question": "prompt", "answer": "completion"})
    for name, options in [("random", {}), ("group_by_length", {"group_by_length": True}), ("packing=bfd", {"packing": "bfd"})]:
        start = time.perf_counter()
        dm = HFDataModule(tok, path=rows, validation_split=0.0, per_device_train_batch_size=args.batch_size,
                          max_length=args.max_length, seed=0, **options)
        dm.setup()
        share, slots = efficiency(dm)
        print(f"{name:<16} real tokens / slots = {share:.3f}  ({slots} slots, {time.perf_counter() - start:.1f} s)")


if __name__ == "__main__":
    main()
