"""Share of real tokens per batch slot on GSM8K for random batches, group_by_length, packing and padding-free.

    python scripts/padding_efficiency.py [--batch-size 16] [--max-length 512]

GSM8K rows become prompt/completion (question / answer), tokenized with the shared GPT-2 tokenizer; one epoch
of each training loader is read and its real tokens divided by the slots of its batches (B x padded length; a
padding-free batch is one row with no padding). Padding follows ``hf_lightning.core.batch.padding_mask``.
"""

from __future__ import annotations

import argparse
import time

from bench_support import gpt2_tokenizer, gsm8k_prompt_completion, table

from hf_lightning import HFDataModule
from hf_lightning.core.batch import padding_mask

LAYOUTS = {
    "random": {},
    "group_by_length": {"group_by_length": True},
    "packing=bfd": {"packing": "bfd"},
    "packing=bfd + padding_free": {"packing": "bfd", "padding_free": True},
    "padding_free": {"padding_free": True},
}


def efficiency(dm: HFDataModule) -> tuple[float, int]:
    """``(real tokens / slots, slots)`` over one epoch of ``dm``'s training loader."""
    real = slots = 0
    for batch in dm.train_dataloader():
        pad = padding_mask(batch, dm.tokenizer.pad_token_id)
        slots += pad.numel()
        real += int((~pad).sum())
    return real / slots, slots


def measure(batch_size: int, max_length: int, layouts=tuple(LAYOUTS)) -> list[list]:
    """``[layout, real / slots, slots, seconds]`` per layout."""
    tok = gpt2_tokenizer()
    rows = gsm8k_prompt_completion()
    out = []
    for name in layouts:
        start = time.perf_counter()
        dm = HFDataModule(
            tok,
            path=rows,
            validation_split=0.0,
            per_device_train_batch_size=batch_size,
            max_length=max_length,
            seed=0,
            **LAYOUTS[name],
        )
        dm.setup()
        share, slots = efficiency(dm)
        out.append([name, share, slots, time.perf_counter() - start])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-length", type=int, default=512)
    args = parser.parse_args()
    rows = measure(args.batch_size, args.max_length)
    print(
        table(
            ["layout", "real tokens / slots", "slots", "s"],
            [[n, f"{s:.3f}", n_slots, t] for n, s, n_slots, t in rows],
        )
    )


if __name__ == "__main__":
    main()
