"""The FSDP wrap policy finds the decoder-layer class from the model itself (HF's _no_split_modules)."""

from __future__ import annotations

import pytest
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM

from hf_lightning.core.errors import ConfigError
from hf_lightning.module import HFLightningModule
from hf_lightning.strategies import NoSplitModulesPolicy


def tiny_llama():
    return AutoModelForCausalLM.from_config(
        AutoConfig.for_model(
            "llama",
            vocab_size=64,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
        )
    )


def wrapped(policy, root):
    """Which modules FSDP would wrap: the policy's answers as torch's recursive wrap asks them (root
    first)."""
    assert policy(module=root, recurse=True, nonwrapped_numel=0) is True
    return sorted(
        {type(m).__name__ for m in root.modules() if policy(module=m, recurse=False, nonwrapped_numel=0)}
    )


def test_decoder_layers_of_the_wrapped_hf_model():
    root = HFLightningModule(tiny_llama())  # Lightning hands FSDP the LightningModule, not the HF model
    policy = NoSplitModulesPolicy()
    assert wrapped(policy, root) == ["LlamaDecoderLayer"]
    assert sum(policy(module=m, recurse=False) for m in root.modules()) == 2  # one unit per layer


def test_t5_blocks():
    model = AutoModelForSeq2SeqLM.from_config(
        AutoConfig.for_model(
            "t5",
            vocab_size=64,
            d_model=16,
            d_ff=32,
            d_kv=8,
            num_heads=2,
            num_layers=1,
            num_decoder_layers=1,
        )
    )
    assert wrapped(NoSplitModulesPolicy(), model) == ["T5Block"]


def test_explicit_classes_and_errors():
    assert wrapped(NoSplitModulesPolicy(["LlamaMLP"]), tiny_llama()) == ["LlamaMLP"]
    with pytest.raises(
        ConfigError, match=r"strategy.layer_classes: \['GPT2Block'\] do not occur in the model"
    ):
        NoSplitModulesPolicy(["GPT2Block"]).resolve(tiny_llama())
    import torch

    with pytest.raises(ConfigError, match="declares no _no_split_modules; set strategy.layer_classes"):
        NoSplitModulesPolicy().resolve(torch.nn.Sequential(torch.nn.Linear(2, 2)))
