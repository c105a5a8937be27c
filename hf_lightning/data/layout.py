"""``data.layout=auto``: the fastest batch layout that keeps the loss exact, chosen once at setup and said in the log.

The layouts, and what each costs (``docs/benchmarks.md`` section 3 measures them side by side):

============== ============================================ ===============================================
layout         slots that are real                          loss of an optimizer step
============== ============================================ ===============================================
padded         the rows' tokens / (B x longest row)         the reference
padding-free   all: one flat row per batch, ``position_ids`` the same rows, the same loss (per-document
               restart per document                         attention, first token of each not a target)
length-grouped almost all: rows of similar length batched   the same definition; HF's mega-batch order
               together (HF ``group_by_length``)            changes which rows share a step
packed         almost all: documents share fixed rows       the same definition; a step holds more
                                                            documents, so the run has fewer steps
============== ============================================ ===============================================

``auto`` takes padding-free or length groups, whichever costs less for the model's attention:

1. **padding-free** (HF ``DataCollatorWithFlattening``) for a causal-LM format when the model's attention is a
   variable-length kernel (``flash_attention_*``: it reads the document boundaries from ``position_ids`` and
   attends within each document, ``sum(L_i**2)`` work) and the model keeps the documents of a row apart
   (``forward`` takes ``position_ids``, no KV cache, probed by
   :func:`~hf_lightning.data.checks.packed_sequences_isolated`). Exactly the padded loss, step for step.
2. **length-grouped** padded batches otherwise. Under ``sdpa`` or ``eager`` attention transformers computes a
   dense ``(T, T)`` mask over the flat row of ``T = sum(L_i)`` tokens: a batch of ``B`` documents does about ``B``
   times the attention work of its length-grouped rows, measured slower end to end on the default experiment
   (``docs/benchmarks.md`` section 3). Also for seq2seq and classification, which cannot be flattened, and a
   model that cannot keep documents apart; the line says which.

Packing is never chosen: it changes how many documents an optimizer step holds, so an experiment's learning rate,
batch size and step count would no longer mean what they say. A layout set by hand (``data.group_by_length``,
``data.packing``, ``data.padding_free``) wins over ``auto``. ``HFDataModule`` and ``conf/data/default.yaml`` default
to ``layout=null`` (those three keys as given); the shipped experiments set ``auto``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from hf_lightning.data.checks import packed_sequences_isolated
from hf_lightning.data.formats import CAUSAL_FORMATS
from hf_lightning.data.model_facts import forward_parameters
from hf_lightning.data.samplers import length_grouped_indices
from hf_lightning.errors import ConfigError

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

    @property
    def name(self) -> str:
        if self.padding_free:
            return "padding-free" + (f" + packing={self.packing}" if self.packing else "")
        if self.packing:
            return f"packing={self.packing}"
        return "length-grouped" if self.group_by_length else "padded"


def check_layout(layout: Any) -> None:
    """Refuse a ``data.layout`` other than ``auto`` or null.

    Raises:
        ConfigError: names the value and the two allowed ones.
    """
    if layout not in (None, "auto"):
        raise ConfigError(
            f"data.layout={layout!r}; expected auto (the fastest exact layout the data and model allow) or null "
            "(data.group_by_length, data.packing and data.padding_free as given)"
        )


def attention_of(model: Any) -> str | None:
    """The model's attention implementation (``config._attn_implementation``, a private transformers attribute,
    as :func:`hf_lightning.compat.attention_backend` reads it)."""
    return getattr(getattr(model, "config", None), "_attn_implementation", None)


def cannot_flatten(model: Any, forward_kwargs: Mapping[str, Any] | None) -> str | None:
    """``None`` when a padding-free row is the cheaper exact layout for ``model``, else why not (for the log).

    Cheapest first: no model, no ``position_ids``, a KV cache, a dense-mask attention; then the probe forward.
    """
    if model is None:
        return "no model to probe (bind one, or let the trainer's LightningModule offer .model)"
    name = type(model).__name__
    if "position_ids" not in forward_parameters(model):
        return f"{name}.forward takes no position_ids, so it cannot keep the documents of one row apart"
    cache_on = getattr(getattr(model, "config", None), "use_cache", False)
    if cache_on and (forward_kwargs or {}).get("use_cache") is not False:
        return f"{name}.config.use_cache is true and the LightningModule does not pass use_cache=False"
    attention = attention_of(model)
    if attention not in VARLEN_ATTENTION:
        return (
            f"under {attention!r} attention one flat row of T tokens costs a dense (T, T) mask, more than "
            "length-grouped rows (flash_attention_* models get padding-free)"
        )
    isolated = packed_sequences_isolated(model)
    if isolated is None:
        return f"{name}'s parameters are not materialised here, so its attention could not be probed"
    if not isolated:
        return (
            f"{name} with {attention!r} attention lets the documents of one row attend to each other (probed)"
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
) -> Layout:
    """The layout of a run: the hand-set keys, or for ``layout="auto"`` the rule of this module's docstring.

    Args:
        layout: ``"auto"`` or ``None`` (``data.layout``).
        group_by_length / packing / padding_free: the settings as given (``packing`` already a strategy).
        fmt: the data format; model / forward_kwargs: the bound model and what every forward gets.

    Returns:
        the :class:`Layout` (``reason`` says why ``auto`` took it; ``None`` when ``layout`` is ``None``).
    """
    if layout != "auto":
        return Layout(group_by_length, packing, padding_free)
    if group_by_length or packing or padding_free:
        return Layout(
            group_by_length, packing, padding_free, "as set by hand; auto chooses only when none is"
        )
    if fmt not in CAUSAL_FORMATS:
        return Layout(
            True, None, False, f"padding-free does not apply to the {fmt!r} format (causal-LM rows only)"
        )
    why_not = cannot_flatten(model, forward_kwargs)
    if why_not is not None:
        return Layout(True, None, False, f"padding-free does not apply: {why_not}")
    reason = f"one flat row per batch, per-document positions, {attention_of(model)} attention"
    return Layout(False, None, True, reason)


def apply_layout(dm: Any, fmt: str, model: Any, forward_kwargs: Mapping[str, Any] | None) -> Layout:
    """Choose ``dm``'s layout (:func:`choose_layout` of its ``layout`` and the settings it was given) and set its
    ``group_by_length``, ``packing`` and ``padding_free`` to it; called by ``HFDataModule.setup``."""
    group_by_length, packing, padding_free = dm._given_layout
    chosen = choose_layout(
        dm.layout,
        group_by_length=group_by_length,
        packing=packing,
        padding_free=padding_free,
        fmt=fmt,
        model=model,
        forward_kwargs=forward_kwargs,
    )
    dm.group_by_length, dm.packing, dm.padding_free = (
        chosen.group_by_length,
        chosen.packing,
        chosen.padding_free,
    )
    return chosen


def grouped_real_share(lengths: Sequence[int], batch_size: int, group_size: int, seed: int) -> float:
    """Real tokens / slots of one epoch of length-grouped padded batches of ``batch_size`` rows on one rank
    (:func:`~hf_lightning.data.samplers.length_grouped_indices` in groups of ``group_size``, seeded)."""
    order = length_grouped_indices(lengths, group_size, torch.Generator().manual_seed(seed))
    real = slots = 0
    for start in range(0, len(order), batch_size):
        batch = [lengths[i] for i in order[start : start + batch_size]]
        real, slots = real + sum(batch), slots + len(batch) * max(batch)
    return real / slots if slots else 1.0


def announce(layout: Layout, dm: Any) -> None:
    """The one start-of-run INFO line of ``data.layout=auto``: the layout, why, and the share of real slots
    (padding-free: all; length groups: one epoch on one rank, from the training lengths)."""
    if layout.reason is None:
        return
    share = ""
    if layout.padding_free:
        share = ": 100% of slots real"
    elif layout.group_by_length and dm._train_lengths:
        batch = dm.per_device_train_batch_size
        value = grouped_real_share(dm._train_lengths, batch, batch * dm._accumulation(), dm.seed)
        share = f": {100.0 * value:.1f}% of slots real (epoch 1, one rank)"
    log.info("layout: %s (data.layout=auto; %s)%s", layout.name, layout.reason, share)
