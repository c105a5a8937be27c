"""The shipped experiments read the format from the column names, and the README's rename override
runs as written: GSM8K's ``question/answer`` under ``+experiment=clm`` is refused naming the
columns, what fits and the override; with that override (taken from README.md) it trains on the completions;
ShareGPT ``conversations`` under ``+experiment=sft`` trains; a forced ``data.format`` that the columns do not
fit is refused naming the format they do fit. Each refusal is one line, printed once."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from tests.errors.support import one_line_error, run_train_cli

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SHORT = (
    "trainer.max_steps=1",
    "trainer.limit_val_batches=1",
    "trainer.enable_model_summary=false",
    "data.per_device_train_batch_size=2",
    "data.per_device_eval_batch_size=2",
)


def readme_rename_override() -> str:
    """The prompt/completion ``data.rename_columns`` override exactly as README.md writes it (one inline code
    span; the README's other renames are classification's)."""
    spans = re.findall(r"`([+]*data\.rename_columns=[^`]*)`", (REPO / "docs" / "data.md").read_text())
    spans = [s for s in spans if "completion" in s]
    assert len(spans) == 1, spans
    return shlex.split(spans[0])[0]  # as the shell hands it to Python: the quotes removed


def _first_rows(source: Path, target: Path, n: int) -> Path:
    if source.suffix == ".json":
        rows = json.loads(source.read_text())[:n]
    else:
        rows = [json.loads(line) for line in source.read_text().splitlines()[:n]]
    target.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return target


def test_gsm8k_under_clm_is_refused_naming_the_fix_and_the_fix_runs(shared_data, tmp_path):
    gsm8k = Path(shared_data) / "gsm8k" / "train.jsonl"
    proc = run_train_cli("+experiment=clm", f"data.path={gsm8k}", f"hydra.run.dir={tmp_path / 'refused'}")
    line = one_line_error(proc)
    assert "the columns ['question', 'answer']" in line
    assert "prompt_completion: prompt+completion" in line  # the formats and the columns they read
    assert "+data.rename_columns='{question: prompt, answer: completion}'" in line
    assert "[ERROR]" not in proc.stdout + proc.stderr  # said once, not also as a log line

    override = readme_rename_override()
    assert override.startswith("+data.rename_columns=")
    rows = _first_rows(gsm8k, tmp_path / "gsm8k.jsonl", 24)
    run = tmp_path / "run"
    # GSM8K's questions run past 64 tokens: the completions need room
    proc = run_train_cli(
        "+experiment=clm",
        f"data.path={rows}",
        override,
        *SHORT,
        "data.max_length=320",
        f"hydra.run.dir={run}",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "examples (prompt_completion format)" in proc.stdout
    assert json.loads((run / "final_metrics.json").read_text())["global_step"] == 1


def test_sharegpt_under_sft_is_detected(shared_data, tmp_path):
    rows = _first_rows(
        Path(shared_data) / "fastchat-dummy" / "dummy_conversation.json", tmp_path / "sharegpt.jsonl", 24
    )
    run = tmp_path / "run"
    proc = run_train_cli(
        "+experiment=sft", f"data.path={rows}", *SHORT, "data.max_length=64", f"hydra.run.dir={run}"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "examples (conversations format)" in proc.stdout
    assert (run / "hf_model" / "config.json").is_file()


def test_a_forced_format_the_columns_do_not_fit_names_the_one_they_do(shared_data, tmp_path):
    rows = _first_rows(
        Path(shared_data) / "fastchat-dummy" / "dummy_conversation.json", tmp_path / "sharegpt.jsonl", 8
    )
    proc = run_train_cli(
        "+experiment=sft", f"data.path={rows}", "data.format=messages", f"hydra.run.dir={tmp_path / 'run'}"
    )
    line = one_line_error(proc)
    assert "format 'messages' needs a 'messages' field; the train split has ['id', 'conversations']" in line
    assert "these columns fit the format conversations: set data.format=conversations" in line
