"""Formats: tokenize the rows of each data format into ``input_ids`` / ``attention_mask`` / ``labels``.

The formats, the columns that select them (:func:`~hf_lightning.data.sources.detect_format` reads the schema,
never the first row; the first matching rule wins) and what is trained on:

============================  ====================  =========================================================
columns                       format                targets
============================  ====================  =========================================================
``input_ids``                 ``tokenized``         given ``labels``, else every token
``messages``                  ``messages``          assistant replies (chat template)
``conversations``             ``conversations``     assistant replies of ShareGPT ``{from, value}`` turns
``prompt`` + ``completion``   ``prompt_completion`` the completion (and the EOS appended to it)
``source`` + ``target``       ``seq2seq``           the target, tokenized as ``text_target``
``text`` + ``label``          ``classification``    the class (``label`` kept; names kept when strings)
``text``                      ``text``              every token (``tokenizer(text, truncation=True)``)
============================  ====================  =========================================================

Every function here has the ``datasets.map(batched=True)`` shape: a dict of columns in, a dict of columns
out, plus the report columns of :mod:`~hf_lightning.data.row_report` (``truncated``: tokens cut off per row;
``untrainable``: why a row has no target, ``""`` if it has one) that the caller counts and removes. Columns a
format does not read are left untouched (column pruning decides what reaches the model).

``max_length=None`` tokenizes whole documents (``wrapped`` packing cuts the concatenation itself).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from hf_lightning.core.arguments import one_of
from hf_lightning.core.batch import IGNORE_INDEX
from hf_lightning.core.errors import DataError
from hf_lightning.data.chat import chat_labels, tokenize_chat, tokenize_sharegpt
from hf_lightning.data.pretokenized import truncate_tokenized
from hf_lightning.data.row_report import (
    CUT,
    EMPTY,
    NO_COMPLETION,
    ONE_TOKEN,
    has_content,
    special_ids,
    target_cause,
)

__all__ = ["FORMATS", "SOURCE_COLUMNS", "TOKENIZERS", "chat_labels", "tokenize_chat"]


def _strings(batch: Mapping[str, list], field: str) -> list[str]:
    values = batch[field]
    for v in values:
        if not isinstance(v, str):
            raise DataError(f"field {field!r} must be a string, got {type(v).__name__} ({v!r:.60})")
    return list(values)


def _encode_counted(
    tokenizer: Any, texts: list[str], max_length: int | None, add_eos: bool = False, **kwargs: Any
) -> tuple[dict, list[int], list[bool]]:
    """``tokenizer(texts, truncation=True, max_length=max_length)``, the tokens cut off per row, and which
    rows hold no token but the special ones the tokenizer adds (an empty or blank text).

    One untruncated pass measures every row; only the rows that overflow are encoded again with truncation, so
    each row equals ``tokenizer(text, truncation=True, max_length=max_length)`` exactly (special tokens a
    post-processor appends survive truncation; plain slicing would cut them). ``add_eos`` (packed text) ends
    each non-empty row with the EOS token unless the tokenizer already did; a row that does not fit with it is
    the truncated encoding, so what truncation cuts includes that EOS (as TRL, which appends ``eos_token``
    before tokenizing).
    """
    enc = {k: [list(x) for x in v] for k, v in tokenizer(texts, **kwargs).items()}
    special = special_ids(tokenizer)
    empty = [not has_content(ids, special) for ids in enc["input_ids"]]
    eos = getattr(tokenizer, "eos_token_id", None) if add_eos else None
    if eos is not None:
        for i, ids in enumerate(enc["input_ids"]):
            if not empty[i] and ids[-1] != eos:
                for key, rows in enc.items():
                    rows[i].append(
                        eos if key == "input_ids" else 1 if key == "attention_mask" else rows[i][-1]
                    )
    full = [len(x) for x in enc["input_ids"]]
    long_rows = [i for i, n in enumerate(full) if max_length is not None and n > max_length]
    if long_rows:
        cut = tokenizer([texts[i] for i in long_rows], truncation=True, max_length=max_length, **kwargs)
        for key in enc:
            for j, i in enumerate(long_rows):
                enc[key][i] = list(cut[key][j])
    return enc, [n - len(x) for n, x in zip(full, enc["input_ids"])], empty


def tokenize_text(
    batch: dict[str, list], tokenizer: Any, max_length: int | None, add_eos: bool = False
) -> dict[str, list]:
    """``text``: causal LM on every token, each row exactly ``tokenizer(text, truncation=True,
    max_length=...)``.

    ``add_eos`` (set for packed rows only): each document ends with the EOS token, as TRL appends
    ``eos_token`` to text before packing; without it packed documents would run into each other with no
    trained end.
    """
    enc, cut, empty = _encode_counted(tokenizer, _strings(batch, "text"), max_length, add_eos=add_eos)
    causes = [
        EMPTY if e else "" if len(ids) > 1 else CUT if c else ONE_TOKEN
        for e, c, ids in zip(empty, cut, enc["input_ids"])
    ]
    return {
        "input_ids": enc["input_ids"],
        "attention_mask": enc["attention_mask"],
        "truncated": cut,
        "untrainable": causes,
    }


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def tokenize_prompt_completion(batch: dict[str, list], tokenizer: Any, max_length: int) -> dict[str, list]:
    """``prompt`` + ``completion``: completion-only loss (TRL's ``completion_only_loss``).

    The row is ``tokenizer(prompt + completion)`` with the EOS token appended when the tokenizer did not end
    it with one (so the model learns to stop, as TRL appends ``eos_token``). Labels are ``-100`` over the
    prompt's tokens: the longest common prefix of ``tokenizer(prompt)`` and the row (a token that merges
    across the boundary counts as completion). Truncation keeps the first ``max_length`` tokens.

    Example (word-level vocab, no special tokens, eos = 2): prompt ``"a b"`` -> ``[5, 6]``, completion
    ``" c"`` -> ``[7]`` gives ``input_ids [5, 6, 7, 2]``, ``labels [-100, -100, 7, 2]``.
    """
    prompts, completions = _strings(batch, "prompt"), _strings(batch, "completion")
    eos = getattr(tokenizer, "eos_token_id", None)
    special = special_ids(tokenizer)
    full = tokenizer([p + c for p, c in zip(prompts, completions)])["input_ids"]
    heads = tokenizer(prompts)["input_ids"]
    out: dict[str, list] = {
        "input_ids": [],
        "attention_mask": [],
        "labels": [],
        "truncated": [],
        "untrainable": [],
    }
    for ids, head in zip(full, heads):
        ids = list(ids)
        empty = not has_content(ids, special)
        if eos is not None and (not ids or ids[-1] != eos):
            ids.append(eos)
        n_prompt = _common_prefix(head, ids)
        labels = [IGNORE_INDEX] * n_prompt + ids[n_prompt:]
        keep = len(ids) if max_length is None else max_length
        out["truncated"].append(max(len(ids) - keep, 0))
        out["input_ids"].append(ids[:keep])
        out["attention_mask"].append([1] * min(len(ids), keep))
        out["labels"].append(labels[:keep])
        out["untrainable"].append(EMPTY if empty else target_cause(labels[:keep], labels, NO_COMPLETION))
    return out


def tokenize_classification(
    batch: dict[str, list], tokenizer: Any, max_length: int, label2id: Mapping[str, int] | None = None
) -> dict[str, list]:
    """``text`` + ``label``: sequence classification; ``label`` stays a column (the collator renames it).

    Every tokenizer output (``input_ids``, ``attention_mask``, ``token_type_ids`` ...) is kept, truncated as
    in :func:`tokenize_text`. String labels are mapped through ``label2id``; integer and float labels are
    kept.

    Raises:
        DataError: a string label missing from ``label2id`` (named), or a label that is neither.
    """
    enc, truncated, _ = _encode_counted(tokenizer, _strings(batch, "text"), max_length)
    labels = []
    for value in batch["label"]:
        if value is None or (isinstance(value, float) and math.isnan(value)) or value == "":
            raise DataError(f"field 'label' is empty on this row ({value!r}); every row needs a class label")
        if isinstance(value, str):
            if label2id is None:
                raise DataError(
                    f"field 'label' holds {value!r:.60}, a class name, but the training labels are numbers "
                    "(integer class ids or float regression targets); write every label the same way"
                )
            if value not in label2id:
                known = sorted(label2id, key=label2id.__getitem__)
                raise DataError(
                    f"field 'label' holds {value!r:.60}, which is not one of the {len(known)} training "
                    f"labels {known[:20]}{' ...' if len(known) > 20 else ''}"
                )
            value = label2id[value]
        elif not isinstance(value, (int, float)) or isinstance(value, bool):
            raise DataError(f"field 'label' must be a class name, an int or a float, got {value!r:.60}")
        labels.append(value)
    return {**enc, "label": labels, "truncated": truncated, "untrainable": [""] * len(labels)}


def tokenize_seq2seq(batch: dict[str, list], tokenizer: Any, max_length: int) -> dict[str, list]:
    """``source`` + ``target``: encoder input ``tokenizer(source)``, ``labels =
    tokenizer(text_target=target)``.

    Both sides are truncated to ``max_length``; a row counts as truncated when either side was.
    """
    enc, cut_src, _ = _encode_counted(tokenizer, _strings(batch, "source"), max_length)
    targets = _strings(batch, "target")
    full = [list(x) for x in tokenizer(text_target=targets)["input_ids"]]
    tgt = list(full)
    long_rows = [i for i, x in enumerate(full) if len(x) > max_length]
    if long_rows:
        cut = tokenizer(text_target=[targets[i] for i in long_rows], truncation=True, max_length=max_length)
        for j, i in enumerate(long_rows):
            tgt[i] = list(cut["input_ids"][j])
    return {
        "input_ids": enc["input_ids"],
        "attention_mask": enc["attention_mask"],
        "labels": tgt,
        "truncated": [a + len(f) - len(t) for a, f, t in zip(cut_src, full, tgt)],
        "untrainable": [target_cause(t, f, EMPTY, causal=False) for t, f in zip(tgt, full)],
    }


TOKENIZERS = {
    "text": tokenize_text,
    "prompt_completion": tokenize_prompt_completion,
    "messages": tokenize_chat,
    "conversations": tokenize_sharegpt,
    "classification": tokenize_classification,
    "seq2seq": tokenize_seq2seq,
    "tokenized": truncate_tokenized,
}
FORMATS = tuple(TOKENIZERS)
#: the value rule of ``data.format`` (read from :class:`~hf_lightning.HFDataModule`'s signature)
FORMAT = one_of(("auto", *FORMATS))
# the columns each format reads; the first ones are required
SOURCE_COLUMNS = {
    "text": ("text",),
    "prompt_completion": ("prompt", "completion"),
    "messages": ("messages",),
    "conversations": ("conversations",),
    "classification": ("text", "label"),
    "seq2seq": ("source", "target"),
    "tokenized": ("input_ids",),
}
# formats whose labels are shifted by the model (the first label position is never a target)
CAUSAL_FORMATS = ("text", "prompt_completion", "messages", "conversations", "tokenized")
# detection order: the first format whose required columns are all present
DETECTION_ORDER = (
    "tokenized",
    "messages",
    "conversations",
    "prompt_completion",
    "seq2seq",
    "classification",
    "text",
)


def fitting_formats(columns: Sequence[str]) -> list[str]:
    """The formats whose required columns are all in ``columns``, in detection order."""
    cols = set(columns)
    return [fmt for fmt in DETECTION_ORDER if all(c in cols for c in SOURCE_COLUMNS[fmt])]


def rename_hint(columns: Sequence[str]) -> str:
    """A ``+data.rename_columns=...`` override that maps the first columns onto a format's names: two columns
    to ``prompt`` / ``completion``, one to ``text`` (``question, answer`` -> ``{question: prompt, answer:
    completion}``).
    """
    cols = list(columns)
    if len(cols) >= 2:
        return f"+data.rename_columns='{{{cols[0]}: prompt, {cols[1]}: completion}}'"
    return f"+data.rename_columns='{{{cols[0] if cols else 'COLUMN'}: text}}'"


CHAT_FORMATS = ("messages", "conversations")
_TURNS = {"messages": "{role, content} turns", "conversations": "ShareGPT {from, value} turns"}
# every column name some format reads: such a column is not offered as another one's source
_FORMAT_COLUMNS = {c for cols in SOURCE_COLUMNS.values() for c in cols}


def _is_id(column: str) -> bool:
    name = column.lower()
    return name in ("id", "idx", "index", "uuid") or name.endswith(("_id", "_idx"))


def spare_columns(columns: Sequence[str]) -> list[str]:
    """The columns that could be renamed to a format's: neither a format's own name nor an id."""
    return [c for c in columns if c not in _FORMAT_COLUMNS and not _is_id(c)]


def guess_source(target: str, spare: Sequence[str]) -> str | None:
    """The spare column most likely to hold ``target``: the last for ``label`` (classes follow the text),
    else the first."""
    if not spare:
        return None
    return spare[-1] if target == "label" else spare[0]


def format_rename_hint(columns: Sequence[str], fmt: str) -> str:
    """What renames ``columns`` into format ``fmt``'s, as an override to type: the missing columns each
    from a spare column (``text, intent`` under ``classification`` -> ``+data.rename_columns='{intent:
    label}'``); columns of text under a chat format are a prompt and a reply (``prompt_completion``)."""
    missing = [c for c in SOURCE_COLUMNS[fmt] if c not in columns]
    spare = spare_columns(columns)
    if fmt in CHAT_FORMATS:
        other = CHAT_FORMATS[1 - CHAT_FORMATS.index(fmt)]
        turns = f"a {fmt!r} field holds a list of {_TURNS[fmt]} ({_TURNS[other]}: the {other} format)"
        if len(spare) >= 2:
            return (
                f"{turns}; columns of prompt and reply text are the prompt_completion format: "
                f"+data.rename_columns='{{{spare[0]}: prompt, {spare[1]}: completion}}' "
                "data.format=prompt_completion"
            )
        source = spare[0] if spare else "COLUMN"
        return f"{turns}: rename the column that holds them, e.g. +data.rename_columns='{{{source}: {fmt}}}'"
    if fmt == "text" and len(spare) >= 2:  # a prompt and a reply, not one text
        return f"rename them to a format's, e.g. {rename_hint(spare)}, and set data.format=prompt_completion"
    pairs, left = [], list(spare)
    for target in sorted(missing, key=lambda c: c != "label"):  # the label first: it takes the last column
        source = guess_source(target, left)
        if source is not None:
            left.remove(source)
        pairs.append((source or "COLUMN", target))
    pairs.sort(key=lambda pair: missing.index(pair[1]))
    mapping = ", ".join(f"{source}: {target}" for source, target in pairs)
    return f"rename the file's columns to the format's, e.g. +data.rename_columns='{{{mapping}}}'"


def check_columns(columns: Sequence[str], fmt: str, path: Any, split: str) -> None:
    """Raise :class:`DataError` naming the missing field when ``columns`` cannot feed format ``fmt``; the
    message names the other chat format when the columns fit it (``data.format=conversations``), else the
    rename that fits ``fmt`` (:func:`format_rename_hint`), else the formats the columns do fit."""
    missing = [c for c in SOURCE_COLUMNS[fmt] if c not in columns]
    if not missing:
        return
    what = (
        f"a {missing[0]!r} field"
        if len(missing) == 1
        else "the fields " + ", ".join(repr(c) for c in missing)
    )
    fits = fitting_formats(columns)
    # text without a label fits the text format, no help to a classifier
    fits_other = [f for f in fits if f != "text"] if fmt == "classification" else fits
    if fits_other:
        fix = (
            f"these columns fit the format{'s' if len(fits_other) > 1 else ''} {', '.join(fits_other)}: set "
            f"data.format={fits_other[0]} (or data.format=auto to detect it)"
        )
    else:
        fix = format_rename_hint(columns, fmt)
    raise DataError(
        f"data.path={path}: format {fmt!r} needs {what}; the {split} split has {list(columns)}; {fix}"
    )
