"""``evaluate``'s greedy generation in left-padded batches gives the replies of one prompt at a time (HF
``Seq2SeqTrainer``'s ``predict_with_generate`` batches the same way); prompts and references of a row."""

from __future__ import annotations

from types import SimpleNamespace

from hf_lightning.core.batch import IGNORE_INDEX
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


def test_label_ids_cover_every_target_and_the_reference_is_their_first_run(default_tokenizer):
    """``predictions.jsonl``: ``positions`` / ``predicted_ids`` / ``label_ids`` are the teacher-forced record
    of every target of the row (both assistant turns: what ``val/loss`` scores, HF ``Trainer.predict``'s
    ``label_ids`` where they are not -100); ``reference`` is one reply, the first turn, which is
    ``label_ids`` up to the first gap in ``positions``."""
    import torch

    from hf_lightning import HFLightningModule
    from hf_lightning.data.chat import chat_labels

    tok = default_tokenizer
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello there"},
        {"role": "user", "content": "How are you?"},
        {"role": "assistant", "content": "Fine"},
    ]
    ids, labels = chat_labels(messages, tok)
    module = HFLightningModule(tiny_llama(vocab_size=len(tok), seed=0))
    batch = {
        "input_ids": torch.tensor([ids]),
        "attention_mask": torch.ones(1, len(ids), dtype=torch.long),
        "labels": torch.tensor([labels]),
    }
    (record,) = module.predict_step(batch, 0)
    targets = [i for i, t in enumerate(labels) if t != IGNORE_INDEX]  # by hand: every trained position
    assert record["positions"] == targets
    assert record["label_ids"] == [labels[i] for i in targets]
    assert tok.decode(record["label_ids"]) == "Hello there<|im_end|>Fine<|im_end|>"
    first_run = next((k for k in range(1, len(targets)) if targets[k] != targets[k - 1] + 1), len(targets))
    prompt, reference = prompt_and_reference({"input_ids": ids, "labels": labels}, causal=True)
    assert reference == record["label_ids"][:first_run]
    assert tok.decode(reference) == "Hello there<|im_end|>" and prompt == ids[: targets[0]]
