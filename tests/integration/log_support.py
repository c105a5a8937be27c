"""A tiny GPT-2 model folder and documents of a known token count, for the CLI log tests.

GPT-2 (``GPT2LMHeadModel``) is the model of the migration tutorial; its ``forward`` is one of those that warn
about padding without an ``attention_mask``, and its pad token is its EOS. Every document here is exactly
:data:`DOC_TOKENS` GPT-2 tokens, so a run's real tokens can be counted by hand: each row is the document plus
the EOS the text format appends.
"""

from __future__ import annotations

import json
from pathlib import Path

DOC_TOKENS = 40


def gpt2_tokenizer(shared: str, chat_template: str | None = None):
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(
        tokenizer_file=str(Path(shared) / "gpt2-tokenizer" / "tokenizer.json"),
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
    )
    if chat_template is not None:
        tok.chat_template = chat_template
    return tok


def save_gpt2(folder: Path, tok) -> Path:
    """A 1-layer GPT-2 built from a config (seeded), saved with ``tok`` by ``save_pretrained``."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=len(tok),
        n_positions=128,
        n_embd=32,
        n_layer=1,
        n_head=2,
        bos_token_id=tok.eos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    GPT2LMHeadModel(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def equal_length_docs(shared: str, tok, path: Path, n: int = 20) -> Path:
    """``n`` c4-demo documents cut to exactly :data:`DOC_TOKENS` tokens (kept only where the cut text
    tokenizes back to the same ids), as a ``text`` jsonl."""
    rows = []
    with open(Path(shared) / "c4-demo" / "c4_demo.jsonl") as fh:
        for line in fh:
            ids = tok(json.loads(line)["text"])["input_ids"][:DOC_TOKENS]
            text = tok.decode(ids)
            if len(ids) == DOC_TOKENS and tok(text)["input_ids"] == ids:
                rows.append({"text": text})
            if len(rows) == n:
                break
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
