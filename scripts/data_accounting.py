"""What the data pipeline keeps and trains on, on real data (c4-demo, GPT-2 BPE from ``../shared/data``).

    python scripts/data_accounting.py      # HF_LIGHTNING_SHARED_DATA=DIR to read the data elsewhere

Prints, with the log lines the DataModule writes:

- ``wrapped`` packing at ``max_length`` 512: tokens kept of the corpus (text + one EOS per document);
- ``bfd`` packing: documents that end with EOS (those truncated to 512 lose it, as in TRL);
- pre-tokenized rows padded to 64 (``padding="max_length"``) plus one all-padding row: targets of the first
  batch of 4 against ``transformers.DataCollatorForLanguageModeling(mlm=False)``, and the rows kept;
- text rows that tokenize to nothing: rows kept and batch shapes at batch size 1; bfd labels per token;
- chat rows without an assistant turn: the drop line.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
from pathlib import Path

import datasets
from transformers import DataCollatorForLanguageModeling, PreTrainedTokenizerFast

from hf_lightning import HFDataModule

DATA = Path(
    os.environ.get("HF_LIGHTNING_SHARED_DATA", Path(__file__).resolve().parents[1] / ".." / "shared" / "data")
)
C4 = str(DATA / "c4-demo" / "c4_demo.jsonl")


def datamodule(tok, path, **kw):
    dm = HFDataModule(
        tok,
        path=path,
        validation_split=0.0,
        shuffle=False,
        model_input_names=["input_ids", "attention_mask"],
        **kw,
    )
    dm.setup()
    return dm


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="  log: %(message)s")
    datasets.disable_progress_bars()
    tok = PreTrainedTokenizerFast(
        tokenizer_file=str(DATA / "gpt2-tokenizer" / "tokenizer.json"),
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
    )
    eos = tok.eos_token_id
    texts = [json.loads(line)["text"] for line in Path(C4).read_text().splitlines()]
    corpus = sum(len(tok(t)["input_ids"]) + 1 for t in texts)

    print("1. wrapped, max_length 512")
    kept = sum(
        len(r) for r in datamodule(tok, C4, packing="wrapped", max_length=512).train_dataset["input_ids"]
    )
    print(f"   tokens kept {kept:,} of {corpus:,} (text + one EOS per document)")

    print("4. bfd, max_length 512")
    packed = datamodule(tok, C4, packing="bfd", max_length=512).train_dataset
    ends = 0
    for ids, docs in zip(packed["input_ids"], packed["seq_lengths"]):
        ends += sum(ids[b - 1] == eos for b in itertools.accumulate(docs))
    print(f"   documents ending with EOS: {ends} of {len(texts)}")

    print("2. pre-tokenized rows padded to 64, no labels, one all-padding row")
    short = sorted(texts[:40], key=lambda t: len(tok(t)["input_ids"]))[:4]
    enc = tok(short + texts[:8], truncation=True, max_length=64, padding="max_length")
    rows = {k: [list(x) for x in v] + [[eos if k == "input_ids" else 0] * 64] for k, v in enc.items()}
    hf = DataCollatorForLanguageModeling(tok, mlm=False)([{k: rows[k][i] for k in rows} for i in range(4)])
    dm = datamodule(tok, datasets.Dataset.from_dict(rows), max_length=64, per_device_train_batch_size=4)
    ours = next(iter(dm.train_dataloader()))
    hf_n, our_n = (int((b["labels"][:, 1:] != -100).sum()) for b in (hf, ours))
    print(
        f"   targets in the first batch: HF {hf_n}, hf_lightning {our_n}; rows kept {len(dm.train_dataset)} "
        "of 13"
    )

    print("3. text rows that tokenize to nothing, batch size 1")
    ds = datasets.Dataset.from_dict({"text": ["hello world", "", "the cat sat"]})
    dm = datamodule(tok, ds, max_length=64, per_device_train_batch_size=1)
    print(
        f"   rows kept {len(dm.train_dataset)} of 3; batch shapes "
        f"{[tuple(b['input_ids'].shape) for b in dm.train_dataloader()]}"
    )
    row = datamodule(tok, ds, max_length=64, packing="bfd").train_dataset[0]
    print(f"   bfd row: {len(row['input_ids'])} tokens, {len(row['labels'])} labels")

    print("13. chat rows without an assistant turn")
    tok.chat_template = (
        "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '<|endoftext|>' }}{% endfor %}"
    )
    chats = [
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
        [{"role": "user", "content": "only a question"}],
        [{"role": "user", "content": "again"}],
    ]
    datamodule(tok, datasets.Dataset.from_dict({"messages": chats}), max_length=64)


if __name__ == "__main__":
    main()
