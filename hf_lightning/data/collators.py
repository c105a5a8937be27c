"""Collators: turn a list of tokenized examples into a padded batch (:func:`collator_for` picks one).

Ours rather than HF's ``DataCollatorForSeq2Seq`` / ``DataCollatorWithPadding``: labels are padded by position
with ``-100`` whatever their key, and a key that cannot be batched is named, not a ``ValueError`` from the
tokenizer's ``pad``. Padding-free, packed and packed-per-batch rows: :mod:`~hf_lightning.data.padding_free`;
packing: :mod:`~hf_lightning.data.packing`.

The dataset side decides which positions are trained on (labels with ``-100``); a collator only pads. This is
the split litgpt uses (``litgpt/data/base.py``): masking in the dataset, padding in the collate function.
Padding is on the right. A key a collator cannot carry into the batch (a string, a ragged list) is
announced once at WARNING and left out, never dropped silently.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from hf_lightning.batch import IGNORE_INDEX
from hf_lightning.data.model_facts import is_sequence_classifier
from hf_lightning.data.packing import UNPACKED, RowPlan
from hf_lightning.errors import DataError

log = logging.getLogger(__name__)


def as_row(value: Any) -> torch.Tensor:
    """A token row as a 1-D int64 tensor; ``(1, n)`` rows (a ``return_tensors`` leftover) become ``(n,)``.

    Raises:
        DataError: a value that is not a (nested) list of integers, e.g. a string or a ragged list.
    """
    # torch would read "" as an empty sequence ([""] an empty row) and size [[], [0]] by its first row ((2,
    # 0), dropping the 0): both would lose or invent tokens silently
    if _holds_text(value):
        raise DataError(f"a token row must be a list of integer ids, got {value!r:.80} (text)")
    nested = isinstance(value, (list, tuple)) and value and all(isinstance(v, (list, tuple)) for v in value)
    if nested and len({len(v) for v in value}) > 1:
        raise DataError(f"a token row must be a list of integer ids, got {value!r:.80} (ragged nested lists)")
    try:
        return torch.as_tensor(value, dtype=torch.long).reshape(-1)
    except (TypeError, ValueError, RuntimeError) as err:
        raise DataError(f"a token row must be a list of integer ids, got {value!r:.80} ({err})") from err


def _holds_text(value: Any) -> bool:
    return isinstance(value, str) or (isinstance(value, (list, tuple)) and any(_holds_text(v) for v in value))


def round_up(length: int, multiple: int | None) -> int:
    return (length + multiple - 1) // multiple * multiple if multiple else length


def _is_flat_int_list(value: Any) -> bool:
    return type(value) is list and (not value or type(value[0]) is int)


def flatten_rows(values: Sequence[Any]) -> tuple[torch.Tensor, list[int]]:
    """Concatenate token rows into one 1-D int64 tensor; also return each row's length.

    Rows are Python lists of ints (what ``datasets`` returns: one ``torch.tensor`` call for the whole batch,
    no tensor per row) or anything :func:`as_row` takes.
    """
    if all(_is_flat_int_list(v) for v in values):
        return torch.tensor(list(itertools.chain.from_iterable(values)), dtype=torch.long), [
            len(v) for v in values
        ]
    rows = [as_row(v) for v in values]
    flat = torch.cat(rows) if rows else torch.zeros(0, dtype=torch.long)
    return flat, [r.numel() for r in rows]


def row_mask(lengths: Sequence[int], length: int) -> torch.Tensor:
    """``(len(lengths), length)`` bool, ``True`` on the first ``lengths[i]`` positions of row ``i``."""
    return torch.arange(length) < torch.tensor(lengths, dtype=torch.long).unsqueeze(1)


def pad_flat(flat: torch.Tensor, mask: torch.Tensor, value: int) -> torch.Tensor:
    """Scatter the concatenated rows ``flat`` into a ``mask``-shaped int64 tensor filled with ``value``.

    Boolean-mask assignment fills row-major order, which is the concatenation order: one op per batch
    instead of one slice assignment per row.
    """
    out = torch.full(mask.shape, value, dtype=torch.long)
    out[mask] = flat
    return out


def pad_rows(rows: Sequence[torch.Tensor], length: int, value: int) -> torch.Tensor:
    """Right-pad 1-D rows into a ``(len(rows), length)`` int64 tensor filled with ``value``."""
    flat, lengths = flatten_rows(rows)
    return pad_flat(flat, row_mask(lengths, length), value)


class _ExtraKeys:
    """Stacks the keys a collator does not handle itself, or announces once that it leaves them out."""

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.announced: set[str] = set()

    def add(
        self, batch: dict[str, Any], examples: Sequence[Mapping[str, Any]], handled: Sequence[str]
    ) -> None:
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
                        "column or set data.remove_unused_columns=true",
                        self.owner,
                        key,
                        values[0],
                    )


def checked_column(
    examples: Sequence[Mapping[str, Any]], key: str, lengths: Sequence[int]
) -> torch.Tensor | None:
    """The concatenated ``key`` rows, ``None`` when no example has the key; every row must match ``lengths``.

    Examples without the key get what it would default to: ``labels`` a copy of ``input_ids``,
    ``position_ids`` ``0..n-1``, anything else (``attention_mask``) all ones.

    Raises:
        DataError: an example whose ``key`` row has a different length than its ``input_ids``.
    """
    values = [ex.get(key) for ex in examples]
    if all(v is None for v in values):
        return None
    if any(v is None for v in values):
        fill = {"labels": lambda ex, n: ex["input_ids"], "position_ids": lambda ex, n: list(range(n))}
        default = fill.get(key, lambda ex, n: [1] * n)
        values = [v if v is not None else default(ex, n) for v, ex, n in zip(values, examples, lengths)]
    flat, got = flatten_rows(values)
    if got != list(lengths):
        i = next(i for i, (a, b) in enumerate(zip(got, lengths)) if a != b)
        raise DataError(f"example {i}: {key!r} has {got[i]} positions but 'input_ids' has {lengths[i]}")
    return flat


def _input_ids(examples: Sequence[Mapping[str, Any]], owner: str) -> tuple[torch.Tensor, list[int]]:
    """The concatenated ``input_ids`` and the row lengths.

    Raises:
        ValueError: an empty list or an example without ``input_ids``.
    """
    if not examples:
        raise DataError(f"{owner}: cannot collate an empty list of examples")
    for i, ex in enumerate(examples):
        if "input_ids" not in ex:
            raise DataError(f"example {i} has no 'input_ids' (keys: {sorted(ex)})")
    return flatten_rows([ex["input_ids"] for ex in examples])


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
        ValueError: an empty list, an example without ``input_ids``, or ``labels`` of a different length.
    """

    def __init__(
        self, pad_token_id: int, pad_to_multiple_of: int | None = None, label_pad_token_id: int = IGNORE_INDEX
    ) -> None:
        self.pad_token_id = int(pad_token_id)
        self.pad_to_multiple_of = pad_to_multiple_of
        self.label_pad_token_id = label_pad_token_id
        self._extra = _ExtraKeys(type(self).__name__)

    def __call__(self, examples: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        ids, lengths = _input_ids(examples, type(self).__name__)
        labels = checked_column(examples, "labels", lengths)
        attention = checked_column(examples, "attention_mask", lengths)
        mask = row_mask(lengths, round_up(max(lengths), self.pad_to_multiple_of))
        batch = {
            "input_ids": pad_flat(ids, mask, self.pad_token_id),
            "attention_mask": mask.long() if attention is None else pad_flat(attention, mask, 0),
            "labels": pad_flat(ids if labels is None else labels, mask, self.label_pad_token_id),
        }
        self._extra.add(batch, examples, ())
        return batch


class ClassificationCollator:
    """Dynamic padding for sequence classification; ``label`` / ``label_ids`` become ``labels``.

    Matches ``transformers.DataCollatorWithPadding`` (right padding): ``input_ids`` padded with the pad id,
    ``attention_mask`` and ``token_type_ids`` with 0, ``labels`` a ``(B,)`` tensor, int64 for class ids and
    float32 for regression targets (as HF's ``default_data_collator``); multi-label rows give ``(B, C)``.

    Raises:
        ValueError: an empty list or an example without ``input_ids``.
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
            first = (
                values[0].item()
                if isinstance(values[0], torch.Tensor) and values[0].dim() == 0
                else values[0]
            )
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
        ``{"input_ids": (B, S), "attention_mask": (B, S), "labels": (B, T)[, "decoder_input_ids": (B, T)]}``.
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
        masks = [
            as_row(ex["attention_mask"]) if "attention_mask" in ex else torch.ones_like(r)
            for ex, r in zip(examples, ids)
        ]
        length = round_up(max(r.numel() for r in ids), self.pad_to_multiple_of)
        batch = {
            "input_ids": pad_rows(ids, length, self.pad_token_id),
            "attention_mask": pad_rows(masks, length, 0),
        }
        if "labels" in examples[0]:
            labels = [as_row(ex["labels"]) for ex in examples]
            label_length = round_up(max(r.numel() for r in labels), self.pad_to_multiple_of)
            batch["labels"] = pad_rows(labels, label_length, self.label_pad_token_id)
            prepare = getattr(self.model, "prepare_decoder_input_ids_from_labels", None)
            if prepare is not None and "decoder_input_ids" not in examples[0]:
                batch["decoder_input_ids"] = prepare(labels=batch["labels"])
        self._extra.add(batch, examples, ())
        return batch


def collator_for(
    fmt: str,
    pad_token_id: int,
    model: Any = None,
    plan: RowPlan = UNPACKED,
    pad_to_multiple_of: int | None = None,
) -> Any:
    """The collator of a data format: classification, seq2seq, padding-free, packed rows, else padding.

    ``plan``: what the rows are (:class:`~hf_lightning.data.packing.RowPlan`).
    """
    # here, not at the top: padding_free.py imports this module's row helpers
    from hf_lightning.data.padding_free import PackedCollator, PaddingFreeCollator

    # pre-tokenized rows for a sequence classifier carry one class per row, not token labels
    if fmt == "classification" or (fmt == "tokenized" and is_sequence_classifier(model)):
        return ClassificationCollator(pad_token_id, pad_to_multiple_of)
    if fmt == "seq2seq":
        return Seq2SeqCollator(pad_token_id, model=model, pad_to_multiple_of=pad_to_multiple_of)
    if plan.padding_free:
        return PaddingFreeCollator()
    if plan.pack is not None:
        return PackedCollator(pad_token_id, pad_to_multiple_of)
    return PaddingCollator(pad_token_id, pad_to_multiple_of=pad_to_multiple_of)
