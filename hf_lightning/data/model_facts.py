"""What the data needs to know about the model: its input and label names (HF ``remove_unused_columns``).

HF ``Trainer`` keeps the ``forward`` parameters plus ``label``, ``label_ids`` and ``label_names`` and drops
the rest, logging the dropped columns at INFO (so most users never see it). Here the drop is logged once at
WARNING (:func:`~hf_lightning.data.tokenize.prune_dataset`,
:class:`~hf_lightning.data.column_pruning.PruneColumnsCollator`), and a dataset left with no model input is an
error that lists what was found (:func:`check_inputs_survive`), instead of an empty batch deep inside the
model.

Example: ``forward(input_ids, attention_mask, position_ids, labels)`` with columns
``input_ids, attention_mask, labels, label, text, id`` keeps ``input_ids, attention_mask, labels, label`` and
drops ``text, id``.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from hf_lightning.compat import unwrap_compiled
from hf_lightning.core.errors import DataError

log = logging.getLogger(__name__)

# HF's default collator accepts labels under these names too (``Trainer._set_signature_columns_if_needed``)
LABEL_COLUMNS = ("label", "label_ids")
# inputs that only qualify another input: a batch of these alone (an image model's ``attention_mask`` kept
# from text data) gives the model nothing to read
AUXILIARY_INPUTS = ("attention_mask", "token_type_ids", "position_ids", "decoder_attention_mask", "head_mask")


def unwrap_model(model: Any) -> Any:
    """The module whose ``forward`` defines the inputs: through ``torch.compile`` and PEFT wrappers."""
    model = unwrap_compiled(model)
    if hasattr(model, "get_base_model"):
        model = model.get_base_model()
    return model


def is_sequence_classifier(model: Any) -> bool:
    """A ``*ForSequenceClassification`` model (one class per row, not token labels)."""
    return model is not None and type(model).__name__.endswith("ForSequenceClassification")


def forward_parameters(model: Any) -> list[str]:
    """Parameter names of ``model.forward`` (``**kwargs`` and ``*args`` excluded)."""
    params = inspect.signature(unwrap_model(model).forward).parameters.values()
    return [p.name for p in params if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]


def find_label_names(model: Any) -> list[str]:
    """HF's ``transformers.utils.find_labels`` of the (unwrapped) model's class: ``forward`` parameters with
    ``label`` in their name, plus ``start_positions``/``end_positions`` for question answering; ``["labels"]``
    if none."""
    from transformers.utils import find_labels

    return find_labels(type(unwrap_model(model))) or ["labels"]


def signature_columns(model_input_names: Iterable[str], label_names: Iterable[str]) -> list[str]:
    """The columns pruning keeps: model inputs, then ``label``, ``label_ids`` and ``label_names``."""
    keep = list(dict.fromkeys(model_input_names))
    keep += [c for c in (*LABEL_COLUMNS, *label_names) if c not in keep]
    return keep


def check_inputs_survive(
    columns: Sequence[str],
    keep: Sequence[str],
    model_input_names: Sequence[str],
    where: str,
    inputs_from: str,
) -> None:
    inputs = [
        c
        for c in model_input_names
        if c in columns and c not in LABEL_COLUMNS and "label" not in c and c not in AUXILIARY_INPUTS
    ]
    if not inputs:
        raise DataError(
            f"{where}: no model input survives column pruning. Columns found: {sorted(columns)}; "
            f"model inputs ({inputs_from}): {list(model_input_names)}. Tokenize into one of those "
            "(usually input_ids), pass data.model_input_names, or set data.remove_unused_columns=false"
        )


@dataclass(frozen=True)
class Columns:
    """What column pruning keeps: ``keep`` (model inputs, then the label columns), ``inputs`` (the model's
    input names) and ``inputs_from`` (where those came from, for messages)."""

    keep: list[str]
    inputs: list[str]
    inputs_from: str


def resolve_columns(
    model: Any, model_input_names: Sequence[str] | None, label_names: Sequence[str], tokenizer: Any
) -> Columns:
    """:class:`Columns` of a model (or of ``model_input_names``, else the tokenizer's names) and
    ``label_names``."""
    inputs, inputs_from = resolve_model_inputs(model, model_input_names, tokenizer)
    return Columns(signature_columns(inputs, label_names), inputs, inputs_from)


def resolve_model_inputs(
    model: Any, model_input_names: Sequence[str] | None, tokenizer: Any
) -> tuple[list[str], str]:
    """``(model input names, where they came from)`` for pruning.

    In order: the explicit ``model_input_names``; the ``forward`` signature of ``model`` (the bound model);
    the tokenizer's ``model_input_names`` (what it produces; logged at
    WARNING because the model's real signature is unknown then).
    """
    if model_input_names is not None:
        return list(model_input_names), "data.model_input_names"
    if model is not None:
        return forward_parameters(model), f"{type(unwrap_model(model)).__name__}.forward"
    names = list(getattr(tokenizer, "model_input_names", None) or ["input_ids", "attention_mask"])
    log.warning(
        "no model to read forward() from (none bound: HFDataModule.bind(model), or a LightningModule with "
        "data_binding(); and data.model_input_names is not set): pruning columns to the tokenizer's "
        "model_input_names %s plus the label columns",
        names,
    )
    return names, "tokenizer.model_input_names"


@dataclass
class Binding:
    """What the data needs from the model side (see :meth:`HFDataModule.bind`)."""

    model: torch.nn.Module | None = None
    count_loss_items: Callable[[Mapping[str, Any]], int] | None = None
    forward_kwargs: dict[str, Any] = field(default_factory=dict)
    metrics: bool = False
    handles_placeholder_batches: bool = False
    steps_windows: bool = False


def binding_from_trainer(trainer: Any) -> Binding:
    """What ``trainer.lightning_module`` declares for the data: its ``data_binding()``, a mapping of
    :meth:`HFDataModule.bind`'s keyword arguments (:class:`~hf_lightning.HFLightningModule` has one). Nothing
    else of the module is read: a module without ``data_binding`` (or no trainer, no module) binds nothing."""
    module = getattr(trainer, "lightning_module", None) if trainer is not None else None
    declare = getattr(module, "data_binding", None)
    return make_binding(**declare()) if callable(declare) else Binding()


def make_binding(
    model: torch.nn.Module | None = None,
    *,
    count_loss_items: Callable[[Mapping[str, Any]], int] | None = None,
    forward_kwargs: Mapping[str, Any] | None = None,
    metrics: bool = False,
    handles_placeholder_batches: bool = False,
    steps_windows: bool = False,
) -> Binding:
    """A :class:`Binding` of :meth:`HFDataModule.bind`'s arguments (described there)."""
    return Binding(
        model,
        count_loss_items,
        dict(forward_kwargs or {}),
        bool(metrics),
        bool(handles_placeholder_batches),
        bool(steps_windows),
    )


class ModelBinding:
    """The :meth:`bind` half of :class:`~hf_lightning.data.datamodule.HFDataModule`: how the data learns
    what it needs from the model side."""

    _bound: Binding | None = None

    def bind(
        self,
        model: torch.nn.Module | None = None,
        *,
        count_loss_items: Callable[[Mapping[str, Any]], int] | None = None,
        forward_kwargs: Mapping[str, Any] | None = None,
        metrics: bool = False,
        handles_placeholder_batches: bool = False,
        steps_windows: bool = False,
    ) -> ModelBinding:
        """Tell the data what it needs from the model side; whoever builds both calls it once, before ``fit``.

        Args:
            model: the ``nn.Module`` the batches are for: its ``forward`` gives the input and label names
                (pruning), its embedding, position table and classes are checked against the data, and packed
                or padding-free rows need ``position_ids`` and an attention that keeps them apart.
            count_loss_items: ``batch -> int``, the loss's target count of a micro-batch
                (:func:`hf_lightning.module.loss.count_loss_items`, which
                :meth:`HFLightningModule.count_loss_items` calls); with it training batches carry the window
                keys (``num_items_in_batch``...), and a module whose first ``training_step`` does not read
                ``num_items_in_batch`` gets one WARNING when a window spans micro-batches or processes
                (:class:`~hf_lightning.data.sampling.CountUse`).
            forward_kwargs: what the LightningModule passes to every forward (``use_cache=False``).
            metrics: evaluation computes metrics, so an evaluation batch must carry a label key.
            handles_placeholder_batches: mark an empty rank's stand-in batch
            (:class:`~hf_lightning.data.collators.PlaceholderAwareCollator`).
            steps_windows: the module's ``training_step`` takes one
                :class:`~hf_lightning.core.batch.Window` per optimizer step and steps it itself
                (:class:`HFLightningModule` does); otherwise training batches are micro-batches.

        Without a call, :meth:`setup` and the loaders ask the trainer's LightningModule, once per call, for
        these arguments through its ``data_binding()`` method, if it has one (:class:`HFLightningModule` does:
        ``trainer.fit(module, datamodule=dm)`` needs no call, and a config-only project neither). Nothing else
        of the module is read: a module of one's own without ``data_binding`` binds nothing (pruning then
        follows the tokenizer's input names, and batches carry no window count, each said in one WARNING).

        Returns:
            ``self``.
        """
        self._bound = make_binding(
            model,
            count_loss_items=count_loss_items,
            forward_kwargs=forward_kwargs,
            metrics=metrics,
            handles_placeholder_batches=handles_placeholder_batches,
            steps_windows=steps_windows,
        )
        return self

    def _binding(self) -> Binding:
        """The :meth:`bind` arguments, else what the trainer's LightningModule declares (its
        ``data_binding()``, read at each call)."""
        return (
            self._bound if self._bound is not None else binding_from_trainer(getattr(self, "trainer", None))
        )
