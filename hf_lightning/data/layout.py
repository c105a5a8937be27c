"""``data.layout=auto``: the fastest batch layout that keeps the loss exact, chosen once at setup and said in
the log.

The layouts, and what each costs (``docs/benchmarks.md`` section 3 measures them side by side):

================= ========================================= ================================================
layout            slots that are real                       an optimizer step
================= ========================================= ================================================
padded            the rows' tokens / (B x longest row)      the reference
padding-free      all: one flat row, ``position_ids``       the same documents, the same loss and gradient
                  restart per document
packed per batch  almost all: the batch's documents in the  the same documents, the same loss and gradient
                  fewest rows of its longest document's     (:mod:`~hf_lightning.data.collators`)
                  length
length-grouped    almost all (HF ``group_by_length``)       other documents: rows of similar length together
padded, sorted    more than padded: each window's documents the same documents, the same loss and gradient
within windows    sorted by length across its micro-batches (each window keeps its documents)
packed            almost all (``data.packing``)             more documents per step, fewer steps
================= ========================================= ================================================

``auto`` keeps every step's documents (so the run is the padded run, step for step, up to float rounding) and
removes the padding the model's attention allows:

1. a causal-LM format and a model that keeps the documents of one row apart (``forward`` takes
   ``position_ids``, no KV cache, and the probe of :func:`~hf_lightning.data.checks.packed_sequences_isolated`
   passes): **padding-free** when its attention is a variable-length kernel (``flash_attention_*``: it attends
   within each document, ``sum(L_i**2)`` work); otherwise (``sdpa``, ``eager``, whose mask over one flat row
   of ``T = sum(L_i)`` tokens is a dense ``(T, T)``: about ``B`` times the padded rows' attention) **packed
   per batch**, whose rows are no longer than the padded rows.
2. classification (one loss per example, each example weighs ``1/B`` in any batch): **length-grouped**.
3. otherwise (seq2seq, a model that cannot keep documents apart, no model to probe): **padded, sorted within
   windows** when an optimizer step takes several micro-batches (``gradient_accumulation_steps`` > 1) from a
   map-style source: each window's documents are ordered by length, longest first, before they are cut into
   its micro-batches, so every micro-batch pads to a length close to its own rows' (the window's loss is the
   sum over the same tokens divided by the same ``num_items_in_batch``). Else **padded**, said in the line.

Not chosen, although each keeps the loss per token: length grouping for token losses, because a step's loss is
divided by its own target count, so batches of short documents weigh each of their tokens more than batches of
long ones (on the default experiment it left ``val/loss`` at 6.19 after 60 steps, against 3.68 padded);
dataset packing, because it changes how many documents a step holds, so an experiment's learning rate, batch
size and step count no longer mean what they say. A layout set by hand (``data.group_by_length``,
``data.packing``, ``data.padding_free``) wins over ``auto``. ``HFDataModule`` and ``conf/data/default.yaml``
default to ``layout=null`` (those three keys as given); the shipped experiments set ``auto``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from hf_lightning.compat import attention_backend
from hf_lightning.core.arguments import Allowed
from hf_lightning.core.errors import ConfigError
from hf_lightning.data.checks import forward_parameters, is_sequence_classifier, packed_sequences_isolated
from hf_lightning.data.collators import (
    BatchPackingCollator,
    ClassificationCollator,
    PackedCollator,
    PaddingCollator,
    PaddingFreeCollator,
    Seq2SeqCollator,
)
from hf_lightning.data.formats import CAUSAL_FORMATS, DOCUMENT_COLUMNS, SEQ_LENGTHS
from hf_lightning.data.packing import UNPACKED, RowPlan, best_fit_decreasing
from hf_lightning.data.sampling import length_grouped_indices, sequence_lengths, sorted_within_windows
from hf_lightning.data.sources import is_stream

log = logging.getLogger(__name__)

#: the values of ``data.layout`` (``HFDataModule``'s annotation says the same)
LayoutChoice = Literal["auto"] | None
#: attention implementations whose kernel attends within each document of a flat row (``cu_seq_lens`` from
#: ``position_ids``), so a padding-free row costs no more attention than its documents
VARLEN_ATTENTION = ("flash_attention_2", "flash_attention_3", "flash_attention_4")


@dataclass(frozen=True)
class Layout:
    """The batch layout of a run: the three ``HFDataModule`` settings and, for ``auto``, why."""

    group_by_length: bool
    packing: str | None
    padding_free: bool
    #: ``None``: ``data.layout`` is null; else what the log line says after the layout's name
    reason: str | None = None
    #: padding-free documents packed into rows per batch (:mod:`~hf_lightning.data.collators`)
    pack_batches: bool = False
    #: each accumulation window's documents sorted by length across its micro-batches
    #: (:class:`~hf_lightning.data.sampling.ExactDistributedSampler`'s ``window_lengths``)
    sort_windows: bool = False

    @property
    def name(self) -> str:
        if self.pack_batches:
            return "packed per batch"
        if self.sort_windows:
            return "padded, sorted within windows"
        if self.padding_free:
            return "padding-free" + (f" + packing={self.packing}" if self.packing else "")
        if self.packing:
            return f"packing={self.packing}"
        return "length-grouped" if self.group_by_length else "padded"

    def batch_collator(self, base: Any, pad_token_id: int, pad_to_multiple_of: int | None) -> Any:
        """The collator of training and evaluation batches: ``base`` (what ``collator_for`` built for the
        three settings) or, packed per batch, :class:`~hf_lightning.data.collators.BatchPackingCollator`
        (under ``sdpa`` / ``eager`` one flat row of an evaluation batch of ``B`` documents would cost about
        ``B`` times the attention of its rows)."""
        return BatchPackingCollator(pad_token_id, pad_to_multiple_of) if self.pack_batches else base


#: the value rule of ``data.layout`` (read from :class:`~hf_lightning.HFDataModule`'s signature)
LAYOUT = Allowed(
    lambda v: v in (None, "auto"),
    "auto (the fastest exact layout the data and model allow) or null (data.group_by_length, data.packing "
    "and data.padding_free as given)",
)


def cannot_flatten(model: Any, forward_kwargs: Mapping[str, Any] | None) -> str | None:
    """``None`` when ``model`` keeps the documents of one row apart, else why not (for the log).

    Cheapest first: no model, no ``position_ids``, a KV cache; then the probe forward.
    """
    if model is None:
        return "no model to probe (bind one, or let the trainer's LightningModule offer .model)"
    name = type(model).__name__
    if "position_ids" not in forward_parameters(model):
        return f"{name}.forward takes no position_ids, so it cannot keep the documents of one row apart"
    cache_on = getattr(getattr(model, "config", None), "use_cache", False)
    if cache_on and (forward_kwargs or {}).get("use_cache") is not False:
        return f"{name}.config.use_cache is true and the LightningModule does not pass use_cache=False"
    isolated = packed_sequences_isolated(model)
    if isolated is None:
        return f"{name}'s parameters are not materialised here, so its attention could not be probed"
    if not isolated:
        return (
            f"{name} with {attention_backend(model)!r} attention lets the documents of one row attend to "
            "each other (probed)"
        )
    return None


def choose_layout(
    layout: LayoutChoice,
    *,
    group_by_length: bool,
    packing: str | None,
    padding_free: bool,
    fmt: str,
    model: Any = None,
    forward_kwargs: Mapping[str, Any] | None = None,
    accumulation: int = 1,
    stream: bool = False,
) -> Layout:
    """The layout of a run: the hand-set keys, or for ``layout="auto"`` the rule of this module's docstring.

    Args:
        layout: ``"auto"`` or ``None`` (``data.layout``).
        group_by_length / packing / padding_free: the settings as given (``packing`` already a strategy).
        fmt: the data format; model / forward_kwargs: the bound model and what every forward gets.
        accumulation: micro-batches per optimizer step; stream: the training source is a stream.

    Returns:
        the :class:`Layout` (``reason`` says why ``auto`` took it; ``None`` when ``layout`` is ``None``).
    """
    if layout != "auto":
        return Layout(group_by_length, packing, padding_free)
    if group_by_length or packing or padding_free:
        return Layout(
            group_by_length, packing, padding_free, "as set by hand; auto chooses only when none is"
        )
    if fmt == "classification":
        return Layout(
            True, None, False, "one loss per example, so grouping by length keeps every example's weight"
        )
    if fmt not in CAUSAL_FORMATS:
        return _padded(
            f"no padding-free layout for the {fmt!r} format (causal-LM rows only)", accumulation, stream
        )
    why_not = cannot_flatten(model, forward_kwargs)
    if why_not is not None:
        return _padded(f"padding-free does not apply: {why_not}", accumulation, stream)
    attention = attention_backend(model)
    if attention in VARLEN_ATTENTION:
        return Layout(
            False, None, True, f"one flat row per batch, per-document positions, {attention} attention"
        )
    reason = (
        f"each batch's documents in the fewest rows of its longest one, per-document positions; under "
        f"{attention!r} attention one flat row would cost a dense (tokens x tokens) mask"
    )
    return Layout(False, None, True, reason, pack_batches=True)


def _padded(why: str, accumulation: int, stream: bool) -> Layout:
    """Padded rows, sorted within windows where a window holds several micro-batches of a map-style source."""
    if accumulation > 1 and not stream:
        return Layout(False, None, False, f"{why}; {accumulation} micro-batches per step", sort_windows=True)
    what = "a stream" if stream else "one micro-batch per step"
    return Layout(False, None, False, f"{why}; no window to sort ({what})")


def apply_layout(
    dm: Any,
    given: tuple[bool, str | None, bool],
    fmt: str,
    model: Any,
    forward_kwargs: Any,
    accumulation: int = 1,
    stream: bool = False,
) -> Layout:
    """Choose ``dm``'s layout (:func:`choose_layout` of ``dm.layout`` and the settings it was ``given``) and
    set its ``group_by_length``, ``packing`` and ``padding_free`` to it; called by ``HFDataModule.setup``.
    Packed per batch is padding-free for tokenization, the checks and evaluation; only the training collator
    differs."""
    group_by_length, packing, padding_free = given
    chosen = choose_layout(
        dm.layout,
        group_by_length=group_by_length,
        packing=packing,
        padding_free=padding_free,
        fmt=fmt,
        model=model,
        forward_kwargs=forward_kwargs,
        accumulation=accumulation,
        stream=stream,
    )
    dm.group_by_length, dm.packing, dm.padding_free = (
        chosen.group_by_length,
        chosen.packing,
        chosen.padding_free,
    )
    dm.sort_windows = chosen.sort_windows
    return chosen


def _share(batches: Any, row_slots: Any) -> float:
    real = slots = 0
    for batch in batches:
        real, slots = real + sum(batch), slots + row_slots(batch)
    return real / slots if slots else 1.0


def grouped_real_share(lengths: Sequence[int], batch_size: int, group_size: int, seed: int) -> float:
    """Real tokens / slots of one epoch of length-grouped padded batches of ``batch_size`` rows on one rank
    (:func:`~hf_lightning.data.sampling.length_grouped_indices` in groups of ``group_size``, seeded)."""
    order = length_grouped_indices(lengths, group_size, torch.Generator().manual_seed(seed))
    batches = [[lengths[i] for i in order[s : s + batch_size]] for s in range(0, len(order), batch_size)]
    return _share(batches, lambda b: len(b) * max(b))


def packed_real_share(lengths: Sequence[int], batch_size: int, seed: int | None) -> float:
    """Real tokens / slots of one epoch of per-batch packed rows on one rank (the seeded random order, or the
    dataset's order for ``seed=None``): each batch in rows as long as its longest document."""
    n = len(lengths)
    order = (
        list(range(n))
        if seed is None
        else torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    )
    batches = [[lengths[i] for i in order[s : s + batch_size]] for s in range(0, n, batch_size)]
    return _share(batches, lambda b: len(best_fit_decreasing(b, max(max(b), 1))) * max(max(b), 1))


def window_shares(
    lengths: Sequence[int], batch_size: int, accumulation: int, seed: int | None
) -> tuple[float, float]:
    """Real tokens / slots of one epoch of padded batches on one rank (the seeded random order, or the
    dataset's order for ``seed=None``): ``(sorted within windows of batch_size x accumulation, as they
    come)``."""
    n = len(lengths)
    order = (
        list(range(n))
        if seed is None
        else torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    )

    def share(indices: list[int]) -> float:
        batches = [[lengths[i] for i in indices[s : s + batch_size]] for s in range(0, n, batch_size)]
        return _share(batches, lambda b: len(b) * max(b))

    return share(sorted_within_windows(order, lengths, batch_size * accumulation)), share(order)


def announce(
    layout: Layout,
    dm: Any,
    lengths: Sequence[int] | None,
    accumulation: int,
    window_lengths: Sequence[int] | None = None,
) -> None:
    """The one start-of-run INFO line of ``data.layout=auto``: the layout, why, and the share of real slots
    (padding-free: all; packed per batch and length groups: one epoch on one rank, from the training lengths
    ``lengths`` when known; sorted within windows: from ``window_lengths``, what the windows are sorted
    by)."""
    if layout.reason is None:
        return
    share, ds, batch = "", dm.train_dataset, dm.per_device_train_batch_size
    if layout.padding_free and not layout.pack_batches:
        share = ": 100% of slots real"
    elif layout.pack_batches and ds is not None and not is_stream(ds):
        value = packed_real_share(sequence_lengths(ds), batch, dm.seed if dm.shuffle else None)
        share = f": {100.0 * value:.1f}% of slots real (epoch 1, one rank)"
    elif layout.group_by_length and lengths:
        value = grouped_real_share(lengths, batch, batch * accumulation, dm.seed)
        share = f": {100.0 * value:.1f}% of slots real (epoch 1, one rank)"
    elif layout.sort_windows and window_lengths:
        seed = dm.seed if dm.shuffle else None
        sorted_share, as_they_come = window_shares(window_lengths, batch, accumulation, seed)
        what = "source + target tokens" if dm.data_format == "seq2seq" else "tokens"
        share = (
            f": {100.0 * sorted_share:.1f}% of slots real, {100.0 * as_they_come:.1f}% unsorted "
            f"(epoch 1, one rank, {what})"
        )
    log.info("layout: %s (data.layout=auto; %s)%s", layout.name, layout.reason, share)


def document_column(fmt: str, columns: Sequence[str]) -> str | None:
    """The column by which pre-tokenized rows say where their documents start (``seq_lengths``, as
    ``trl.pack_dataset`` writes it, else ``position_ids``), ``None`` for rows of one document each."""
    if fmt != "tokenized":
        return None
    return next((c for c in DOCUMENT_COLUMNS if c in columns), None)


def check_documents_apart(
    column: str,
    path: Any,
    packing: str | None,
    model: Any = None,
    forward_kwargs: Mapping[str, Any] | None = None,
) -> None:
    """Rows that hold several documents each (their ``column``, :func:`document_column`) are batched with the
    documents kept apart, as TRL's padding-free collator keeps them: ``position_ids`` restarting at each
    document, no ``attention_mask`` (:class:`~hf_lightning.data.collators.PackedCollator`, or padding-free /
    packed per batch), each document's first token not a target. Said in one INFO line.

    Raises:
        ConfigError: ``data.packing`` (the rows are packed already: packing them again would lose where their
            documents start), or a model that cannot keep the documents of one row apart
            (:func:`cannot_flatten`; no model bound: not checked).
    """
    where = path if isinstance(path, (str, os.PathLike)) else "<in-memory dataset>"
    what = f"the rows of data.path={where} hold several documents each (their {column!r} column"
    what += ", as trl.pack_dataset writes it)" if column == SEQ_LENGTHS else ")"
    if packing:
        raise ConfigError(
            f"data.packing={packing}: {what}, so they are packed already, and packing them again would lose "
            "where their documents start; set data.packing=false"
        )
    why_not = cannot_flatten(model, forward_kwargs) if model is not None else None
    if why_not is not None:
        raise ConfigError(
            f"{what}, and they cannot be kept apart: {why_not}; use a model whose attention keeps them apart "
            "(a Llama-style causal LM under sdpa, eager or flash attention), or give one document per row"
        )
    log.info(
        "%s: batches keep them apart by position_ids restarting at each document (no attention_mask), "
        "each document's first token not a target",
        what,
    )


def collator_for(
    fmt: str,
    pad_token_id: int,
    model: Any = None,
    plan: RowPlan = UNPACKED,
    pad_to_multiple_of: int | None = None,
    documents: bool = False,
) -> Any:
    """The collator of a data format: classification, seq2seq, padding-free, packed rows, else padding.

    ``plan``: what the rows are (:class:`~hf_lightning.data.packing.RowPlan`). ``documents``: the rows hold
    several documents each (:func:`document_column`), padded per batch as packed rows are.
    """
    # pre-tokenized rows for a sequence classifier carry one class per row, not token labels
    if fmt == "classification" or (fmt == "tokenized" and is_sequence_classifier(model)):
        return ClassificationCollator(pad_token_id, pad_to_multiple_of)
    if fmt == "seq2seq":
        return Seq2SeqCollator(pad_token_id, model=model, pad_to_multiple_of=pad_to_multiple_of)
    if plan.padding_free:
        return PaddingFreeCollator()
    if plan.pack is not None or documents:
        return PackedCollator(pad_token_id, pad_to_multiple_of)
    return PaddingCollator(pad_token_id, pad_to_multiple_of=pad_to_multiple_of)
