"""The test stage of a training run (lightning-hydra-template's ``train.py``: ``trainer.test`` after ``fit``).

When ``data.test_path`` or ``data.test_split_name`` is set, the train command

1. sets the test split up before ``fit`` (:func:`prepare_test_data`): the training split first, so that the
   test rows are prepared exactly as the validation rows (the same format, layout, pruning and checks), then
   the test split (``HFDataModule.setup("test")``). A missing file, an unsupported file type or columns that
   fit no format stop the command in one line, before a step is trained or a checkpoint written;
2. after ``fit``, tests the weights the run ends with (:func:`run_test_stage`): the final ones, or the best
   ones where ``load_best_model_at_end`` loaded them. Every rank takes part: the test split is shared out
   over the ranks as the validation split is (every example once, an empty rank evaluating a masked stand-in),
   and ``test/*`` is reduced over the ranks once. The values go to ``metrics.csv`` (at the final optimizer
   step) and to ``final_metrics.json``.

Neither key set: no test stage, nothing read.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)


def wants_test(datamodule: Any) -> bool:
    """Whether the run has a test stage: ``data.test_path`` or ``data.test_split_name`` is set."""
    return (
        getattr(datamodule, "test_path", None) is not None
        or getattr(datamodule, "test_split_name", None) is not None
    )


def prepare_test_data(datamodule: Any, module: Any) -> bool:
    """Set the training and test splits up before ``fit``; ``False`` when the run has no test stage.

    ``datamodule`` is bound to ``module`` (:meth:`HFDataModule.bind`, what ``fit`` would ask the module
    for), so the test rows are pruned and checked for its model. ``fit`` then finds the splits ready.

    Raises:
        DataError: the test source is missing, unreadable or of an unsupported type, its columns fit no
            format (or not the training split's), or a row is bad (named by its line).
        ConfigError: ``data.test_split_name`` names no split of ``data.path``.
    """
    if not wants_test(datamodule):
        return False
    datamodule.bind(**module.data_binding())
    datamodule.setup("fit")
    datamodule.setup("test")
    rows = datamodule.test_dataset
    size = f"{len(rows)} rows" if hasattr(rows, "__len__") else "a stream"
    log.info(
        "test: %s (%s), tested on the weights the run ends with, after training",
        size,
        datamodule.test_path
        if datamodule.test_path is not None
        else f"the {datamodule.test_split_name} split of {datamodule.path}",
    )
    return True


def run_test_stage(trainer: Any, module: Any, datamodule: Any) -> dict[str, float]:
    """``trainer.test`` on the weights ``module`` holds after ``fit``; the ``test/*`` values (empty when the
    run has no test stage, was stopped by a signal or interrupted).

    Call it on every rank (the test loop's metric sync is a collective)."""
    if datamodule.test_dataset is None or getattr(module, "preempted", False) or trainer.interrupted:
        return {}
    from hf_lightning.callbacks.load_best import LoadBestModel

    best = next((c for c in trainer.callbacks if isinstance(c, LoadBestModel)), None)
    loaded = best is not None and best.best_model_step not in (None, trainer.global_step)
    if trainer.is_global_zero:
        log.info(
            "testing the %s after training",
            f"best weights (step {best.best_model_step}, load_best_model_at_end)"
            if loaded
            else f"final weights (step {trainer.global_step})",
        )
    results = trainer.test(module, datamodule=datamodule, verbose=False)
    return {k: float(v) for k, v in (results[0] if results else {}).items() if k.startswith("test/")}
