"""The FSDP2 units: the decoder-layer class found from the model itself (HF's _no_split_modules), and
shard_module on a one-rank gloo group (names kept, one unit per block plus the root)."""

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
    """The class names of the modules that become FSDP units."""
    return sorted({type(m).__name__ for m in policy.blocks(root)})


def test_decoder_layers_of_the_wrapped_hf_model():
    root = HFLightningModule(tiny_llama())  # the strategy shards the LightningModule, not the HF model
    policy = NoSplitModulesPolicy()
    assert wrapped(policy, root) == ["LlamaDecoderLayer"]
    assert len(policy.blocks(root)) == 2  # one unit per layer
    # a block inside a block is not a unit of its own
    nested = NoSplitModulesPolicy(["LlamaDecoderLayer", "LlamaMLP"]).blocks(root)
    assert [type(m).__name__ for m in nested] == ["LlamaDecoderLayer"] * 2


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


def test_shard_module_on_one_rank_keeps_names(tmp_path):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    from hf_lightning.module.optim import decay_parameter_names
    from hf_lightning.strategies import shard_module

    root = HFLightningModule(tiny_llama())
    names = [n for n, _ in root.named_parameters()]
    decay = decay_parameter_names(root.model)
    assert decay and len(decay) < len(names)  # HF's two weight-decay groups, by parameter name
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        sharded = shard_module(root, init_device_mesh("cpu", (1,)), NoSplitModulesPolicy())
        assert sharded == (["LlamaDecoderLayer"], ["model"])
        assert sum(isinstance(m, FSDPModule) for m in root.modules()) == 3  # 2 layers + the HF model
        # the unit above the blocks is what training_step calls (the LightningModule holds no parameter)
        assert isinstance(root.model, FSDPModule) and not isinstance(root, FSDPModule)
        # activation checkpointing included: the names the optimizer groups and peft read are unchanged
        assert [n for n, _ in root.named_parameters()] == names
        assert decay_parameter_names(root.model) == decay
        assert all(isinstance(p, DTensor) for p in root.parameters())
    finally:
        dist.destroy_process_group()


def test_bf16_mixed_computes_in_bf16_and_keeps_fp32_shards(tmp_path):
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from hf_lightning.strategies import shard_module
    from hf_lightning.strategies.fsdp import mixed_precision_policy

    assert mixed_precision_policy("32-true") is None and mixed_precision_policy("bf16-true") is None
    policy = mixed_precision_policy("bf16-mixed")
    assert (policy.param_dtype, policy.reduce_dtype) == (torch.bfloat16, torch.float32)
    model = tiny_llama()
    seen = []
    model.model.layers[0].mlp.register_forward_hook(
        lambda module, args, out: seen.append(module.gate_proj.weight.dtype)
    )
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        shard_module(model, init_device_mesh("cpu", (1,)), NoSplitModulesPolicy(), mp_policy=policy)
        model(input_ids=torch.tensor([[1, 2, 3]])).logits.float().sum().backward()
        assert seen == [torch.bfloat16]  # the block computed with bf16 weights
        weight = model.model.layers[0].mlp.gate_proj.weight
        assert weight.dtype == torch.float32 and weight.grad.dtype == torch.float32  # fp32 shards and grads
    finally:
        dist.destroy_process_group()
