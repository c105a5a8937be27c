"""Packing benchmark: tokens/s and peak memory of ``bfd`` and ``wrapped`` packing, before / ours / TRL.

    python scripts/bench_packing.py [--rounds 3] [--sizes 10000 100000 1000000] [--before-max 100000]
    python scripts/bench_packing.py --pipeline [--rounds 2] [--sizes 10000 100000 1000000]
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

``--pipeline``: the whole data preparation from text rows to packed rows, ``bfd``. Input ``gsm8k-text-N``: N
rows ``{"text": question + " " + answer}`` (GSM8K train, cycled, each row made distinct by its index), written
as JSON Lines and loaded with ``datasets.load_dataset("json")`` into a fresh cache folder per probe (nothing
is served from an earlier probe's cache; loading is not measured). Sides: ``ours`` (``tokenize_dataset`` with
the ``bfd`` row plan, then ``pack_dataset``: the DataModule's ``prepare_split``), ``ours-before`` (the same
tokenization, then ``pack_dataset`` of ``hf_lightning/data/packing.py`` at ``--pipeline-before``, loaded from
git: the packed table in memory) and ``hf-trl`` (``Dataset.map`` of ``tokenizer(text + eos, truncation=True,
max_length=512)`` as ``SFTTrainer`` tokenizes, then ``trl.pack_dataset(ds, 512, "bfd")``). Besides the peak
(``VmHWM``, which counts the pages of memory-mapped files that were read), a thread reads ``RssAnon`` every
5 ms: "anonymous peak" is the memory the process allocated, without the page cache of mapped files.

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
import threading
import time
from pathlib import Path

MAX_LENGTH = 512
BEFORE_COMMIT = "22a61d6"
SIDES = ("before", "ours", "trl", "trl-1batch")
PIPELINE_SIDES = ("ours-before", "ours", "hf-trl")
PIPELINE_BEFORE = "7ef62b2"


def _text_rows(n: int, data_dir: Path) -> Path:
    """``gsm8k-text-N`` as JSON Lines in ``data_dir`` (written once)."""
    path = data_dir / f"gsm8k-text-{n}.jsonl"
    if not path.exists():
        from bench_support import shared_data

        texts = [
            (r["question"] + " " + r["answer"])
            for r in map(json.loads, (shared_data() / "gsm8k" / "train.jsonl").open())
        ]
        with path.open("w") as fh:
            for i in range(n):
                fh.write(json.dumps({"text": f"{i}. {texts[i % len(texts)]}"}) + "\n")
    return path


def _pipeline(side: str, data_dir: Path):
    """``(text dataset) -> packed dataset`` of ``side`` (see the module docstring)."""
    from bench_support import gpt2_tokenizer

    tok = gpt2_tokenizer()
    if side == "hf-trl":
        from trl import pack_dataset

        def run(ds):
            def tokenize(batch):
                return tok([t + tok.eos_token for t in batch["text"]], truncation=True, max_length=MAX_LENGTH)

            return pack_dataset(ds.map(tokenize, batched=True, remove_columns=["text"]), MAX_LENGTH, "bfd")

        return run
    from hf_lightning.data.packing import pack_dataset, row_plan
    from hf_lightning.data.tokenize import tokenize_dataset

    pack = pack_dataset
    if side == "ours-before":
        spec = importlib.util.spec_from_file_location(
            "packing_before", data_dir / "packing_pipeline_before.py"
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules["packing_before"] = module  # its dataclasses look their module up
        spec.loader.exec_module(module)
        pack = module.pack_dataset
    plan = row_plan("bfd", False, MAX_LENGTH)

    def run(ds):
        out = tokenize_dataset(ds, "text", tok, MAX_LENGTH, "train", "bench", plan=plan)
        return pack(out, "bfd", MAX_LENGTH)

    return run


def pipeline_probe(side: str, n: int, data_dir: Path) -> dict:
    """One tokenize + pack run in this process on a fresh cache: its times and the memory around it."""
    import logging
    import warnings

    import datasets
    import pyarrow.compute as pc
    from bench_support import clock, proc_status_kib

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    datasets.disable_progress_bars()
    run = _pipeline(side, data_dir)
    with tempfile.TemporaryDirectory(dir=data_dir) as cache:
        warm = datasets.load_dataset("json", data_files=str(_text_rows(50, data_dir)), cache_dir=cache)
        run(warm["train"])  # imports and first-call costs, untimed
        ds = datasets.load_dataset("json", data_files=str(_text_rows(n, data_dir)), cache_dir=cache)["train"]
        rss_before = proc_status_kib("VmRSS")
        anon_before = proc_status_kib("RssAnon")
        anon_peak = [anon_before]
        done = threading.Event()

        def sample() -> None:  # the kernel keeps no peak of RssAnon: read it every 5 ms
            while not done.wait(0.005):
                anon_peak[0] = max(anon_peak[0], proc_status_kib("RssAnon"))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        wall0, cpu0 = clock()
        out = run(ds)
        wall1, cpu1 = clock()
        hwm = proc_status_kib("VmHWM")
        done.set()
        sampler.join()
        lengths = pc.list_value_length(out.data.column("input_ids"))
        tokens = int(pc.sum(lengths).as_py() or 0)
        return {
            "docs": n,
            "tokens": tokens,
            "rows": len(out),
            "wall": wall1 - wall0,
            "cpu": cpu1 - cpu0,
            "rss_before_kib": rss_before,
            "hwm_after_kib": hwm,
            "anon_above_kib": max(anon_peak[0], proc_status_kib("RssAnon")) - anon_before,
            "file_backed": bool(out.cache_files),
        }


def pipeline_report(results: dict[tuple[str, str], list[dict]], rounds: str) -> None:
    """The pipeline table: medians over the rounds; ratios per round against ``hf-trl``."""
    from bench_support import median, table

    rows = []
    for (source, side), rs in results.items():
        hf = results.get((source, "hf-trl"), [])
        peak = [(r["hwm_after_kib"] - r["rss_before_kib"]) / 1024 for r in rs]
        hf_peak = [(h["hwm_after_kib"] - h["rss_before_kib"]) / 1024 for h in hf]
        rows.append(
            [
                source,
                side,
                rs[0]["docs"],
                rs[0]["tokens"],
                rs[0]["rows"],
                rs[0]["file_backed"],
                len(rs),
                median([r["cpu"] for r in rs]),
                median([r["cpu"] / h["cpu"] for r, h in zip(rs, hf)]) if hf else float("nan"),
                median(peak),
                median([p / q for p, q in zip(peak, hf_peak)]) if hf else float("nan"),
                median([r.get("anon_above_kib", float("nan")) / 1024 for r in rs]),
            ]
        )
    print(
        f"tokenize + bfd pack, max_length {MAX_LENGTH}, {rounds} interleaved rounds, medians; a process each"
    )
    header = ["input", "side", "documents", "tokens", "rows", "file-backed", "rounds", "CPU s"]
    header += ["CPU / hf-trl", "peak above start MiB", "peak / hf-trl", "anonymous peak above start MiB"]
    print(table(header, rows))


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


def run_pipeline(args: argparse.Namespace) -> None:
    """The ``--pipeline`` runs, interleaved, and their table (each probe logged to ``--log`` as it comes)."""
    from bench_support import REPO, interleaved, machine_note

    print(machine_note(), flush=True)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp)
        before = subprocess.run(
            ["git", "show", f"{args.pipeline_before}:hf_lightning/data/packing.py"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        (data_dir / "packing_pipeline_before.py").write_text(before)

        def probe_once(side: str, n: int) -> dict:
            _text_rows(n, data_dir)
            env = {**os.environ, "HF_HUB_OFFLINE": "1"}
            cmd = [sys.executable, __file__, "--pipeline-probe", side, str(n), str(data_dir)]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, env=env)
            if proc.returncode != 0:
                raise RuntimeError(f"pipeline probe {side} {n} failed:\n{proc.stderr[-3000:]}")
            result = json.loads(proc.stdout.strip().splitlines()[-1])
            if args.log:
                with open(args.log, "a") as fh:
                    fh.write(json.dumps({"key": [f"gsm8k-text-{n}", side], **result}) + "\n")
            print(f"{side} {n}: {result}", file=sys.stderr, flush=True)
            return result

        runs = {}
        for n in args.sizes:
            for side in args.sides:
                runs[(f"gsm8k-text-{n}", side)] = lambda side=side, n=n: probe_once(side, n)
        results = interleaved(runs, args.rounds)
    pipeline_report(results, str(args.rounds))
    print(f"total {time.perf_counter() - started:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--before-max", type=int, default=100_000)
    parser.add_argument("--one-batch-max", type=int, default=10_000, help="largest input for trl-1batch")
    parser.add_argument("--strategies", nargs="+", default=["bfd", "wrapped"])
    parser.add_argument("--log", help="append each probe's result to this JSON Lines file as it comes")
    parser.add_argument("--report", help="print the table from a --log file (all rounds that finished)")
    parser.add_argument("--pipeline", action="store_true", help="tokenize + pack against datasets.map + TRL")
    parser.add_argument("--pipeline-before", default=PIPELINE_BEFORE, help="commit of the ours-before side")
    parser.add_argument("--sides", nargs="+", default=list(PIPELINE_SIDES), help="--pipeline sides")
    parser.add_argument("--probe", nargs=5, help=argparse.SUPPRESS)
    parser.add_argument("--pipeline-probe", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.pipeline_probe:
        side, n, data_dir = args.pipeline_probe
        print(json.dumps(pipeline_probe(side, int(n), Path(data_dir))))
        return
    if args.pipeline and args.report:
        piped: dict[tuple[str, str], list[dict]] = {}
        for line in Path(args.report).read_text().splitlines():
            r = json.loads(line)
            piped.setdefault(tuple(r.pop("key")), []).append(r)
        pipeline_report(piped, "up to " + str(max(len(v) for v in piped.values())))
        return
    if args.pipeline:
        run_pipeline(args)
        return
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
