"""``python -m hf_lightning.evaluate`` on a file: no train split is prepared or logged,
``predictions.jsonl`` holds each row's prompt and reference text beside the reply, and ``generate=true``
generates in left-padded batches whose greedy replies equal HF ``generate`` run on one prompt at a time."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.integration.log_support import gpt2_tokenizer, save_gpt2

pytestmark = pytest.mark.slow

ROWS = [
    {"prompt": "What is two plus three?", "completion": " Five."},
    {"prompt": "Name a colour.", "completion": " Blue."},
    {
        "prompt": "Which city is the capital of France, the country in western Europe?",
        "completion": " Paris.",
    },
    {"prompt": "Say hi.", "completion": " Hi!"},
    {"prompt": "How many legs has a cat?", "completion": " Four."},
]


def test_evaluate_writes_prompt_reference_and_batched_replies(shared_data, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    tok = gpt2_tokenizer(shared_data)
    folder = save_gpt2(tmp_path / "gpt2", tok)
    data = tmp_path / "qa.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    run = tmp_path / "eval"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "hf_lightning.evaluate",
            "+experiment=clm",
            f"model.name_or_path={folder}",
            f"data.path={data}",
            "data.per_device_eval_batch_size=3",
            "generate=true",
            "max_new_tokens=6",
            f"hydra.run.dir={run}",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "] - train: " not in proc.stdout and "] - validation: 5 examples" in proc.stdout

    preds = [json.loads(line) for line in (run / "predictions.jsonl").read_text().splitlines()]
    assert [p["prompt"] for p in preds] == [r["prompt"] for r in ROWS]
    assert [p["reference"] for p in preds] == [r["completion"] for r in ROWS]

    # the oracle: HF generate, one unpadded prompt at a time
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    for pred, row in zip(preds, ROWS):
        ids = torch.tensor([tok(row["prompt"])["input_ids"]])
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=6,
                do_sample=False,
                pad_token_id=tok.pad_token_id,
            )
        assert pred["reply"] == tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
