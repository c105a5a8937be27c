"""Helpers of the data tests: shared data location, a tiny real Llama, a word-level tokenizer."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LETTERS = "abcdefghijklmnopqrstuvwxyz"
WORDS = ["<pad>", "<unk>", "<eos>", "<bos>"] + [chr(c) for c in range(ord("a"), ord("z") + 1)]


def shared_data() -> Path:
    """``$HF_LIGHTNING_SHARED_DATA`` or ``<repo>/../shared/data``; skips the test when it is missing."""
    path = Path(os.environ.get("HF_LIGHTNING_SHARED_DATA", REPO / ".." / "shared" / "data"))
    if not path.is_dir():
        pytest.skip(f"shared data folder {path} not found (set HF_LIGHTNING_SHARED_DATA)")
    return path


def make_word_tokenizer():
    """Words ``a``..``z`` are ids 4..29 (``a`` = 4); ``<pad>`` 0, ``<unk>`` 1, ``<eos>`` 2, ``<bos>`` 3; no
    special tokens are added, so ``"a b c"`` encodes to ``[4, 5, 6]``. Chat template: ``"<role initial>
    <content> <eos> "``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    out = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>", unk_token="<unk>"
    )
    out.chat_template = (
        "{%- for m in messages %}{{- m['role'][0] + ' ' + m['content'] + ' <eos> ' }}{%- endfor %}"
        "{%- if add_generation_prompt %}{{- 'a ' }}{%- endif %}"
    )
    return out


def tiny_llama(vocab_size: int = 32, seed: int = 0, **overrides):
    """A real ``LlamaForCausalLM`` from a config, fp32, no KV cache (so packed sequences are detected)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    defaults = dict(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        use_cache=False,
        pad_token_id=0,
    )
    config = LlamaConfig(**{**defaults, **overrides})
    return LlamaForCausalLM(config).eval()


class PadOnly:
    """The one tokenizer attribute a pre-tokenized dataset needs."""

    pad_token_id = 0


def chat_rows(n: int) -> list[dict]:
    """``n`` conversations of distinct words (each tokenizes to its own sequence)."""
    return [
        {
            "messages": [
                {"role": "user", "content": " ".join(LETTERS[i % 9 : i % 9 + 2 + i % 3])},
                {"role": "assistant", "content": " ".join(LETTERS[(3 * i) % 20 : (3 * i) % 20 + 1 + i % 4])},
            ]
        }
        for i in range(n)
    ]


def write_chats(folder: Path, n: int) -> list[dict]:
    """``chats.jsonl`` in ``folder`` with :func:`chat_rows` ``(n)``; returns the rows."""
    rows = chat_rows(n)
    (folder / "chats.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def packed_documents(row) -> list[list[int]]:
    """The documents of a packed row, cut at its ``seq_lengths`` (which must add up to its tokens)."""
    ends = [sum(row["seq_lengths"][: k + 1]) for k in range(len(row["seq_lengths"]))]
    assert ends[-1] == len(row["input_ids"]), (row["seq_lengths"], len(row["input_ids"]))
    return [row["input_ids"][a:b] for a, b in zip([0] + ends, ends)]
