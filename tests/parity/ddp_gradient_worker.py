"""Run one optimizer step of the tiny-Llama case on 2 real gloo DDP processes (Lightning ``ddp_spawn``).

Usage: ``python tests/parity/ddp_gradient_worker.py STATE.pt ROWS.json OUTDIR [--no-average-tokens] [--arch A]
[--plain] [--chunk N]``: ``--arch`` one of :data:`tests.parity.lean_cases.ARCHS` (default: the tiny-Llama
case's model), ``--plain`` the loss from the full logits (``lean_loss=False``), ``--chunk`` the lean loss's
tokens per chunk.
Called by ``test_gradient_invariance.py`` in a subprocess so that the spawned processes start from a clean
interpreter (no pytest state, no process group left over).
"""

from __future__ import annotations

import functools
import json
import logging
import sys

import torch

from tests.parity.lean_cases import make_arch_model
from tests.parity.tiny_llama_case import run_lightning_step

# hf_lightning's INFO lines (which loss ran) on stderr; at import, so that the spawned ranks (which import
# this file as __mp_main__) configure it too
logging.basicConfig(level=logging.INFO)


def _option(flag: str) -> str | None:
    args = sys.argv[4:]
    return args[args.index(flag) + 1] if flag in args else None


if __name__ == "__main__":
    state_path, rows_path, outdir = sys.argv[1:4]
    average = "--no-average-tokens" not in sys.argv[4:]
    state = torch.load(state_path)
    with open(rows_path) as fh:
        rows = json.load(fh)
    arch, chunk = _option("--arch"), _option("--chunk")
    run_lightning_step(
        state,
        rows,
        micro_batch=2,
        accumulation=2,
        outdir=outdir,
        devices=2,
        average_tokens=average,
        model_factory=None if arch is None else functools.partial(make_arch_model, arch),
        chunk_size=None if chunk is None else int(chunk),
        lean_loss="--plain" not in sys.argv[4:],
    )
