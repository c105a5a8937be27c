"""``HFDataModule.bind``: what the data needs from the model side, given once, with no trainer or
LightningModule."""

from __future__ import annotations

import datasets

from hf_lightning import HFDataModule
from hf_lightning.core.batch import MICRO_ITEMS_KEY, NUM_ITEMS_KEY, WINDOW_LENGTH_KEY
from tests.data_support import tiny_llama


def test_a_bound_model_prunes_and_a_bound_count_adds_the_window_keys(word_tokenizer):
    rows = {"input_ids": [[4, 5, 6], [7, 8], [9, 10, 11, 12]], "source_id": ["a", "b", "c"]}
    dm = HFDataModule(
        word_tokenizer,
        path=datasets.Dataset.from_dict(rows),
        validation_split=0.0,
        per_device_train_batch_size=3,
        shuffle=False,
    )
    # the targets of a causal LM: labels after the first position that are not -100 (2 + 1 + 3 here)
    dm.bind(
        tiny_llama(len(word_tokenizer)), count_loss_items=lambda b: int((b["labels"][:, 1:] != -100).sum())
    )
    dm.setup("fit")
    assert dm.dropped_columns["train"] == ["source_id"]  # not a LlamaForCausalLM.forward argument
    batch = next(iter(dm.train_dataloader()))
    assert sorted(k for k in batch if k not in (NUM_ITEMS_KEY, MICRO_ITEMS_KEY, WINDOW_LENGTH_KEY)) == [
        "attention_mask",
        "input_ids",
        "labels",
    ]
    assert (batch[NUM_ITEMS_KEY], batch[MICRO_ITEMS_KEY], batch[WINDOW_LENGTH_KEY]) == (6, 6, 1)


def test_without_bind_or_trainer_the_loader_is_plain(word_tokenizer):
    dm = HFDataModule(
        word_tokenizer, path=datasets.Dataset.from_dict({"input_ids": [[4, 5, 6]]}), validation_split=0.0
    )
    batch = next(iter(dm.train_dataloader()))
    assert NUM_ITEMS_KEY not in batch
