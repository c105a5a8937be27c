"""Assistant-only labels for chat data: exact ids, built independently from hand-assembled strings."""

from __future__ import annotations

import pytest

from hf_lightning.data.chat import chat_labels
from hf_lightning.data.formats import tokenize_chat
from hf_lightning.defaults.tokenizer import CHATML_TEMPLATE

IGNORE = -100


def _enc(tok, text):
    return tok.encode(text, add_special_tokens=False)


def _expected(tok, messages):
    """Render ChatML by hand, segment by segment; assistant replies + <|im_end|> are the only targets."""
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    ids, labels = [], []
    for m in messages:
        head = _enc(tok, f"<|im_start|>{m['role']}\n")
        body = _enc(tok, m["content"]) + [im_end]
        tail = _enc(tok, "\n")
        ids += head + body + tail
        trained = m["role"] == "assistant"
        labels += [IGNORE] * len(head) + (body if trained else [IGNORE] * len(body)) + [IGNORE] * len(tail)
    return ids, labels


CASES = {
    "single_turn": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello there"}],
    "multi_turn": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello there"},
        {"role": "user", "content": "How are you?"},
        {"role": "assistant", "content": "Fine"},
    ],
    "system_first": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
    ],
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_assistant_only_labels_exact(default_tokenizer, name):
    messages = CASES[name]
    ids, labels = chat_labels(messages, default_tokenizer)
    exp_ids, exp_labels = _expected(default_tokenizer, messages)
    assert ids == exp_ids
    assert labels == exp_labels


def test_multi_turn_trains_on_both_replies_and_their_end_of_turn(default_tokenizer):
    tok = default_tokenizer
    _, labels = chat_labels(CASES["multi_turn"], tok)
    trained = [t for t in labels if t != IGNORE]
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert trained == _enc(tok, "Hello there") + [im_end] + _enc(tok, "Fine") + [im_end]
    assert tok.decode(trained) == "Hello there<|im_end|>Fine<|im_end|>"


def test_template_without_generation_markers_gives_the_same_labels(default_tokenizer):
    """The prefix-rendering fallback (any template) agrees with HF's generation-mask path."""
    import copy

    tok = copy.deepcopy(default_tokenizer)
    tok.chat_template = CHATML_TEMPLATE.replace("{%- generation %}", "").replace("{%- endgeneration %}", "")
    assert "endgeneration" not in tok.chat_template
    for messages in CASES.values():
        assert chat_labels(messages, tok) == chat_labels(messages, default_tokenizer)


def test_truncation_cuts_ids_and_labels_together(default_tokenizer):
    batch = {"messages": [CASES["multi_turn"]]}
    full = tokenize_chat(batch, default_tokenizer, max_length=10_000)
    cut = tokenize_chat(batch, default_tokenizer, max_length=12)
    assert full["truncated"] == [0] and cut["truncated"] == [len(full["input_ids"][0]) - 12]
    assert cut["input_ids"][0] == full["input_ids"][0][:12]
    assert cut["labels"][0] == full["labels"][0][:12]
