"""The longest row a model can take, checked against ``data.max_length`` at setup.

A model with a *learned* absolute position table (GPT-2's ``wpe``, GPT-Neo, OPT, BART, BERT/RoBERTa) or a
precomputed table of rotary angles (GPT-J, CodeGen) has one row per position: a longer sequence indexes past
it, and the first such batch dies with ``IndexError: index out of range in self`` (on a GPU a device-side
assert that kills the process), possibly hours into a run. Those limits are refused at setup. Rotary models
that compute their angles on the fly (Llama, Qwen, Mistral, GPT-NeoX, ...) run past
``max_position_embeddings`` without any error (transformers does too); there the field only says what the
model was trained on, so a longer ``max_length`` is a WARNING, not an error. Models with relative positions
(T5) or ALiBi (BLOOM) have no limit and are not checked.

The limit is read from the model itself: the position table whose row count matches one of the config fields
of :data:`POSITION_FIELDS` (less the rows its positions skip: OPT and BART start at 2, RoBERTa after its
padding index). HF's ``run_clm.py`` caps ``block_size`` at ``tokenizer.model_max_length`` instead; the model's
table is what fails.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import datasets
from torch import nn

from hf_lightning.core.errors import ConfigError
from hf_lightning.data.sampling import sequence_lengths

log = logging.getLogger(__name__)

#: config fields that hold a model's number of positions, in the order they are looked up
POSITION_FIELDS = ("n_positions", "max_position_embeddings", "n_ctx", "max_sequence_length", "seq_length")


@dataclass(frozen=True)
class PositionLimit:
    """``tokens``: the longest sequence the model takes; ``field`` / ``value``: the config field it comes
    from; ``hard``: a longer sequence fails (a position table) rather than runs untrained (rotary angles on
    the fly)."""

    tokens: int
    field: str
    value: int
    hard: bool


def _config_limit(config: Any) -> tuple[str, int] | None:
    for field in POSITION_FIELDS:
        value = getattr(config, field, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return field, value
    return None


def _skipped_rows(table: nn.Embedding) -> int:
    """Rows of a position table that no position uses: OPT/BART's ``offset`` (2), RoBERTa's padding index +
    1."""
    offset = getattr(table, "offset", None)
    if isinstance(offset, int):
        return offset
    return table.padding_idx + 1 if table.padding_idx is not None else 0


def position_limit(model: Any) -> PositionLimit | None:
    """The position limit of ``model`` (see the module docstring), or ``None`` when it has none to check."""
    found = _config_limit(getattr(model, "config", None))
    if found is None or not isinstance(model, nn.Module):
        return None
    field, value = found
    tokens = set()
    for get in ("get_input_embeddings", "get_output_embeddings"):
        fn = getattr(model, get, None)
        tokens.add(id(fn() if callable(fn) else None))
    limits = []
    for name, module in model.named_modules():
        if isinstance(module, nn.Embedding) and id(module) not in tokens and "relative" not in name:
            rows, skipped = module.num_embeddings, _skipped_rows(module)
            if value in (rows, rows - skipped):
                limits.append(rows - skipped)
    for _, buffer in model.named_buffers():
        if buffer.dim() >= 2 and buffer.shape[0] == value:  # sin/cos of every position, computed once (GPT-J)
            limits.append(value)
    if limits:
        return PositionLimit(min(limits), field, value, hard=True)
    if any("Rotary" in type(m).__name__ for m in model.modules()):
        return PositionLimit(value, field, value, hard=False)
    return None


def longest_row(max_length: int, pad_to_multiple_of: int | None, padding_free: bool) -> int:
    """Positions of the longest row a batch can hold: ``max_length`` rounded up to ``pad_to_multiple_of``
    (padded and packed batches; a padding-free row restarts its ``position_ids`` per sequence and is never
    rounded)."""
    if padding_free or not pad_to_multiple_of:
        return max_length
    return -(-max_length // pad_to_multiple_of) * pad_to_multiple_of


def longest_measured(splits: Mapping[str, Any]) -> tuple[int, str] | None:
    """``(tokens, split)`` of the longest row over the splits (``input_ids``, and list ``labels`` such as
    seq2seq targets), read from Arrow; ``None`` when a split cannot be measured ahead (a stream, a torch
    dataset)."""
    best: tuple[int, str] = (0, "")
    for split, ds in splits.items():
        if ds is None:
            continue
        if not isinstance(ds, datasets.Dataset):
            return None
        for column in ("input_ids", "labels"):
            if column not in ds.column_names or not hasattr(ds.features[column], "feature"):
                continue  # a class label is one value, not a row
            lengths = sequence_lengths(ds, column)
            if lengths and max(lengths) > best[0]:
                best = (max(lengths), split)
    return best


def check_positions(
    model: Any,
    max_length: int,
    pad_to_multiple_of: int | None = None,
    padding_free: bool = False,
    splits: Mapping[str, Any] | None = None,
) -> None:
    """Refuse rows the model's position table cannot hold; warn past a rotary model's trained length.

    Nothing to check while ``data.max_length`` (rounded up to ``pad_to_multiple_of``) fits. Past that, the
    rows of ``splits`` (the prepared, tokenized or packed datasets) are measured: when every one fits, one
    WARNING says that ``data.max_length`` exceeds the model's positions (a longer row would fail); when one
    does not, or the data cannot be measured ahead (streams, torch datasets, ``splits`` not given), the run is
    refused.

    Raises:
        ConfigError: names the longest row (when measured), ``data.max_length`` (and
            ``data.pad_to_multiple_of`` when the rounding is what goes past), the model's limit, the config
            field it comes from, and what fits.
    """
    limit = position_limit(model)
    if limit is None or longest_row(max_length, pad_to_multiple_of, padding_free) <= limit.tokens:
        return
    name = type(model).__name__
    field = f"config.{limit.field}={limit.value}"
    if limit.tokens != limit.value:
        field += f", less {limit.value - limit.tokens} rows its positions skip"
    measured = longest_measured(splits) if splits is not None else None
    if measured is not None:
        tokens, split = measured
        padded = longest_row(tokens, pad_to_multiple_of, padding_free)
        if padded <= limit.tokens:
            if not limit.hard:
                return  # within what the rotary model was trained on: nothing to say
            log.warning(
                "data.max_length=%d is longer than %s's %d positions (%s); no row of this data is (the "
                "longest has %d tokens%s), so nothing fails now, but a longer row would: set "
                "data.max_length=%d",
                max_length, name, limit.tokens, field, tokens,
                (
                    f", {padded} padded to data.pad_to_multiple_of={pad_to_multiple_of}"
                    if padded != tokens
                    else ""
                ),
                limit.tokens,
            )  # fmt: skip
            return
        what = f"The longest {split} row ({tokens} tokens after truncation to data.max_length={max_length}"
        what += (
            f", padded to {padded} by data.pad_to_multiple_of={pad_to_multiple_of})"
            if padded != tokens
            else ")"
        )
    else:
        padded = longest_row(max_length, pad_to_multiple_of, padding_free)
        what = f"data.max_length={max_length}"
        if padded != max_length:
            what += f" rounded up to data.pad_to_multiple_of={pad_to_multiple_of} ({padded})"
        if splits is not None:
            what += " (the rows of a stream or a torch dataset are not measured ahead)"
    if not limit.hard:
        log.warning(
            "%s is longer than %s's %d positions (%s): its rotary positions go on without an error, but the "
            "model was not trained past position %d, so longer rows may be modelled badly; set "
            "data.max_length=%d to stay within them",
            what, name, limit.tokens, field, limit.tokens, limit.tokens,
        )  # fmt: skip
        return
    rounds = bool(pad_to_multiple_of) and not padding_free
    fits = limit.tokens // pad_to_multiple_of * pad_to_multiple_of if rounds else limit.tokens
    fix = f"Set data.max_length={fits} or less" if fits else "Set"
    if rounds and limit.tokens % pad_to_multiple_of:
        fix += f"{', or' if fits else ''} a data.pad_to_multiple_of that divides {limit.tokens}"
    raise ConfigError(
        f"{what} is longer than the {limit.tokens} positions {name} has ({field}): its "
        f"position table has no row past that, so that batch would fail (IndexError; on a GPU a device-side "
        f"assert). {fix}"
    )
