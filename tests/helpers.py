"""Small builders shared by tests: a tiny real Llama and fixed token datasets."""

from __future__ import annotations

import torch


def tiny_llama(vocab_size: int = 64, seed: int = 0, hidden: int = 32, layers: int = 2):
    """A randomly initialised ``LlamaForCausalLM`` (real transformers model), fp32, eager attention."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128, pad_token_id=0,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(cfg).eval()


class PadOnly:
    """The one tokenizer attribute a pre-tokenized dataset needs."""

    pad_token_id = 0
