"""Two real gloo DDP processes x 2 DataLoader workers on a stream of 8 JSON Lines files:
each of the 4 readers reads its own files, every row is trained on exactly once in the epoch (by content), and
both ranks run the same number of steps (shorter readers end with masked copies)."""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L
import pytest

from hf_lightning import HFDataModule, HFLightningModule
from tests.data_support import make_word_tokenizer, tiny_llama
from tests.unit.test_stream_shards import FILE_ROWS, stream_of, write_files

pytestmark = [pytest.mark.slow, pytest.mark.distributed]


class Record(L.Callback):
    def __init__(self, folder) -> None:
        self.folder = folder
        self.rows: list[list[int]] = []
        self.batches = 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        for micro in batch:  # a window of micro-batches (one here: no accumulation)
            self.batches += 1
            for ids, labels in zip(micro["input_ids"], micro["labels"]):
                if labels.ne(-100).any():  # a masked copy has no target
                    self.rows.append(ids.tolist())

    def on_train_end(self, trainer, pl_module):
        plan = trainer.train_dataloader.dataset.plan
        path = self.folder / f"rank{trainer.global_rank}.json"
        path.write_text(
            json.dumps(
                {"rows": self.rows, "batches": self.batches, "readers": plan.readers if plan else None}
            )
        )


def test_two_ranks_two_workers_read_each_file_once_and_cover_every_row(tmp_path):
    paths = write_files(tmp_path)
    data = HFDataModule(
        make_word_tokenizer(),
        path=stream_of(paths),
        format="tokenized",
        validation_split=0.0,
        per_device_train_batch_size=2,
        num_workers=2,
        seed=4,
    )
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp_spawn",
        max_epochs=1,
        max_steps=100,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[Record(tmp_path)],
        default_root_dir=tmp_path,
    )
    module = HFLightningModule(
        tiny_llama().train(), optim={"name": "sgd", "lr": 0.01}, scheduler={"name": "constant"}
    )
    trainer.fit(module, datamodule=data)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert ranks[0]["readers"] == ranks[1]["readers"] == 4  # split by shards, 4 readers
    # the largest reader's share: 8 rows, 4 batches of 2 per worker, 2 workers per rank
    assert ranks[0]["batches"] == ranks[1]["batches"] == 8
    seen = sorted(r for rank in ranks for r in rank["rows"])
    expected = sorted(
        json.loads(line)["input_ids"] for p in paths for line in Path(p).read_text().splitlines()
    )
    assert len(expected) == sum(FILE_ROWS) and seen == expected  # every row once: no row missing, none twice
