"""Column pruning per example (HF ``remove_unused_columns``) for datasets that keep their columns: streams
and torch datasets, whose examples are filtered in the collator. A ``datasets.Dataset`` loses the same
columns once, up front (:func:`~hf_lightning.data.tokenize.prune_dataset`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hf_lightning.data.model_facts import check_inputs_survive

log = logging.getLogger(__name__)


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
            check_inputs_survive(
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


def prune_per_example(
    base: Callable[[list[Mapping[str, Any]]], Any],
    columns: Any,
    example: Mapping[str, Any] | None,
    split: str,
) -> PruneColumnsCollator:
    """``base`` behind a :class:`PruneColumnsCollator` of ``columns`` (a
    :class:`~hf_lightning.data.model_facts.Columns`), for datasets that keep their columns (streams, torch
    datasets).

    ``example``, the split's first, is checked at once, in the main process: the drop is logged once (not once
    per worker) and a dataset without model inputs fails at setup rather than in the first batch.

    Raises:
        DataError: ``example`` has no model input left.
    """
    collator = PruneColumnsCollator(base, columns.keep, columns.inputs, split, columns.inputs_from)
    if example is not None:
        collator.inspect(example)
    return collator
