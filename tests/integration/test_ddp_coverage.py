"""Two real gloo DDP processes: every row trained on exactly once per epoch, the same step count on both ranks
(the tail is topped up with masked copies; unequal counts would hang DDP)."""

from __future__ import annotations

import json

import datasets
import lightning as L
import pytest

from hf_lightning import HFDataModule, HFLightningModule
from tests.data_support import make_word_tokenizer, tiny_llama

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

# 11 rows with distinct token sequences; 11 is odd, so one rank gets a masked top-up
TEXTS = [" ".join("abcdefghijklmnopqrstuvwxyz"[i : i + 2 + i % 3]) for i in range(11)]


class Record(L.Callback):
    def __init__(self, folder) -> None:
        self.folder = folder
        self.rows: list[list[int]] = []
        self.batches = 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        for micro in batch:  # a window of micro-batches (one here: no accumulation)
            self.batches += 1
            for ids, labels, mask in zip(micro["input_ids"], micro["labels"], micro["attention_mask"]):
                if labels[1:].ne(-100).any():  # a masked top-up has no target
                    self.rows.append(ids[mask.bool()].tolist())

    def on_train_end(self, trainer, pl_module):
        path = self.folder / f"rank{trainer.global_rank}.json"
        path.write_text(json.dumps({"rows": self.rows, "batches": self.batches, "step": trainer.global_step}))


@pytest.mark.parametrize("stream", [False, True], ids=["map_style", "stream"])
def test_two_ranks_cover_every_row_once(tmp_path, stream):
    tok = make_word_tokenizer()
    source = datasets.Dataset.from_dict({"text": TEXTS})
    if stream:
        source = source.to_iterable_dataset(num_shards=3)
    data = HFDataModule(tok, path=source, validation_split=0.0, per_device_train_batch_size=2, seed=4)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp_spawn",
        max_epochs=1,
        max_steps=50 if stream else -1,
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
    assert ranks[0]["batches"] == ranks[1]["batches"] == 3  # ceil(11 / 2) = 6 rows per rank, batches of 2
    seen = sorted(r for rank in ranks for r in rank["rows"])
    assert seen == sorted(tok(t)["input_ids"] for t in TEXTS)
