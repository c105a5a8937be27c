"""The evaluation placeholder of a rank with no example adds nothing.

Two real processes are in ``tests/integration/test_ddp_small_validation.py``; here one process checks the
pieces: the sampler and the stream give an empty rank one masked copy, the collator marks it, and a
validation, test or prediction pass over real batches plus that placeholder gives what the real batches alone
give.
"""

from __future__ import annotations

import datasets
import lightning as L
import pytest
from torch.utils.data import DataLoader

from hf_lightning import HFLightningModule
from hf_lightning.core.batch import PLACEHOLDER_KEY
from hf_lightning.data.collators import PaddingCollator, PlaceholderAwareCollator
from hf_lightning.data.sampling import ExactDistributedSampler, PlaceholderRow, TopUpDataset
from hf_lightning.data.streams import ShardedStream
from tests.unit.hand_case import TableLM
from tests.unit.test_evaluation import ROWS


def test_an_empty_rank_gets_one_masked_placeholder():
    ds = datasets.Dataset.from_list(ROWS[:1])
    rank0, rank1 = (ExactDistributedSampler(ds, 2, r, shuffle=False, top_up=False) for r in (0, 1))
    assert (list(rank0), len(rank0), rank0.needs_top_up) == ([0], 1, False)
    assert (list(rank1), len(rank1), rank1.needs_top_up) == ([~0], 1, True)
    row = TopUpDataset(ds, placeholder=True)[~0]
    assert isinstance(row, PlaceholderRow)
    assert row["input_ids"] == ROWS[0]["input_ids"] and row["labels"] == [-100] * 4
    # training top-ups stay plain masked rows
    assert type(TopUpDataset(ds)[~0]) is dict


def test_a_stream_reader_without_rows_yields_one_placeholder():
    rows = [dict(r) for r in ROWS[:1]]
    got = [list(ShardedStream(rows, rank=r, world_size=2, top_up=False, split="validation")) for r in (0, 1)]
    assert got[0] == rows and not isinstance(got[0][0], PlaceholderRow)
    assert len(got[1]) == 1 and isinstance(got[1][0], PlaceholderRow)
    assert got[1][0]["labels"] == [-100] * 4


def test_the_collator_marks_placeholder_batches_only():
    collate = PlaceholderAwareCollator(PaddingCollator(0))
    assert PLACEHOLDER_KEY not in collate([ROWS[0]])
    batch = collate([PlaceholderRow(ROWS[0], labels=[-100] * 4)])
    assert batch[PLACEHOLDER_KEY] is True and (batch["labels"] == -100).all()


def _loader(rows, placeholder: bool) -> DataLoader:
    examples = list(rows) + ([PlaceholderRow(ROWS[0], labels=[-100] * 4)] if placeholder else [])
    return DataLoader(examples, batch_size=1, collate_fn=PlaceholderAwareCollator(PaddingCollator(0)))


@pytest.mark.parametrize("stage", ["validate", "test", "predict"])
def test_a_placeholder_batch_changes_no_result(stage):
    def compute_metrics(p):
        return {"n": float(len(p.predictions)), "first": float(p.label_ids[0][p.label_ids[0] != -100][0])}

    results = []
    for placeholder in (False, True):
        trainer = L.Trainer(
            accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False
        )
        module = HFLightningModule(TableLM(), compute_metrics=compute_metrics)
        loader = _loader(ROWS[:3], placeholder)
        assert len(loader) == 3 + placeholder  # the placeholder is a batch of its own
        results.append(
            getattr(trainer, stage)(
                module, dataloaders=loader, **({} if stage == "predict" else {"verbose": False})
            )
        )
    without, with_placeholder = results
    if stage == "predict":
        assert [r for b in with_placeholder for r in b] == [r for b in without for r in b]
        assert with_placeholder[-1] == []
    else:
        assert without[0][f"{'val' if stage == 'validate' else 'test'}/n"] == 3.0
        assert with_placeholder == [pytest.approx(without[0], rel=1e-7)]
