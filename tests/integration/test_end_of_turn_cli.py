"""A chat template whose end-of-turn generation cannot stop on.

The sft run's ChatML template on GPT-2's tokenizer: ``<|im_end|>`` is 7 BPE tokens; the run says so at setup
in a WARNING naming the text, its pieces and the fix. With ``<|im_end|>`` added as a special token (one token,
not the EOS), the exported ``hf_model/`` stops generating on it: its ``generation_config.eos_token_id`` lists
the EOS and the end-of-turn id (HF ``generate`` stops on any id of that list).
"""

from __future__ import annotations

import json

import pytest

from hf_lightning.defaults.tokenizer import CHATML_TEMPLATE
from tests.errors.support import run_train_cli
from tests.integration.log_support import gpt2_tokenizer, save_gpt2

pytestmark = pytest.mark.slow

SHORT = (
    "trainer.max_steps=1",
    "trainer.limit_val_batches=1",
    "trainer.enable_model_summary=false",
    "data.max_length=64",
    "data.per_device_train_batch_size=2",
    "data.per_device_eval_batch_size=2",
)


def _chats(path):
    rows = [
        {
            "messages": [
                {"role": "user", "content": f"Hi {i}"},
                {"role": "assistant", "content": "Hello there."},
            ]
        }
        for i in range(12)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_multi_token_end_of_turn_is_warned_and_a_one_token_one_stops_generation(shared_data, tmp_path):
    chats = _chats(tmp_path / "chats.jsonl")

    tok = gpt2_tokenizer(shared_data, CHATML_TEMPLATE)
    pieces = tok.convert_ids_to_tokens(tok.encode("<|im_end|>", add_special_tokens=False))
    assert len(pieces) == 7  # the case of the issue, computed by the tokenizer itself
    folder = save_gpt2(tmp_path / "split", tok)
    proc = run_train_cli(
        "+experiment=sft",
        f"model.name_or_path={folder}",
        f"data.path={chats}",
        *SHORT,
        f"hydra.run.dir={tmp_path / 'a'}",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    warning = [line for line in proc.stdout.splitlines() if "[WARNING]" in line and "'<|im_end|>'" in line]
    assert len(warning) == 1, proc.stdout[-3000:]
    assert f"splits into 7 tokens {pieces}" in warning[0]
    assert "tok.add_special_tokens({'eos_token': '<|im_end|>'})" in warning[0]

    tok = gpt2_tokenizer(shared_data, CHATML_TEMPLATE)
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    folder = save_gpt2(tmp_path / "one", tok)
    run = tmp_path / "b"
    proc = run_train_cli(
        "+experiment=sft",
        f"model.name_or_path={folder}",
        f"data.path={chats}",
        *SHORT,
        f"hydra.run.dir={run}",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "splits into" not in proc.stdout
    generation = json.loads((run / "hf_model" / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [tok.eos_token_id, im_end]
