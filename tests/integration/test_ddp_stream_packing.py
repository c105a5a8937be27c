"""Two real gloo DDP processes x 2 DataLoader workers on a packed stream (``data.packing=bfd``) of 8 JSON
Lines files: every document is trained on exactly once in the epoch (found by content in the packed rows),
both ranks run the same number of steps, and the packed rows are split 1 in 4 over the readers (not by
shards)."""

from __future__ import annotations

import json
from collections import Counter

import lightning as L
import pytest

from hf_lightning import HFDataModule, HFLightningModule
from tests.data_support import make_word_tokenizer, tiny_llama
from tests.unit.test_stream_packing import stream_of, texts, token_ids, write_jsonl

pytestmark = [pytest.mark.slow, pytest.mark.distributed]


class Record(L.Callback):
    def __init__(self, folder) -> None:
        self.folder = folder
        self.docs: list[list[int]] = []
        self.rows = 0
        self.batches = 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        for micro in batch:  # a window of micro-batches (one here: no accumulation)
            self.batches += 1
            for ids, labels, pos in zip(micro["input_ids"], micro["labels"], micro["position_ids"]):
                if labels.eq(-100).all():  # a masked copy (the tail's top-up) has no target
                    continue
                self.rows += 1
                starts = pos.eq(0).nonzero().flatten().tolist() + [len(ids)]
                for a, b in zip(starts, starts[1:]):
                    if ids[a:b].ne(0).all():  # the padding tail is a segment of pad tokens
                        self.docs.append(ids[a:b].tolist())

    def on_train_end(self, trainer, pl_module):
        stream = trainer.train_dataloader.dataset
        path = self.folder / f"rank{trainer.global_rank}.json"
        path.write_text(
            json.dumps(
                {
                    "docs": self.docs,
                    "rows": self.rows,
                    "batches": self.batches,
                    "plan": stream.plan is not None,
                    "step": trainer.global_step,
                }
            )
        )


def test_two_ranks_two_workers_train_on_every_packed_document_once(tmp_path):
    rows_in = texts(53, seed=7)
    paths = write_jsonl(tmp_path, [{"text": t} for t in rows_in], files=8)
    data = HFDataModule(
        make_word_tokenizer(),
        path=stream_of(paths),
        validation_split=0.0,
        per_device_train_batch_size=2,
        num_workers=2,
        packing="bfd",
        pack_buffer=10,
        max_length=12,
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
    assert not ranks[0]["plan"] and not ranks[1]["plan"]  # split by packed rows, not by the 8 shards
    assert ranks[0]["batches"] == ranks[1]["batches"] == ranks[0]["step"] == ranks[1]["step"]  # in step
    seen = Counter(tuple(d) for rank in ranks for d in rank["docs"])
    assert seen == Counter(tuple(token_ids(t)) for t in rows_in)  # every document once, none twice
    # 4 readers of ceil(rows / 4) rows each, in batches of 2: at most one masked copy per reader
    packed = ranks[0]["rows"] + ranks[1]["rows"]
    per_reader = -(-packed // 4)
    assert ranks[0]["batches"] == 2 * -(-per_reader // 2)
