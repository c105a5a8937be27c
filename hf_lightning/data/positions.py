"""The longest row a model can take, checked against ``data.max_length`` at setup.

A model with a *learned* absolute position table (GPT-2's ``wpe``, GPT-Neo, OPT, BART, BERT/RoBERTa) or a
precomputed table of rotary angles (GPT-J, CodeGen) has one row per position: a longer sequence indexes past it,
and the first such batch dies with ``IndexError: index out of range in self`` (on a GPU a device-side assert that
kills the process), possibly hours into a run. Those limits are refused at setup. Rotary models that compute their
angles on the fly (Llama, Qwen, Mistral, GPT-NeoX, ...) run past ``max_position_embeddings`` without any error
(transformers does too); there the field only says what the model was trained on, so a longer ``max_length`` is a
WARNING, not an error. Models with relative positions (T5) or ALiBi (BLOOM) have no limit and are not checked.

The limit is read from the model itself: the position table whose row count matches one of the config fields of
:data:`POSITION_FIELDS` (less the rows its positions skip: OPT and BART start at 2, RoBERTa after its padding index).
HF's ``run_clm.py`` caps ``block_size`` at ``tokenizer.model_max_length`` instead; the model's table is what fails.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from torch import nn

from hf_lightning.errors import ConfigError

log = logging.getLogger(__name__)

#: config fields that hold a model's number of positions, in the order they are looked up
POSITION_FIELDS = ("n_positions", "max_position_embeddings", "n_ctx", "max_sequence_length", "seq_length")


@dataclass(frozen=True)
class PositionLimit:
    """``tokens``: the longest sequence the model takes; ``field`` / ``value``: the config field it comes from;
    ``hard``: a longer sequence fails (a position table) rather than runs untrained (rotary angles on the fly)."""

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
    """Rows of a position table that no position uses: OPT/BART's ``offset`` (2), RoBERTa's padding index + 1."""
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
    """Positions of the longest row a batch can hold: ``max_length`` rounded up to ``pad_to_multiple_of`` (padded
    and packed batches; a padding-free row restarts its ``position_ids`` per sequence and is never rounded)."""
    if padding_free or not pad_to_multiple_of:
        return max_length
    return -(-max_length // pad_to_multiple_of) * pad_to_multiple_of


def check_positions(
    model: Any, max_length: int, pad_to_multiple_of: int | None = None, padding_free: bool = False
) -> None:
    """Refuse a ``data.max_length`` the model's position table cannot hold; warn past a rotary model's trained length.

    Raises:
        ConfigError: names ``data.max_length`` (and ``data.pad_to_multiple_of`` when the rounding is what goes past),
            the model's limit, the config field it comes from, and the largest value that fits.
    """
    limit = position_limit(model)
    if limit is None:
        return
    longest = longest_row(max_length, pad_to_multiple_of, padding_free)
    if longest <= limit.tokens:
        return
    name = type(model).__name__
    field = f"config.{limit.field}={limit.value}"
    if limit.tokens != limit.value:
        field += f", less {limit.value - limit.tokens} rows its positions skip"
    if not limit.hard:
        log.warning(
            "data.max_length=%d is longer than %s's %d positions (%s): its rotary positions go on without an "
            "error, but the model was not trained past position %d, so longer rows may be modelled badly; set "
            "data.max_length=%d to stay within them",
            max_length,
            name,
            limit.tokens,
            field,
            limit.tokens,
            limit.tokens,
        )
        return
    what = (
        f"data.max_length={max_length}"
        if longest == max_length
        else f"data.max_length={max_length} rounded up to data.pad_to_multiple_of={pad_to_multiple_of} ({longest})"
    )
    if longest == max_length:
        fix = f"Set data.max_length={limit.tokens} or less"
    else:
        fits = limit.tokens // pad_to_multiple_of * pad_to_multiple_of
        fix = f"Set data.max_length={fits} or less, or " if fits else "Set "
        fix += f"a data.pad_to_multiple_of that divides {limit.tokens}"
    raise ConfigError(
        f"{what} is longer than the {limit.tokens} positions {name} has ({field}): its position table has no row "
        f"past that, so the first longer batch would fail (IndexError; on a GPU a device-side assert). {fix}"
    )
