"""Packing: several tokenized documents per ``max_length`` row, so that almost no slot is padding.

``bfd`` (best-fit decreasing, TRL's ``packing_strategy="bfd"``): documents sorted longest first, each put
into the open row with the least room that still fits it (ties: the row that came to have that room first, as
TRL), else a new row.
Documents stay whole and isolated: each restarts its ``position_ids`` at 0 and its first token is not a
target. So a document longer than ``max_length`` cannot be packed whole: it is truncated at tokenization, like
an unpacked row, and the rows and tokens cut are counted in the log. TRL's ``bfd`` cuts the same overflow
without a word (its ``bfd_split`` spreads it over rows as separate documents, which breaks a conversation
apart); to keep every token of long documents use ``wrapped``. A row of three documents of lengths 3, 2 and 2
with ``max_length`` 8::

    input_ids     a0   a1   a2 | b0   b1 | c0   c1 | pad
    position_ids   0    1    2 |  0    1 |  0    1 |   0
    labels      -100   a1   a2 |-100  b1 |-100  c1 |-100

    attention (1 = may attend), block-diagonal causal:
        a0 1
        a1 1 1
        a2 1 1 1
        b0       1
        b1       1 1
        c0           1
        c1           1 1

``wrapped`` (TRL's ``"wrapped"``, HF ``run_clm``'s ``group_texts``): all documents, tokenized whole (no
truncation), concatenated and cut every ``max_length`` tokens: every token is kept, the last row may be
shorter (``group_texts`` drops that remainder). Documents in a row attend to each other, as in classic
pre-training.

Where one document ends is marked by the documents themselves, never after a cut: ``text`` documents end with
EOS when packed (TRL appends ``eos_token`` to each text; ``group_texts`` adds nothing), prompt/completion rows
always end with EOS, chat rows with the template's end of turn, and pre-tokenized rows are packed as given.

The packing efficiency, real tokens / (rows x ``max_length``), is logged at INFO. The rows are computed by
:mod:`~hf_lightning.data.packing_engine` on Arrow offsets and lengths (no token goes through Python; the
packed columns are int32, 12 bytes per token). A stream is not packed (:func:`check_packing` says why).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import datasets
import numpy as np
import pyarrow.compute as pc

from hf_lightning.core.arguments import Allowed, shown
from hf_lightning.core.errors import ConfigError
from hf_lightning.data.checks import check_sequence_isolation
from hf_lightning.data.formats import CAUSAL_FORMATS
from hf_lightning.data.model_facts import forward_parameters
from hf_lightning.data.packing_engine import (
    best_fit_rows,
    documents_across,
    pack_bfd_table,
    pack_wrapped_table,
    to_dataset,
    token_columns,
)

log = logging.getLogger(__name__)

STRATEGIES = ("bfd", "wrapped")
#: the value rule of ``data.packing`` (read from :class:`~hf_lightning.HFDataModule`'s signature)
PACKING = Allowed(
    lambda v: v is True or v is False or v is None or v in STRATEGIES, "false, true (= bfd), bfd, wrapped"
)
#: the values ``data.packing`` takes (``HFDataModule``'s annotation says the same)
Packing = bool | Literal["bfd", "wrapped"]


def packing_strategy(packing: Any) -> str | None:
    """``data.packing`` as a strategy: ``True`` is ``"bfd"``, ``False``/``None`` no packing.

    Raises:
        ConfigError: a value that is none of ``false, true, "bfd", "wrapped"``.
    """
    if packing is True:
        return "bfd"
    if packing is False or packing is None:
        return None
    if packing not in STRATEGIES:
        raise ConfigError(f"data.packing={shown(packing)}: allowed values: {PACKING.text}")
    return packing


@dataclass(frozen=True)
class RowPlan:
    """What ``data.packing`` and ``data.padding_free`` mean for the rows, resolved once (:func:`row_plan`).

    The tokenizers (:func:`~hf_lightning.data.on_the_fly.fn_kwargs_for`), the split preparation
    (:func:`~hf_lightning.data.tokenize.prepare_split`) and the collators
    (:func:`~hf_lightning.data.layout.collator_for`) read these facts, never the two options.

    Attributes:
        truncate: each document is cut at ``max_length`` (``False`` for ``wrapped``, which cuts the
            concatenation instead, so that no token is lost).
        add_eos: packed ``text`` documents end with the EOS token (TRL's ``SFTTrainer`` appends it too).
        drop_padding: pre-tokenized rows lose their padding (their rows go side by side).
        padding_free: each batch is one flat row
            (:class:`~hf_lightning.data.collators.PaddingFreeCollator`).
        pack: ``(dataset, split) -> dataset``: :func:`pack_dataset`, strategy and ``max_length`` bound;
            ``None``: rows are not packed.
    """

    truncate: bool = True
    add_eos: bool = False
    drop_padding: bool = False
    padding_free: bool = False
    pack: Callable[[datasets.Dataset, str], datasets.Dataset] | None = None


#: rows as given: truncated, unpacked, padded per batch
UNPACKED = RowPlan()


def row_plan(strategy: str | None, padding_free: bool, max_length: int) -> RowPlan:
    """The :class:`RowPlan` of a strategy (:func:`packing_strategy`'s value) and ``data.padding_free``."""
    return RowPlan(
        truncate=strategy != "wrapped",
        add_eos=strategy is not None,
        drop_padding=strategy is not None or bool(padding_free),
        padding_free=bool(padding_free),
        pack=functools.partial(pack_dataset, strategy=strategy, max_length=max_length) if strategy else None,
    )


def check_packing(
    packing: Any,
    padding_free: bool = False,
    *,
    fmt: str | None = None,
    stream: bool | None = None,
    task: str | None = None,
    encoder_decoder: bool | None = None,
    model: Any = None,
    forward_kwargs: Mapping[str, Any] | None = None,
) -> str | None:
    """Every rule of ``data.packing`` (and of ``data.padding_free``, which shares the model's part), in one
    place.

    A rule runs when its facts are given (``None``: not known yet), so the config schema calls it before
    anything is built (``packing``, ``task``, ``encoder_decoder``) and ``HFDataModule.setup`` once with the
    data and the model (``fmt``, ``stream``, ``model``, ``forward_kwargs``).

    Args:
        packing / padding_free: the two options as given.
        fmt: the data format (:mod:`~hf_lightning.data.formats`); only causal formats can be packed or
        flattened. stream: whether the training source is a stream (packing needs the whole dataset).
        task / encoder_decoder: the model's task (``model.task``) and whether it is an encoder-decoder.
        model: the ``nn.Module``; its ``forward`` must take ``position_ids`` and its attention must keep
            packed sequences apart (:func:`~hf_lightning.data.checks.check_sequence_isolation`, a probe
            forward).
        forward_kwargs: what the LightningModule passes to every forward (``use_cache=False`` keeps the
            sequences apart; without it one WARNING, else no line).

    Returns:
        the strategy (``"bfd"``, ``"wrapped"``) or ``None`` (no packing).

    Raises:
        ConfigError: one line naming the option, the value and what to change.
    """
    strategy = packing_strategy(packing)
    if strategy and encoder_decoder:
        raise ConfigError(
            f"data.packing={strategy!r} with an encoder-decoder model (model.task={task}): packing "
            "concatenates examples into one causal sequence, which an encoder-decoder cannot attend "
            "correctly; allowed values: false"
        )
    if strategy and task == "sequence_classification":
        raise ConfigError(
            f"data.packing={strategy!r} with model.task=sequence_classification; allowed values: false"
        )
    if strategy and fmt is not None and fmt not in CAUSAL_FORMATS:
        raise ConfigError(
            f"data.packing={strategy!r} packs causal-LM rows; the {fmt!r} format cannot be packed"
        )
    if strategy and stream:
        # packing on the fly would give each rank a content-dependent number of rows, so ranks would run
        # different numbers of steps (DDP hangs) and the exact per-rank split would be lost
        raise ConfigError(
            f"data.packing={strategy!r} needs the whole dataset (a map-style source) so that every rank "
            "gets the same number of packed rows; this source is a stream. Use data.padding_free=true for "
            "streams (no padding either), or data.streaming=false"
        )
    if padding_free and fmt is not None and fmt not in CAUSAL_FORMATS:
        raise ConfigError(
            f"data.padding_free=true flattens causal-LM rows; the {fmt!r} format cannot be flattened"
        )
    if (strategy or padding_free) and model is not None:
        _check_model_separates_sequences(
            model, "data.packing" if strategy else "data.padding_free", forward_kwargs
        )
    return strategy


def packing_config_errors(data: Mapping[str, Any], model: Mapping[str, Any]) -> list[str]:
    """The rules of :func:`check_packing` that a composed config decides alone (the schema's last pass).

    Args:
        data / model: the config's ``data`` and ``model`` nodes (``data.packing``, ``model.task``,
            ``model.name_or_path``).

    Returns:
        one line per problem (none or one).
    """
    if not data.get("packing"):
        return []
    from hf_lightning.core.errors import HFLightningError
    from hf_lightning.models.loading import is_encoder_decoder

    task = model.get("task", "causal_lm")
    try:
        encdec = is_encoder_decoder(task, model.get("name_or_path"))
    except HFLightningError:  # the model's own error comes when it is built
        encdec = task == "seq2seq_lm"
    try:
        check_packing(data.get("packing"), task=task, encoder_decoder=encdec)
    except ConfigError as err:
        return [str(err)]
    return []


def _check_model_separates_sequences(
    model: Any, option: str, forward_kwargs: Mapping[str, Any] | None
) -> None:
    if "position_ids" not in forward_parameters(model):
        raise ConfigError(
            f"{type(model).__name__}.forward takes no position_ids, so packed or padding-free batches "
            "cannot mark where sequences start; set data.packing=false and data.padding_free=false"
        )
    check_sequence_isolation(model, option)
    # HFLightningModule turns the cache off itself: nothing for its user to do (no line); any other
    # LightningModule must do it, or packed sequences attend to each other (WARNING)
    cache_on = getattr(getattr(model, "config", None), "use_cache", False)
    if cache_on and (forward_kwargs or {}).get("use_cache") is not False:
        log.warning(
            "packed/padding-free batches: transformers only separates sequences by position_ids when "
            "no KV cache is built; %s.config.use_cache is true, so the LightningModule must call the "
            "model with use_cache=False (HFLightningModule does) or sequences will attend to each other",
            type(model).__name__,
        )


def best_fit_decreasing(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Bins of example indices, each summing to at most ``capacity`` (best-fit decreasing).

    Examples go longest first (ties in dataset order), each into the bin with the least room that still fits
    it; among bins with that room, the one that came to have it first (TRL's ``_pack_bfd`` rule, so the rows
    are TRL's row for row). Empty examples are in no bin (TRL leaves them out too). Example: lengths ``[3, 7,
    2, 5, 1]`` with capacity 8 give ``[[1, 4], [3, 0], [2]]`` (7+1, 5+3, 2). Computed by
    :func:`~hf_lightning.data.packing_engine.best_fit_rows` (O(n log capacity)).

    Raises:
        ValueError: an example longer than ``capacity``.
    """
    order, per_row = best_fit_rows(np.asarray(lengths, dtype=np.int64), capacity)
    bounds = np.cumsum(per_row).tolist()
    flat = order.tolist()
    return [flat[a:b] for a, b in zip([0] + bounds, bounds)]


def pack_bfd(ds: datasets.Dataset, max_length: int) -> datasets.Dataset:
    """Pack documents whole with :func:`best_fit_decreasing`; per-document positions, first tokens masked.

    Computed on Arrow offsets (:func:`~hf_lightning.data.packing_engine.pack_bfd_table`): no token goes
    through Python.

    Returns:
        a dataset with ``input_ids``, ``labels`` and ``position_ids`` columns (int32 lists, one row per bin),
        each row's three the same length.

    Raises:
        ValueError: a document longer than ``max_length`` (tokenization truncates them first).
    """
    return to_dataset(pack_bfd_table(*token_columns(ds), max_length)[0])


def pack_wrapped(ds: datasets.Dataset, max_length: int) -> datasets.Dataset:
    """Concatenate every document as it is (no separator added) and cut into ``max_length`` rows.

    Example: documents ``[1, 2, 3]``, ``[4, 5, 2]``, ``[6]`` with ``max_length`` 4 give rows ``[1, 2, 3, 4]``
    and ``[5, 2, 6]``.

    Returns:
        a dataset with ``input_ids``, ``labels`` and ``position_ids`` (``0..n-1``) columns (int32 lists).
    """
    return to_dataset(pack_wrapped_table(*token_columns(ds), max_length))


def documents_across_rows(lengths: Sequence[int], max_length: int) -> int:
    """How many documents of ``lengths``, concatenated and cut every ``max_length`` tokens, span two rows or
    more."""
    return documents_across(lengths, max_length)


def announce_document_ends(tokenizer: Any, fmt: str, packing: str | None) -> None:
    """Say once (at INFO) that packed ``text`` documents end with EOS, or warn when the tokenizer has none."""
    if fmt != "text" or not packing:
        return
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        log.warning(
            "data.packing=%s: the tokenizer has no EOS token, so packed text documents have no end marker",
            packing,
        )
        return
    log.info(
        "data.packing=%s: each text document ends with the EOS token %r (id %d) unless the tokenizer ended "
        "it with one, as TRL does; unpacked and padding-free rows stay exactly tokenizer(text, "
        "truncation=True, max_length=...)",
        packing,
        tokenizer.eos_token,
        eos,
    )


def pack_dataset(
    ds: datasets.Dataset, strategy: str, max_length: int, split: str = "train"
) -> datasets.Dataset:
    """Pack a tokenized dataset with ``strategy`` (``"bfd"`` or ``"wrapped"``) and log the efficiency.

    Columns other than ``input_ids``, ``attention_mask``, ``labels`` cannot follow documents into shared rows;
    they are named in the log.

    Raises:
        KeyError: a strategy not in :data:`STRATEGIES` (:func:`check_packing` refuses it first).
    """
    if strategy not in STRATEGIES:
        raise KeyError(strategy)
    left = [c for c in ds.column_names if c not in ("input_ids", "attention_mask", "labels")]
    if left:
        log.warning(
            "%s: packing leaves the columns %s out (they cannot follow documents into shared rows)",
            split,
            left,
        )
    ids, labels = token_columns(ds)
    lengths = pc.list_value_length(ids).to_numpy(zero_copy_only=False).astype(np.int64)
    if strategy == "bfd":
        table = pack_bfd_table(ids, labels, max_length)[0]
    else:
        table = pack_wrapped_table(ids, labels, max_length)
    tokens = int(lengths.sum())
    slots = table.num_rows * max_length
    log.info(
        "%s: packed %d documents into %d rows of %d (%s): efficiency %.1f%% (%d real tokens / %d slots)",
        split,
        len(lengths),
        table.num_rows,
        max_length,
        strategy,
        100.0 * tokens / slots if slots else 0.0,
        tokens,
        slots,
    )
    empty = int(np.count_nonzero(lengths == 0))
    if empty:
        log.warning("%s: %d empty documents (no token) are in no packed row", split, empty)
    if strategy == "wrapped":
        across = documents_across(lengths, max_length)
        log.info("%s: %d documents continue from one row into the next (nothing is cut off)", split, across)
    return to_dataset(table)
