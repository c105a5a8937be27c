"""Every training batch is one window of micro-batches with its ``num_items_in_batch``, whatever the batching
mode."""

from __future__ import annotations

import datasets
import lightning as L
import pytest

from hf_lightning import HFDataModule, HFLightningModule
from hf_lightning.module.loss import count_loss_items
from tests.data_support import tiny_llama

TEXTS = [" ".join("abcdefghijklmnopqrstuvwxyz"[i % 9 : i % 9 + i % 6 + 2]) for i in range(26)]


class Record(L.Callback):
    def __init__(self) -> None:
        self.seen: list[tuple[int, int, set]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.seen.append(
            (batch.num_items_in_batch, [count_loss_items(m) for m in batch], set(batch.micro_batches[0]))
        )


@pytest.mark.parametrize(
    "options",
    [
        {"padding_free": True},
        {"packing": "bfd", "max_length": 12},
        {"packing": "wrapped", "max_length": 12},
        {"group_by_length": True},
        {"stream": True, "num_workers": 2},
        {"stream": True, "group_by_length": True},
    ],
    ids=["padding_free", "bfd", "wrapped", "group_by_length", "stream_workers", "stream_grouped"],
)
def test_window_count_is_attached_to_every_batch(word_tokenizer, tmp_path, options):
    options = dict(options)
    source = datasets.Dataset.from_dict({"text": TEXTS})
    if options.pop("stream", False):
        source = source.to_iterable_dataset(num_shards=2)
    data = HFDataModule(
        word_tokenizer,
        path=source,
        validation_split=0.0,
        per_device_train_batch_size=3,
        gradient_accumulation_steps=2,
        **options,
    )
    record = Record()
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=3,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[record],
        default_root_dir=tmp_path,
    )
    trainer.fit(
        HFLightningModule(
            tiny_llama().train(), optim={"name": "sgd", "lr": 0.01}, scheduler={"name": "constant"}
        ),
        datamodule=data,
    )
    assert len(record.seen) == 3 and trainer.global_step == 3
    for n, counts, _ in record.seen:
        assert len(counts) == 2 and n == sum(counts) and counts[0] > 0
    keys = record.seen[0][2]
    if options.get("padding_free") or options.get("packing"):
        assert "position_ids" in keys and "attention_mask" not in keys
