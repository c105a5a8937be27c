"""Collators: turn a list of tokenized examples into a padded batch.

The dataset side decides which positions are trained on (labels with ``-100``); a collator only pads. This is
the split litgpt uses (``litgpt/data/base.py``): masking in the dataset, padding in the collate function.
Padding is on the right. A key a collator cannot carry into the batch (a string, a ragged list) is
announced once at WARNING and left out, never dropped silently.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from hf_lightning.errors import DataError
from hf_lightning.module.loss import IGNORE_INDEX

log = logging.getLogger(__name__)


def as_row(value: Any) -> torch.Tensor:
    """A token row as a 1-D int64 tensor; ``(1, n)`` rows (a ``return_tensors`` leftover) become ``(n,)``.

    Raises:
        DataError: a value that is not a (nested) list of integers, e.g. a string or a ragged list.
    """
    try:
        return torch.as_tensor(value, dtype=torch.long).reshape(-1)
    except (TypeError, ValueError, RuntimeError) as err:
        raise DataError(f"a token row must be a list of integer ids, got {value!r:.80} ({err})") from err


def round_up(length: int, multiple: int | None) -> int:
    return (length + multiple - 1) // multiple * multiple if multiple else length


def pad_rows(rows: Sequence[torch.Tensor], length: int, value: int) -> torch.Tensor:
    """Right-pad 1-D rows into a ``(len(rows), length)`` int64 tensor filled with ``value``."""
    out = torch.full((len(rows), length), value, dtype=torch.long)
    for i, row in enumerate(rows):
        out[i, : row.numel()] = row
    return out


class _ExtraKeys:
    """Stacks the keys a collator does not handle itself, or announces once that it leaves them out."""

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.announced: set[str] = set()

    def add(self, batch: dict[str, Any], examples: Sequence[Mapping[str, Any]], handled: Sequence[str]) -> None:
        for key in examples[0]:
            if key in batch or key in handled:
                continue
            values = [ex.get(key) for ex in examples]
            try:
                batch[key] = torch.as_tensor(values)
            except (TypeError, ValueError, RuntimeError):
                if key not in self.announced:
                    self.announced.add(key)
                    log.warning(
                        "%s cannot batch key %r (values like %r): it is left out of every batch; remove the "
                        "column or set data.remove_unused_columns=true", self.owner, key, values[0],
                    )


def _rows(examples: Sequence[Mapping[str, Any]], owner: str) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """``(input_ids, attention_mask, labels)`` per example; labels default to a copy of ``input_ids``."""
    if not examples:
        raise DataError(f"{owner}: cannot collate an empty list of examples")
    rows = []
    for i, ex in enumerate(examples):
        if "input_ids" not in ex:
            raise DataError(f"example {i} has no 'input_ids' (keys: {sorted(ex)})")
        ids = as_row(ex["input_ids"])
        labels = ex.get("labels")
        labels = ids.clone() if labels is None else as_row(labels)
        if labels.numel() != ids.numel():
            raise DataError(f"example {i}: 'labels' has {labels.numel()} positions but 'input_ids' has {ids.numel()}")
        mask = ex.get("attention_mask")
        mask = torch.ones_like(ids) if mask is None else as_row(mask)
        rows.append((ids, mask, labels))
    return rows


class PaddingCollator:
    """Right-pads ``input_ids``, ``attention_mask`` and ``labels`` to the longest example of the batch.

    Matches ``transformers.DataCollatorForLanguageModeling(mlm=False)`` for examples without labels, with
    one deliberate difference: labels are padded with ``-100`` *by position*, never by comparing token ids
    with the pad id. With ``pad_token_id == eos_token_id`` HF's collator masks every real EOS as well; here
    pad = eos = 2, rows ``[10, 11, 2]`` and ``[12, 2]`` give labels ``[[10, 11, 2], [12, 2, -100]]``.

    Args:
        pad_token_id: id written into padded ``input_ids`` positions.
        pad_to_multiple_of: round the padded length up to a multiple of this (tensor-core friendly).
        label_pad_token_id: value for padded label positions (HF's ``-100``).

    Input: a list of mappings with ``input_ids`` (list[int] or int tensor), optional ``attention_mask``
    and ``labels`` (same length; missing labels are copied from ``input_ids``, user labels are kept). Other
    keys are stacked when they can be; the rest are announced once and left out.

    Returns:
        ``{"input_ids": (B, L) int64, "attention_mask": (B, L) int64, "labels": (B, L) int64, ...}``.

    Raises:
        DataError (a ``ValueError``): an empty list, an example without ``input_ids``, ``labels`` of a different
            length, or a token row that is not a list of integers.
    """

    def __init__(
        self, pad_token_id: int, pad_to_multiple_of: int | None = None, label_pad_token_id: int = IGNORE_INDEX
    ) -> None:
        self.pad_token_id = int(pad_token_id)
        self.pad_to_multiple_of = pad_to_multiple_of
        self.label_pad_token_id = label_pad_token_id
        self._extra = _ExtraKeys(type(self).__name__)

    def __call__(self, examples: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        rows = _rows(examples, type(self).__name__)
        length = round_up(max(r[0].numel() for r in rows), self.pad_to_multiple_of)
        batch = {
            "input_ids": pad_rows([r[0] for r in rows], length, self.pad_token_id),
            "attention_mask": pad_rows([r[1] for r in rows], length, 0),
            "labels": pad_rows([r[2] for r in rows], length, self.label_pad_token_id),
        }
        self._extra.add(batch, examples, ())
        return batch


class ClassificationCollator:
    """Dynamic padding for sequence classification; ``label`` / ``label_ids`` become ``labels``.

    Matches ``transformers.DataCollatorWithPadding`` (right padding): ``input_ids`` padded with the pad id,
    ``attention_mask`` and ``token_type_ids`` with 0, ``labels`` a ``(B,)`` tensor, int64 for class ids and
    float32 for regression targets (as HF's ``default_data_collator``); multi-label rows give ``(B, C)``.

    Args:
        pad_token_id: id written into padded ``input_ids`` positions.
        pad_to_multiple_of: round the padded length up to a multiple of this.

    Returns:
        ``{"input_ids": (B, L) int64, "attention_mask": (B, L) int64[, "token_type_ids": (B, L) int64],
        "labels": (B,) int64 or float32}``; ``labels`` is absent when the examples carry none.

    Raises:
        DataError (a ``ValueError``): an empty list or an example without ``input_ids``.
    """

    def __init__(self, pad_token_id: int, pad_to_multiple_of: int | None = None) -> None:
        self.pad_token_id = int(pad_token_id)
        self.pad_to_multiple_of = pad_to_multiple_of
        self._extra = _ExtraKeys(type(self).__name__)

    def __call__(self, examples: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        if not examples:
            raise DataError("ClassificationCollator: cannot collate an empty list of examples")
        for i, ex in enumerate(examples):
            if "input_ids" not in ex:
                raise DataError(f"example {i} has no 'input_ids' (keys: {sorted(ex)})")
        ids = [as_row(ex["input_ids"]) for ex in examples]
        length = round_up(max(r.numel() for r in ids), self.pad_to_multiple_of)
        batch = {"input_ids": pad_rows(ids, length, self.pad_token_id)}
        for key in ("attention_mask", "token_type_ids"):
            if key in examples[0]:
                batch[key] = pad_rows([as_row(ex[key]) for ex in examples], length, 0)
        if "attention_mask" not in batch:
            batch["attention_mask"] = pad_rows([torch.ones_like(r) for r in ids], length, 0)
        label_key = next((k for k in ("label", "label_ids", "labels") if k in examples[0]), None)
        if label_key is not None:
            values = [ex[label_key] for ex in examples]
            first = values[0].item() if isinstance(values[0], torch.Tensor) and values[0].dim() == 0 else values[0]
            dtype = torch.long if isinstance(first, int) else torch.float32
            batch["labels"] = torch.as_tensor(values, dtype=dtype)
        self._extra.add(batch, examples, ("label", "label_ids", "labels"))
        return batch


class Seq2SeqCollator:
    """Encoder-decoder batches, as ``transformers.DataCollatorForSeq2Seq`` builds them.

    ``input_ids`` padded with the pad id, ``attention_mask`` with 0, ``labels`` with ``label_pad_token_id``
    (-100) to the longest label; ``decoder_input_ids`` made by ``model.prepare_decoder_input_ids_from_labels``
    when the model has it (the labels shifted right behind the decoder start token, exactly as the model
    would do itself).

    Args:
        pad_token_id: id for padded input positions.
        model: the seq2seq model (optional), for its ``prepare_decoder_input_ids_from_labels``.
        label_pad_token_id / pad_to_multiple_of: as HF.

    Returns:
        ``{"input_ids": (B, S), "attention_mask": (B, S), "labels": (B, T)[, "decoder_input_ids": (B, T)]}``,
        all int64; ``S`` the longest source, ``T`` the longest target of the batch.

    Raises:
        ValueError: an empty list or an example without ``input_ids``.
    """

    def __init__(
        self,
        pad_token_id: int,
        model: Any = None,
        label_pad_token_id: int = IGNORE_INDEX,
        pad_to_multiple_of: int | None = None,
    ) -> None:
        self.pad_token_id = int(pad_token_id)
        self.model = model
        self.label_pad_token_id = label_pad_token_id
        self.pad_to_multiple_of = pad_to_multiple_of
        self._extra = _ExtraKeys(type(self).__name__)

    def __call__(self, examples: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        if not examples:
            raise DataError("Seq2SeqCollator: cannot collate an empty list of examples")
        for i, ex in enumerate(examples):
            if "input_ids" not in ex:
                raise DataError(f"example {i} has no 'input_ids' (keys: {sorted(ex)})")
        ids = [as_row(ex["input_ids"]) for ex in examples]
        masks = [as_row(ex["attention_mask"]) if "attention_mask" in ex else torch.ones_like(r) for ex, r in zip(examples, ids)]
        length = round_up(max(r.numel() for r in ids), self.pad_to_multiple_of)
        batch = {"input_ids": pad_rows(ids, length, self.pad_token_id), "attention_mask": pad_rows(masks, length, 0)}
        if "labels" in examples[0]:
            labels = [as_row(ex["labels"]) for ex in examples]
            label_length = round_up(max(r.numel() for r in labels), self.pad_to_multiple_of)
            batch["labels"] = pad_rows(labels, label_length, self.label_pad_token_id)
            prepare = getattr(self.model, "prepare_decoder_input_ids_from_labels", None)
            if prepare is not None and "decoder_input_ids" not in examples[0]:
                batch["decoder_input_ids"] = prepare(labels=batch["labels"])
        self._extra.add(batch, examples, ())
        return batch
