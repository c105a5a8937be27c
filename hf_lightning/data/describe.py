"""A batch as text: keys, shapes, dtypes, the ignored and padded shares, and the first example decoded.

Used by ``python -m hf_lightning.inspect_batch``; importable without Hydra.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from hf_lightning.core.batch import IGNORE_INDEX, padding_mask

OPEN, CLOSE = "[[", "]]"


def first_sequence(batch: Mapping[str, Any], pad: torch.Tensor) -> tuple[list[int], list[int] | None]:
    """Token ids and labels of the first example (up to the second sequence start in a flattened row)."""
    ids = batch["input_ids"][0]
    keep = ~pad[0]
    labels = batch.get("labels")
    row_labels = (
        labels[0]
        if labels is not None and labels.dim() == 2 and labels.shape == batch["input_ids"].shape
        else None
    )
    end = int(keep.sum())
    pos = batch.get("position_ids")
    if pos is not None:
        starts = (pos[0, :end] == 0).nonzero().reshape(-1).tolist()
        if len(starts) > 1:
            end = starts[1]
    return ids[:end].tolist(), (row_labels[:end].tolist() if row_labels is not None else None)


def mark_trained(ids: Sequence[int], labels: Sequence[int], decode: Any) -> str:
    """Decode ``ids`` with the trained-on runs (labels != -100) wrapped in ``[[ ]]``."""
    out, run, trained = [], [], None
    for token, label in zip(ids, labels):
        flag = label != IGNORE_INDEX
        if flag != trained and run:
            text = decode(run)
            out.append(f"{OPEN}{text}{CLOSE}" if trained else text)
            run = []
        trained = flag
        run.append(token)
    if run:
        text = decode(run)
        out.append(f"{OPEN}{text}{CLOSE}" if trained else text)
    return "".join(out)


def describe_batch(
    batch: Mapping[str, Any],
    tokenizer: Any,
    dropped_columns: Mapping[str, Sequence[str]] | None = None,
    id2label: Mapping[int, str] | None = None,
) -> str:
    """A multi-line report of one collated batch.

    Lines: every key with its shape and dtype (or value); the share of label positions that are -100; the
    padding share of ``input_ids``; the columns dropped by pruning; the first example decoded, trained-on
    spans in ``[[ ]]`` (classification: its class; seq2seq: the target).
    """
    lines = ["batch keys:"]
    width = max(len(k) for k in batch)
    for key, value in batch.items():
        if isinstance(value, torch.Tensor):
            lines.append(f"  {key:<{width}}  {tuple(value.shape)}  {value.dtype}")
        else:
            lines.append(f"  {key:<{width}}  {type(value).__name__} = {value}")
    pad = padding_mask(batch, getattr(tokenizer, "pad_token_id", None))
    labels = batch.get("labels")
    if isinstance(labels, torch.Tensor) and labels.dim() == 2:
        ignored = int((labels == IGNORE_INDEX).sum())
        lines.append(
            f"labels -100: {100 * ignored / labels.numel():.1f}% of label positions ({ignored} of "
            f"{labels.numel()})"
        )
        if labels.shape == pad.shape:
            real = ~pad
            ignored_real = int(((labels == IGNORE_INDEX) & real).sum())
            lines.append(
                f"             {100 * ignored_real / max(int(real.sum()), 1):.1f}% of non-padding positions"
            )
    n_pad = int(pad.sum())
    lines.append(f"padding: {100 * n_pad / pad.numel():.1f}% of input positions ({n_pad} of {pad.numel()})")
    dropped = {k: list(v) for k, v in (dropped_columns or {}).items() if v}
    lines.append(f"dropped columns: {dropped if dropped else 'none'}")
    ids, row_labels = first_sequence(batch, pad)
    decode = lambda toks: tokenizer.decode(toks, skip_special_tokens=False)  # noqa: E731
    lines.append(f"first example ({len(ids)} tokens; trained-on spans in {OPEN} {CLOSE}):")
    if row_labels is not None:
        lines.append(mark_trained(ids, row_labels, decode))
    else:
        lines.append(decode(ids))
        if isinstance(labels, torch.Tensor) and labels.dim() == 1:
            value = labels[0].item()
            name = id2label.get(value) if id2label and isinstance(value, int) else None
            lines.append(f"label: {value}" + (f" ({name})" if name else ""))
        elif isinstance(labels, torch.Tensor):
            target = [t for t in labels[0].tolist() if t != IGNORE_INDEX]
            lines.append(f"target: {OPEN}{decode(target)}{CLOSE}")
    return "\n".join(lines)
