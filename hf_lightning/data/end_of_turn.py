"""The chat template's end-of-turn marker: found, checked against the tokenizer, and made a stop token.

A chat model learns to end its replies with the template's end-of-turn text (ChatML's ``<|im_end|>``);
generation stops only on a token id in ``generation_config.eos_token_id``. When that text is several tokens
(ChatML reused on GPT-2's tokenizer: ``<|im_end|>`` is 7 BPE pieces) or one token that is not a stop token,
the trained model never stops generating. :func:`warn_end_of_turn` says so at setup, with the fix;
:func:`stop_on_end_of_turn` adds a one-token end-of-turn to the exported model's ``eos_token_id`` list (what
TRL's ``setup_chat_format`` achieves by making ``<|im_end|>`` the EOS).
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

# a reply no template rewrites (no blanks to trim, no control text): where it lands shows the reply's place
REPLY_MARKER = "hf-lightning-reply-marker"


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
