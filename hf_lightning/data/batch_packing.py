"""Padding-free rows packed per batch: the documents of one micro-batch, and only those, in as few rows as
fit.

A padded batch of ``B`` documents is ``B`` rows as long as its longest document ``L``; most of it is padding
when lengths vary. A padding-free batch (:mod:`~hf_lightning.data.flattening`) is one row of ``T = sum(L_i)``
tokens, but under ``sdpa`` / ``eager`` attention transformers computes a dense ``(T, T)`` mask over it: about
``B`` times the attention work of the padded rows. This collator does neither: it puts the batch's documents
into rows of ``L`` tokens by best-fit decreasing (:func:`~hf_lightning.data.packing.best_fit_decreasing`),
each document whole, ``position_ids`` restarting at 0 per document, its first token not a target, and pads the
rows' tails (:class:`~hf_lightning.data.packing.PackedCollator`). Lengths ``[5, 2, 3, 1]`` (``L = 5``) become
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

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from hf_lightning.data.flattening import PaddingFreeCollator
from hf_lightning.data.packing import PackedCollator, best_fit_decreasing


class BatchPackingCollator:
    """Packs one batch's documents into rows as long as its longest document (see the module docstring).

    Args:
        pad_token_id: the id of the rows' padding tails.
        pad_to_multiple_of: round the row length up to this multiple (the rows are packed to the longest
        document).

    Input: what :class:`~hf_lightning.data.flattening.PaddingFreeCollator` takes (``input_ids``; optional
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
