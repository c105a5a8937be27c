"""Chat templates: which tokens of a rendered conversation are the assistant's (assistant-only labels), and
the template's end-of-turn marker.

A conversation is rendered with the tokenizer's chat template; only assistant replies and their end-of-turn
token are targets, every other position is ``-100``: the tokens HF's
``apply_chat_template(return_assistant_tokens_mask=True)`` marks (TRL's ``assistant_only_loss``) in a template
with ``{% generation %}`` around each reply and its end-of-turn token. A template without the markers gets
the same targets from :func:`reply_spans`; for example ChatML with ``eos_token=<|endoftext|>``::

    <|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\nHello<|im_end|>\\n
                                                  trained: Hello<|im_end|>

The line break after ``<|im_end|>`` is never generated (generation stops at the end-of-turn token), so it
is not a target. The row functions of the ``messages`` and ``conversations`` formats are in
:mod:`~hf_lightning.data.formats`.

The end-of-turn marker: a chat model learns to end its replies with the template's end-of-turn text (ChatML's
``<|im_end|>``); generation stops only on a token id in ``generation_config.eos_token_id``. When that text is
several tokens (ChatML reused on GPT-2's tokenizer: ``<|im_end|>`` is 7 BPE pieces) or one token that is not a
stop token, the trained model never stops generating. :func:`warn_end_of_turn` says so at setup, with the
fix; :func:`stop_on_end_of_turn` adds a one-token end-of-turn to the exported model's ``eos_token_id`` list
(what TRL's ``setup_chat_format`` achieves by making ``<|im_end|>`` the EOS).
"""

from __future__ import annotations

import logging
import re
from typing import Any

from hf_lightning.core.batch import IGNORE_INDEX
from hf_lightning.core.errors import DataError

log = logging.getLogger(__name__)

GENERATION_BLOCK = re.compile(r"\{%-?\s*generation\s*-?%\}")
REWRITTEN = "the chat template writes the conversation up to it differently once the conversation goes on"
# a reply no template rewrites (no blanks to trim, no control text): where it lands shows the reply's place
REPLY_MARKER = "hf-lightning-reply-marker"


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


def end_of_turn_text(tokenizer: Any) -> str | None:
    """The text the chat template writes right after an assistant reply (up to the first line break,
    stripped), found by rendering ``[user, assistant]``; ``None`` without a template, or when it writes
    nothing there."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    messages = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": REPLY_MARKER}]
    try:
        rendered = tokenizer.apply_chat_template(messages, tokenize=False)
    except Exception:  # a template that refuses this conversation: the data's own refusal comes later
        return None
    if not isinstance(rendered, str) or REPLY_MARKER not in rendered:
        return None
    after = rendered.split(REPLY_MARKER, 1)[1].strip()
    text = after.splitlines()[0].strip() if after else ""
    return text or None


def end_of_turn_ids(tokenizer: Any) -> tuple[str, list[int]] | None:
    """``(end-of-turn text, its token ids without special tokens added)``, or ``None`` (see
    :func:`end_of_turn_text`)."""
    text = end_of_turn_text(tokenizer)
    if text is None:
        return None
    return text, list(tokenizer.encode(text, add_special_tokens=False))


def reply_spans(messages: list[dict[str, str]], tokenizer: Any, text: str) -> dict[int, tuple[int, int]]:
    """``{message index: (start, end)}``: the characters of ``text`` (the whole conversation as the template
    writes it) that a ``{% generation %}`` block would cover in a template without one, for each assistant
    message: the reply and its end-of-turn text, nothing the template writes after that (ChatML's ``\\n``,
    Phi-3's closing EOS).

    A reply starts where the generation prompt before it ends (the messages before it rendered with
    ``add_generation_prompt=True``; for a reply that opens the conversation, after what the template writes
    before the content of ``[assistant]``). It ends after the last end-of-turn text
    (:func:`end_of_turn_text`: ChatML's ``<|im_end|>``, Llama-3's
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


def warn_end_of_turn(tokenizer: Any) -> None:
    """One WARNING when the template's end-of-turn is not one token, or is one token that is not the EOS (the
    export then adds it to the generation config's stop tokens: said at INFO)."""
    found = end_of_turn_ids(tokenizer)
    if found is None:
        return
    text, ids = found
    if len(ids) != 1:
        pieces = [tokenizer.convert_ids_to_tokens(i) for i in ids]
        log.warning(
            "the chat template ends each assistant turn with %r, which this tokenizer splits into %d tokens "
            "%s (ids %s): the model learns to write it piece by piece and generation, which stops on one "
            "token id, never stops on it. Make it one token and the EOS before training: "
            "tok.add_special_tokens({'eos_token': %r}); model.resize_token_embeddings(len(tok)); "
            "model.generation_config.eos_token_id = tok.eos_token_id; then save both into model.name_or_path",
            text,
            len(ids),
            pieces,
            ids,
            text,
        )
    elif ids[0] != getattr(tokenizer, "eos_token_id", None):
        log.info(
            "the chat template ends each assistant turn with %r (token %d), which is not the EOS token %r: "
            "the exported hf_model/ stops generating on both (generation_config.eos_token_id)",
            text,
            ids[0],
            getattr(tokenizer, "eos_token", None),
        )


def stop_on_end_of_turn(model: Any, tokenizer: Any) -> list[int] | None:
    """Add a one-token end-of-turn to ``model.generation_config.eos_token_id`` (kept a list: HF generation
    stops on any id in it). Returns the new list, or ``None`` when nothing changed."""
    config = getattr(model, "generation_config", None)
    found = end_of_turn_ids(tokenizer)
    if config is None or found is None or len(found[1]) != 1:
        return None
    eot = found[1][0]
    current = config.eos_token_id
    ids = [] if current is None else [current] if isinstance(current, int) else list(current)
    if not ids and getattr(tokenizer, "eos_token_id", None) is not None:
        ids = [tokenizer.eos_token_id]
    if eot in ids:
        return None
    config.eos_token_id = [*ids, eot]
    return config.eos_token_id
