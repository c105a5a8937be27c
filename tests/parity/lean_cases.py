"""Tiny real causal LMs whose LM heads differ, for the lean-loss tests (and their DDP worker).

``llama``: untied head; ``gpt2``: head tied to the input embedding (``GPT2LMHeadModel``); ``gemma2``:
Gemma-2's final logit soft-capping (``tanh(x / c) * c``); ``cohere``: logits multiplied by ``logit_scale``;
``granite``: logits divided by ``logits_scaling``. All fp32, no dropout, vocabulary
:data:`tests.parity.tiny_llama_case.VOCAB` (the rows of ``make_rows`` fit it). The head's weight is drawn 10x
larger than the init's, so that the logits are of order 1 to 10 as in a trained model (at init they are ~0.1,
where a soft-cap is nearly the identity).
"""

from __future__ import annotations

import torch

from tests.parity.tiny_llama_case import VOCAB

ARCHS = ("llama", "gpt2", "gemma2", "cohere", "granite")
# the config key of each model's logit transform and a value far from neutral on tiny random logits
TRANSFORMS = {
    "gemma2": ("final_logit_softcapping", 4.0),
    "cohere": ("logit_scale", 3.0),
    "granite": ("logits_scaling", 0.25),
}


def make_arch_model(arch: str, seed: int = 0):
    import transformers as tf

    torch.manual_seed(seed)
    common = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        use_cache=False,
    )
    if arch == "llama":
        model = tf.LlamaForCausalLM(tf.LlamaConfig(**common, tie_word_embeddings=False))
    elif arch == "gpt2":
        config = tf.GPT2Config(
            vocab_size=VOCAB,
            n_embd=32,
            n_layer=2,
            n_head=4,
            n_positions=64,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=0,
            use_cache=False,
        )
        model = tf.GPT2LMHeadModel(config)
    elif arch == "gemma2":
        config = tf.Gemma2Config(**common, head_dim=8, final_logit_softcapping=TRANSFORMS["gemma2"][1])
        model = tf.Gemma2ForCausalLM(config)
    elif arch == "cohere":
        model = tf.CohereForCausalLM(tf.CohereConfig(**common, logit_scale=TRANSFORMS["cohere"][1]))
    elif arch == "granite":
        model = tf.GraniteForCausalLM(tf.GraniteConfig(**common, logits_scaling=TRANSFORMS["granite"][1]))
    else:
        raise ValueError(arch)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(10.0)
    return model.float()
