"""What the data needs to know about the model: its input and label names (HF ``remove_unused_columns``).

HF ``Trainer`` keeps the ``forward`` parameters plus ``label``, ``label_ids`` and ``label_names`` and drops the
rest, logging the dropped columns at INFO (so most users never see it). Here the drop is logged once at WARNING
(:func:`~hf_lightning.data.tokenize.prune_dataset`, :class:`~hf_lightning.data.collators.PruneColumnsCollator`),
and a dataset left with no model input is an error that lists what was found (:func:`check_inputs_survive`),
instead of an empty batch deep inside the model.

Example: ``forward(input_ids, attention_mask, position_ids, labels)`` with columns
``input_ids, attention_mask, labels, label, text, id`` keeps ``input_ids, attention_mask, labels, label`` and
drops ``text, id``.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Iterable, Sequence
from typing import Any

from hf_lightning.errors import DataError

log = logging.getLogger(__name__)

# HF's default collator accepts labels under these names too (``Trainer._set_signature_columns_if_needed``)
LABEL_COLUMNS = ("label", "label_ids")
# inputs that only qualify another input: a batch of these alone (an image model's ``attention_mask`` kept
# from text data) gives the model nothing to read
AUXILIARY_INPUTS = ("attention_mask", "token_type_ids", "position_ids", "decoder_attention_mask", "head_mask")


def unwrap_model(model: Any) -> Any:
    """The module whose ``forward`` defines the inputs: through ``torch.compile`` and PEFT wrappers."""
    model = getattr(model, "_orig_mod", model)
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
    """HF's ``transformers.utils.find_labels``: ``forward`` parameters with ``label`` in their name, plus
    ``start_positions``/``end_positions`` for question answering; ``["labels"]`` if none."""
    base = unwrap_model(model)
    params = forward_parameters(base)
    qa = "QuestionAnswering" in type(base).__name__
    names = [p for p in params if "label" in p or (qa and p in ("start_positions", "end_positions"))]
    return names or ["labels"]


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


def resolve_model_inputs(
    model: Any, model_input_names: Sequence[str] | None, tokenizer: Any
) -> tuple[list[str], str]:
    """``(model input names, where they came from)`` for pruning.

    In order: the explicit ``model_input_names``; the ``forward`` signature of ``model`` (the attached
    LightningModule's ``.model``); the tokenizer's ``model_input_names`` (what it produces; logged at
    WARNING because the model's real signature is unknown then).
    """
    if model_input_names is not None:
        return list(model_input_names), "data.model_input_names"
    if model is not None:
        return forward_parameters(model), f"{type(unwrap_model(model)).__name__}.forward"
    names = list(getattr(tokenizer, "model_input_names", None) or ["input_ids", "attention_mask"])
    log.warning(
        "no model to read forward() from (the LightningModule has no .model and data.model_input_names is "
        "not set): pruning columns to the tokenizer's model_input_names %s plus the label columns",
        names,
    )
    return names, "tokenizer.model_input_names"
