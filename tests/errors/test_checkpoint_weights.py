"""A checkpoint's weights go only into a model they fit: ``evaluate ckpt_path=...`` and
``resume_weights_only`` used to load with ``strict=False`` and left every missing layer at its random init,
silently."""

from __future__ import annotations

import pytest
import torch

from hf_lightning import HFLightningModule, ModelError
from hf_lightning.checkpointing.weights import load_model_weights


def llama(layers: int = 2, vocab_size: int = 32, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(
        LlamaConfig(
            vocab_size=vocab_size,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=128,
            use_cache=False,
            pad_token_id=0,
        )
    )


@pytest.fixture
def checkpoint(tmp_path):
    """A Lightning-style checkpoint of a 2-layer tiny Llama at optimizer step 5."""
    module = HFLightningModule(llama(seed=1))
    path = tmp_path / "step5.ckpt"
    torch.save({"state_dict": module.state_dict(), "global_step": 5}, path)
    return path, module


def test_matching_model_gets_every_weight(checkpoint):
    path, trained = checkpoint
    module = HFLightningModule(llama(seed=2))  # same architecture, other init
    assert load_model_weights(module, str(path), "RUN/hf_model") == 5
    for (name, a), b in zip(trained.model.state_dict().items(), module.model.state_dict().values()):
        assert torch.equal(a, b), name


def test_a_deeper_model_is_refused_naming_the_missing_layer(checkpoint):
    path, _ = checkpoint
    module = HFLightningModule(llama(layers=3))
    with pytest.raises(ModelError) as err:
        load_model_weights(module, str(path), "three_layers")
    msg = str(err.value)
    assert msg.startswith(
        f"ckpt_path={path}: its weights do not fit the model of model.name_or_path=three_layers ("
    )
    assert "weights missing from the checkpoint, e.g. ['model.model.layers.2." in msg
    assert msg.endswith(
        "use the model.name_or_path (and model.* overrides) of the run that wrote the checkpoint"
    )


def test_a_shallower_model_is_refused_naming_the_extra_weights(checkpoint):
    path, _ = checkpoint
    module = HFLightningModule(llama(layers=1))
    with pytest.raises(
        ModelError,
        match=r"checkpoint weights the model has no place for, e\.g\. \['model\.model\.layers\.1\.",
    ):
        load_model_weights(module, str(path), "one_layer")


def test_another_width_is_one_line_not_a_traceback(checkpoint):
    path, _ = checkpoint
    module = HFLightningModule(llama(vocab_size=48))
    with pytest.raises(ModelError, match=r"size mismatch for model\.model\.embed_tokens\.weight"):
        load_model_weights(module, str(path), "wider_vocab")


def test_training_from_a_checkpoint_of_another_architecture_is_one_error(tmp_path):
    """``train ... ckpt_path=OTHER/checkpoints/last.ckpt`` (what the run-folder refusal recommends) with a
    model that does not fit: Lightning's strict restore raised a raw RuntimeError; now one ModelError naming
    both."""
    from hf_lightning.config.compose import compose_train
    from hf_lightning.train import train
    from tests.conftest import SHRINK

    train(compose_train([*SHRINK, "+experiment=sft"], output_dir=tmp_path / "first"))
    ckpt = tmp_path / "first" / "checkpoints" / "last.ckpt"
    cfg = compose_train(
        [*SHRINK, "+experiment=sft", f"ckpt_path={ckpt}", "model.config.num_hidden_layers=5"],
        output_dir=tmp_path / "second",
    )
    with pytest.raises(ModelError) as err:
        train(cfg)
    msg = str(err.value)
    assert msg.startswith(f"ckpt_path={ckpt}: its weights do not fit the model of model.name_or_path=None (")
    # the sft model has 4 layers: the 5th is missing from the checkpoint
    assert "Missing key(s) in state_dict: 9, e.g. ['model.model.layers.4." in msg
