"""Stream readers: rows/s per reader at 2 ranks x 2 DataLoader workers, split by rows (before) and by shards
(after).

A ``datasets`` stream of GSM8K rows (cycled, each row made distinct by its index) written as ``--files`` JSON
Lines or Parquet files, ``--rows`` rows in all, read by the 4 readers of 2 ranks x 2 workers through
:class:`hf_lightning.data.streams.ShardedStream` exactly as the training loader reads it (shuffle buffer 1000,
the epoch's seed), without tokenization (``--tokenize`` adds the GPT-2 tokenization of the rows a reader
keeps):

- ``rows``: today's split, every reader decodes all the rows and keeps 1 in 4 (no :meth:`plan_readers`);
- ``shards``: each reader reads its own 2 files (``plan_readers``); the per-shard row count that the plan
  makes once per rank, when the loader is built, is timed on its own (``count s``).

``datasets`` 5.2 ends every shuffled pass over Parquet files with a fixed 5 s pause (``time.sleep`` of
``config.SLEEP_TIME_ON_THREADS_SHUTDOWN``, a workaround for an Arrow thread issue), once per reader and epoch,
in both configurations; ``--no-shuffle`` measures the decoding without it.

Readers run one after the other in this process (one core each when they run in parallel); rows/s per reader =
the rows it yields / its time. Configurations interleaved per round; medians over readers and rounds.

    python scripts/bench_streams.py --rows 200000 --files 8 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from bench_support import gsm8k_prompt_completion, interleaved, median, table

READERS = (2, 2)  # ranks, workers


def write_files(folder: Path, rows: int, files: int, fmt: str) -> list[str]:
    import datasets

    base = gsm8k_prompt_completion()
    n = len(base)
    prompts, completions = base["prompt"], base["completion"]
    paths = []
    per_file = -(-rows // files)
    for f in range(files):
        lo, hi = f * per_file, min((f + 1) * per_file, rows)
        cols = {
            "id": list(range(lo, hi)),
            "prompt": [f"{i}: {prompts[i % n]}" for i in range(lo, hi)],
            "completion": [completions[i % n] for i in range(lo, hi)],
        }
        path = folder / f"part{f:02d}.{fmt}"
        if fmt == "parquet":
            datasets.Dataset.from_dict(cols).to_parquet(str(path))
        else:
            with open(path, "w") as fh:
                for i in range(hi - lo):
                    fh.write(json.dumps({k: v[i] for k, v in cols.items()}) + "\n")
        paths.append(str(path))
    return paths


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--format", choices=("jsonl", "parquet"), default="jsonl")
    ap.add_argument("--no-shuffle", action="store_true", help="read in file order (no shuffle buffer)")
    ap.add_argument(
        "--tokenize", action="store_true", help="tokenize the kept rows (GPT-2, prompt_completion)"
    )
    args = ap.parse_args()

    import datasets

    from hf_lightning.data.streams import ShardedStream
    from hf_lightning.data.tokenize import ExampleProcessor

    world, workers = READERS
    readers = world * workers
    processor = None
    if args.tokenize:
        from bench_support import gpt2_tokenizer

        processor = ExampleProcessor("prompt_completion", gpt2_tokenizer(), 512)
    with tempfile.TemporaryDirectory() as tmp:
        files = write_files(Path(tmp), args.rows, args.files, args.format)
        builder = "parquet" if args.format == "parquet" else "json"
        source = datasets.load_dataset(builder, data_files=files, streaming=True, split="train")

        def stream(rank: int) -> ShardedStream:
            shuffle = not args.no_shuffle
            s = ShardedStream(source, processor, rank=rank, world_size=world, shuffle=shuffle, seed=7)
            s.set_epoch(1)
            return s

        def run(split_by_shards: bool):
            def go():
                rates, count_s, seen = [], [], 0
                for rank in range(world):
                    s = stream(rank)
                    if split_by_shards:
                        t0 = time.perf_counter()
                        assert s.plan_readers(workers) is not None
                        count_s.append(time.perf_counter() - t0)
                    for w in range(workers):
                        t0 = time.perf_counter()
                        n = sum(1 for _ in s.read_shard(rank * workers + w, readers))
                        rates.append(n / (time.perf_counter() - t0))
                        seen += n
                return rates, count_s, seen

            return go

        results = interleaved({"rows": run(False), "shards": run(True)}, args.rounds)
    rows_rate = median([r for rates, _, _ in results["rows"] for r in rates])
    shard_rate = median([r for rates, _, _ in results["shards"] for r in rates])
    count_s = median([c for _, counts, _ in results["shards"] for c in counts])
    print(
        f"{args.rows:,} rows in {args.files} {args.format} files, {world} ranks x {workers} workers, "
        f"{args.rounds} rounds, shuffle={not args.no_shuffle}, tokenize={args.tokenize}"
    )
    print(
        table(
            ["split", "rows/s per reader", "rows per reader", "count s (once per rank)", "ratio"],
            [
                ["rows (before)", rows_rate, results["rows"][0][2] // readers, "-", 1.0],
                [
                    "shards (after)",
                    shard_rate,
                    results["shards"][0][2] // readers,
                    count_s,
                    shard_rate / rows_rate,
                ],
            ],
        )
    )


if __name__ == "__main__":
    main()
