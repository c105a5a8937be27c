"""``lightning.Trainer.validate()`` / ``.test()`` return the metrics.

Lightning users read the list of dicts these calls return. HFLightningModule writes its evaluation metrics to
the loggers itself (at HF's step), so Lightning's own collection stayed empty and both calls returned
``[{}]``. Expected values: the token mean computed by hand from the table model (``hand_case.row_losses``),
and the row a plain Lightning ``CSVLogger`` received.
"""

from __future__ import annotations

import csv
import math

import datasets
import lightning as L
import pytest
from lightning.pytorch.loggers import CSVLogger

from hf_lightning import HFDataModule, HFLightningModule
from tests.data_support import PadOnly
from tests.unit.hand_case import TableLM, row_losses
from tests.unit.test_evaluation import ROWS


def _hand_metrics() -> dict[str, float]:
    per_row = [row_losses(r) for r in ROWS]
    loss = sum(map(sum, per_row)) / sum(map(len, per_row))
    correct = total = 0
    for r in ROWS:  # TableLM predicts its input token: argmax(W[a]) == a
        for i in range(1, len(r["input_ids"])):
            if r["labels"][i] != -100:
                total += 1
                correct += int(r["input_ids"][i - 1] == r["labels"][i])
    return {"loss": loss, "perplexity": math.exp(loss), "accuracy": correct / total}


def _logged_rows(folder) -> list[dict[str, str]]:
    (path,) = folder.rglob("metrics.csv")
    with open(path) as fh:
        return list(csv.DictReader(fh))


@pytest.mark.parametrize("stage", ["val", "test"])
def test_validate_and_test_return_the_logged_metrics(tmp_path, stage):
    ds = datasets.Dataset.from_list(ROWS)
    dm = HFDataModule(PadOnly(), path=ds, validation_path=ds, per_device_eval_batch_size=2)
    trainer = L.Trainer(
        accelerator="cpu",
        logger=CSVLogger(str(tmp_path)),
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    module = HFLightningModule(TableLM())
    if stage == "val":
        out = trainer.validate(module, datamodule=dm, verbose=False)
    else:
        dm.setup("test")
        out = trainer.test(module, dataloaders=dm.val_dataloader(), verbose=False)

    hand = _hand_metrics()
    assert len(out) == 1 and set(out[0]) == {f"{stage}/{k}" for k in hand}, out
    for key, value in hand.items():
        assert out[0][f"{stage}/{key}"] == pytest.approx(value, rel=1e-6), key
    # the same numbers the loggers received
    (row,) = [r for r in _logged_rows(tmp_path) if r.get(f"{stage}/loss")]
    assert {k: float(v) for k, v in row.items() if k.startswith(f"{stage}/") and v} == pytest.approx(
        out[0], rel=1e-6
    )
    assert int(row["step"]) == 0  # HF's step: no optimizer step was taken
