"""Chat formats: ``messages`` (role/content) and ShareGPT ``conversations`` (from/value), assistant-only
labels.

A conversation is rendered with the tokenizer's chat template; only assistant replies (and their end-of-turn
token) are targets, every other position is ``-100`` (TRL's ``assistant_only_loss``).
"""

from __future__ import annotations

import re
from typing import Any

from hf_lightning.batch import IGNORE_INDEX
from hf_lightning.data.row_report import EMPTY, NO_ASSISTANT, NO_ASSISTANT_TOKEN, target_cause
from hf_lightning.errors import DataError

GENERATION_BLOCK = re.compile(r"\{%-?\s*generation\s*-?%\}")
ROLES = ("system", "user", "assistant")
# ShareGPT / FastChat speaker names -> chat roles (FastChat's own conversion table plus common variants)
SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "model": "assistant",
    "system": "system",
}


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, list) or not messages:
        raise DataError(
            f"field 'messages' must be a non-empty list of {{role, content}}, got {messages!r:.80}"
        )
    for m in messages:
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise DataError(f"each message needs 'role' and 'content', got {m!r:.80}")
        if m["role"] not in ROLES:
            raise DataError(f"unknown message role {m['role']!r}; expected one of {ROLES}")
        if not isinstance(m["content"], str):
            raise DataError(f"message 'content' must be a string, got {type(m['content']).__name__}")
    roles = [m["role"] for m in messages]
    if "system" in roles[1:]:
        raise DataError(
            f"a 'system' message must come first, found one at position {roles.index('system', 1)} (roles: "
            f"{roles})"
        )


def require_chat_template(tokenizer: Any) -> None:
    """Raise :class:`DataError` when chat data meets a tokenizer without a chat template."""
    if not getattr(tokenizer, "chat_template", None):
        raise DataError(
            "chat data ('messages') needs a tokenizer with a chat template; this tokenizer has none. "
            "Set tokenizer.chat_template (e.g. ChatML) and save it into the model folder."
        )


def _apply_template(tokenizer: Any, messages: list[dict[str, str]], **kwargs: Any) -> dict:
    """``tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True, ...)``; a template that
    refuses the conversation (``raise_exception``, e.g. roles that do not alternate) becomes a
    :class:`DataError`."""
    from jinja2.exceptions import TemplateError

    try:
        return tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True, **kwargs)
    except TemplateError as err:
        roles = [m["role"] for m in messages]
        raise DataError(
            f"the tokenizer's chat template refuses this conversation (roles: {roles}): {err}"
        ) from err


def turn_ends(tokenizer: Any) -> set[int]:
    """The token ids an assistant turn ends on: the EOS and the chat template's end-of-turn when that is one
    token (ChatML's ``<|im_end|>`` where the EOS is ``<|endoftext|>``, as in Qwen2.5's base tokenizer)."""
    from hf_lightning.data.end_of_turn import end_of_turn_ids

    ends = {tokenizer.eos_token_id} if getattr(tokenizer, "eos_token_id", None) is not None else set()
    found = end_of_turn_ids(tokenizer)
    if found is not None and len(found[1]) == 1:
        ends.add(found[1][0])
    return ends


def chat_labels(
    messages: list[dict[str, str]], tokenizer: Any, ends: set[int] | None = None
) -> tuple[list[int], list[int]]:
    """Token ids of a rendered conversation and its labels (assistant tokens kept, the rest ``-100``).

    With a template that marks replies with ``{% generation %}``, HF's
    ``apply_chat_template(return_assistant_tokens_mask=True)`` gives the mask. Otherwise each assistant
    turn's tokens are found by rendering the prefix before it (with the generation prompt) and the
    conversation up to and including it; the turn's tokens up to its last end token (``ends``, default
    :func:`turn_ends`) are the targets (formatting the template writes after the end-of-turn token is never
    generated). This requires the prefix tokens to be a prefix of the longer rendering, which is checked.

    Raises:
        DataError: the tokenizer has no chat template, the template refuses the conversation, or it cannot be
            split by turn.
    """
    require_chat_template(tokenizer)
    if GENERATION_BLOCK.search(tokenizer.chat_template):
        out = _apply_template(tokenizer, messages, return_assistant_tokens_mask=True)
        ids = list(out["input_ids"])
        return ids, [t if m else IGNORE_INDEX for t, m in zip(ids, out["assistant_masks"])]

    def render(msgs, gen):
        return list(_apply_template(tokenizer, msgs, add_generation_prompt=gen)["input_ids"])

    ends = turn_ends(tokenizer) if ends is None else ends

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
        last = max((k for k, t in enumerate(span) if t in ends), default=None)
        if last is not None:
            # what a template writes after the end-of-turn token (a newline) is never generated: not a target
            span = span[: last + 1]
        labels[len(start) : len(start) + len(span)] = span
    return ids, labels


def tokenize_chat(batch: dict[str, list], tokenizer: Any, max_length: int | None) -> dict[str, list]:
    """``datasets.map(batched=True)`` function for the ``messages`` format (assistant-only labels).

    A conversation without an assistant turn has no target (``untrainable`` names it); ``max_length=None``
    keeps every token (``wrapped`` packing).
    """
    out: dict[str, list] = {
        "input_ids": [],
        "attention_mask": [],
        "labels": [],
        "truncated": [],
        "untrainable": [],
    }
    ends = None if GENERATION_BLOCK.search(tokenizer.chat_template or "") else turn_ends(tokenizer)
    for messages in batch["messages"]:
        _check_messages(messages)
        ids, labels = chat_labels(messages, tokenizer, ends)
        keep = len(ids) if max_length is None else max_length
        out["truncated"].append(max(len(ids) - keep, 0))
        if not any(m["role"] == "assistant" for m in messages):
            cause = NO_ASSISTANT
        else:
            cause = target_cause(labels[:keep], labels, NO_ASSISTANT_TOKEN) if ids else EMPTY
        ids, labels = ids[:keep], labels[:keep]
        out["input_ids"].append(ids)
        out["attention_mask"].append([1] * len(ids))
        out["labels"].append(labels)
        out["untrainable"].append(cause)
    return out


def sharegpt_to_messages(conversation: Any) -> list[dict[str, str]]:
    """``[{"from": "human", "value": ...}, {"from": "gpt", ...}]`` -> ``[{"role": "user", "content": ...},
    ...]``.

    Speaker names follow FastChat (``human``/``gpt``/``system``, plus ``user``/``assistant``/``chatgpt``/...).

    Raises:
        DataError: not a list of ``{from, value}`` mappings, or an unknown speaker (named).
    """
    if not isinstance(conversation, list) or not conversation:
        raise DataError(
            f"field 'conversations' must be a non-empty list of {{from, value}}, got {conversation!r:.80}"
        )
    out = []
    for turn in conversation:
        if not isinstance(turn, dict) or "from" not in turn or "value" not in turn:
            raise DataError(f"each ShareGPT turn needs 'from' and 'value', got {turn!r:.80}")
        role = SHAREGPT_ROLES.get(str(turn["from"]).lower())
        if role is None:
            raise DataError(
                f"unknown ShareGPT speaker {turn['from']!r}; expected one of {sorted(SHAREGPT_ROLES)}"
            )
        out.append({"role": role, "content": turn["value"]})
    return out


def tokenize_sharegpt(batch: dict[str, list], tokenizer: Any, max_length: int | None) -> dict[str, list]:
    """``datasets.map(batched=True)`` function for ShareGPT ``conversations`` (assistant-only labels)."""
    messages = [sharegpt_to_messages(c) for c in batch["conversations"]]
    return tokenize_chat({"messages": messages}, tokenizer, max_length)
