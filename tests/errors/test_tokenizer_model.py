"""Tokenizer and model mismatches: caught at setup by a real ``Trainer.fit`` with real HF models, before any
forward could fail with an ``IndexError`` (on a GPU: a device-side assert) or train on leaking sequences."""

from __future__ import annotations

import logging

import datasets
import pytest
import torch
from transformers import (
    AttentionInterface,
    LlamaConfig,
    LlamaForSequenceClassification,
    T5Config,
    T5ForConditionalGeneration,
    ViTConfig,
    ViTForImageClassification,
)
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from hf_lightning import ConfigError, DataError, HFDataModule, ModelError
from hf_lightning.data.checks import packed_sequences_isolated
from hf_lightning.models.loading import load_model_and_tokenizer
from tests.data_support import make_word_tokenizer, tiny_llama
from tests.errors.support import CHAT_ROW, TEXT_ROWS, fit, write_jsonl


def test_tokenizer_without_pad_token():
    tok = make_word_tokenizer()
    tok.pad_token = None
    with pytest.raises(ConfigError) as err:
        HFDataModule(tokenizer=tok, path=datasets.Dataset.from_list(TEXT_ROWS))
    assert str(err.value) == (
        "the tokenizer has no pad token; set tokenizer.pad_token (for example to its eos_token) and save it "
        "into the model folder"
    )


def test_chat_data_without_chat_template(tmp_path):
    tok = make_word_tokenizer()
    tok.chat_template = None
    path = write_jsonl(tmp_path / "chat.jsonl", [CHAT_ROW] * 4)
    dm = HFDataModule(tokenizer=tok, path=path, validation_split=0.0)
    with pytest.raises(DataError) as err:
        dm.setup("fit")
    assert str(err.value) == (
        "chat data ('messages') needs a tokenizer with a chat template; this tokenizer has none. Set "
        "tokenizer.chat_template (e.g. ChatML) and save it into the model folder."
    )


def test_token_id_beyond_the_model_vocabulary(word_tokenizer, tmp_path):
    """Data tokenized with a bigger vocabulary than the model's embedding (32 rows)."""
    rows = [{"input_ids": [4, 5, 6, 7]}] * 5 + [{"input_ids": [4, 5, 40, 7]}] + [{"input_ids": [4, 5]}] * 2
    dm = HFDataModule(tokenizer=word_tokenizer, path=datasets.Dataset.from_list(rows), validation_split=0.0)
    with pytest.raises(DataError) as err:
        fit(tmp_path, tiny_llama(vocab_size=32), dm)
    assert str(err.value) == (
        "data.path=Dataset({\n    features: ['input_ids'],\n    num_rows: 8\n}) (train row 5): input_ids "
        "holds token id 40, but LlamaForCausalLM's input embedding has only 32 entries (ids 0..31); the data "
        "was tokenized with a larger vocabulary than the model's. Use the model's own tokenizer, or resize "
        "the model (model.resize_token_embeddings)"
    )


def test_label_id_beyond_the_output_layer(word_tokenizer, tmp_path):
    rows = [{"input_ids": [4, 5, 6], "labels": [-100, 5, 6]}] * 3 + [
        {"input_ids": [4, 5, 6], "labels": [-100, 5, 33]}
    ]
    dm = HFDataModule(tokenizer=word_tokenizer, path=datasets.Dataset.from_list(rows), validation_split=0.0)
    with pytest.raises(
        DataError,
        match=r"\(train row 3\): labels holds token id 33, but LlamaForCausalLM's output layer has only 32",
    ):
        fit(tmp_path, tiny_llama(vocab_size=32), dm)


def test_pad_id_beyond_the_model_vocabulary(tmp_path):
    tok = make_word_tokenizer()
    tok.add_special_tokens({"pad_token": "<newpad>"})  # id 30, a row the 30-row model does not have
    dm = HFDataModule(tokenizer=tok, path=datasets.Dataset.from_list(TEXT_ROWS[:8]), validation_split=0.0)
    with pytest.raises(
        DataError,
        match=r"the tokenizer's pad_token_id=30 is outside LlamaForCausalLM's input embedding \(30 rows\)",
    ):
        fit(tmp_path, tiny_llama(vocab_size=30), dm)


def test_class_label_beyond_num_labels(word_tokenizer, tmp_path):
    torch.manual_seed(0)
    model = LlamaForSequenceClassification(
        LlamaConfig(
            vocab_size=32,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
            pad_token_id=0,
            num_labels=2,
        )
    )
    rows = [{"text": "a b", "label": i % 2} for i in range(6)] + [{"text": "c d", "label": 2}]
    dm = HFDataModule(tokenizer=word_tokenizer, path=datasets.Dataset.from_list(rows), validation_split=0.0)
    with pytest.raises(DataError) as err:
        fit(tmp_path, model, dm)
    assert str(err.value).endswith(
        "(train row 6): class label 2 is outside the model's 2 classes (config.num_labels=2, labels 0..1); "
        "build the model with num_labels set to the number of classes in the data"
    )


def test_model_whose_forward_takes_none_of_the_batch_keys(word_tokenizer, tmp_path):
    """An image model fed text: no column survives pruning against ``forward(pixel_values, ...)``."""
    model = ViTForImageClassification(
        ViTConfig(
            hidden_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=32,
            image_size=8,
            patch_size=4,
        )
    )
    dm = HFDataModule(
        tokenizer=word_tokenizer, path=datasets.Dataset.from_list(TEXT_ROWS[:8]), validation_split=0.0
    )
    with pytest.raises(DataError) as err:
        fit(tmp_path, model, dm)
    assert str(err.value).startswith(
        "train split: no model input survives column pruning. Columns found: ['attention_mask', 'input_ids', "
        "'text']; model inputs (ViTForImageClassification.forward): ['pixel_values', 'labels', "
        "'interpolate_pos_encoding', 'attention_mask']. Tokenize into one of those (usually input_ids)"
    )


def test_packing_for_a_model_without_position_ids(word_tokenizer, tmp_path):
    """An encoder-decoder (T5) cannot take packed rows: its forward has no position_ids."""
    model = T5ForConditionalGeneration(
        T5Config(
            vocab_size=32,
            d_model=16,
            d_ff=32,
            d_kv=8,
            num_layers=1,
            num_heads=2,
            decoder_start_token_id=0,
        )
    )
    dm = HFDataModule(
        tokenizer=word_tokenizer,
        path=datasets.Dataset.from_list(TEXT_ROWS[:8]),
        validation_split=0.0,
        packing=True,
    )
    with pytest.raises(ConfigError) as err:
        fit(tmp_path, model, dm)
    assert str(err.value) == (
        "T5ForConditionalGeneration.forward takes no position_ids, so packed or padding-free batches cannot "
        "mark where sequences start; set data.packing=false and data.padding_free=false"
    )


def _leaky_attention(module, query, key, value, attention_mask, **kwargs):
    """A custom kernel as users register them: causal, but blind to packed-sequence boundaries."""
    return sdpa_attention_forward(module, query, key, value, None, **{**kwargs, "is_causal": True})


AttentionInterface.register("leaky_sdpa", _leaky_attention)


@pytest.mark.parametrize(("backend", "isolated"), [("sdpa", True), ("eager", True), ("leaky_sdpa", False)])
def test_isolation_probe(backend, isolated):
    assert packed_sequences_isolated(tiny_llama(attn_implementation=backend)) is isolated


def test_padding_free_with_a_backend_that_cannot_isolate_sequences(word_tokenizer, tmp_path):
    dm = HFDataModule(
        tokenizer=word_tokenizer,
        path=datasets.Dataset.from_list(TEXT_ROWS[:8]),
        validation_split=0.0,
        padding_free=True,
    )
    with pytest.raises(ConfigError) as err:
        fit(tmp_path, tiny_llama(attn_implementation="leaky_sdpa"), dm)
    assert str(err.value).startswith(
        "data.padding_free: LlamaForCausalLM with attention backend 'leaky_sdpa' lets packed sequences "
        "attend to each other (probed: the second sequence's logits change with the first one)."
    )


def test_padding_free_with_sdpa_trains(word_tokenizer, tmp_path):
    """The probe does not refuse a backend that isolates sequences: one real step runs."""
    dm = HFDataModule(
        tokenizer=word_tokenizer,
        path=datasets.Dataset.from_list(TEXT_ROWS[:8]),
        validation_split=0.0,
        padding_free=True,
    )
    assert fit(tmp_path, tiny_llama(attn_implementation="sdpa"), dm).global_step == 1


# ------------------------------------------------------------------------------------------ model folders
@pytest.fixture
def model_folder(tmp_path, word_tokenizer):
    """A complete save_pretrained folder: a tiny Llama and the word-level tokenizer."""
    folder = tmp_path / "model"
    tiny_llama(vocab_size=32).save_pretrained(folder)
    word_tokenizer.save_pretrained(folder)
    return folder


def test_model_path_that_is_not_a_folder(tmp_path):
    with pytest.raises(
        ModelError,
        match=rf"^model.name_or_path={tmp_path}/absent: not a folder \(expected a local HF model folder\)$",
    ):
        load_model_and_tokenizer(str(tmp_path / "absent"))


def test_a_checkpoint_given_as_model_path_points_to_ckpt_path(tmp_path):
    ckpt = tmp_path / "last.ckpt"
    ckpt.write_bytes(b"not a folder")
    with pytest.raises(ModelError) as err:
        load_model_and_tokenizer(str(ckpt))
    assert str(err.value) == (
        f"model.name_or_path={ckpt}: not a folder (expected a local HF model folder); a .ckpt is read with "
        f"ckpt_path: python -m hf_lightning.evaluate ckpt_path={ckpt} (with the run's overrides), or train "
        f"... ckpt_path={ckpt} to continue from it"
    )


def test_model_folder_without_config(model_folder):
    (model_folder / "config.json").unlink()
    with pytest.raises(ModelError, match="no config.json, so not a model folder saved by save_pretrained"):
        load_model_and_tokenizer(str(model_folder))


def test_model_folder_with_weights_missing(model_folder):
    (model_folder / "model.safetensors").unlink()
    with pytest.raises(ModelError) as err:
        load_model_and_tokenizer(str(model_folder))
    assert str(err.value) == (
        f"model.name_or_path={model_folder}: no weights (looked for model.safetensors, "
        "model.safetensors.index.json, pytorch_model.bin, pytorch_model.bin.index.json)"
    )


def test_model_folder_with_truncated_weights(model_folder):
    weights = model_folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # a copy interrupted half-way
    with pytest.raises(
        ModelError,
        match=rf"^model.name_or_path={model_folder}: the model could not be loaded \(.*\); the folder must "
        r"hold a complete save_pretrained output",
    ):
        load_model_and_tokenizer(str(model_folder))


def test_model_folder_with_a_broken_config(model_folder):
    (model_folder / "config.json").write_text('{"model_type": "llama", ')
    with pytest.raises(
        ModelError,
        match=rf"^model.name_or_path={model_folder}: config.json is not valid JSON \(Expecting property name "
        r"enclosed in double quotes: line 1 column 25",
    ):
        load_model_and_tokenizer(str(model_folder))


def test_model_folder_without_tokenizer(model_folder):
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (model_folder / name).unlink(missing_ok=True)
    with pytest.raises(
        ModelError, match=rf"^model.name_or_path={model_folder}: no loadable tokenizer in the folder"
    ):
        load_model_and_tokenizer(str(model_folder))


def test_folder_tokenizer_without_pad_falls_back_to_eos(tmp_path, caplog):
    """The documented fallback (HF's usual fix): pad = eos, announced at WARNING; padded labels stay -100 by
    position, so the real EOS tokens are still trained on."""
    folder = tmp_path / "model"
    tiny_llama(vocab_size=32).save_pretrained(folder)
    tok = make_word_tokenizer()
    tok.pad_token = None
    tok.save_pretrained(folder)
    with caplog.at_level(logging.WARNING, logger="hf_lightning"):
        _, loaded = load_model_and_tokenizer(str(folder))
    assert loaded.pad_token == "<eos>" and loaded.pad_token_id == 2
    assert f"tokenizer in {folder} has no pad token: using its eos token '<eos>'" in caplog.text


def test_folder_tokenizer_without_pad_or_eos_stops(tmp_path):
    folder = tmp_path / "model"
    tiny_llama(vocab_size=32).save_pretrained(folder)
    tok = make_word_tokenizer()
    tok.pad_token = None
    tok.eos_token = None
    tok.save_pretrained(folder)
    _, loaded = load_model_and_tokenizer(str(folder))
    with pytest.raises(ConfigError) as err:
        HFDataModule(tokenizer=loaded, path=datasets.Dataset.from_list(TEXT_ROWS))
    assert str(err.value) == (
        "the tokenizer has no pad token; it has no eos_token either: set tokenizer.pad_token and "
        "tokenizer.eos_token (for example both to its end-of-text token, such as '<|endoftext|>' for GPT-2) "
        "and save it into the model folder"
    )
