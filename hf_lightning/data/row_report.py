"""What tokenization did to each row, and the log lines that count it per split.

Every format function of :mod:`~hf_lightning.data.formats` returns, beside the token columns, one value per
row in each of these columns (the caller counts them with :class:`RowReport` and removes them):

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
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hf_lightning.core.batch import IGNORE_INDEX

log = logging.getLogger(__name__)

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


def jsonl_lines(path: str, rows: Sequence[int]) -> list[int | None]:
    """The 1-based lines of source rows ``rows`` of a JSON Lines file (blank lines are not rows), in one
    pass."""
    wanted = set(rows)
    found: dict[int, int] = {}
    seen = -1
    with open(path, "rb") as fh:
        for number, raw in enumerate(fh, start=1):
            if raw.strip():
                seen += 1
                if seen in wanted:
                    found[seen] = number
                    if len(found) == len(wanted):
                        break
    return [found.get(r) for r in rows]


class RowReport:
    """Adds up the report columns of one split (or one stream reader) and logs them.

    Args:
        split: the split's name in the log (``train``, ``validation``).
        name_rows: turns row indices into words (see :func:`row_names`).
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
