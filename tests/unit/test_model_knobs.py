"""Model loading knobs: tasks, activation checkpointing, compile, package folders."""

from __future__ import annotations

import logging

import pytest
import torch

from hf_lightning.core.errors import ModelError
from hf_lightning.models.loading import build_model, is_encoder_decoder, resolve_name_or_path

LLAMA = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
}


def grads(model, batch):
    model.zero_grad()
    model.train()
    out = model(**batch)
    torch.nn.functional.cross_entropy(out.logits.flatten(0, 1), batch["input_ids"].flatten()).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_gradient_checkpointing_recomputes_without_changing_gradients(default_tokenizer):
    torch.manual_seed(0)
    plain = build_model(default_tokenizer, config={**LLAMA, "attention_dropout": 0.0})
    torch.manual_seed(0)
    ckpt = build_model(
        default_tokenizer, config={**LLAMA, "attention_dropout": 0.0}, gradient_checkpointing=True
    )
    flag = (
        "is_activation_checkpointing"
        if hasattr(ckpt, "is_activation_checkpointing")
        else "is_gradient_checkpointing"
    )
    assert getattr(ckpt, flag) and not getattr(plain, flag)
    batch = {
        "input_ids": torch.randint(5, 200, (2, 12)),
        "attention_mask": torch.ones(2, 12, dtype=torch.long),
    }
    reference, got = grads(plain, batch), grads(ckpt, batch)
    assert reference.keys() == got.keys()
    for name in reference:
        torch.testing.assert_close(got[name], reference[name], rtol=1e-6, atol=1e-7)


def test_compile_is_applied_in_place_and_keeps_parameter_names(default_tokenizer):
    model = build_model(default_tokenizer, config=LLAMA, compile=True)
    assert model._compiled_call_impl is not None  # nn.Module.compile: compiled on first call
    assert all(not n.startswith("_orig_mod") for n in model.state_dict())


def test_tasks_and_heads(default_tokenizer):
    with pytest.raises(
        ModelError,
        match=r"model.task='ner'; allowed values: \['causal_lm', 'seq2seq_lm', "
        r"'sequence_classification'\]",
    ):
        build_model(default_tokenizer, task="ner")
    with pytest.raises(ModelError, match="needs model.num_labels"):
        build_model(default_tokenizer, task="sequence_classification", architecture="llama", config=LLAMA)
    clf = build_model(
        default_tokenizer,
        task="sequence_classification",
        architecture="llama",
        config=LLAMA,
        id2label={0: "card_arrival", 1: "top_up_failed"},
    )
    assert clf.config.num_labels == 2 and clf.config.label2id == {"card_arrival": 0, "top_up_failed": 1}
    assert clf(input_ids=torch.tensor([[5, 6, 7]])).logits.shape == (1, 2)


def test_package_folders_and_encoder_decoder_detection(tmp_path):
    with pytest.raises(
        ModelError,
        match=r"^model.name_or_path=pkg:no_such_pkg_xyz/model needs the Python package "
        r"'no_such_pkg_xyz', which is not installed here: pip install no-such-pkg-xyz$",
    ):
        resolve_name_or_path("pkg:no_such_pkg_xyz/model")
    assert resolve_name_or_path(str(tmp_path)) == str(tmp_path) and resolve_name_or_path(None) is None
    assert is_encoder_decoder("seq2seq_lm") and not is_encoder_decoder("causal_lm")
    (tmp_path / "config.json").write_text('{"model_type": "bart", "is_encoder_decoder": true}')
    assert is_encoder_decoder("causal_lm", str(tmp_path))


def test_a_model_without_name_or_path_says_its_weights_are_random(default_tokenizer, caplog):
    # a new user running the shipped experiments trains a randomly initialised tiny Llama: the log says so
    with caplog.at_level(logging.INFO, logger="hf_lightning.models.loading"):
        model = build_model(default_tokenizer, config=LLAMA)
    n = sum(p.numel() for p in model.parameters())
    said = [r.getMessage() for r in caplog.records if "random weights" in r.getMessage()]
    assert said == [
        f"model.name_or_path is null: a LlamaForCausalLM with random weights, built from its config ({n} "
        "parameters); model.name_or_path=DIR or a hub id fine-tunes pretrained weights"
    ]
