"""Collators: turn a list of tokenized examples into a padded batch.

The dataset side decides which positions are trained on (labels with ``-100``); a collator only pads. This is
the split litgpt uses (``litgpt/data/base.py``): masking in the dataset, padding in the collate function.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from hf_lightning.module.loss import IGNORE_INDEX


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

    Input: a list of mappings with ``input_ids`` (list[int] or 1-D int tensor), optional ``attention_mask``
    and ``labels`` (same length; missing labels are copied from ``input_ids``). Other keys whose values are
    numbers are stacked; anything else raises.

    Returns:
        ``{"input_ids": (B, L) int64, "attention_mask": (B, L) int64, "labels": (B, L) int64, ...}``.

    Raises:
        ValueError: an example without ``input_ids``, or with ``labels`` of a different length.
    """

    def __init__(
        self, pad_token_id: int, pad_to_multiple_of: int | None = None, label_pad_token_id: int = IGNORE_INDEX
    ) -> None:
        self.pad_token_id = int(pad_token_id)
        self.pad_to_multiple_of = pad_to_multiple_of
        self.label_pad_token_id = label_pad_token_id

    def __call__(self, examples: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        if not examples:
            raise ValueError("cannot collate an empty list of examples")
        rows = []
        for i, ex in enumerate(examples):
            if "input_ids" not in ex:
                raise ValueError(f"example {i} has no 'input_ids' (keys: {sorted(ex)})")
            ids = torch.as_tensor(ex["input_ids"], dtype=torch.long).reshape(-1)
            labels = ex.get("labels")
            labels = ids if labels is None else torch.as_tensor(labels, dtype=torch.long).reshape(-1)
            if labels.numel() != ids.numel():
                raise ValueError(
                    f"example {i}: 'labels' has {labels.numel()} positions but 'input_ids' has {ids.numel()}"
                )
            mask = ex.get("attention_mask")
            mask = torch.ones_like(ids) if mask is None else torch.as_tensor(mask, dtype=torch.long).reshape(-1)
            rows.append((ids, mask, labels))

        length = max(r[0].numel() for r in rows)
        if self.pad_to_multiple_of:
            m = self.pad_to_multiple_of
            length = (length + m - 1) // m * m
        n = len(rows)
        input_ids = torch.full((n, length), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((n, length), dtype=torch.long)
        labels = torch.full((n, length), self.label_pad_token_id, dtype=torch.long)
        for i, (ids, mask, lab) in enumerate(rows):
            k = ids.numel()
            input_ids[i, :k] = ids
            attention_mask[i, :k] = mask
            labels[i, :k] = lab
        batch = {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}

        for key in examples[0]:
            if key in batch:
                continue
            values = [ex[key] for ex in examples]
            try:
                batch[key] = torch.as_tensor(values)
            except (TypeError, ValueError) as err:
                raise ValueError(
                    f"PaddingCollator cannot batch key {key!r} (values like {values[0]!r}); "
                    "remove the column or use remove_unused_columns=true"
                ) from err
        return batch
