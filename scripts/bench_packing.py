"""Packing benchmark: tokens/s and peak memory of ``bfd`` and ``wrapped`` packing, before / ours / TRL.

    python scripts/bench_packing.py [--rounds 3] [--sizes 10000 100000 1000000] [--before-max 100000]
    python scripts/bench_packing.py --probe SIDE STRATEGY SOURCE N DATA_DIR  # one measurement as JSON

Inputs (``max_length`` 512, GPT-2 BPE, ``input_ids`` and ``labels`` columns, as the DataModule hands them
over): ``c4-demo`` (300 web documents, each ``text + EOS`` cut to 512), ``gsm8k`` (7,473 rows ``question + " "
+ answer + EOS``, the question masked in ``labels``), and ``synthetic-N``: N documents whose lengths are drawn
from GSM8K's (seeded) with random token ids.

Sides: ``before`` (``hf_lightning/data/packing.py`` at commit ``22a61d6``, every token a Python int, loaded
from git), ``ours`` (the Arrow engine), ``trl`` (``trl.pack_dataset`` as ``SFTTrainer`` calls it: map batches
of 1,000 documents, each packed on its own) and, for ``bfd``, ``trl-1batch`` (one map batch holding every
document: the same rows as ours; up to ``--one-batch-max`` documents). Every input is an in-memory
``datasets.Dataset`` over one Arrow table.

Each measurement runs in a fresh process: each side packs 50 c4-demo documents first (imports and first-call
costs stay out of the figures), the input is built, then ``VmRSS`` read, the packing call timed (wall and
CPU), and ``VmHWM`` (the process's peak resident memory, not ``ru_maxrss``, which carries the parent's peak)
read after it: "peak above start" is their difference. Configurations run interleaved over ``--rounds``
rounds; medians and the medians of per-round ratios are printed. ``before`` holds ~50 bytes per token in
Python lists, so it runs only up to ``--before-max`` documents (10^6 GSM8K-length documents would need about
10 GB).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MAX_LENGTH = 512
BEFORE_COMMIT = "22a61d6"
SIDES = ("before", "ours", "trl", "trl-1batch")


def _input_dataset(source: str, n: int, data_dir: Path):
    """The packing input as a ``datasets.Dataset`` (``input_ids``, ``labels``: int32 lists) and its token
    count."""
    import datasets
    import numpy as np
    import pyarrow as pa
    from datasets.fingerprint import generate_random_fingerprint

    if source.startswith("synthetic"):
        pool = np.load(data_dir / "gsm8k.npz")["lengths"]
        rng = np.random.default_rng(0)
        lengths = rng.choice(pool, n)
        offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int32)
        values = pa.array(rng.integers(0, 50_257, int(offsets[-1]), dtype=np.int32))
        ids = pa.ListArray.from_arrays(pa.array(offsets), values)
        labels = ids  # the same buffers: a copy would only cost the input memory
    else:
        saved = np.load(data_dir / f"{source}.npz")
        offsets = pa.array(np.concatenate(([0], np.cumsum(saved["lengths"]))).astype(np.int32))
        ids = pa.ListArray.from_arrays(offsets, pa.array(saved["ids"]))
        labels = pa.ListArray.from_arrays(offsets, pa.array(saved["labels"]))
    table = pa.table({"input_ids": ids, "labels": labels})
    return datasets.Dataset(table, fingerprint=generate_random_fingerprint()), int(len(ids.flatten()))


def _packer(side: str, strategy: str, data_dir: Path):
    if side == "ours":
        from hf_lightning.data.packing import pack_bfd, pack_wrapped

        return {"bfd": pack_bfd, "wrapped": pack_wrapped}[strategy]
    if side == "before":
        spec = importlib.util.spec_from_file_location("packing_before", data_dir / "packing_before.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return {"bfd": module.pack_bfd, "wrapped": module.pack_wrapped}[strategy]
    from trl import pack_dataset

    kwargs = {} if side == "trl" else {"map_kwargs": {"batch_size": 10**9}}
    return lambda ds, max_length: pack_dataset(ds, max_length, strategy, **kwargs)


def probe(side: str, strategy: str, source: str, n: int, data_dir: Path) -> dict:
    """One packing call in this process: its times and the process's memory around it."""
    import logging
    import warnings

    import datasets
    from bench_support import clock, proc_status_kib

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    datasets.disable_progress_bars()
    pack = _packer(side, strategy, data_dir)
    pack(_input_dataset("c4-demo", 0, data_dir)[0].select(range(50)), MAX_LENGTH)  # first-call costs, untimed
    ds, tokens = _input_dataset(source, n, data_dir)
    rss_before = proc_status_kib("VmRSS")
    hwm_before = proc_status_kib("VmHWM")
    wall0, cpu0 = clock()
    out = pack(ds, MAX_LENGTH)
    wall1, cpu1 = clock()
    return {
        "docs": len(ds),
        "tokens": tokens,
        "rows": len(out),
        "wall": wall1 - wall0,
        "cpu": cpu1 - cpu0,
        "rss_before_kib": rss_before,
        "hwm_before_kib": hwm_before,
        "hwm_after_kib": proc_status_kib("VmHWM"),
        "out_bytes": out.data.nbytes,
    }


def run_probe(side: str, strategy: str, source: str, n: int, data_dir: Path) -> dict:
    """:func:`probe` in a fresh Python process (``VmHWM`` only grows within one)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, __file__, "--probe", side, strategy, source, str(n), str(data_dir)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"probe {side} {strategy} {source} {n} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def prepare(data_dir: Path) -> dict[str, int]:
    """Tokenize c4-demo and GSM8K once (token arrays in ``data_dir``), write the ``before`` module; document
    counts."""
    import numpy as np
    from bench_support import REPO, gpt2_tokenizer, gsm8k_tokenized, shared_data

    tok = gpt2_tokenizer()
    texts = [json.loads(line)["text"] for line in (shared_data() / "c4-demo" / "c4_demo.jsonl").open()]
    c4 = [x[:MAX_LENGTH] for x in tok([t + tok.eos_token for t in texts])["input_ids"]]
    gsm = gsm8k_tokenized(tok, max_length=MAX_LENGTH)
    for name, ids, labels in (
        ("c4-demo", c4, c4),
        ("gsm8k", [r["input_ids"] for r in gsm], [r["labels"] for r in gsm]),
    ):
        np.savez(
            data_dir / f"{name}.npz",
            lengths=np.array([len(x) for x in ids]),
            ids=np.array([t for x in ids for t in x], dtype=np.int32),
            labels=np.array([t for x in labels for t in x], dtype=np.int32),
        )
    before = subprocess.run(
        ["git", "show", f"{BEFORE_COMMIT}:hf_lightning/data/packing.py"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    (data_dir / "packing_before.py").write_text(before)
    return {"c4-demo": len(c4), "gsm8k": len(gsm)}


def report(results: dict[tuple[str, str, str], list[dict]], rounds: str) -> None:
    """Print the table: medians over the rounds each configuration ran, ratios per round (ours / side, CPU
    time)."""
    from bench_support import median, table

    rows = []
    for (source, strategy, side), rs in results.items():
        tokens = rs[0]["tokens"]
        peak = median([(r["hwm_after_kib"] - r["rss_before_kib"]) * 1024 for r in rs])
        ours = results.get((source, strategy, "ours"), [])
        ratios = [r["cpu"] / o["cpu"] for o, r in zip(ours, rs)]
        rows.append(
            [
                source,
                strategy,
                side,
                rs[0]["docs"],
                tokens,
                rs[0]["rows"],
                len(rs),
                tokens / median([r["wall"] for r in rs]) / 1e6,
                tokens / median([r["cpu"] for r in rs]) / 1e6,
                median(ratios) if ratios else float("nan"),
                peak / 2**20,
                peak / tokens,
                rs[0]["out_bytes"] / tokens,
            ]
        )
    print(f"max_length {MAX_LENGTH}, {rounds} interleaved rounds, medians; each probe a fresh process")
    header = ["input", "strategy", "side", "documents", "tokens", "rows", "rounds", "M tok/s wall"]
    header += ["M tok/s CPU", "side CPU / ours CPU", "peak above start MiB", "peak B/token", "output B/token"]
    print(table(header, rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--before-max", type=int, default=100_000)
    parser.add_argument("--one-batch-max", type=int, default=10_000, help="largest input for trl-1batch")
    parser.add_argument("--strategies", nargs="+", default=["bfd", "wrapped"])
    parser.add_argument("--log", help="append each probe's result to this JSON Lines file as it comes")
    parser.add_argument("--report", help="print the table from a --log file (all rounds that finished)")
    parser.add_argument("--probe", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe:
        side, strategy, source, n, data_dir = args.probe
        print(json.dumps(probe(side, strategy, source, int(n), Path(data_dir))))
        return
    if args.report:
        results: dict[tuple[str, str, str], list[dict]] = {}
        for line in Path(args.report).read_text().splitlines():
            r = json.loads(line)
            results.setdefault(tuple(r.pop("key")), []).append(r)
        report(results, "up to " + str(max(len(v) for v in results.values())))
        return
    from bench_support import interleaved, machine_note

    print(machine_note(), flush=True)
    started = time.perf_counter()

    def logged(key, n, data_dir):
        result = run_probe(key[2], key[1], key[0], n, data_dir)
        if args.log:
            with open(args.log, "a") as fh:
                fh.write(json.dumps({"key": list(key), **result}) + "\n")
        return result

    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp)
        real = prepare(data_dir)
        inputs = [(name, n) for name, n in real.items()] + [(f"synthetic-{n}", n) for n in args.sizes]
        runs = {}
        for source, n in inputs:
            for strategy in args.strategies:
                for side in SIDES:
                    if side == "before" and n > args.before_max:
                        continue
                    if side == "trl-1batch" and (strategy != "bfd" or n > args.one_batch_max):
                        continue
                    key = (source, strategy, side)
                    runs[key] = lambda k=key, n=n: logged(k, n, data_dir)
        results = interleaved(runs, args.rounds)
    report(results, str(args.rounds))
    print(f"total {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
