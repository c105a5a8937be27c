"""Shared pieces of the benchmark scripts: data location, the GPT-2 tokenizer, GSM8K rows, tiny Llamas, and an
interleaved runner that reports medians and ratios.

Benchmarks on a shared machine: absolute times move with the load of the other processes, so every script runs
its configurations *interleaved* (round 1: a, b, c; round 2: b, c, a; ...) and reports medians and the ratios
of medians. A ratio is only compared within one run of one script.

Imported by the scripts beside it (``python scripts/NAME.py`` puts this folder first on ``sys.path``).
"""

from __future__ import annotations

import logging
import os
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def proc_status_kib(field: str) -> int:
    """A ``/proc/self/status`` memory field in KiB: ``VmRSS`` (resident now) or ``VmHWM`` (peak resident).

    ``VmHWM`` belongs to this process's address space, which ``exec`` makes new. ``getrusage().ru_maxrss``
    does not: Linux carries the parent's peak across ``fork`` + ``exec``, so a probe started from a large
    pytest process would report the parent's peak as its own.
    """
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def shared_data() -> Path:
    """``$HF_LIGHTNING_SHARED_DATA`` or ``<repo>/../shared/data``; exits with a message when it is missing."""
    path = Path(os.environ.get("HF_LIGHTNING_SHARED_DATA", REPO / ".." / "shared" / "data"))
    if not path.is_dir():
        raise SystemExit(f"shared data folder {path} not found (set HF_LIGHTNING_SHARED_DATA)")
    return path


def gpt2_tokenizer():
    """The shared GPT-2 BPE (``gpt2-tokenizer/tokenizer.json``), pad = eos = ``<|endoftext|>``."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_file=str(shared_data() / "gpt2-tokenizer" / "tokenizer.json"),
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
    )


def gsm8k_prompt_completion(limit: int | None = None):
    """GSM8K train as a ``datasets.Dataset`` of ``prompt`` (question) / ``completion`` (answer) strings."""
    import datasets

    rows = datasets.load_dataset(
        "json", data_files=str(shared_data() / "gsm8k" / "train.jsonl"), split="train"
    )
    if limit is not None:
        rows = rows.select(range(min(limit, len(rows))))
    return rows.rename_columns({"question": "prompt", "answer": "completion"})


def gsm8k_tokenized(tokenizer, max_length: int = 512, limit: int | None = None) -> list[dict[str, list[int]]]:
    """GSM8K rows as ``input_ids`` / ``labels`` with the question masked (-100): the SFT rows of the
    benchmarks.

    Tokenized as ``tokenizer(question + " " + answer + eos)``, the question part measured with the same call.
    """
    rows = gsm8k_prompt_completion(limit)
    prompts = tokenizer(list(rows["prompt"]))["input_ids"]
    full = tokenizer(
        [p + " " + c + tokenizer.eos_token for p, c in zip(rows["prompt"], rows["completion"])],
        truncation=True,
        max_length=max_length,
    )["input_ids"]
    out = []
    for p, ids in zip(prompts, full):
        n = min(len(p), len(ids) - 1)
        out.append({"input_ids": ids, "labels": [-100] * n + ids[n:]})
    return out


def tiny_llama(
    vocab_size: int, hidden_size: int, layers: int, heads: int, seed: int = 0, max_positions: int = 1024
):
    """A ``LlamaForCausalLM`` from a config (fp32, no KV cache, untied head), seeded init."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=4 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=max_positions,
        use_cache=False,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config)


def interleaved(runs: dict[str, Callable[[], Any]], rounds: int) -> dict[str, list[Any]]:
    """Call every run ``rounds`` times, rotating the order each round; ``{name: [result per round]}``."""
    names = list(runs)
    out: dict[str, list[Any]] = {n: [] for n in names}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            out[name].append(runs[name]())
    return out


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def clock() -> tuple[float, float]:
    """``(wall, cpu)`` seconds: ``time.perf_counter()`` and this process's CPU time (all its threads).

    On a shared machine the wall time of a step includes the time the process waited for a core; its CPU time
    does not, so CPU-time ratios stay put while the load moves. Both are reported.
    """
    return time.perf_counter(), time.process_time()


def step_times(stamps: Sequence[tuple[float, float]], warmup: int, which: int = 0) -> list[float]:
    """Durations between consecutive step-end :func:`clock` stamps (``which`` 0: wall, 1: CPU), the first
    ``warmup`` steps dropped."""
    return [b[which] - a[which] for a, b in zip(stamps[warmup:], stamps[warmup + 1 :])]


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table (pastes into ``docs/benchmarks.md`` as is)."""

    def cell(c: Any) -> str:
        if isinstance(c, float):
            return f"{c:.0f}" if abs(c) >= 100 else f"{c:.3g}"
        return str(c)

    cells = [[str(c) for c in header]] + [[cell(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in cells]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def set_threads(n: int) -> None:
    """Pin torch's intra-op threads. On a machine whose cores other processes also use, torch's default (one
    thread per core) makes every op wait for a descheduled thread: a 12 ms micro-batch took 200 ms with 2
    threads under a load of 6 on 2 cores. One thread keeps the timings stable; the ratios are what matter."""
    import torch

    torch.set_num_threads(n)
    torch.set_num_interop_threads(n)


def machine_note() -> str:
    """CPU count, load average and library versions, printed above each table."""
    import lightning
    import torch
    import transformers

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (
        f"{os.cpu_count()} CPUs, torch {torch.__version__} ({torch.get_num_threads()} threads), lightning "
        f"{lightning.__version__}, transformers {transformers.__version__}, load average {load:.1f} at "
        f"start, {time.strftime('%Y-%m-%d %H:%M')}"
    )


def hf_stamps(stamps: list[tuple[float, float]]) -> Any:
    """An HF ``TrainerCallback`` that appends a :func:`clock` stamp at the start of training and at every
    optimizer-step end to ``stamps``."""
    from transformers import TrainerCallback

    class Stamp(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            stamps.append(clock())

        def on_step_end(self, args, state, control, **kw):
            stamps.append(clock())

    return Stamp()


def lightning_stamps(stamps: list[tuple[float, float]]) -> Any:
    """A Lightning callback that appends a :func:`clock` stamp at the start of training and after every
    batch that ended an optimizer step to ``stamps``."""
    import lightning as L

    class Stamp(L.Callback):
        def on_train_start(self, trainer, pl_module):
            stamps.append(clock())

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if trainer.global_step > len(stamps) - 1:
                stamps.append(clock())

    return Stamp()


def quiet_libraries() -> None:
    """Only errors from the loggers of lightning, hf_lightning, transformers and datasets (imported first)."""
    import lightning  # noqa: F401  (its loggers exist once imported)
    import transformers  # noqa: F401

    for name in list(logging.root.manager.loggerDict):
        if name.split(".")[0] in (
            "lightning",
            "pytorch_lightning",
            "hf_lightning",
            "transformers",
            "datasets",
        ):
            logging.getLogger(name).setLevel(logging.ERROR)
