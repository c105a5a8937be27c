"""The Lightning route of docs/python.md runs as it is written: its block executed with a
tiny model folder and two chat files in place of the hub id and the file names it shows."""

from __future__ import annotations

import json
import re

from tests.data_support import tiny_llama
from tests.docs_support import docs_block

HUB_ID = '"Qwen/Qwen2.5-0.5B-Instruct"'


def lightning_route() -> str:
    return docs_block("lightning-route")


def chats(n: int, offset: int) -> str:
    letters = "abcdefghijklmnopqrstuvwxyz"
    rows = []
    for i in range(n):
        q = " ".join(letters[(offset + i + j) % 26] for j in range(2 + i % 3))
        a = " ".join(letters[(offset + 3 * i + j) % 26] for j in range(1 + i % 4))
        rows.append({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]})
    return "".join(json.dumps(r) + "\n" for r in rows)


def test_the_readme_lightning_route_runs_as_written(tmp_path, monkeypatch, capsys, word_tokenizer):
    code = lightning_route()
    assert code.count(HUB_ID) == 2 and '"chats.jsonl"' in code and '"test.jsonl"' in code
    model_dir = tmp_path / "model"
    tiny_llama(len(word_tokenizer)).save_pretrained(model_dir)
    word_tokenizer.save_pretrained(model_dir)
    (tmp_path / "chats.jsonl").write_text(chats(40, 0))
    (tmp_path / "test.jsonl").write_text(chats(6, 7))
    monkeypatch.chdir(tmp_path)

    namespace: dict = {}
    exec(compile(code.replace(HUB_ID, repr(str(model_dir))), "docs/python.md", "exec"), namespace)

    trainer, dm = namespace["trainer"], namespace["dm"]
    assert trainer.global_step == 2  # 38 training rows (2 held out): 5 micro-batches of 8, windows of 4 and 1
    assert len(dm.test_dataset) == 6
    printed = capsys.readouterr().out
    assert re.search(
        r"\[\{'test/loss': [0-9.]+, 'test/accuracy': [0-9.]+, 'test/perplexity': [0-9.]+\}\]", printed
    )
