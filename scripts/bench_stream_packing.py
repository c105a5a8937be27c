"""Packing a stream as it is read: tokens/s and peak memory against the corpus size.

``--docs`` short pre-tokenized documents (``input_ids`` of 8 to 64 GPT-2 ids, seeded) are written to a JSON
Lines file and trained on as ``HFDataModule(format="tokenized", streaming=True, packing=...)`` hands them out:
one epoch of the training ``DataLoader`` (batches of 8 packed rows of ``max_length`` 512, shuffle buffer 1000,
``data.pack_buffer`` 4096 for ``bfd``), read to its end. Each configuration runs in a fresh process, so that
its peak resident memory (``VmHWM``) is its own:

- ``stream bfd`` / ``stream wrapped``: one reader (1 rank, no workers), the whole stream packed and batched;
- ``stream bfd, reader 0 of 4``: what each reader of 2 ranks x 2 workers does: it reads and packs the whole
  stream and keeps 1 packed row in 4 (tokens/s counts the tokens it keeps);
- ``map-style bfd`` (the reference, ``--map-style``): the same file loaded as a ``datasets.Dataset`` and
  packed whole (``pack_dataset``) before the first batch; its time includes loading and packing.

tokens/s = real (non-padding) tokens of the batches / the seconds from the loader's first ``iter()`` to its
end (map-style: from ``setup``). One torch thread (``bench_support.set_threads``); the machine, the load and
the library versions are printed above the table.

    python scripts/bench_stream_packing.py --docs 100000 1000000 --map-style
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_support import machine_note, proc_status_kib, set_threads, table

CONFIGS = {
    "stream bfd": {"streaming": True, "packing": "bfd", "reader": None},
    "stream wrapped": {"streaming": True, "packing": "wrapped", "reader": None},
    "stream bfd, reader 0 of 4": {"streaming": True, "packing": "bfd", "reader": (0, 4)},
    "map-style bfd": {"streaming": False, "packing": "bfd", "reader": None},
}


def write_documents(path: Path, docs: int, seed: int = 0) -> int:
    """``docs`` rows ``{"input_ids": [...]}`` of 8 to 64 ids; returns the number of tokens."""
    rng = random.Random(seed)
    tokens = 0
    with open(path, "w") as fh:
        for _ in range(docs):
            n = rng.randint(8, 64)
            tokens += n
            fh.write(json.dumps({"input_ids": [rng.randrange(50257) for _ in range(n)]}) + "\n")
    return tokens


class PadOnly:
    pad_token_id = 50256
    eos_token_id = 50256
    model_input_names = ["input_ids"]


def measure(path: str, name: str) -> dict:
    """One configuration in this process: ``{"tokens", "seconds", "rows", "hwm_mib"}``."""
    import logging

    logging.disable(logging.WARNING)
    from hf_lightning import HFDataModule

    set_threads(1)
    config = CONFIGS[name]
    start = time.perf_counter()
    dm = HFDataModule(
        PadOnly(),
        path=path,
        format="tokenized",
        streaming=config["streaming"],
        packing=config["packing"],
        max_length=512,
        per_device_train_batch_size=8,
        validation_split=0.0,
        model_input_names=["input_ids", "position_ids"],
        seed=1,
    )
    dm.setup("fit")
    loader = dm.train_dataloader()
    if config["streaming"]:
        start = time.perf_counter()
    tokens = rows = 0
    if config["reader"] is not None:
        stream = loader.dataset
        stream.set_epoch(0)
        for row in stream.read_shard(*config["reader"]):
            rows += 1
            if any(v != -100 for v in row["labels"]):
                tokens += len(row["input_ids"])
    else:
        for batch in loader:
            rows += batch["input_ids"].shape[0]
            tokens += int(batch["input_ids"].ne(50256).sum())
    seconds = time.perf_counter() - start
    return {"tokens": tokens, "seconds": seconds, "rows": rows, "hwm_mib": proc_status_kib("VmHWM") / 1024}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--map-style", action="store_true", help="also the map-style reference")
    ap.add_argument("--one", nargs=2, metavar=("FILE", "CONFIG"), help=argparse.SUPPRESS)  # a child run
    args = ap.parse_args()
    if args.one:
        print(json.dumps(measure(*args.one)))
        return
    names = [n for n in CONFIGS if args.map_style or not n.startswith("map")]
    print(machine_note(), flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "HF_DATASETS_CACHE": str(Path(tmp) / "cache"), "HF_HUB_OFFLINE": "1"}
        for docs in args.docs:
            path = Path(tmp) / f"docs{docs}.jsonl"
            total = write_documents(path, docs)
            for name in names:
                proc = subprocess.run(
                    [sys.executable, __file__, "--one", str(path), name],
                    capture_output=True,
                    text=True,
                    env=env,
                )
                if proc.returncode:
                    raise SystemExit(proc.stderr[-3000:])
                r = json.loads(proc.stdout.strip().splitlines()[-1])
                rows.append(
                    [
                        f"{docs:,}",
                        name,
                        f"{total:,}",
                        f"{r['rows']:,}",
                        f"{r['tokens'] / r['seconds']:,.0f}",
                        f"{r['seconds']:.1f}",
                        f"{r['hwm_mib']:.0f}",
                    ]
                )
                print(" | ".join(rows[-1]), flush=True)
    print(
        table(
            ["documents", "configuration", "tokens", "rows", "tokens/s", "s", "peak MiB (VmHWM)"],
            rows,
        )
    )


if __name__ == "__main__":
    main()
