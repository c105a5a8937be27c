"""A CSV logger shipped to spawned processes (``strategy=ddp_spawn``): each ``fit`` / ``test`` worker gets a
pickled copy of the main process's logger, whose writer has never seen the columns an earlier worker wrote.

lightning-hydra-template logs its hyperparameters in the main process before ``fit`` (that creates the writer
and fixes the version folder), then runs ``trainer.fit`` and ``trainer.test``, each in new processes. The test
worker's first row brings new columns, so the writer rewrites ``metrics.csv`` with the header it knows: only
the test columns. Lightning's writer then fails on the old rows ("dict contains fields not in fieldnames")
with the file already emptied.
"""

from __future__ import annotations

import csv
import pickle

import lightning as L
import pytest
from lightning.pytorch.loggers import CSVLogger

from hf_lightning import HFLightningModule
from hf_lightning.run.loggers import ResumableCSVLogger
from tests.data_support import tiny_llama


def spawned(logger):
    """What ``ddp_spawn`` hands a worker: the main process's logger, pickled and unpickled."""
    return pickle.loads(pickle.dumps(logger))


def module_logging_to(logger) -> HFLightningModule:
    module = HFLightningModule(tiny_llama())
    module.trainer = L.Trainer(
        accelerator="cpu", devices=1, logger=logger, enable_progress_bar=False, enable_model_summary=False
    )
    return module


@pytest.mark.parametrize("logger_cls", [CSVLogger, ResumableCSVLogger])
def test_the_test_workers_rows_join_the_fit_workers_rows(tmp_path, logger_cls):
    main = logger_cls(tmp_path, name="csv")
    main.log_hyperparams({"seed": 1})  # lightning-hydra-template's log_hyperparameters, before fit
    fit_worker = spawned(main)
    trainer_rows = module_logging_to(fit_worker)
    trainer_rows.log_to_loggers({"train/loss": 2.5, "lr": 0.1}, step=1)
    trainer_rows.log_to_loggers({"train/loss": 2.25, "lr": 0.1}, step=2)
    test_worker = spawned(main)
    module_logging_to(test_worker).log_to_loggers({"test/loss": 2.0}, step=2)

    with open(main.log_dir + "/metrics.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert rows == [
        {"lr": "0.1", "step": "1", "test/loss": "", "train/loss": "2.5"},
        {"lr": "0.1", "step": "2", "test/loss": "", "train/loss": "2.25"},
        {"lr": "", "step": "2", "test/loss": "2.0", "train/loss": ""},
    ]
