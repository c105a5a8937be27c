"""Every marked block of the README and the docs pages (``<!-- docs-test: NAME -->``) is run by a test,
and the blocks that bring their own stand-ins for the reader's tokenizer, model and data run as written.

Where each block runs: :data:`RUN_BY`. The blocks of docs/python.md also run without their stand-ins, under
the tests named there, with a tokenizer, a model and rows those tests choose to check the order of every
batch against HF.
"""

from __future__ import annotations

import json
import os
import re

import pytest

from tests.docs_support import REPO, docs_block, marked_blocks

#: block name -> the test file that runs it (the hub blocks and the tutorial run block by block there)
RUN_BY = {
    "chat": "tests/integration/test_docs_snippets.py",
    "hub-lora": "tests/integration/test_docs_hub.py",
    "hub-lora-load": "tests/integration/test_docs_hub.py",
    "hub-lora-default": "tests/integration/test_docs_hub.py",
    "hub-lora-default-load": "tests/integration/test_docs_hub.py",
    "tutorial-prepare": "tests/integration/test_docs.py",
    "tutorial-inspect": "tests/integration/test_docs.py",
    "tutorial-train": "tests/integration/test_docs.py",
    "tutorial-best": "tests/integration/test_docs.py",
    "tutorial-evaluate": "tests/integration/test_docs.py",
    "tutorial-python": "tests/integration/test_docs.py",
    "lightning-route": "tests/integration/test_readme_lightning_route.py",
    "own-module": "tests/unit/test_own_module.py",
    "plain-loop": "tests/integration/test_plain_loop.py",
    "hf-trainer": "tests/integration/test_hf_trainer_route.py",
}


def test_every_marked_block_is_run_by_a_test():
    blocks = marked_blocks()
    assert set(blocks) == set(RUN_BY)
    for name, test_file in RUN_BY.items():
        text = (REPO / test_file).read_text()
        # the test names the block (the hub and tutorial tests take every block of their prefix)
        assert name in text or re.match(r"(hub|tutorial)-", name), (name, test_file)


def test_every_python_block_of_the_readme_is_marked():
    """The README's Python blocks all run (each is marked, hence in :data:`RUN_BY`)."""
    text = (REPO / "README.md").read_text()
    assert text.count("```python") == len(re.findall(r"<!-- docs-test: [\w-]+ -->\n```python", text)) >= 1


def run_whole(name: str, capsys) -> dict:
    """The block run as a script (``__name__ == "__main__"``) in the current folder; its namespace."""
    namespace = {"__name__": "__main__"}
    capsys.readouterr()
    exec(compile(docs_block(name), f"<docs {name}>", "exec"), namespace)
    namespace["printed"] = capsys.readouterr().out
    return namespace


def conversations() -> int:
    from hf_lightning.defaults import prepare_chatterbot

    with open(prepare_chatterbot()["validation"]) as fh:
        return sum(1 for _ in fh)


@pytest.mark.slow
def test_the_plain_loop_block_runs_as_written(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    run_whole("plain-loop", capsys)
    saved = __import__("torch").load(tmp_path / "loop.pt")
    # 3 epochs over the copied conversations, batches of 4: the saved position is the end of the third
    per_epoch = -(-conversations() // 4)
    assert saved["data"]["epoch"] == 2 and saved["data"]["batches_consumed"] == per_epoch


@pytest.mark.slow
def test_the_hf_trainer_block_runs_as_written(tmp_path, monkeypatch, capsys):
    pytest.importorskip("accelerate", reason="HF Trainer needs accelerate (the test extra)")
    monkeypatch.chdir(tmp_path)
    ns = run_whole("hf-trainer", capsys)
    # HF counts its steps from the loader's length: 2 epochs of ceil(rows / 4) batches, accumulation 1
    assert ns["trainer"].state.global_step == 2 * -(-conversations() // 4)


@pytest.mark.slow
def test_the_own_module_block_runs_its_driver(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    ns = run_whole("own-module", capsys)
    assert ns["trainer"].global_step == 4 and "optimizer steps: 4" in ns["printed"]


@pytest.mark.slow
def test_the_readme_chat_block_runs_on_a_run_folder(tmp_path, monkeypatch, capsys):
    """The README's chat block reads the newest ``outputs/*/*/hf_model``: here a 2-step run of the default
    experiment, written where the README's first command writes it."""
    import subprocess
    import sys

    run = tmp_path / "outputs" / "2026-01-01" / "00-00-00"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "hf_lightning.train",
            "+experiment=sft",
            "trainer.max_steps=2",
            "scheduler.warmup_steps=1",
            "trainer.limit_val_batches=1",
            f"hydra.run.dir={run}",
        ],
        cwd=tmp_path,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    monkeypatch.chdir(tmp_path)
    ns = run_whole("chat", capsys)
    assert ns["path"] == os.path.join("outputs", "2026-01-01", "00-00-00", "hf_model")
    assert len(ns["out"][0]) > ns["inputs"]["input_ids"].shape[1]  # it generated
    assert json.loads((run / "hf_model" / "config.json").read_text())["model_type"] == "llama"
