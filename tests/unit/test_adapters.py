"""peft=lora: what trains, what reaches the optimizer and the checkpoint, gradient checkpointing, refusals."""

from __future__ import annotations

import pytest
import torch

from hf_lightning.adapters import AdapterSettings, apply_adapters
from hf_lightning.adapters.checkpoint import KEY, drop_frozen, fill_frozen
from hf_lightning.config import validate_config
from hf_lightning.core.errors import ConfigError
from tests.parity.tiny_llama_case import make_model, make_rows


def lora_model(seed=0, **settings):
    return apply_adapters(make_model(seed), AdapterSettings(**{"r": 4, "lora_alpha": 8, **settings}))


def test_only_the_adapter_trains_and_reaches_the_optimizer():
    from hf_lightning.module.optim import build_optimizer

    model = lora_model()
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    # all-linear: q, k, v, o, gate, up, down of both layers, A and B each; never the output head
    assert len(trainable) == 2 * 7 * 2 and not any("lm_head" in n for n in trainable)
    optimizer = build_optimizer(model, lr=1e-3, weight_decay=0.1)
    in_optimizer = {id(p) for g in optimizer.param_groups for p in g["params"]}
    assert in_optimizer == {id(p) for p in model.parameters() if p.requires_grad}
    # B starts at zero: the adapted model is the base model exactly
    base = make_model(0)
    ids = torch.tensor([[5, 6, 7, 8]])
    assert torch.equal(model(input_ids=ids).logits, base(input_ids=ids).logits)


def test_the_init_seed_fixes_the_adapter_whatever_came_before():
    a = lora_model(init_seed=3)
    torch.rand(100)  # the global stream moved on
    b = lora_model(init_seed=3)
    c = lora_model(init_seed=4)
    la = {n: p for n, p in a.named_parameters() if "lora_A" in n}
    lb = {n: p for n, p in b.named_parameters() if "lora_A" in n}
    lc = {n: p for n, p in c.named_parameters() if "lora_A" in n}
    assert all(torch.equal(la[n], lb[n]) for n in la)
    assert not all(torch.equal(la[n], lc[n]) for n in la)


def test_the_checkpoint_keeps_the_trainable_weights_and_a_resume_fills_the_base():
    from hf_lightning.module import HFLightningModule

    module = HFLightningModule(lora_model(init_seed=1))
    with torch.no_grad():  # a trained adapter: B no longer zero
        for name, p in module.named_parameters():
            if "lora_B" in name:
                p.normal_()
    checkpoint = {"state_dict": module.state_dict()}
    total = len(checkpoint["state_dict"])
    drop_frozen(module, checkpoint)
    kept = checkpoint["state_dict"]
    assert set(kept) == {n for n, p in module.named_parameters() if p.requires_grad}
    assert checkpoint[KEY]["frozen_entries_left_out"] == total - len(kept)

    fresh = HFLightningModule(lora_model(init_seed=2))  # another adapter init, the same base
    fill_frozen(fresh, checkpoint)
    fresh.load_state_dict(checkpoint["state_dict"], strict=True)
    for (name, p), (_, q) in zip(fresh.state_dict().items(), module.state_dict().items(), strict=True):
        assert torch.equal(p, q), name

    other = HFLightningModule(lora_model(r=8))  # another rank: the strict load names the adapter weights
    state = {k: v.clone() for k, v in kept.items()}
    checkpoint = {"state_dict": state, KEY: {}}
    fill_frozen(other, checkpoint)
    with pytest.raises(RuntimeError, match="size mismatch for model.base_model.model.model.layers.0"):
        other.load_state_dict(checkpoint["state_dict"], strict=True)


def test_gradient_checkpointing_with_lora_gives_the_same_gradients():
    """With the base frozen nothing before the first checkpointed layer requires grad;
    enable_input_require_grads makes the embeddings' output do so (HF Trainer / TRL's fix)."""
    rows = make_rows(4)
    length = max(len(r["input_ids"]) for r in rows)
    ids = torch.tensor([r["input_ids"] + [0] * (length - len(r["input_ids"])) for r in rows])
    labels = torch.tensor([r["labels"] + [-100] * (length - len(r["labels"])) for r in rows])
    grads = []
    for checkpointing in (False, True):
        base = make_model(0)
        if checkpointing:
            base.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": True})
        model = apply_adapters(base, AdapterSettings(r=4, lora_alpha=8), gradient_checkpointing=checkpointing)
        model.train()
        model(input_ids=ids, labels=labels).loss.backward()
        # without the embeddings' output requiring grad, reentrant checkpointing leaves every .grad None
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=1e-5, atol=1e-7)


def test_a_4bit_base_keeps_its_checkpointing_through_peft_without_a_deprecated_call():
    """``peft.prepare_model_for_kbit_training(use_gradient_checkpointing=True)`` calls
    ``gradient_checkpointing_enable``, transformers 5's FutureWarning ("removed in v6"). The model comes with
    checkpointing on (``build_model``): the 4-bit path keeps it without that call. ``is_loaded_in_4bit`` set
    on a float model takes peft's 4-bit path on a CPU (bitsandbytes' weights need CUDA). The suite's
    filters (pyproject.toml) make transformers' FutureWarning an error."""
    rows = make_rows(2)
    ids = torch.tensor([r["input_ids"][:6] for r in rows])
    base = make_model(0)
    base.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    base.is_loaded_in_4bit = True
    model = apply_adapters(
        base, AdapterSettings(r=4, lora_alpha=8, load_in_4bit=True), gradient_checkpointing=True
    )
    assert model.get_base_model().is_activation_checkpointing  # transformers' own flag
    model.train()
    model(input_ids=ids, labels=ids).loss.backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_qlora_is_refused_on_cpu_in_one_line(compose_cfg):
    cfg = compose_cfg("+experiment=sft", "peft=qlora", "model.name_or_path=Qwen/Qwen2.5-0.5B-Instruct")
    with pytest.raises(ConfigError) as caught:
        validate_config(cfg)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("peft=qlora (peft.load_in_4bit=true) on trainer.accelerator=cpu")


def test_peft_keys_are_checked(compose_cfg):
    cfg = compose_cfg("+experiment=sft", "peft=lora", "+peft.rank=4")
    with pytest.raises(ConfigError, match="peft.*rank"):
        validate_config(cfg)
    cfg = compose_cfg("+experiment=sft", "peft=lora", "peft.use_dora=maybe")
    with pytest.raises(ConfigError, match="peft.use_dora='maybe': allowed values: true or false"):
        validate_config(cfg)
    validate_config(compose_cfg("+experiment=sft", "peft=lora", "peft.target_modules=[q_proj,v_proj]"))


def test_an_adapter_checkpoint_on_another_base_is_refused():
    """The checkpoint leaves the base out; put on another base (here another init seed) it is refused, not
    run."""
    from hf_lightning.core.errors import ModelError
    from hf_lightning.module import HFLightningModule

    module = HFLightningModule(lora_model(seed=0))
    checkpoint = {"state_dict": module.state_dict()}
    drop_frozen(module, checkpoint)
    fill_frozen(
        HFLightningModule(lora_model(seed=0)), {**checkpoint, "state_dict": dict(checkpoint["state_dict"])}
    )
    with pytest.raises(ModelError, match="trained on another base model"):
        fill_frozen(HFLightningModule(lora_model(seed=1)), checkpoint)


def test_a_lora_model_keeps_packed_sequences_apart():
    """The packing probe passes ``use_cache=False`` through the LoRA wrapper (``PeftModel.forward`` does not
    name it): without it, a model whose config keeps the KV cache on builds a cache, and transformers then
    lets packed sequences attend to each other, so packing with ``peft=lora`` was refused."""
    from peft import LoraConfig, get_peft_model

    from hf_lightning.data.checks import packed_sequences_isolated
    from tests.data_support import tiny_llama

    model = tiny_llama(use_cache=True)
    assert packed_sequences_isolated(model) is True  # the bare model, the cache turned off by the probe
    wrapped = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    assert packed_sequences_isolated(wrapped) is True


def test_the_module_turns_the_kv_cache_off_through_the_lora_wrapper():
    """``PeftModel.forward`` takes ``**kwargs`` only, so reading its own signature missed ``use_cache`` and a
    LoRA model trained packed rows with its cache on (sequences attending to each other); the base model's
    forward names it, and the wrapper passes it on."""
    from peft import LoraConfig, get_peft_model

    from hf_lightning import HFLightningModule
    from tests.data_support import tiny_llama

    wrapped = get_peft_model(tiny_llama(use_cache=True), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    assert HFLightningModule(wrapped).forward_kwargs == {"use_cache": False}
