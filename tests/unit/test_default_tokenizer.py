"""The embedded default tokenizer ends documents and chat turns as Qwen2.5's base tokenizer does: plain text
with its EOS ``<|endoftext|>``, a chat reply with the template's ``<|im_end|>``; a model built on it stops
generating on both.

Expected rows are the texts tokenized with the end-of-document text appended, as TRL's ``SFTTrainer`` appends
``eos_token`` to a text before packing it.
"""

from __future__ import annotations

import datasets

from hf_lightning import HFDataModule
from tests.data_support import packed_documents

TEXTS = ["hello there", "how are you doing today", "fine, thanks"]


def test_packed_text_documents_end_with_endoftext_not_the_chat_end_of_turn(default_tokenizer):
    # before: the default tokenizer's EOS was <|im_end|>, so a clm run on plain text ended every document
    # with the chat end-of-turn
    tok = default_tokenizer
    assert tok.eos_token == "<|endoftext|>"
    ds = datasets.Dataset.from_dict({"text": TEXTS})
    dm = HFDataModule(tok, path=ds, packing="bfd", max_length=64, validation_split=0.0, shuffle=False)
    dm.setup()
    got = sorted(doc for row in dm.train_dataset for doc in packed_documents(row))
    expected = sorted(tok(text + "<|endoftext|>", add_special_tokens=False)["input_ids"] for text in TEXTS)
    assert got == expected
    assert tok.convert_tokens_to_ids("<|im_end|>") not in {t for doc in got for t in doc}


def test_chat_replies_still_end_with_im_end(default_tokenizer):
    tok = default_tokenizer
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello there"}]
    ds = datasets.Dataset.from_dict({"messages": [messages]})
    dm = HFDataModule(tok, path=ds, validation_split=0.0, shuffle=False)
    dm.setup()
    out = tok.apply_chat_template(
        messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    trained = [t for t, m in zip(out["input_ids"], out["assistant_masks"]) if m]
    assert [t for t in dm.train_dataset[0]["labels"] if t != -100] == trained
    assert tok.decode(trained) == "Hello there<|im_end|>"


def test_a_model_built_on_it_stops_on_the_eos_and_the_end_of_turn(default_tokenizer):
    from hf_lightning.models.loading import build_model

    tok = default_tokenizer
    model = build_model(
        tok,
        config={
            "hidden_size": 16,
            "intermediate_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
        },
    )
    ends = tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_end|>"])
    assert model.config.eos_token_id == ends[0]
    assert model.generation_config.eos_token_id == ends
