"""Formats: detect what a dataset holds and tokenize it into ``input_ids`` / ``attention_mask`` / ``labels``.

Detection reads the schema (column names), never the first row. Formats:

- ``text``: causal LM on a ``text`` column; each row is tokenized exactly as
  ``tokenizer(text, truncation=True, max_length=max_length)``; every token is a target.
- ``tokenized``: rows that already hold ``input_ids`` (and optionally ``attention_mask``, ``labels``), used
  as they are apart from truncation to ``max_length``.
- ``messages``: chat (a list of ``{"role", "content"}``) rendered with the tokenizer's chat template;
  only assistant replies and their end-of-turn tokens are targets (assistant-only loss).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from hf_lightning.errors import DataError
from hf_lightning.module.loss import IGNORE_INDEX

GENERATION_BLOCK = re.compile(r"\{%-?\s*generation\s*-?%\}")
FORMATS = ("text", "messages", "tokenized")
ROLES = ("system", "user", "assistant")


def detect_format(columns: Sequence[str], path: Any = None) -> str:
    """Return ``"tokenized"``, ``"messages"`` or ``"text"`` from the column names (in that order).

    Raises:
        DataError: no known field; the message lists the columns found and the fields expected.
    """
    cols = set(columns)
    if "input_ids" in cols:
        return "tokenized"
    if "messages" in cols:
        return "messages"
    if "text" in cols:
        return "text"
    raise DataError(
        f"data.path={path}: cannot tell the data format from the columns {sorted(cols)}; expected a "
        "'messages' column (chat: list of {role, content}) or a 'text' column (plain causal LM), "
        "or set data.format explicitly"
    )


def tokenize_text(batch: dict[str, list], tokenizer: Any, max_length: int) -> dict[str, list]:
    """``datasets.map(batched=True)`` function for the ``text`` format."""
    texts = batch["text"]
    for t in texts:
        if not isinstance(t, str):
            raise DataError(f"field 'text' must be a string, got {type(t).__name__} ({t!r:.60})")
    # One untruncated pass counts truncations; only the rows that overflow are encoded again with
    # truncation, so each row equals tokenizer(text, truncation=True, max_length=max_length) exactly
    # (special tokens a post-processor appends survive truncation, plain slicing would cut them).
    enc = tokenizer(texts)
    ids, mask = list(enc["input_ids"]), list(enc["attention_mask"])
    truncated = [len(x) > max_length for x in ids]
    long_rows = [i for i, t in enumerate(truncated) if t]
    if long_rows:
        cut = tokenizer([texts[i] for i in long_rows], truncation=True, max_length=max_length)
        for j, i in enumerate(long_rows):
            ids[i], mask[i] = cut["input_ids"][j], cut["attention_mask"][j]
    return {"input_ids": ids, "attention_mask": mask, "truncated": truncated}


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, list) or not messages:
        raise DataError(f"field 'messages' must be a non-empty list of {{role, content}}, got {messages!r:.80}")
    for m in messages:
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise DataError(f"each message needs 'role' and 'content', got {m!r:.80}")
        if m["role"] not in ROLES:
            raise DataError(f"unknown message role {m['role']!r}; expected one of {ROLES}")
        if not isinstance(m["content"], str):
            raise DataError(f"message 'content' must be a string, got {type(m['content']).__name__}")


def chat_labels(messages: list[dict[str, str]], tokenizer: Any) -> tuple[list[int], list[int]]:
    """Token ids of a rendered conversation and its labels (assistant tokens kept, the rest ``-100``).

    With a template that marks replies with ``{% generation %}``, HF's
    ``apply_chat_template(return_assistant_tokens_mask=True)`` gives the mask. Otherwise each assistant
    turn's tokens are found by rendering the prefix before it (with the generation prompt) and the
    conversation up to and including it; the turn's tokens up to its last EOS token are the targets
    (formatting the template writes after the end-of-turn token is never generated). This requires the
    prefix tokens to be a prefix of the longer rendering, which is checked.

    Raises:
        DataError: the tokenizer has no chat template, or the template cannot be split by turn.
    """
    if not getattr(tokenizer, "chat_template", None):
        raise DataError(
            "chat data ('messages') needs a tokenizer with a chat template; this tokenizer has none. "
            "Set tokenizer.chat_template (e.g. ChatML) and save it into the model folder."
        )
    if GENERATION_BLOCK.search(tokenizer.chat_template):
        out = tokenizer.apply_chat_template(
            messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
        ids = list(out["input_ids"])
        return ids, [t if m else IGNORE_INDEX for t, m in zip(ids, out["assistant_masks"])]

    def render(msgs, gen):
        out = tokenizer.apply_chat_template(msgs, tokenize=True, add_generation_prompt=gen, return_dict=True)
        return list(out["input_ids"])

    ids = render(messages, False)
    labels = [IGNORE_INDEX] * len(ids)
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        start = render(messages[:i], True) if i else []
        upto = render(messages[: i + 1], False)
        if ids[: len(upto)] != upto or upto[: len(start)] != start:
            raise DataError(
                "the chat template renders a conversation differently from its prefixes, so assistant "
                "turns cannot be located; add {% generation %} markers around assistant replies"
            )
        span = upto[len(start) :]
        eos = getattr(tokenizer, "eos_token_id", None)
        if eos in span:
            # what a template writes after the end-of-turn token (a newline) is never generated: not a target
            span = span[: len(span) - span[::-1].index(eos)]
        labels[len(start) : len(start) + len(span)] = span
    return ids, labels


def tokenize_chat(batch: dict[str, list], tokenizer: Any, max_length: int) -> dict[str, list]:
    """``datasets.map(batched=True)`` function for the ``messages`` format (assistant-only labels)."""
    out: dict[str, list] = {"input_ids": [], "attention_mask": [], "labels": [], "truncated": []}
    for messages in batch["messages"]:
        _check_messages(messages)
        ids, labels = chat_labels(messages, tokenizer)
        out["truncated"].append(len(ids) > max_length)
        ids, labels = ids[:max_length], labels[:max_length]
        out["input_ids"].append(ids)
        out["attention_mask"].append([1] * len(ids))
        out["labels"].append(labels)
    return out


def truncate_tokenized(batch: dict[str, list], tokenizer: Any, max_length: int) -> dict[str, list]:
    """``datasets.map(batched=True)`` function for pre-tokenized rows: truncate and count."""
    out: dict[str, list] = {"truncated": [len(x) > max_length for x in batch["input_ids"]]}
    for key in ("input_ids", "attention_mask", "labels"):
        if key in batch:
            out[key] = [list(x)[:max_length] for x in batch[key]]
    return out


TOKENIZERS = {"text": tokenize_text, "messages": tokenize_chat, "tokenized": truncate_tokenized}
# the column each format reads (the rest of a row is not used by the format)
SOURCE_COLUMNS = {"text": ("text",), "messages": ("messages",), "tokenized": ("input_ids", "attention_mask", "labels")}
