"""Collators whose documents are kept apart by ``position_ids`` instead of padding and an attention mask.

- :class:`PaddingFreeCollator` (``data.padding_free``): every example of the batch flattened into one row.
- :class:`PackedCollator` (``data.packing``): rows packed with documents before training, padded per batch.
- :class:`BatchPackingCollator` (``data.layout=auto``, "packed per batch"): one batch's documents packed
  into as few rows as fit, at collation.

Padding-free batches: every example of the batch flattened into one row, no padding at all.

Ours rather than a wrapper of transformers' ``DataCollatorWithFlattening``: the wrapper (our checks of empty,
text, ragged and padded rows, then HF's collator) costs 2.1x the CPU time per batch of this one (1,896 vs 896
us, GSM8K rows, batches of 16: ``python scripts/bench_flattening.py``), over the 10% issue 16 allows; HF's
collator also fills positions token by token in Python, ignores an ``attention_mask`` (it would flatten
padding) and the ``position_ids`` of packed rows (document boundaries lost). Outputs are equal
(``tests/unit/test_collators.py``).

Sequences ``[10, 11, 12, 13]``, ``[20, 21, 22]`` and ``[30, 31]`` become::

    input_ids     10   11   12   13 | 20   21   22 | 30   31
    position_ids   0    1    2    3 |  0    1    2 |  0    1        boundaries [0, 4, 7, 9]
    labels      -100   11   12   13 |-100  21   22 |-100  31        6 targets

How the model keeps the sequences apart: ``transformers`` (``masking_utils._preprocess_mask_arguments``)
derives a block-diagonal causal mask from ``position_ids`` (``find_packed_sequence_indices``: a new sequence
wherever the position does not grow by one) **only when** ``attention_mask`` is ``None`` and there is no
KV cache. So the batch carries no ``attention_mask``, and the model must run with ``use_cache=False``
(``HFLightningModule`` passes it; a ``config.use_cache=True`` model called without it builds a cache, skips
the detection and lets sequences attend to each other). Flash-attention kernels read the same boundaries from
``cu_seq_lens_q/k`` (``return_flash_attn_kwargs=True``).

The ``-100`` at each sequence start keeps the last token of one sequence from being trained to predict the
first token of the next; with it the loss and the per-sequence logits equal the padded batch's.

Packed per batch: the documents of one micro-batch, and only those, in as few rows as fit.

A padded batch of ``B`` documents is ``B`` rows as long as its longest document ``L``; most of it is padding
when lengths vary. A padding-free batch (:class:`PaddingFreeCollator`) is one row of ``T = sum(L_i)``
tokens, but under ``sdpa`` / ``eager`` attention transformers computes a dense ``(T, T)`` mask over it: about
``B`` times the attention work of the padded rows. This collator does neither: it puts the batch's documents
into rows of ``L`` tokens by best-fit decreasing (:func:`~hf_lightning.data.packing.best_fit_decreasing`),
each document whole, ``position_ids`` restarting at 0 per document, its first token not a target, and pads the
rows' tails (:class:`PackedCollator`). Lengths ``[5, 2, 3, 1]`` (``L = 5``) become
3 rows, not 4::

    row 0   a0 a1 a2 a3 a4     positions 0 1 2 3 4    labels -100 a1 a2 a3 a4
    row 1   b0 b1 c0 c1 c2     positions 0 1 0 1 2    labels -100 b1 -100 c1 c2
    row 2   d0 pd pd pd pd     positions 0 0 1 2 3    labels -100 -100 -100 -100 -100   (pd: the pad id)

(a row's documents keep the batch's order; its padding tail is a segment of its own that nothing real attends
to)

The step holds exactly the padded batch's documents and targets, so its loss (sum over targets /
``num_items_in_batch``) and gradient are the padded batch's up to float rounding; the attention of each
document sees only itself (transformers derives the block-diagonal mask from ``position_ids`` when there is no
``attention_mask`` and no KV cache). Unlike packing the dataset (``data.packing``), no document moves to
another step. Slots: ``rows x L`` instead of ``B x L``.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from hf_lightning.batch import IGNORE_INDEX
from hf_lightning.data.collators import checked_column, flatten_rows, pad_flat, round_up, row_mask
from hf_lightning.data.packing import best_fit_decreasing
from hf_lightning.errors import DataError

log = logging.getLogger(__name__)

CARRIED = ("input_ids", "labels", "position_ids", "attention_mask")


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
    ``position_ids`` (a packed row brings its own, restarting at each document; otherwise ``0..n-1``).
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
        if not examples:
            raise DataError("PaddingFreeCollator: cannot collate an empty list of examples")
        for i, ex in enumerate(examples):
            if "input_ids" not in ex:
                raise DataError(f"example {i} has no 'input_ids' (keys: {sorted(ex)})")
        # whole-batch tensor ops on the concatenated rows (no per-example tensors)
        ids, lengths = flatten_rows([ex["input_ids"] for ex in examples])
        if not ids.numel():
            raise DataError("PaddingFreeCollator: every example of the batch is empty")
        labels = checked_column(examples, "labels", lengths)
        labels = ids.clone() if labels is None else labels
        positions = checked_column(examples, "position_ids", lengths)
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
        positions, _ = flatten_rows([ex["position_ids"] for ex in examples])
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
