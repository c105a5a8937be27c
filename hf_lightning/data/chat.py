"""Chat formats: ``messages`` (role/content) and ShareGPT ``conversations`` (from/value), assistant-only
labels.

A conversation is rendered with the tokenizer's chat template; only assistant replies and their end-of-turn
token are targets, every other position is ``-100``: the tokens HF's
``apply_chat_template(return_assistant_tokens_mask=True)`` marks (TRL's ``assistant_only_loss``) in a template
with ``{% generation %}`` around each reply and its end-of-turn token. A template without the markers gets
the same targets from :func:`reply_spans`; for example ChatML with ``eos_token=<|endoftext|>``::

    <|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\nHello<|im_end|>\\n
                                                  trained: Hello<|im_end|>

The line break after ``<|im_end|>`` is never generated (generation stops at the end-of-turn token), so it
is not a target.
"""

from __future__ import annotations

import re
from typing import Any

from hf_lightning.core.batch import IGNORE_INDEX
from hf_lightning.core.errors import DataError
from hf_lightning.data.end_of_turn import REPLY_MARKER, end_of_turn_text
from hf_lightning.data.row_report import EMPTY, NO_ASSISTANT, NO_ASSISTANT_TOKEN, target_cause

GENERATION_BLOCK = re.compile(r"\{%-?\s*generation\s*-?%\}")
ROLES = ("system", "user", "assistant")
REWRITTEN = "the chat template writes the conversation up to it differently once the conversation goes on"
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


def _other_turns(turn: Any, key: str) -> str:
    """The rename that fits a turn of the other chat format (``{from, value}`` in ``messages``, ``{role,
    content}`` in ``conversations``), ``""`` for any other turn."""
    if not isinstance(turn, dict) or turn.get(key) is None:
        return ""
    here, there = ("messages", "conversations") if key == "from" else ("conversations", "messages")
    kind = "ShareGPT {from, value}" if key == "from" else "{role, content}"
    return (
        f": these are {kind} turns, which the {there} format reads; rename the column: "
        f"+data.rename_columns='{{{here}: {there}}}' (with data.format=auto or {there})"
    )


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, list) or not messages:
        raise DataError(
            f"field 'messages' must be a non-empty list of {{role, content}}, got {messages!r:.80}"
        )
    for m in messages:
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise DataError(
                f"each message needs 'role' and 'content', got {m!r:.80}{_other_turns(m, 'from')}"
            )
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


def _template_call(tokenizer: Any, messages: list[dict[str, str]], **kwargs: Any) -> Any:
    """``tokenizer.apply_chat_template(messages, **kwargs)``; a template that refuses the conversation
    (``raise_exception``, e.g. roles that do not alternate) becomes a :class:`DataError`."""
    from jinja2.exceptions import TemplateError

    try:
        return tokenizer.apply_chat_template(messages, **kwargs)
    except TemplateError as err:
        roles = [m["role"] for m in messages]
        raise DataError(
            f"the tokenizer's chat template refuses this conversation (roles: {roles}): {err}"
        ) from err


def _render(tokenizer: Any, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
    """The conversation as the template writes it (``tokenize=False``); ``""`` for no message."""
    if not messages:
        return ""
    return _template_call(tokenizer, messages, tokenize=False, add_generation_prompt=add_generation_prompt)


def reply_spans(messages: list[dict[str, str]], tokenizer: Any, text: str) -> dict[int, tuple[int, int]]:
    """``{message index: (start, end)}``: the characters of ``text`` (the whole conversation as the template
    writes it) that a ``{% generation %}`` block would cover in a template without one, for each assistant
    message: the reply and its end-of-turn text, nothing the template writes after that (ChatML's ``\\n``,
    Phi-3's closing EOS).

    A reply starts where the generation prompt before it ends (the messages before it rendered with
    ``add_generation_prompt=True``; for a reply that opens the conversation, after what the template writes
    before the content of ``[assistant]``). It ends after the last end-of-turn text
    (:func:`~hf_lightning.data.end_of_turn.end_of_turn_text`: ChatML's ``<|im_end|>``, Llama-3's
    ``<|eot_id|>``, Gemma's ``<end_of_turn>``, Mistral's ``</s>``) in the conversation rendered up to and
    including the reply; where the template writes none there, after the reply's last non-blank character.
    What lies before a reply's end must be written the same way in the whole conversation.

    Raises:
        DataError: the template refuses the conversation, or writes a turn differently once the conversation
            goes on (the reply cannot be located; the message names it and the fix).
    """
    eot = end_of_turn_text(tokenizer)
    spans = {}
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = _render(tokenizer, messages[:i], True) if i else _first_header(tokenizer)
        upto = _render(tokenizer, messages[: i + 1], False)
        start = len(before)
        reply = upto[start:]
        at = reply.rfind(eot) if eot else -1
        end = start + (at + len(eot) if at >= 0 else len(reply.rstrip()))
        if upto[:start] != before or text[:end] != upto[:end]:
            raise _unlocated(i, REWRITTEN)
        spans[i] = (start, end)
    return spans


def _first_header(tokenizer: Any) -> str:
    """What the template writes before a reply that opens the conversation (no generation prompt can be
    rendered before it): the text before the reply in ``[assistant: REPLY_MARKER]``; ``""`` where the marker
    does not come out as it went in."""
    text = _render(tokenizer, [{"role": "assistant", "content": REPLY_MARKER}], False)
    return text[: text.index(REPLY_MARKER)] if REPLY_MARKER in text else ""


def _unlocated(index: int, why: str) -> DataError:
    return DataError(
        f"cannot tell which tokens are the reply of message {index} (assistant; messages counted from 0): "
        f"{why}. Mark each assistant reply and its end-of-turn token with {{% generation %}}...{{% "
        "endgeneration %} in the chat template (HF's return_assistant_tokens_mask reads them)"
    )


def _trained_tokens(
    tokenizer: Any, text: str, spans: dict[int, tuple[int, int]]
) -> tuple[list[int], list[bool]]:
    """The ids of ``text`` (``add_special_tokens=False``, as ``apply_chat_template`` tokenizes it) and, per
    token, whether it overlaps a span: HF's rule for ``{% generation %}`` blocks, on the tokenizer's
    character offsets. A tokenizer without offsets (a Python one) maps each end of a span by tokenizing the
    text before it, which must give a prefix of the ids.

    Raises:
        DataError: a tokenizer without offsets that writes one token across an end of a span.
    """
    if getattr(tokenizer, "is_fast", False):
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids = list(enc["input_ids"])
        ordered = sorted(spans.values())
        trained, k = [], 0
        for start, end in enc["offset_mapping"]:
            while k < len(ordered) and start >= ordered[k][1]:
                k += 1
            trained.append(k < len(ordered) and end > ordered[k][0])
        return ids, trained

    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    trained = [False] * len(ids)
    for index, chars in spans.items():
        first, last = (_tokens_before(tokenizer, text, ids, c, index) for c in chars)
        trained[first:last] = [True] * (last - first)
    return ids, trained


def _tokens_before(tokenizer: Any, text: str, ids: list[int], char: int, index: int) -> int:
    head = list(tokenizer(text[:char], add_special_tokens=False)["input_ids"])
    if ids[: len(head)] != head:
        raise _unlocated(
            index,
            "this tokenizer writes one token across an end of the reply and gives no character offsets "
            "(a Python tokenizer) to tell which tokens it covers",
        )
    return len(head)


def chat_labels(messages: list[dict[str, str]], tokenizer: Any) -> tuple[list[int], list[int]]:
    """Token ids of a rendered conversation and its labels (assistant tokens kept, the rest ``-100``).

    With a template that marks replies with ``{% generation %}``, HF's
    ``apply_chat_template(return_assistant_tokens_mask=True)`` gives the mask (what TRL's
    ``assistant_only_loss`` trains). Otherwise the same targets are found by rendering prefixes
    (:func:`reply_spans`): each reply and its end-of-turn token, never what the template writes after it;
    the tokens are those that overlap a reply, as HF maps a generation block.

    Raises:
        DataError: the tokenizer has no chat template, the template refuses the conversation, or its
            replies cannot be located.
    """
    require_chat_template(tokenizer)
    if GENERATION_BLOCK.search(tokenizer.chat_template):
        out = _template_call(
            tokenizer, messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
        ids = list(out["input_ids"])
        return ids, [t if m else IGNORE_INDEX for t, m in zip(ids, out["assistant_masks"])]
    text = _render(tokenizer, messages, False)
    ids, trained = _trained_tokens(tokenizer, text, reply_spans(messages, tokenizer, text))
    return ids, [t if keep else IGNORE_INDEX for t, keep in zip(ids, trained)]


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
    for messages in batch["messages"]:
        _check_messages(messages)
        ids, labels = chat_labels(messages, tokenizer)
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
            raise DataError(
                f"each ShareGPT turn needs 'from' and 'value', got {turn!r:.80}{_other_turns(turn, 'role')}"
            )
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
