"""Formats: tokenize the rows of each data format into ``input_ids`` / ``attention_mask`` / ``labels``, and
report what tokenization did to each row.

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

Every format function has the ``datasets.map(batched=True)`` shape: a dict of columns in, a dict of columns
out, plus the report columns below that the caller counts (:class:`RowReport`) and removes. Columns a format
does not read are left untouched (column pruning decides what reaches the model).

``max_length=None`` tokenizes whole documents (``wrapped`` packing cuts the concatenation itself).

Chat rows (``messages``, ``conversations``) are rendered with the tokenizer's chat template, their labels
found by :mod:`~hf_lightning.data.chat`. Pre-tokenized rows (``tokenized``) arrive with ``input_ids`` (and
maybe ``attention_mask`` / ``labels``), possibly as ``(1, n)`` leftovers of ``return_tensors``; their token
values are checked, positions with ``attention_mask == 0`` never become targets (HF
``DataCollatorForLanguageModeling``), and a row that keeps no target is reported as untrainable.

The report columns, one value per row each:

- ``truncated``: how many tokens truncation to ``data.max_length`` cut off (0: none);
- ``untrainable``: ``""`` when the row has a target, else why it has none (one of the causes below);
- pre-tokenized rows only: ``padding_masked``, given labels set to -100 because ``attention_mask`` is 0 there,
  and ``padding_removed``, padding positions taken out for packed or padding-free batches.

A row without a target is dropped from a map-style split (a stream keeps a zero-weight stand-in instead, so
that ranks stay in step). The warning names each cause with its count and its first rows::

    train: dropped 3 of 5 rows with no trained-on token: empty after tokenization: 2 (data.path=F.jsonl lines
    2, 4); no assistant turn: 1 (data.path=F.jsonl line 5)
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hf_lightning.core.arguments import one_of
from hf_lightning.core.batch import IGNORE_INDEX
from hf_lightning.core.errors import DataError
from hf_lightning.data.chat import chat_labels

log = logging.getLogger(__name__)

# ------------------------------------------------------------------------------ the row report
EMPTY = "empty after tokenization"
ONE_TOKEN = "a single token (nothing after it to predict)"
ALL_PADDING = "all padding (attention_mask 0 everywhere)"
NO_ASSISTANT = "no assistant turn"
NO_ASSISTANT_TOKEN = "no assistant token in the rendered conversation"
NO_COMPLETION = "no completion token (an empty completion and no EOS token)"
CUT = "all labels -100 after truncation to data.max_length"
GIVEN = "all labels -100 as given"
CLASS_IGNORED = "class label -100"
REPORT_COLUMNS = ("truncated", "untrainable", "padding_masked", "padding_removed")
SHOWN_ROWS = 5  # row numbers listed per cause


def has_target(labels: Any, causal: bool) -> bool:
    """Whether a label row holds at least one position that gets a loss term.

    A causal LM never trains on position 0 (it has no preceding token), so it is skipped when ``causal``; a
    scalar (a class label) is a target unless it is -100; ``None`` (no labels) counts as a target.
    """
    if labels is None:
        return True
    if isinstance(labels, (int, float)):
        return labels != IGNORE_INDEX
    start = 1 if causal else 0
    return any(t != IGNORE_INDEX for t in list(labels)[start:])


def target_cause(
    labels: Sequence[int], full_labels: Sequence[int], otherwise: str, causal: bool = True
) -> str:
    """``""`` when ``labels`` hold a target; :data:`CUT` when only truncation took them (``full_labels``, the
    untruncated row, had one); else ``otherwise``."""
    if has_target(labels, causal):
        return ""
    return CUT if has_target(full_labels, causal) else otherwise


def special_ids(tokenizer: Any) -> set[int]:
    """The ids of the special tokens a tokenizer may add around text (BOS, EOS, CLS, ...); not ``unk``, which
    stands for real text the vocabulary lacks."""
    ids = set(getattr(tokenizer, "all_special_ids", ()) or ())
    return ids - {getattr(tokenizer, "unk_token_id", None)}


def has_content(ids: Sequence[int], special: set[int]) -> bool:
    """Whether a tokenized row holds a token other than ``special`` ones (see :func:`special_ids`)."""
    return any(t not in special for t in ids)


def row_numbers(noun: str, values: Sequence[int]) -> str:
    """``rows 1, 3, 8`` (``noun`` ``rows``); at most :data:`SHOWN_ROWS` numbers, then ``...``."""
    more = "" if len(values) <= SHOWN_ROWS else ", ..."
    return f"{noun}{'s' if len(values) > 1 else ''} {', '.join(str(v) for v in values[:SHOWN_ROWS])}{more}"


class RowReport:
    """Adds up the report columns of one split (or one stream reader) and logs them.

    Args:
        split: the split's name in the log (``train``, ``validation``).
        name_rows: turns row indices into words (see :func:`~hf_lightning.data.sources.row_names`).
    """

    def __init__(self, split: str, name_rows: Callable[[list[int]], str] | None = None) -> None:
        self.split = split
        self.name_rows = name_rows or (lambda rows: row_numbers(f"{split} row", rows))
        self.rows = 0
        self.truncated_rows = 0
        self.cut_tokens = 0
        self.causes: dict[str, list[int]] = {}
        self.masked = [0, 0]  # label positions, rows
        self.removed = [0, 0]

    def add(self, index: int, info: Mapping[str, Any]) -> str:
        """Count one row (``info``: its report columns); returns its cause (``""``: it has a target)."""
        self.rows += 1
        cut = int(info.get("truncated") or 0)
        self.truncated_rows += cut > 0
        self.cut_tokens += cut
        for key, tally in (("padding_masked", self.masked), ("padding_removed", self.removed)):
            n = int(info.get(key) or 0)
            tally[0] += n
            tally[1] += n > 0
        cause = info.get("untrainable") or ""
        if cause:
            self.causes.setdefault(cause, []).append(index)
        return cause

    def add_columns(self, columns: Mapping[str, Sequence[Any]]) -> list[int]:
        """Count every row of a ``Dataset.map`` output (its report columns, by name); returns the rows to
        keep."""
        n = len(next(iter(columns.values())))
        keep = []
        for i in range(n):
            if not self.add(i, {k: v[i] for k, v in columns.items()}):
                keep.append(i)
        return keep

    @property
    def untrainable(self) -> int:
        return sum(len(rows) for rows in self.causes.values())

    def describe_causes(self) -> str:
        """``empty after tokenization: 2 (train rows 1, 3); no assistant turn: 1 (train row 5)``."""
        return "; ".join(
            f"{cause}: {len(rows)} ({self.name_rows(rows[: SHOWN_ROWS + 1])})"
            for cause, rows in self.causes.items()
        )

    def empty_remedy(self, max_length: int | None) -> str:
        """What to change when no row of the split has a target, from the causes seen: ``raise
        data.max_length (now 256)`` only where truncation removed the targets."""
        said = {
            CUT: f"raise data.max_length (now {max_length})",
            NO_ASSISTANT: "the conversations need an assistant turn to train on",
            NO_ASSISTANT_TOKEN: "the chat template must render the assistant turns",
            NO_COMPLETION: "give the completions some text",
        }
        remedies = [said[c] for c in self.causes if c in said]
        return "; ".join(remedies or ["check which fields hold the targets"])

    def empty_error(self, path: Any, max_length: int | None) -> DataError:
        """The refusal of a split in which no row has a target: the rows read, the causes and the remedy."""
        return DataError(
            f"data.path={path}: the {self.split} split is empty after tokenization: {self.rows} rows were "
            f"read and none has a trained-on token [{self.describe_causes()}]: "
            f"{self.empty_remedy(max_length)}"
        )

    def log(
        self,
        max_length: int | None,
        level: int = logging.WARNING,
        prefix: str = "",
        kept: bool = False,
        remedy: str = "",
    ) -> None:
        """One line per thing that happened: truncation, padding labels masked, padding removed, rows without
        target.

        ``kept``: the rows without a target stay as zero-weight stand-ins (streams) instead of being dropped.
        ``remedy``: appended to the truncation line (what keeps the cut tokens).
        """
        head = f"{self.split}: {prefix}"
        if self.truncated_rows:
            log.log(
                level,
                "%s%d of %d rows were longer than data.max_length=%s and were truncated (%d tokens cut "
                "off)%s",
                head,
                self.truncated_rows,
                self.rows,
                max_length,
                self.cut_tokens,
                remedy,
            )
        if self.masked[0]:
            log.log(
                level,
                "%s%d label positions in %d rows lie on padding (attention_mask 0) and were set to -100",
                head,
                *self.masked,
            )
        if self.removed[0]:
            log.info(
                "%s%d padding positions (attention_mask 0) in %d rows were removed (packed and padding-free "
                "rows hold no padding)",
                head,
                *self.removed,
            )
        if self.causes:
            what = (
                "%s%d of %d rows have no trained-on token, kept with zero weight so that ranks stay in step: "
                "%s"
                if kept
                else "%sdropped %d of %d rows with no trained-on token: %s"
            )
            log.log(level, what, head, self.untrainable, self.rows, self.describe_causes())


# ------------------------------------------------------------------------------ the formats
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


#: the column of a pre-tokenized row that holds its documents' lengths, in order (``trl.pack_dataset``'s, and
#: our packed rows'); with ``position_ids`` the layout's own columns: kept through column pruning
SEQ_LENGTHS = "seq_lengths"
DOCUMENT_COLUMNS = (SEQ_LENGTHS, "position_ids")


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def document_starts(lengths: Any, positions: Any, n: int) -> list[int]:
    """Where each document of a pre-tokenized row of ``n`` tokens starts, from its ``seq_lengths`` (the
    documents' lengths, in order: ``trl.pack_dataset``'s column) and/or its ``position_ids`` (0 at each
    document's first token, then up by 1; what HF ``DataCollatorWithFlattening`` and TRL's padding-free
    collator write). Either may be ``None``; given both, they must describe the same documents.

    Example: ``seq_lengths [3, 2]`` and ``position_ids [0, 1, 2, 0, 1]`` both give ``[0, 3]``.

    Raises:
        DataError: a length that is not a whole number >= 0, lengths that do not add up to ``n``, positions
            that do not start at 0 or do not count up by 1 within a document, or the two columns disagreeing.
    """
    starts = None
    if lengths is not None:
        lengths = _flat(lengths)
        bad = next((x for x in lengths if not _whole(x) or x < 0), None)
        if bad is not None:
            raise DataError(
                f"field {SEQ_LENGTHS!r} holds {bad!r} in {_shown(lengths)}: the lengths of the row's "
                "documents are whole numbers >= 0"
            )
        if sum(lengths) != n:
            raise DataError(
                f"field {SEQ_LENGTHS!r} holds {_shown(lengths)}, which add up to {sum(lengths)} tokens, but "
                f"the row has {n} input_ids; they are the lengths of the row's documents, in order "
                "(trl.pack_dataset's column), and must add up to its input_ids"
            )
        starts, at = [], 0
        for x in lengths:
            if x:
                starts.append(at)
            at += x
    if positions is not None:
        positions = _flat(positions)
        for k, x in enumerate(positions):
            previous = positions[k - 1] if k else None
            if not _whole(x) or (x != 0 and x != (previous if previous is not None else -1) + 1):
                after = f"after {previous}" if previous is not None else "first"
                raise DataError(
                    f"field 'position_ids' holds {x!r} at position {k} ({after}): a row's positions start at "
                    "0 at each document's first token and count up by 1 within it"
                )
        given = [k for k, x in enumerate(positions) if x == 0]
        if starts is not None and given != starts:
            raise DataError(
                f"fields {SEQ_LENGTHS!r} and 'position_ids' disagree: the lengths start documents at "
                f"{_shown(starts)}, the positions restart at 0 at {_shown(given)}"
            )
        starts = given
    return starts or []


def _shown(values: list) -> str:
    return str(values) if len(values) <= 8 else f"[{', '.join(map(str, values[:8]))}, ...] ({len(values)})"


def _cut_lengths(lengths: list[int], n: int) -> list[int]:
    """``seq_lengths`` of a row cut to its first ``n`` tokens: the documents past the cut are gone, the one it
    falls in is shortened."""
    out, left = [], n
    for x in lengths:
        if left <= 0:
            break
        out.append(min(x, left))
        left -= x
    return out


def _flat(x: Any) -> list:
    """A token row as a flat list: ``(n,)`` stays, ``(1, n)`` (a ``return_tensors`` leftover) becomes
    ``(n,)``."""
    if hasattr(x, "tolist"):
        x = x.tolist()
    x = list(x)
    while len(x) == 1 and isinstance(x[0], (list, tuple)):
        x = list(x[0])
    return x


def _check_token_values(key: str, row: list, allowed_negative: int | None = None) -> None:
    """Token ids are whole numbers >= 0 (labels may also be -100): a float id would be truncated by ``torch``
    without a word, a negative one is an ``IndexError`` inside the model."""
    for value in row:
        if isinstance(value, float) and not value.is_integer():
            raise DataError(f"field {key!r} holds {value!r}, not a whole token id; token ids are integers")
        if (
            isinstance(value, (int, float))
            and not isinstance(value, bool)
            and value < 0
            and value != allowed_negative
        ):
            extra = (
                " (the only negative label allowed is -100: not trained on)"
                if allowed_negative is not None
                else ""
            )
            raise DataError(f"field {key!r} holds the negative token id {value!r}{extra}")


def _token_row(x: Any) -> Any:
    # a scalar label (sequence classification) is one class per row, not a token row
    return x if x is None or isinstance(x, int) else _flat(x)


def truncate_tokenized(
    batch: dict[str, list], tokenizer: Any, max_length: int | None, drop_padding: bool = False
) -> dict[str, list]:
    """``tokenized``: rows that already hold ``input_ids`` (optional
    ``attention_mask``/``labels``/``position_ids``).

    Padding (``attention_mask`` 0) is never a target: without given labels, labels are ``input_ids`` with -100
    where the mask is 0 (what ``DataCollatorForLanguageModeling(mlm=False)`` gives when the pad id marks only
    padding; it compares ids with the pad id, so with ``pad = eos`` it also masks real EOS tokens, which we
    keep); given labels on padding are set to -100 and counted (``padding_masked``). ``drop_padding`` (packed
    and padding-free rows, which cannot hold padding) removes the padding positions from every token column
    first (``padding_removed``). Then each row is truncated to ``max_length`` tokens.

    Rows that carry several documents, with ``seq_lengths`` (``trl.pack_dataset``'s rows) or ``position_ids``
    restarting at 0, keep them apart (:func:`_documents_apart`): both columns are checked row by row
    (:func:`document_starts`), ``seq_lengths`` is kept (cut with the row: the documents past ``max_length``
    are gone, the one the cut falls in shortened), and each document's first label is -100.

    Example: ``input_ids [4, 5, 0]``, ``attention_mask [1, 1, 0]`` give ``labels [4, 5, -100]``; with
    ``drop_padding``, ``input_ids [4, 5]``, ``labels [4, 5]``.

    Raises:
        DataError: a token id that is not a whole number >= 0 (a label may be -100), a row without ``labels``
            when other rows have them, an ``attention_mask``, ``labels`` or ``position_ids`` row of another
            length than ``input_ids``, or documents that do not fit the row (:func:`document_starts`).
    """
    ids = [_flat(x) for x in batch["input_ids"]]
    for row in ids:
        _check_token_values("input_ids", row)
    if "labels" in batch:
        for row in batch["labels"]:
            if row is None:
                raise DataError(
                    "field 'labels' is missing on this row while other rows have it; give every row its "
                    "labels (-100 where nothing is trained on), or drop the field from every row (then every "
                    "token is a target)"
                )
            if not isinstance(row, int):
                _check_token_values("labels", _flat(row), allowed_negative=-100)
    columns = {
        key: [_token_row(x) for x in batch[key]]
        for key in ("attention_mask", "labels", "position_ids")
        if key in batch
    }
    for key, rows in columns.items():
        for row, row_ids in zip(rows, ids):
            if isinstance(row, list) and len(row) != len(row_ids):
                raise DataError(
                    f"field {key!r} has {len(row)} positions but 'input_ids' has {len(row_ids)}; "
                    "they must be the same length"
                )
    masks = columns.get("attention_mask")
    class_label = next((k for k in ("label", "label_ids") if k in batch), None)
    if masks is not None and "labels" not in columns and class_label is None:
        columns["labels"] = [
            [t if m else IGNORE_INDEX for t, m in zip(row, mask)] for row, mask in zip(ids, masks)
        ]
    if class_label is None and any(k in batch for k in DOCUMENT_COLUMNS):
        columns = _documents_apart(batch, ids, columns)
    out: dict[str, list] = {"input_ids": [], **{k: [] for k in columns}, "truncated": [], "untrainable": []}
    if masks is not None and "labels" in batch:
        out["padding_masked"] = []
    if masks is not None and drop_padding:
        out["padding_removed"] = []
    for i, row_ids in enumerate(ids):
        row = {"input_ids": row_ids, **{k: rows[i] for k, rows in columns.items()}}
        mask = row.get("attention_mask")
        labels = row.get("labels")
        padded = isinstance(mask, list) and 0 in mask
        if "padding_masked" in out:
            on_pad = (
                [m == 0 and t != IGNORE_INDEX for t, m in zip(labels, mask)]
                if padded and isinstance(labels, list)
                else []
            )
            out["padding_masked"].append(sum(on_pad))
            if any(on_pad):
                row["labels"] = [IGNORE_INDEX if p else t for t, p in zip(labels, on_pad)]
        if "padding_removed" in out:
            out["padding_removed"].append(mask.count(0) if padded else 0)
            if padded:
                row = {
                    k: [x for x, m in zip(v, mask) if m] if isinstance(v, list) else v for k, v in row.items()
                }
        full = row
        if max_length is not None:
            row = {k: v[:max_length] if isinstance(v, list) else v for k, v in row.items()}
            if SEQ_LENGTHS in row:
                row[SEQ_LENGTHS] = _cut_lengths(full[SEQ_LENGTHS], len(row["input_ids"]))
        for key, value in row.items():
            out[key].append(value)
        out["truncated"].append(len(full["input_ids"]) - len(row["input_ids"]))
        out["untrainable"].append(_tokenized_cause(row_ids, mask, row, full, batch, class_label, i))
    return out


def _documents_apart(batch: dict[str, list], ids: list[list], columns: dict[str, list]) -> dict[str, list]:
    """Rows that carry several documents (``seq_lengths`` and/or ``position_ids``, :func:`document_starts`):
    checked row by row, ``seq_lengths`` kept as a token column of its own, and ``labels`` (a copy of
    ``input_ids`` when not given) -100 at each document's first token, which has nothing of its document
    before it (TRL's padding-free collator sets the same -100s, where ``position_ids == 0``).

    Raises:
        DataError: see :func:`document_starts`; padding (``attention_mask`` 0) in such a row.
    """
    lengths = batch.get(SEQ_LENGTHS)
    positions = columns.get("position_ids")
    masks = columns.get("attention_mask")
    labels = columns.get("labels") or [list(row) for row in ids]
    for i, row_ids in enumerate(ids):
        row_lengths = lengths[i] if lengths is not None else None
        if lengths is not None and row_lengths is None:
            raise DataError(
                f"field {SEQ_LENGTHS!r} is missing on this row while other rows have it; give every row the "
                "lengths of its documents (one document: [len(input_ids)])"
            )
        if masks is not None and isinstance(masks[i], list) and 0 in masks[i]:
            raise DataError(
                "field 'attention_mask' has zeros in a row whose documents are given by "
                f"{SEQ_LENGTHS!r} / 'position_ids': such a row holds documents side by side and no padding; "
                "remove the padding positions from its columns"
            )
        starts = document_starts(row_lengths, positions[i] if positions is not None else None, len(row_ids))
        row_labels = list(labels[i])
        for k in starts:
            row_labels[k] = IGNORE_INDEX
        labels[i] = row_labels
    columns = {**columns, "labels": labels}
    if lengths is not None:
        columns[SEQ_LENGTHS] = [_flat(x) for x in lengths]
    return columns


def _tokenized_cause(
    raw_ids: list, mask: Any, row: dict, full: dict, batch: dict, class_label: Any, i: int
) -> str:
    if not raw_ids:
        return EMPTY
    if isinstance(mask, list) and not any(mask):
        return ALL_PADDING
    labels = row.get("labels")
    if class_label is not None or isinstance(labels, int):
        value = batch[class_label][i] if class_label is not None else labels
        return "" if has_target(value, causal=False) else CLASS_IGNORED
    given = "labels" in batch
    return target_cause(
        row["input_ids"] if labels is None else labels,
        full["input_ids"] if labels is None else full["labels"],
        GIVEN if given else ONE_TOKEN,
    )


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
