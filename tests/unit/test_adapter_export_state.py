"""The adapter export from a state dict gathered beforehand (what a sharded FSDP2 model gives rank 0): the
same adapter folder and the same merged model as from the model's own tensors."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

peft = pytest.importorskip("peft")


def lora_model(tie: bool):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        tie_word_embeddings=tie,
    )
    model = peft.get_peft_model(
        LlamaForCausalLM(config), peft.LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False)
    )
    return model


@pytest.mark.parametrize("tie", [False, True])
def test_merged_from_gathered_state_equals_the_model_merge(tmp_path, tie):
    from hf_lightning.adapters.export import save_merged

    model = lora_model(tie)
    gathered = {k: v.detach().clone() for k, v in model.state_dict().items()}
    save_merged(model, str(tmp_path / "own"))
    save_merged(model, str(tmp_path / "gathered"), full_state=gathered)
    own, other = (load_file(str(tmp_path / d / "model.safetensors")) for d in ("own", "gathered"))
    assert own.keys() == other.keys() and own
    for key, value in own.items():
        torch.testing.assert_close(other[key], value, rtol=0, atol=0)
    # init_lora_weights=False: the adapter is not zero, so the merge changed the base weights
    base = model.get_base_model().model.layers[0].self_attn.q_proj.base_layer.weight
    assert not torch.equal(own["model.layers.0.self_attn.q_proj.weight"], base)


def test_adapter_from_gathered_state_equals_the_model_adapter(tmp_path):
    from hf_lightning.adapters.export import save_adapter

    model = lora_model(tie=False)
    gathered = {k: v.detach().clone() for k, v in model.state_dict().items()}
    save_adapter(model, str(tmp_path / "own"), str(tmp_path / "own"))
    save_adapter(model, str(tmp_path / "gathered"), str(tmp_path / "gathered"), full_state=gathered)
    for name in ("adapter_model.safetensors", "base_model/model.safetensors"):
        own, other = (load_file(str(tmp_path / d / name)) for d in ("own", "gathered"))
        assert own.keys() == other.keys() and own
        for key, value in own.items():
            torch.testing.assert_close(other[key], value, rtol=0, atol=0)
