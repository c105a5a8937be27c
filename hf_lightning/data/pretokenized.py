"""Pre-tokenized rows (the ``tokenized`` format): checked token values, truncated, and counted like the
others.

Rows arrive with ``input_ids`` (and maybe ``attention_mask`` / ``labels``), possibly as ``(1, n)`` leftovers
of ``return_tensors``; positions with ``attention_mask == 0`` never become targets (HF
``DataCollatorForLanguageModeling``), and a row that keeps no target is reported as untrainable.
"""

from __future__ import annotations

from typing import Any

from hf_lightning.core.batch import IGNORE_INDEX
from hf_lightning.core.errors import DataError
from hf_lightning.data.row_report import (
    ALL_PADDING,
    CLASS_IGNORED,
    EMPTY,
    GIVEN,
    ONE_TOKEN,
    has_target,
    target_cause,
)


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

    Example: ``input_ids [4, 5, 0]``, ``attention_mask [1, 1, 0]`` give ``labels [4, 5, -100]``; with
    ``drop_padding``, ``input_ids [4, 5]``, ``labels [4, 5]``.

    Raises:
        DataError: a token id that is not a whole number >= 0 (a label may be -100), a row without ``labels``
            when other rows have them, or an ``attention_mask``, ``labels`` or ``position_ids`` row of another
            length than ``input_ids``.
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
        for key, value in row.items():
            out[key].append(value)
        out["truncated"].append(len(full["input_ids"]) - len(row["input_ids"]))
        out["untrainable"].append(_tokenized_cause(row_ids, mask, row, full, batch, class_label, i))
    return out


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
