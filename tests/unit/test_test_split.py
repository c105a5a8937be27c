"""The DataModule's test data: ``trainer.test`` / ``trainer.predict`` with the DataModule alone.

lightning-hydra-template's ``train.py`` and ``eval.py`` call ``trainer.test(model=model, datamodule=dm)``;
without a ``test_dataloader`` Lightning stops with ``MisconfigurationException``. The expected numbers come
from the HF model run by hand on the rows as the tokenizer encodes them.
"""

from __future__ import annotations

import json

import datasets
import lightning as L
import pytest
import torch

from hf_lightning import ConfigError, DataError, HFDataModule, HFLightningModule
from tests.data_support import tiny_llama

TRAIN = ["a b c d", "e f g", "h i j k l", "m n", "o p q", "r s t u"]
TEST = ["c d e f g", "x y", "k l m"]


def write_jsonl(path, texts):
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return str(path)


def trainer() -> L.Trainer:
    return L.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )


def hand_test_loss(model, tokenizer, texts) -> float:
    """The token-weighted mean of the HF model's own per-row loss (a mean over each row's targets)."""
    total, count = 0.0, 0
    with torch.no_grad():
        for text in texts:
            ids = torch.tensor([tokenizer(text)["input_ids"]])
            n = ids.shape[1] - 1  # a causal LM predicts every token after the first
            total += float(model(input_ids=ids, labels=ids).loss) * n
            count += n
    return total / count


def test_trainer_test_reads_data_test_path(tmp_path, word_tokenizer):
    dm = HFDataModule(
        word_tokenizer,
        path=write_jsonl(tmp_path / "train.jsonl", TRAIN),
        test_path=write_jsonl(tmp_path / "test.jsonl", TEST),
        per_device_eval_batch_size=2,
        max_length=16,
    )
    model = tiny_llama(len(word_tokenizer))
    (out,) = trainer().test(HFLightningModule(model), datamodule=dm, verbose=False)

    assert dm.train_dataset is None  # an evaluation reads no train split
    rows = [ids for batch in dm.test_dataloader() for ids in batch["input_ids"].tolist()]
    assert [[i for i in r if i != word_tokenizer.pad_token_id] for r in rows] == [
        word_tokenizer(t)["input_ids"] for t in TEST
    ]  # the file's rows, in its order
    assert out["test/loss"] == pytest.approx(hand_test_loss(model.eval(), word_tokenizer, TEST), rel=1e-5)


def test_the_test_split_of_a_dataset_with_splits(word_tokenizer):
    splits = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"text": TRAIN}),
            "validation": datasets.Dataset.from_dict({"text": TRAIN[:2]}),
            "test": datasets.Dataset.from_dict({"text": TEST}),
            "heldout": datasets.Dataset.from_dict({"text": TEST[:1]}),
        }
    )
    dm = HFDataModule(word_tokenizer, path=splits, max_length=16)
    dm.setup("fit")
    dm.setup("test")  # after fit, as lightning-hydra-template's train.py runs it: the test split joins
    assert dm.test_dataset["input_ids"] == [word_tokenizer(t)["input_ids"] for t in TEST]
    assert dm.val_dataset["input_ids"] == [word_tokenizer(t)["input_ids"] for t in TRAIN[:2]]

    named = HFDataModule(word_tokenizer, path=splits, test_split_name="heldout", max_length=16)
    named.setup("test")
    assert named.test_dataset["input_ids"] == [word_tokenizer(TEST[0])["input_ids"]]

    with pytest.raises(DataError) as err:
        HFDataModule(word_tokenizer, path=splits, test_split_name="dev").setup("test")
    assert str(err.value) == (
        "data.test_split_name=dev: no such split in <in-memory dataset> (splits: ['train', 'validation', "
        "'test', 'heldout'])"
    )


def test_no_test_data_is_refused_naming_the_key(tmp_path, word_tokenizer):
    path = write_jsonl(tmp_path / "train.jsonl", TRAIN)
    dm = HFDataModule(word_tokenizer, path=path, max_length=16)
    with pytest.raises(ConfigError) as err:
        trainer().test(HFLightningModule(tiny_llama(len(word_tokenizer))), datamodule=dm, verbose=False)
    assert str(err.value) == (
        f"trainer.test needs test data, and there is none: data.path={path} has no splits. Set "
        "data.test_path (a file, folder or dataset, as data.path), or data.test_split_name to a split of "
        "data.path"
    )


def test_trainer_predict_with_the_datamodule_alone(tmp_path, word_tokenizer):
    """``predict`` reads the validation data, in its order, one prediction per example."""
    dm = HFDataModule(
        word_tokenizer,
        path=write_jsonl(tmp_path / "train.jsonl", TRAIN),
        validation_path=write_jsonl(tmp_path / "val.jsonl", TEST),
        per_device_eval_batch_size=2,
        max_length=16,
    )
    model = tiny_llama(len(word_tokenizer))
    batches = trainer().predict(HFLightningModule(model), datamodule=dm)
    predictions = [p for batch in batches for p in batch]
    with torch.no_grad():
        expected = [
            model.eval()(input_ids=torch.tensor([word_tokenizer(t)["input_ids"]])).logits[0, :-1].argmax(-1)
            for t in TEST
        ]
    assert [p["predicted_ids"] for p in predictions] == [e.tolist() for e in expected]
    assert [p["label_ids"] for p in predictions] == [word_tokenizer(t)["input_ids"][1:] for t in TEST]
