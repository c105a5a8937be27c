"""``evaluate``'s greedy generation in left-padded batches gives the replies of one prompt at a time (HF
``Seq2SeqTrainer``'s ``predict_with_generate`` batches the same way); prompts and references of a row."""

from __future__ import annotations

from types import SimpleNamespace

from hf_lightning.batch import IGNORE_INDEX
from hf_lightning.evaluate import generate_replies, prompt_and_reference
from tests.data_support import tiny_llama


def test_batched_greedy_replies_equal_one_at_a_time(word_tokenizer):
    model = tiny_llama(vocab_size=len(word_tokenizer), seed=3)
    module = SimpleNamespace(tokenizer=word_tokenizer, model=model)
    prompts = [[4, 5, 6, 7, 8, 9], [10], [11, 12, 13], [14, 15], [16, 17, 18, 19, 20]]  # unequal: padding
    one = generate_replies(module, prompts, max_new_tokens=6, batch_size=1)
    batched = generate_replies(module, prompts, max_new_tokens=6, batch_size=3)
    assert batched == one
    assert any(reply for reply in one)  # something was generated to compare


def test_prompt_and_reference_of_a_row():
    row = {"input_ids": [1, 2, 3, 4, 5], "labels": [IGNORE_INDEX, IGNORE_INDEX, 3, 4, IGNORE_INDEX]}
    assert prompt_and_reference(row, causal=True) == ([1, 2], [3, 4])
    text = {"input_ids": [7, 8, 9]}  # every token trained: the prompt is the first token
    assert prompt_and_reference(text, causal=True) == ([7], [8, 9])
    # a two-turn chat: the reference is the first assistant turn, the reply generate=true is compared with
    # (it used to be both turns glued together, the second user turn left out)
    chat = {
        "input_ids": [1, 2, 3, 4, 5, 6, 7, 8],
        "labels": [IGNORE_INDEX] * 2 + [3, 4] + [IGNORE_INDEX] * 2 + [7, 8],
    }
    assert prompt_and_reference(chat, causal=True) == ([1, 2], [3, 4])
    seq2seq = {"input_ids": [1, 2], "labels": [5, 6, IGNORE_INDEX]}
    assert prompt_and_reference(seq2seq, causal=False) == ([1, 2], [5, 6])
