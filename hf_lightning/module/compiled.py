"""``model.compile=true``: the model's inputs compiled with symbolic lengths, and the compilations of a
``fit`` counted and said in one INFO line at its end.

Batch shapes vary from step to step: padded rows take the longest row of their batch, a padding-free row the
sum of its documents, packed-per-batch batches a varying number of rows, the window's last micro-batch may be
short. ``torch.compile`` specialises its first compilation to the shapes it sees and recompiles, with those
dimensions symbolic, the first time another one comes (its "automatic dynamic shapes"); past
``torch._dynamo.config.recompile_limit`` recompilations of one frame it stops compiling and runs the frame
eagerly. :func:`mark_batch_dynamic` marks the batch and sequence dimensions of every input symbolic from the
first compilation on, so varying lengths cost no recompilation at all, and no length is padded (the loss stays
exactly the eager one's). What does recompile the model is a change of what its graph is: training (with
gradients) and evaluation or a probe (without) are separate graphs. :class:`CompileReport` counts them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import torch

from hf_lightning.compat import compilations, mark_dimension_dynamic

log = logging.getLogger(__name__)

#: characters of one recompilation reason kept in the log line
REASON_CHARS = 160


def mark_batch_dynamic(inputs: Mapping[str, Any]) -> None:
    """Mark dimensions 0 (rows) and 1 (positions) of each input tensor of two or more dimensions symbolic for
    ``torch.compile`` (``input_ids``, ``attention_mask``, ``position_ids``, ``decoder_input_ids`` ...). A
    dimension of size 0 or 1 may still specialise (a padding-free batch is one row)."""
    for value in inputs.values():
        if isinstance(value, torch.Tensor) and value.dim() >= 2:
            mark_dimension_dynamic(value, 0)
            mark_dimension_dynamic(value, 1)


def _reason(text: str) -> str:
    first = " ".join(text.strip().splitlines()[0].split()) if text.strip() else "unknown"
    return first if len(first) <= REASON_CHARS else first[: REASON_CHARS - 3] + "..."


class CompileReport:
    """The compilations of ``torch.compile`` between :meth:`start` and :meth:`line`, in this process (every
    compiled function's: the model's forward, and any other a user compiled)."""

    def __init__(self) -> None:
        self._since_us = time.time_ns() // 1000

    def start(self) -> None:
        self._since_us = time.time_ns() // 1000

    def counts(self) -> tuple[int, list[str], list[str]]:
        """``(first compilations, recompilation reasons, failures)`` since :meth:`start`."""
        new = compilations(self._since_us)
        firsts = sum(1 for _, reason, _ in new if reason is None)
        reasons = [f"{compile_id}: {_reason(reason)}" for compile_id, reason, _ in new if reason is not None]
        failures = [f"{compile_id}: {_reason(failure)}" for compile_id, _, failure in new if failure]
        return firsts, reasons, failures

    def line(self) -> str:
        """One line: how many compilations, recompilations and why, failures (``model.compile=true: ...``)."""
        firsts, reasons, failures = self.counts()
        total = firsts + len(reasons)
        text = (
            f"model.compile=true: torch.compile compiled {total} time{'s' if total != 1 else ''} during fit: "
            f"{firsts} first compilation{'s' if firsts != 1 else ''} and {len(reasons)} "
            f"recompilation{'s' if len(reasons) != 1 else ''}"
        )
        if reasons:
            text += " (" + "; ".join(reasons) + ")"
        if failures:
            text += f"; {len(failures)} failed and ran eagerly (" + "; ".join(failures) + ")"
        return text

    def say(self, rank_zero: bool = True) -> None:
        """Log :meth:`line` at INFO (on rank zero only)."""
        if rank_zero:
            log.info(self.line())
