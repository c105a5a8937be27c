"""``model.compile=true``: the compilations of a fit counted with their reasons, and inputs of varying batch
and sequence lengths compiled once (``hf_lightning.module.compiled``). The eager backend keeps these fast; the
inductor runs, compiled weights against eager ones, are in ``tests/integration/test_compile_cpu.py``."""

from __future__ import annotations

import torch

from hf_lightning.module.compiled import CompileReport, mark_batch_dynamic


def _masked_sum(input_ids, attention_mask):
    return (input_ids * attention_mask).sum()


def _batches():
    # rows and lengths vary as padded and packed-per-batch batches do (a one-row batch is specialised by
    # dynamo: sizes 0 and 1 are never symbolic)
    for rows, length in ((4, 9), (3, 12), (4, 17), (2, 40)):
        yield {
            "input_ids": torch.ones(rows, length, dtype=torch.long),
            "attention_mask": torch.ones(rows, length),
        }


def _run(mark: bool) -> CompileReport:
    torch._dynamo.reset()
    report = CompileReport()
    report.start()
    fn = torch.compile(_masked_sum, backend="eager")
    for batch in _batches():
        if mark:
            mark_batch_dynamic(batch)
        fn(**batch)
    return report


def test_unmarked_lengths_recompile_and_the_line_says_why():
    report = _run(mark=False)
    firsts, reasons, failures = report.counts()
    assert firsts == 1 and len(reasons) >= 1 and failures == []
    assert "size mismatch at index" in reasons[0]
    line = report.line()
    assert line.startswith(
        f"model.compile=true: torch.compile compiled {1 + len(reasons)} times during fit: 1 first "
        f"compilation and {len(reasons)} recompilation"
    )
    assert reasons[0] in line


def test_marked_batches_compile_once():
    report = _run(mark=True)
    assert report.counts() == (1, [], [])
    assert report.line() == (
        "model.compile=true: torch.compile compiled 1 time during fit: 1 first compilation and 0 "
        "recompilations"
    )


def test_a_report_counts_only_what_came_after_its_start():
    _run(mark=True)
    report = CompileReport()
    report.start()
    assert report.counts() == (0, [], [])
