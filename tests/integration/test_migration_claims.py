"""Claims of docs/migration.md that are about behaviour, not about config keys (those are in test_docs.py)."""

from __future__ import annotations

import datasets
import lightning as L
import torch

from hf_lightning import HFDataModule, HFLightningModule
from hf_lightning.data.collators import PaddingCollator
from tests.data_support import tiny_llama

TEXTS = [" ".join("abcdefghijklmnopqrstuvwxyz"[i % 8 : i % 8 + i % 5 + 3]) for i in range(10)]


class Record(L.Callback):
    def __init__(self) -> None:
        self.batches: list[dict] = []
        self.validated_at: list[int] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.batches.append(batch)

    def on_validation_end(self, trainer, pl_module):
        self.validated_at.append(trainer.global_step)


def fit(data, record, **trainer_args):
    module = HFLightningModule(tiny_llama(), optim={"name": "sgd", "lr": 0.1}, scheduler={"name": "constant"})
    trainer = L.Trainer(
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        use_distributed_sampler=False,
        callbacks=[record],
        **trainer_args,
    )
    trainer.fit(module, datamodule=data)
    return trainer


def test_eval_steps_is_val_check_interval(word_tokenizer):
    """HF ``eval_steps=3`` with ``gradient_accumulation_steps=2``: ``val_check_interval=3`` (each training
    batch is one optimizer step), and ``check_val_every_n_epoch=None`` lets the count run across epoch ends (4
    micro-batches, 2 steps per epoch here)."""
    data = HFDataModule(
        word_tokenizer,
        path=datasets.Dataset.from_dict({"text": TEXTS}),
        validation_split=0.2,
        per_device_train_batch_size=2,
        max_length=16,
        gradient_accumulation_steps=2,
    )
    record = Record()
    fit(data, record, max_steps=9, val_check_interval=3, check_val_every_n_epoch=None)
    assert record.validated_at == [3, 6, 9]


def test_a_collator_of_your_own_after_setup(word_tokenizer):
    """The documented workaround for HF's ``data_collator``: set it on the DataModule after ``setup``."""

    class FirstTwoMasked:
        """A user's collator: pads, then trains on nothing in the first two positions."""

        def __init__(self) -> None:
            self.pad = PaddingCollator(word_tokenizer.pad_token_id)

        def __call__(self, examples):
            batch = self.pad(examples)
            batch["labels"][:, :2] = -100
            return batch

    data = HFDataModule(
        word_tokenizer,
        path=datasets.Dataset.from_dict({"text": TEXTS}),
        validation_split=0.2,
        per_device_train_batch_size=4,
        max_length=16,
    )
    data.setup("fit")
    data.train_collator = data.eval_collator = FirstTwoMasked()
    record = Record()
    fit(data, record, max_steps=2)
    assert len(record.batches) == 2
    for window in record.batches:
        (batch,) = window.micro_batches
        assert torch.all(batch["labels"][:, :2] == -100)
        # still counted for the window: the loss stays HF's (causal targets are labels[:, 1:] != -100)
        assert window.num_items_in_batch == int((batch["labels"][:, 1:] != -100).sum())


def test_val_check_interval_counts_the_optimizer_steps_its_messages_name(word_tokenizer):
    """``trainer.val_check_interval=2`` under ``gradient_accumulation_steps=2`` validates after every second
    optimizer step (each training batch is a window of 2 micro-batches): the unit the schema's message and the
    README name."""
    from hf_lightning.config.schema import OVERLAY

    said = OVERLAY["trainer.val_check_interval"].text
    assert "an integer >= 1 (optimizer steps: each training batch is one;" in said
    data = HFDataModule(
        word_tokenizer,
        path=datasets.Dataset.from_dict({"text": TEXTS}),
        validation_split=0.2,
        per_device_train_batch_size=1,
        max_length=16,
        gradient_accumulation_steps=2,
    )
    record = Record()
    fit(data, record, max_steps=4, val_check_interval=2, check_val_every_n_epoch=None)
    assert record.validated_at == [2, 4]
