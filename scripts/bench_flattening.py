"""Per-batch cost of our ``PaddingFreeCollator`` against a wrapper of transformers'
``DataCollatorWithFlattening`` with our checks around it (the rule: wrap the library's collator unless
that costs over 10% per batch).

    python scripts/bench_flattening.py

CPU time per batch (``process_time``, so the load of other processes does not count), 5 interleaved rounds,
GSM8K rows tokenized with the shared GPT-2 tokenizer (``bench_support``), batches of 16; outputs checked
equal.
"""

import statistics
import time

import torch
from bench_support import gpt2_tokenizer, gsm8k_tokenized, set_threads
from transformers import DataCollatorWithFlattening

from hf_lightning.core.errors import DataError
from hf_lightning.data.collators import PaddingFreeCollator, checked_column, flatten_rows


class Wrapped:
    """Our checks, then HF's collator (separator -100 at each start), positions as HF computes them."""

    def __init__(self):
        self.hf = DataCollatorWithFlattening(return_position_ids=True, separator_id=-100)

    def __call__(self, examples):
        if not examples:
            raise DataError("empty")
        for i, ex in enumerate(examples):
            if "input_ids" not in ex:
                raise DataError(f"example {i} has no input_ids")
        ids, lengths = flatten_rows([ex["input_ids"] for ex in examples])  # the as_row checks (text, ragged)
        if not ids.numel():
            raise DataError("every example is empty")
        checked_column(examples, "labels", lengths)
        mask = checked_column(examples, "attention_mask", lengths)
        if mask is not None and not bool(mask.all()):
            raise DataError("attention_mask has zeros")
        out = self.hf([{k: ex[k] for k in ("input_ids", "labels") if k in ex} for ex in examples])
        return {k: out[k] for k in ("input_ids", "labels", "position_ids")}


def main() -> None:
    set_threads(1)
    tok = gpt2_tokenizer()
    rows = gsm8k_tokenized(tok, 512)
    B = 16
    batches = [rows[i : i + B] for i in range(0, len(rows), B)]
    ours, wrapped = PaddingFreeCollator(), Wrapped()
    a, b = ours(batches[0]), wrapped(batches[0])
    for k in a:
        assert torch.equal(a[k], b[k]), k

    def run(c):
        t = time.process_time()
        for x in batches:
            c(x)
        return (time.process_time() - t) / len(batches) * 1e6

    res = {"ours": [], "wrapped": []}
    for r in range(5):
        for name in ["ours", "wrapped"] if r % 2 == 0 else ["wrapped", "ours"]:
            res[name].append(run(ours if name == "ours" else wrapped))
    m = {k: statistics.median(v) for k, v in res.items()}
    print(
        f"CPU us/batch (median of 5, batch {B}, {len(batches)} batches): ours {m['ours']:.0f}, wrapper of "
        f"DataCollatorWithFlattening {m['wrapped']:.0f}; wrapper/ours = {m['wrapped'] / m['ours']:.2f}"
    )


if __name__ == "__main__":
    main()
