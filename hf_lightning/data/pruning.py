"""Column pruning against the model's ``forward`` signature (HF ``remove_unused_columns``).

HF ``Trainer`` keeps the ``forward`` parameters plus ``label``, ``label_ids`` and ``label_names`` and drops the
rest, logging the dropped columns at INFO (so most users never see it). Here the drop is logged once at
WARNING, and a dataset left with no model input is an error that lists what was found, instead of an empty
batch deep inside the model.

Example: ``forward(input_ids, attention_mask, position_ids, labels)`` with columns
``input_ids, attention_mask, labels, label, text, id`` keeps ``input_ids, attention_mask, labels, label`` and
drops ``text, id``.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import datasets

from hf_lightning.compat import unwrap_compiled
from hf_lightning.errors import DataError

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


def _check_inputs_survive(
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


def prune_dataset(
    ds: datasets.Dataset,
    keep: Sequence[str],
    model_input_names: Sequence[str],
    split: str,
    inputs_from: str = "the model inputs",
    consumed: Sequence[str] = (),
) -> tuple[datasets.Dataset, list[str]]:
    """Drop the columns of ``ds`` not in ``keep``; log them once at WARNING.

    ``consumed``: the source columns the data format has just tokenized (``text``, ``messages``, ...). Their drop
    is expected, so it is logged at INFO; any other dropped column is a WARNING (HF drops both silently).

    Returns:
        ``(pruned dataset, dropped column names)``.

    Raises:
        DataError: no column left that the model takes as input (lists columns and ``forward`` parameters).
    """
    dropped = [c for c in ds.column_names if c not in keep]
    _check_inputs_survive(ds.column_names, keep, model_input_names, f"{split} split", inputs_from)
    if dropped:
        tokenized = [c for c in dropped if c in consumed]
        others = [c for c in dropped if c not in consumed]
        if tokenized:
            log.info("%s: source columns %s were tokenized and are dropped", split, tokenized)
        if others:
            log.warning(
                "%s: columns %s are not in %s and are dropped (remove_unused_columns=true)",
                split,
                others,
                inputs_from,
            )
        ds = ds.remove_columns(dropped)
    return ds, dropped


class PruneColumnsCollator:
    """Collator wrapper that filters each example mapping to ``keep`` (HF's ``RemoveColumnsCollator``).

    For datasets whose columns cannot be removed up front (streams, plain torch datasets). The first batch
    that loses a key logs the dropped keys once at WARNING; :attr:`dropped` records them.

    Raises:
        DataError: an example with no model input left (lists keys and ``forward`` parameters).
    """

    def __init__(
        self,
        collator: Callable[[list[Mapping[str, Any]]], Any],
        keep: Sequence[str],
        model_input_names: Sequence[str],
        split: str = "train",
        inputs_from: str = "the model inputs",
    ) -> None:
        self.collator = collator
        self.keep = list(keep)
        self.model_input_names = list(model_input_names)
        self.split = split
        self.inputs_from = inputs_from
        self.dropped: list[str] = []
        self._checked = False

    def inspect(self, example: Mapping[str, Any]) -> None:
        """Check one example: raise if no model input survives, log keys dropped for the first time."""
        if not self._checked:
            _check_inputs_survive(
                list(example), self.keep, self.model_input_names, f"{self.split} examples", self.inputs_from
            )
            self._checked = True
        extra = [k for k in example if k not in self.keep and k not in self.dropped]
        if extra:
            self.dropped += extra
            log.warning(
                "%s: keys %s are not in %s and are dropped from every example (remove_unused_columns=true)",
                self.split,
                extra,
                self.inputs_from,
            )

    def __call__(self, examples: Sequence[Mapping[str, Any]]) -> Any:
        for ex in examples:
            self.inspect(ex)
        return self.collator([{k: v for k, v in ex.items() if k in self.keep} for ex in examples])


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
