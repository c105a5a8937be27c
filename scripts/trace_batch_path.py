"""The files a batch passes through, from ``data.path`` to ``loss.backward()``.

    python scripts/trace_batch_path.py [--json OUT] [OVERRIDES...]
    python scripts/trace_batch_path.py +experiment=clm data.path=../shared/data/c4-demo/c4_demo.jsonl \\
        data.max_length=128 trainer.max_steps=1 trainer.limit_val_batches=0 trainer.enable_progress_bar=false

Runs ``train(cfg)`` of the composed config under ``sys.setprofile`` until the first
``torch.autograd.backward`` and records every ``hf_lightning`` function that receives the data: the
``data.path`` string, a dataset, rows or a batch (a mapping with a column such as ``input_ids`` or ``text``),
or a loader or sampler of them; from the first ``training_step`` on, also every function that receives a
tensor (the loss files: ``compute_loss``, the lean loss and its chunked cross-entropy get the hidden states
and the labels, not the batch). Prints the files (with the functions seen in each) and the cross-file hops (a
new caller file -> callee file pair). ``config/``, ``callbacks/`` and ``core/arguments.py`` are listed apart,
with the files reached only through ``callbacks/``: they read the path or the batch (the schema and the value
rules it shares with the constructors, the throughput figures) but never change it. Slow (the profiler sees
every call).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Mapping
from typing import Any

COLUMNS = {"input_ids", "text", "messages", "conversations", "prompt", "source", "labels"}
# they read the data, never change it (core/arguments.py: the value rules the schema and constructors check)
SIDE = ("config/", "callbacks/", "core/arguments.py")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the files and hops here")
    args, overrides = parser.parse_known_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import datasets
    import torch
    from torch.utils.data import DataLoader, Dataset, Sampler

    import hf_lightning
    from hf_lightning.config.compose import compose_train
    from hf_lightning.train import train

    root = os.path.dirname(hf_lightning.__file__) + os.sep
    run_dir = tempfile.TemporaryDirectory(prefix="trace_batch_path")  # the run's folder, removed at the end
    cfg = compose_train(overrides, output_dir=run_dir.name)
    data_path = cfg.data.path
    kinds = (datasets.Dataset, datasets.IterableDataset, datasets.DatasetDict, Dataset, DataLoader, Sampler)

    def carries(value: Any) -> bool:
        if isinstance(value, kinds) or type(value).__name__ in (
            "AccumulationWindowLoader",
            "WindowLoader",
            "ShardedStream",
        ):
            return True
        if isinstance(value, Mapping):
            return bool(COLUMNS & set(map(str, value)))
        if isinstance(value, (list, tuple)) and value and isinstance(value[0], Mapping):
            return bool(COLUMNS & set(map(str, value[0])))
        return data_path is not None and isinstance(value, str) and value == data_path

    files: dict[str, set[str]] = {}
    reads: dict[str, set[str]] = {}  # in config/ or callbacks/, or reached only from callbacks/ (reads)
    hops: dict[tuple[str, str], str] = {}
    reached = False
    stepping = False  # inside the first training_step: tensors are the batch's from here on
    backward = os.path.join("torch", "autograd", "__init__.py")

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal reached, stepping
        if reached or event != "call":
            return
        code = frame.f_code
        if code.co_filename.endswith(backward) and code.co_name == "backward":
            reached = True
            sys.setprofile(None)
            return
        if not code.co_filename.startswith(root) or not code.co_flags & 0x02:  # a function, not a module
            return
        names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
        if code.co_name == "training_step":
            stepping = True
        try:
            values = [frame.f_locals.get(n) for n in names]
            if not any(carries(v) or (stepping and isinstance(v, torch.Tensor)) for v in values):
                return
        except Exception:  # a value whose __eq__ or keys fail: not data
            return
        callee = code.co_filename[len(root) :]
        if callee.startswith(SIDE) or _under_side(frame.f_back, root):
            reads.setdefault(callee, set()).add(code.co_qualname)
            return
        files.setdefault(callee, set()).add(code.co_qualname)
        caller_frame = frame.f_back
        while caller_frame is not None and not caller_frame.f_code.co_filename.startswith(root):
            caller_frame = caller_frame.f_back
        if caller_frame is not None:
            caller = caller_frame.f_code.co_filename[len(root) :]
            if caller != callee:
                hops.setdefault((caller, callee), f"{caller_frame.f_code.co_name} -> {code.co_name}")

    sys.setprofile(profile)
    try:
        train(cfg)
    finally:
        sys.setprofile(None)
        run_dir.cleanup()
    path = sorted(files)
    side = sorted(set(reads) - set(files))
    print(f"backward reached: {reached}")
    print(f"files on the path: {len(path)}")
    for name in path:
        print(f"  {name}: {', '.join(sorted(files[name]))}")
    print(f"read only ({', '.join(SIDE)}): {len(side)}: {', '.join(side)}")
    print(f"cross-file hops: {len(hops)}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(
                {
                    "overrides": overrides,
                    "reached_backward": reached,
                    "files": {k: sorted(v) for k, v in sorted(files.items())},
                    "read_only": {k: sorted(v) for k, v in sorted(reads.items())},
                    "hops": [{"from": a, "to": b, "first": f} for (a, b), f in hops.items()],
                },
                fh,
                indent=1,
            )
    return 0 if reached else 1


def _under_side(frame: Any, root: str) -> bool:
    """Whether a call from ``frame`` comes from a ``callbacks/`` function (a read of the batch; the builder in
    ``config/`` also prepares data for some tasks, so what it calls stays on the path)."""
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(root) and name[len(root) :].startswith("callbacks/"):
            return True
        frame = frame.f_back
    return False


if __name__ == "__main__":
    sys.exit(main())
