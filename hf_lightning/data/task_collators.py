"""Collators of task rows: sequence classification (:class:`ClassificationCollator`, HF's
``DataCollatorWithPadding``) and encoder-decoder seq2seq (:class:`Seq2SeqCollator`, HF's
``DataCollatorForSeq2Seq``), on the row helpers of :mod:`~hf_lightning.data.collators` (why ours: there).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from hf_lightning.core.batch import IGNORE_INDEX
from hf_lightning.core.errors import DataError
from hf_lightning.data.collators import ExtraKeys, as_row, pad_rows, round_up


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
        self._extra = ExtraKeys(type(self).__name__)

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
