"""docs/hub.md ("Hub models and datasets, LoRA") runs as written, block by block, from a fresh folder.

The hub ids it names are served from caches laid out by the test in a private ``HF_HOME``: a tiny Llama (the
default tokenizer, ChatML template) stands in for ``Qwen/Qwen2.5-0.5B-Instruct``, and chat rows with
``no_robots``' columns and splits (``train``, ``test``) for ``HuggingFaceH4/no_robots``. Shell blocks run in
bash with no ``HF_HUB_OFFLINE`` of ours (the block exports it) and the hub endpoint pointed at a closed port.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hub_support import lay_out_dataset, lay_out_model, save_tiny_llama

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


def readme_blocks() -> dict[str, str]:
    from tests.docs_support import marked_blocks

    return {name: body for name, (_, _, body) in marked_blocks().items() if name.startswith("hub-")}


def chat_rows(n: int, start: int = 0) -> list[dict]:
    rows = []
    for i in range(start, start + n):
        messages = [
            {"role": "user", "content": f"Name {i % 5 + 2} colours, please."},
            {"role": "assistant", "content": "Red, green, blue, yellow and white."[: 10 + 3 * (i % 7)]},
        ]
        rows.append(
            {
                "prompt": messages[0]["content"],
                "prompt_id": str(i),
                "messages": messages,
                "category": "Brainstorm",
            }
        )
    return rows


@pytest.fixture
def home(tmp_path, default_tokenizer):
    home = tmp_path / "hf_home"
    model = save_tiny_llama(tmp_path / "standin-model", default_tokenizer)
    lay_out_model(home / "hub", "Qwen/Qwen2.5-0.5B-Instruct", model)
    files = {}
    for split, rows in (("train", chat_rows(40)), ("test", chat_rows(8, 40))):
        files[split] = str(tmp_path / f"{split}.jsonl")
        Path(files[split]).write_text("".join(json.dumps(r) + "\n" for r in rows))
    lay_out_dataset(home / "datasets", "HuggingFaceH4/no_robots", files)
    return home


def run(code: str, language: str, cwd: Path, home: Path) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(HF_HOME=str(home), HF_ENDPOINT="http://127.0.0.1:9", HF_HUB_DISABLE_TELEMETRY="1")
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    if language == "python":
        env["HF_HUB_OFFLINE"] = "1"  # the shell of the README exported it
        command = [sys.executable, "-c", code]
    else:
        command = ["bash", "-ec", code.replace("python -m", f"{sys.executable} -m")]
    proc = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


def test_the_hub_lora_section_runs_as_written(home, tmp_path):
    blocks = readme_blocks()
    assert set(blocks) == {"hub-lora", "hub-lora-load", "hub-lora-default", "hub-lora-default-load"}
    work = tmp_path / "work"
    work.mkdir()

    run(blocks["hub-lora"], "bash", work, home)
    exported = work / "outputs" / "qwen-lora" / "hf_model"
    config = json.loads((exported / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "Qwen/Qwen2.5-0.5B-Instruct"
    assert (exported / "adapter_model.safetensors").is_file() and not (
        exported / "model.safetensors"
    ).exists()
    assert (exported / "chat_template.jinja").is_file()
    with open(work / "outputs" / "qwen-lora" / "metrics.csv") as fh:
        assert "val/loss" in fh.readline()  # validated on the dataset's test split
    reply = run(blocks["hub-lora-load"], "python", work, home).strip().splitlines()
    assert reply, "no reply printed"

    run(blocks["hub-lora-default"], "bash", work, home)
    assert (work / "outputs" / "sft-lora" / "hf_model" / "adapter_config.json").is_file()
    assert not (work / "outputs" / "sft-merged" / "hf_model" / "adapter_config.json").exists()
    printed = run(blocks["hub-lora-default-load"], "python", work, home).strip().splitlines()
    kinds = [line.split(" ", 1)[0] for line in printed[-2:]]
    assert kinds == ["PeftModelForCausalLM", "LlamaForCausalLM"]
    # the same training (same seed and data), one exported as an adapter and one merged: the same greedy reply
    assert printed[-2].split(" ", 1)[1] == printed[-1].split(" ", 1)[1]
