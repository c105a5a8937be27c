"""Collators: a list of tokenized examples -> one batch of tensors. ``collator_for``
(:mod:`~hf_lightning.data.layout`) picks one.

- :class:`PaddingCollator`: rows padded on the right to the longest, labels with -100 whatever their key.
- :class:`PaddingFreeCollator` (``data.padding_free``): every example of the batch flattened into one row.
- :class:`PackedCollator` (``data.packing``): rows packed with documents before training, padded per batch.
- :class:`BatchPackingCollator` (``data.layout=auto``, "packed per batch"): one batch's documents packed
  into as few rows as fit, at collation.
- :class:`ClassificationCollator` (HF's ``DataCollatorWithPadding``) and :class:`Seq2SeqCollator` (HF's
  ``DataCollatorForSeq2Seq``): sequence classification and encoder-decoder rows.
- :class:`PlaceholderAwareCollator`: marks an evaluation batch that only stands for a rank with no example.

The dataset side decides which positions are trained on (labels with ``-100``); a collator only pads or lays
rows out (litgpt's split, ``litgpt/data/base.py``). A key a collator cannot carry (a string, a ragged list) is
announced once at WARNING and left out, never dropped silently.

Ours rather than HF's: ``DataCollatorWithPadding`` / ``DataCollatorForSeq2Seq`` pad labels under their own
key only and answer a key that cannot be batched with the tokenizer's ``ValueError``. A wrapper of
``DataCollatorWithFlattening`` (our checks of empty, text, ragged and padded rows, then HF's collator) costs
more CPU time per batch than ours (``python scripts/bench_flattening.py`` measures both); HF's collator also
fills positions token by token in Python, ignores an ``attention_mask`` (it would flatten padding) and the
``position_ids`` of packed rows (document boundaries lost). Outputs are equal
(``tests/unit/test_collators.py``).

Documents kept apart by ``position_ids``: ``transformers`` (``masking_utils._preprocess_mask_arguments``)
derives a block-diagonal causal mask from ``position_ids`` (a new sequence wherever the position does not grow
by one) **only when** ``attention_mask`` is ``None`` and there is no KV cache. So these batches carry no
``attention_mask`` and the model runs with ``use_cache=False`` (``HFLightningModule`` passes it); flash
attention reads the same boundaries from ``cu_seq_lens_q/k``. The ``-100`` at each document start keeps the
last token of one document from being trained to predict the first of the next; with it the loss and the
per-document logits equal the padded batch's. ``[10, 11, 12, 13]``, ``[20, 21, 22]``, ``[30, 31]``::

    input_ids     10   11   12   13 | 20   21   22 | 30   31
    position_ids   0    1    2    3 |  0    1    2 |  0    1        boundaries [0, 4, 7, 9]
    labels      -100   11   12   13 |-100  21   22 |-100  31        6 targets

Packed per batch: one flat row of ``T = sum(L_i)`` tokens costs a dense ``(T, T)`` mask under ``sdpa`` /
``eager`` (about ``B`` times the padded rows' attention work). :class:`BatchPackingCollator` puts the batch's
documents, each whole, into rows of the longest one's length ``L`` by best-fit decreasing and pads the rows'
tails (a segment of their own that nothing real attends to). Lengths ``[5, 2, 3, 1]`` make 3 rows, not 4::

    row 0   a0 a1 a2 a3 a4     positions 0 1 2 3 4    labels -100 a1 a2 a3 a4
    row 1   b0 b1 c0 c1 c2     positions 0 1 0 1 2    labels -100 b1 -100 c1 c2
    row 2   d0 pd pd pd pd     positions 0 0 1 2 3    labels -100 -100 -100 -100 -100   (pd: the pad id)

The step holds exactly the padded batch's documents and targets: the same loss and gradient up to float
rounding; unlike ``data.packing``, no document moves to another step.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from hf_lightning.core.batch import IGNORE_INDEX, PLACEHOLDER_KEY
from hf_lightning.core.errors import DataError
from hf_lightning.data.packing import SEQ_LENGTHS, best_fit_decreasing
from hf_lightning.data.sampling import PlaceholderRow

log = logging.getLogger(__name__)

#: the keys a padding-free batch carries (any other is announced once and left out); ``seq_lengths`` becomes
#: ``position_ids``
CARRIED = ("input_ids", "labels", "position_ids", "attention_mask", SEQ_LENGTHS)


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


class ExtraKeys:
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


def positions_column(examples: Sequence[Mapping[str, Any]], lengths: Sequence[int]) -> torch.Tensor | None:
    """The concatenated ``position_ids`` rows, ``None`` when no example has ``position_ids`` or
    ``seq_lengths``.

    A packed row's ``seq_lengths`` (its documents' lengths, TRL's ``pack_dataset`` column) give positions
    restarting at 0 at each document; an example with neither key gets ``0..n-1``.

    Raises:
        DataError: ``seq_lengths`` that are negative or do not add up to the row's ``input_ids``, or
            ``position_ids`` of another length than ``input_ids``.
    """
    if not any(SEQ_LENGTHS in ex for ex in examples):
        return checked_column(examples, "position_ids", lengths)
    rows = []
    for i, (ex, n) in enumerate(zip(examples, lengths)):
        docs = ex.get(SEQ_LENGTHS)
        if docs is None:
            given = ex.get("position_ids")
            rows.append(torch.arange(n) if given is None else checked_column([ex], "position_ids", [n]))
            continue
        docs = as_row(docs)
        if bool((docs < 0).any()) or int(docs.sum()) != n:
            raise DataError(
                f"example {i}: {SEQ_LENGTHS!r} {docs.tolist()[:8]} must be document lengths adding up to "
                f"its {n} 'input_ids'"
            )
        rows.append(torch.arange(n) - torch.repeat_interleave(torch.cumsum(docs, 0) - docs, docs))
    return torch.cat(rows) if rows else torch.zeros(0, dtype=torch.long)


def input_ids_of(examples: Sequence[Mapping[str, Any]], owner: str) -> list[Any]:
    """Each example's ``input_ids``.

    Raises:
        DataError: an empty list (named by ``owner``, the collator) or an example without ``input_ids``.
    """
    if not examples:
        raise DataError(f"{owner}: cannot collate an empty list of examples")
    for i, ex in enumerate(examples):
        if "input_ids" not in ex:
            raise DataError(f"example {i} has no 'input_ids' (keys: {sorted(ex)})")
    return [ex["input_ids"] for ex in examples]


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
        self._extra = ExtraKeys(type(self).__name__)

    def __call__(self, examples: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        ids, lengths = flatten_rows(input_ids_of(examples, type(self).__name__))
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


def sequence_boundaries(position_ids: torch.Tensor) -> torch.Tensor:
    """Start offsets of the sequences in a flattened row plus its length (flash-attention ``cu_seq_lens``).

    Args:
        position_ids: ``(1, T)`` or ``(T,)`` positions that restart at 0 for every sequence.

    Returns:
        ``(n_sequences + 1,)`` int32, e.g. ``[0, 4, 7, 9]`` for positions ``[0,1,2,3,0,1,2,0,1]``.
    """
    pos = position_ids.reshape(-1)
    starts = torch.nonzero(pos == 0).reshape(-1)
    return torch.cat([starts, torch.tensor([pos.numel()])]).to(torch.int32)


class PaddingFreeCollator:
    """Flattens a batch into one row with restarting ``position_ids`` (HF ``DataCollatorWithFlattening``).

    Args:
        label_pad_token_id: the separator written at each sequence start (-100).
        return_flash_attn_kwargs: also return ``cu_seq_lens_q/k`` (int32) and ``max_length_q/k`` (int).

    Input: examples with ``input_ids`` and optional ``labels`` (copied from ``input_ids`` if missing) and
    ``position_ids`` or ``seq_lengths`` (a packed row brings its documents', restarting at each document;
    otherwise ``0..n-1``; see :func:`positions_column`).
    ``attention_mask`` is consumed (it must be all ones: flattening is the padding removal). Other keys are
    announced once and left out: there is no per-example axis to carry them on.

    Returns:
        ``{"input_ids": (1, T), "labels": (1, T), "position_ids": (1, T)}`` int64, ``T`` = total tokens.

    Raises:
        ValueError: an empty batch, an example without ``input_ids``, mismatched lengths, or an
            ``attention_mask`` with zeros.
    """

    def __init__(
        self, label_pad_token_id: int = IGNORE_INDEX, return_flash_attn_kwargs: bool = False
    ) -> None:
        self.label_pad_token_id = label_pad_token_id
        self.return_flash_attn_kwargs = return_flash_attn_kwargs
        self._announced: set[str] = set()

    def __call__(self, examples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        # whole-batch tensor ops on the concatenated rows (no per-example tensors)
        ids, lengths = flatten_rows(input_ids_of(examples, "PaddingFreeCollator"))
        if not ids.numel():
            raise DataError("PaddingFreeCollator: every example of the batch is empty")
        labels = checked_column(examples, "labels", lengths)
        labels = ids.clone() if labels is None else labels
        positions = positions_column(examples, lengths)
        starts = torch.tensor([0, *itertools.accumulate(lengths)][:-1], dtype=torch.long)
        sizes = torch.tensor(lengths, dtype=torch.long)
        if positions is None:
            positions = torch.arange(ids.numel()) - torch.repeat_interleave(starts, sizes)
        else:
            nonempty = sizes > 0
            first = positions[starts[nonempty]]
            if bool((first != 0).any()):
                i = int(torch.nonzero(nonempty).reshape(-1)[int(torch.nonzero(first != 0)[0])])
                row = positions[starts[i] : starts[i] + lengths[i]]
                raise DataError(f"example {i}: position_ids must start at 0, got {row[:4].tolist()}...")
        mask = checked_column(examples, "attention_mask", lengths)
        if mask is not None and not bool(mask.all()):
            row_of = torch.repeat_interleave(torch.arange(len(lengths)), sizes)
            i = int(row_of[int(torch.nonzero(mask == 0)[0])])
            raise DataError(f"example {i}: attention_mask has zeros; padding-free batches take unpadded rows")
        labels[positions == 0] = (
            self.label_pad_token_id
        )  # each sequence start (every document of a packed row)
        extra = set().union(*examples) - set(CARRIED) - self._announced
        for key in sorted(extra):
            self._announced.add(key)
            log.warning("PaddingFreeCollator leaves key %r out of the flattened batch", key)
        batch: dict[str, Any] = {
            "input_ids": ids.unsqueeze(0),
            "labels": labels.unsqueeze(0),
            "position_ids": positions.unsqueeze(0),
        }
        if self.return_flash_attn_kwargs:
            cu = sequence_boundaries(batch["position_ids"])
            batch["cu_seq_lens_q"] = batch["cu_seq_lens_k"] = cu
            batch["max_length_q"] = batch["max_length_k"] = int((cu[1:] - cu[:-1]).max())
        return batch


class PackedCollator:
    """Pads packed rows into ``(B, L)`` without an ``attention_mask``: ``position_ids`` isolate documents.

    Input: rows with ``input_ids``, ``labels`` and ``seq_lengths`` or ``position_ids`` (see
    :func:`positions_column`).

    The padding tail of a row gets ``position_ids`` ``0, 1, ...`` (a segment of its own, which nothing real
    attends to) and labels -100. With no ``attention_mask`` and no KV cache, ``transformers`` builds the
    block-diagonal causal mask from ``position_ids`` (see the module docstring). Unlike
    flattening the whole batch into one row, attention stays per row: ``B * L**2`` instead of ``(B * L)**2``.

    Returns:
        ``{"input_ids", "labels", "position_ids"}``, int64 ``(B, L)``.
    """

    def __init__(self, pad_token_id: int, pad_to_multiple_of: int | None = None) -> None:
        self.pad_token_id = int(pad_token_id)
        self.pad_to_multiple_of = pad_to_multiple_of

    def __call__(self, examples: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        ids, lengths = flatten_rows([ex["input_ids"] for ex in examples])
        labels, _ = flatten_rows([ex["labels"] for ex in examples])
        positions = positions_column(examples, lengths)
        if positions is None:
            positions = torch.cat([torch.arange(n) for n in lengths])
        length = round_up(max(lengths), self.pad_to_multiple_of)
        mask = row_mask(lengths, length)
        # the padding tail counts 0, 1, ... from the end of each row's documents
        tail = torch.arange(length) - torch.tensor(lengths, dtype=torch.long).unsqueeze(1)
        position_ids = torch.where(mask, pad_flat(positions, mask, 0), tail)
        return {
            "input_ids": pad_flat(ids, mask, self.pad_token_id),
            "labels": pad_flat(labels, mask, IGNORE_INDEX),
            "position_ids": position_ids,
        }


class BatchPackingCollator:
    """Packs one batch's documents into rows as long as its longest document (see the module docstring).

    Args:
        pad_token_id: the id of the rows' padding tails.
        pad_to_multiple_of: round the row length up to this multiple (the rows are packed to the longest
        document).

    Input: what :class:`PaddingFreeCollator` takes (``input_ids``; optional
    ``labels``, ``position_ids`` restarting per document, an all-ones ``attention_mask``).

    Returns:
        ``{"input_ids", "labels", "position_ids"}``, int64 ``(R, L)``: ``R <= B`` rows, ``L`` the longest
        document.

    Raises:
        DataError: what ``PaddingFreeCollator`` refuses (an empty batch, padded rows, ...).
    """

    def __init__(self, pad_token_id: int, pad_to_multiple_of: int | None = None) -> None:
        self.flatten = PaddingFreeCollator()
        self.pad = PackedCollator(pad_token_id, pad_to_multiple_of)

    def __call__(self, examples: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        lengths = [len(ex["input_ids"]) if "input_ids" in ex else 0 for ex in examples]
        capacity = max(max(lengths, default=0), 1)
        rows = []
        for members in best_fit_decreasing(lengths, capacity):
            flat = self.flatten([examples[i] for i in sorted(members)])  # checks each example, marks starts
            rows.append({key: value[0] for key, value in flat.items()})
        return self.pad(rows)


# ------------------------------------------------------------------------------ task collators
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
        self._extra = ExtraKeys(type(self).__name__)

    def __call__(self, examples: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        ids = [as_row(row) for row in input_ids_of(examples, "ClassificationCollator")]
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
        self._extra = ExtraKeys(type(self).__name__)

    def __call__(self, examples: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        ids = [as_row(row) for row in input_ids_of(examples, "Seq2SeqCollator")]
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


class PlaceholderAwareCollator:
    """Wraps an evaluation collator: a batch whose examples are all placeholders gets ``PLACEHOLDER_KEY:
    True``.

    With fewer evaluation examples than ranks (8 rows, a 5% hold-out of 1 row, 2 ranks), some rank's share is
    empty. Lightning refuses a loader of length zero on one rank, and a rank that skipped the loop would leave
    the others waiting in the loop's collectives (DDP's buffer broadcast in the first forward, the metric sync
    at the end). So that rank evaluates one *placeholder*: a masked copy of an example (every label -100,
    :class:`~hf_lightning.data.sampling.PlaceholderRow`), which adds nothing to the loss, accuracy or F1 sums.
    A LightningModule that sets ``handles_placeholder_batches = True`` (as
    :class:`~hf_lightning.HFLightningModule` does) gets such a batch marked, and leaves it out of
    ``compute_metrics`` and of the predictions too; any other module receives the masked copy as it is, like
    the masked top-up rows of training.
    """

    def __init__(self, collate: Callable[[Sequence[Any]], Any]) -> None:
        self.collate = collate

    def __call__(self, examples: Sequence[Any]) -> Any:
        batch = self.collate(examples)
        if examples and isinstance(batch, dict) and all(isinstance(ex, PlaceholderRow) for ex in examples):
            batch[PLACEHOLDER_KEY] = True
        return batch
