"""Run one optimizer step of the tiny-Llama case on 2 real gloo DDP processes (Lightning ``ddp_spawn``).

Usage: ``python tests/parity/ddp_gradient_worker.py STATE.pt ROWS.json OUTDIR [--no-average-tokens]``.
Called by ``test_gradient_invariance.py`` in a subprocess so that the spawned processes start from a clean
interpreter (no pytest state, no process group left over).
"""

from __future__ import annotations

import json
import sys

import torch

from tests.parity.tiny_llama_case import run_lightning_step

if __name__ == "__main__":
    state_path, rows_path, outdir = sys.argv[1:4]
    average = "--no-average-tokens" not in sys.argv[4:]
    state = torch.load(state_path)
    with open(rows_path) as fh:
        rows = json.load(fh)
    run_lightning_step(state, rows, micro_batch=2, accumulation=2, outdir=outdir, devices=2, average_tokens=average)
