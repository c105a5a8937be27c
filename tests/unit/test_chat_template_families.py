"""Chat templates without ``{% generation %}`` markers train what the marked template trains.

The oracle is HF: the same template with ``{% generation %}`` around each assistant reply and its end-of-turn
token (``tests/chat_families.py``), rendered by ``apply_chat_template(return_dict=True,
return_assistant_tokens_mask=True)``: what TRL's ``assistant_only_loss=True`` trains. The unmarked template's
labels must equal it row by row, on every conversation of fastchat-dummy (1 to 3 assistant turns) and on
conversations with a system prompt, a last message from the user, a reply that opens the conversation, replies
that start or end with blanks, and an empty reply. The families: Qwen2.5's ChatML with the base model's EOS
(``<|endoftext|>``, not the end of turn), Llama-3 (``<|eot_id|>``), Gemma (``<end_of_turn>\\n``), Phi-3
(``<|end|>\\n`` and an EOS closing the conversation), Mistral v0.1 (``</s>`` after ``[/INST]`` replies),
Llama-2 (a space before ``</s>``), ChatML with a line break before ``<|im_end|>``, plain ChatML, and ChatML
whose ``<|im_end|>`` is 7 BPE pieces. A conversation a template refuses (Gemma and Mistral: a system prompt;
Llama-2: a first reply) is refused by both.
"""

from __future__ import annotations

import json

import pytest

from hf_lightning import DataError, HFDataModule
from hf_lightning.data.chat import chat_labels
from tests.chat_families import CHATML, FAMILIES, family_tokenizers
from tests.data_support import shared_data

IGNORE = -100

EXTRA = {
    "system prompt, two turns": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Who are you?"},
        {"role": "assistant", "content": "An assistant."},
        {"role": "user", "content": "And your name?"},
        {"role": "assistant", "content": "Vicuna."},
    ],
    "last message from the user": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a joke."},
    ],
    "no assistant turn": [{"role": "user", "content": "Anyone there?"}],
    "system prompt, no assistant turn": [
        {"role": "system", "content": "Be kind."},
        {"role": "user", "content": "Anyone there?"},
    ],
    "blanks around and inside replies": [
        {"role": "user", "content": "List two colours."},
        {"role": "assistant", "content": "  Red\nBlue\n"},
        {"role": "user", "content": "And one more?"},
        {"role": "assistant", "content": "Green. "},
    ],
    "the assistant speaks first": [
        {"role": "assistant", "content": "Welcome! Ask me anything."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
    ],
    "an empty reply": [
        {"role": "user", "content": "Say nothing."},
        {"role": "assistant", "content": ""},
    ],
}


def _fastchat():
    speaker = {"human": "user", "gpt": "assistant"}
    rows = json.loads((shared_data() / "fastchat-dummy" / "dummy_conversation.json").read_text())
    return [[{"role": speaker[t["from"]], "content": t["value"]} for t in r["conversations"]] for r in rows]


def _conversations():
    """fastchat-dummy's 500 conversations, then :data:`EXTRA`."""
    return _fastchat() + list(EXTRA.values())


def _refused(marked, messages):
    from jinja2.exceptions import TemplateError

    try:
        marked.apply_chat_template(messages, tokenize=False)
    except TemplateError:
        return True
    return False


def _hf_labels(marked, messages):
    """HF's mask of the marked template: the oracle."""
    out = marked.apply_chat_template(
        messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    ids = list(out["input_ids"])
    return ids, [t if m else IGNORE for t, m in zip(ids, out["assistant_masks"])]


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_the_marked_template_writes_the_same_text(gpt2_tokenizer, name):
    tok, marked = family_tokenizers(gpt2_tokenizer, name)
    for messages in _conversations()[::25] + list(EXTRA.values()):
        if _refused(marked, messages):
            continue
        for gen in (False, True):
            text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
            assert marked.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen) == text


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_unmarked_labels_equal_hf_mask_of_the_marked_template(gpt2_tokenizer, name):
    tok, marked = family_tokenizers(gpt2_tokenizer, name)
    for i, messages in enumerate(_conversations()):
        if _refused(marked, messages):
            with pytest.raises(DataError, match="the tokenizer's chat template refuses this conversation"):
                chat_labels(messages, tok)
            continue
        assert chat_labels(messages, tok) == _hf_labels(marked, messages), (i, messages)


def test_chatml_with_another_eos_trains_each_reply_and_its_end_of_turn_only(gpt2_tokenizer):
    """The case of the report, counted by hand: each reply's tokens and one ``<|im_end|>``, never the line
    break after it (ChatML with ``eos_token=<|endoftext|>``, the Qwen2.5 base models' setup)."""
    tok, _ = family_tokenizers(gpt2_tokenizer, "qwen2.5-chatml")
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    messages = EXTRA["system prompt, two turns"]
    ids, labels = chat_labels(messages, tok)
    trained = [t for t in labels if t != IGNORE]
    replies = [m["content"] for m in messages if m["role"] == "assistant"]
    assert trained == sum((tok.encode(r, add_special_tokens=False) + [im_end] for r in replies), [])
    newline = tok.encode("\n", add_special_tokens=False)[0]
    after = [labels[i + 1] for i, t in enumerate(ids[:-1]) if t == im_end]
    assert ids[-1] == newline and all(t == IGNORE for t in after)


def test_fastchat_dummy_through_the_datamodule_has_the_hf_targets(gpt2_tokenizer, tmp_path):
    """The ShareGPT file as ``data.path`` with ChatML and ``eos=<|endoftext|>``: every row's labels are HF's,
    and the total is the replies' tokens plus one ``<|im_end|>`` per reply."""
    tok, marked = family_tokenizers(gpt2_tokenizer, "chatml")
    path = shared_data() / "fastchat-dummy" / "dummy_conversation.json"
    dm = HFDataModule(tok, path=str(path), validation_split=0.0, shuffle=False)
    dm.setup()
    rows = dm.train_dataset
    conversations = _fastchat()
    assert len(rows) == len(conversations) == 500
    for row, messages in zip(rows, conversations):
        assert (row["input_ids"], row["labels"]) == _hf_labels(marked, messages)
    replies = [m["content"] for c in conversations for m in c if m["role"] == "assistant"]
    by_hand = sum(len(tok.encode(r, add_special_tokens=False)) + 1 for r in replies)
    assert sum(t != IGNORE for row in rows["labels"] for t in row) == by_hand


def test_a_tokenizer_without_offsets_gets_the_same_targets():
    """A Python tokenizer (ByT5's bytes: no character offsets) maps the replies by tokenizing the text before
    each end; the targets by hand: each reply's bytes and ``<|im_end|>``."""
    from transformers import ByT5Tokenizer

    tok = ByT5Tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = CHATML
    assert not tok.is_fast
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    for messages in EXTRA.values():
        ids, labels = chat_labels(messages, tok)
        assert ids == tok.encode(tok.apply_chat_template(messages, tokenize=False), add_special_tokens=False)
        replies = [m["content"] for m in messages if m["role"] == "assistant"]
        expected = sum((tok.encode(r, add_special_tokens=False) + [im_end] for r in replies), [])
        assert [t for t in labels if t != IGNORE] == expected
