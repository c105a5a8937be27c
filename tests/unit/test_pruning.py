"""Column pruning against the model's forward signature, label_names, and the metrics check."""

from __future__ import annotations

import logging

import datasets
import lightning as L
import pytest
import torch
from torch import nn
from transformers.modeling_outputs import CausalLMOutput

from hf_lightning import ConfigError, DataError, HFDataModule
from hf_lightning.data.tokenize import (
    PruneColumnsCollator,
    find_label_names,
    prune_dataset,
    signature_columns,
)


class Forward4(nn.Module):
    """forward(input_ids, attention_mask, position_ids, labels): the issue's example model."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(32, 4)

    def forward(self, input_ids, attention_mask=None, position_ids=None, labels=None):
        return CausalLMOutput(logits=self.emb(input_ids))


class Holder(L.LightningModule):
    """A module of one's own that declares what the data needs (HFDataModule.bind's arguments)."""

    def __init__(self, model, metrics=None) -> None:
        super().__init__()
        self.model = model
        self.metrics = metrics

    def data_binding(self):
        return {"model": self.model, "metrics": bool(self.metrics)}


ROWS = [
    {
        "input_ids": [4, 5, 6],
        "attention_mask": [1, 1, 1],
        "labels": [4, 5, 6],
        "label": 1,
        "text": "a b c",
        "id": 0,
    },
    {"input_ids": [7, 8], "attention_mask": [1, 1], "labels": [7, 8], "label": 0, "text": "d e", "id": 1},
]


def test_the_issue_example_keeps_four_columns_and_warns_once(caplog):
    keep = signature_columns(
        ["input_ids", "attention_mask", "position_ids", "labels"], find_label_names(Forward4())
    )
    ds = datasets.Dataset.from_list(ROWS)
    with caplog.at_level(logging.WARNING):
        pruned, dropped = prune_dataset(
            ds, keep, ["input_ids", "attention_mask", "position_ids", "labels"], "train"
        )
    assert pruned.column_names == ["input_ids", "attention_mask", "labels", "label"]
    assert dropped == ["text", "id"]
    assert caplog.text.count("columns ['text', 'id'] are not in") == 1
    assert [r.levelno for r in caplog.records] == [logging.WARNING]


def test_datamodule_reads_the_forward_signature_of_the_attached_model(word_tokenizer):
    dm = HFDataModule(
        word_tokenizer, path=datasets.Dataset.from_list(ROWS), validation_split=0.0, shuffle=False
    )
    dm.trainer = L.Trainer(accelerator="cpu", logger=False)
    dm.trainer.strategy.connect(Holder(Forward4()))
    dm.setup()
    assert dm.train_dataset.column_names == ["input_ids", "attention_mask", "labels", "label"]
    assert dm.dropped_columns == {"train": ["text", "id"]}
    assert dm.resolved_label_names == ["labels"]


def test_no_model_input_left_is_an_error_listing_columns_and_parameters():
    ds = datasets.Dataset.from_list([{"tokens": [1, 2], "text": "x"}])
    with pytest.raises(
        DataError, match=r"no model input survives.*\['text', 'tokens'\].*\['input_ids', 'attention_mask'\]"
    ):
        prune_dataset(ds, ["input_ids", "attention_mask", "label"], ["input_ids", "attention_mask"], "train")


def test_torch_dataset_is_pruned_per_example_by_the_collator(word_tokenizer, caplog):
    rows = [
        {"input_ids": torch.tensor([4, 5]), "source": "web", "idx": 3},
        {"input_ids": torch.tensor([6, 7]), "source": "x", "idx": 4},
    ]

    class Plain(torch.utils.data.Dataset):
        def __len__(self):
            return 2

        def __getitem__(self, i):
            return rows[i]

    with caplog.at_level(logging.WARNING):
        dm = HFDataModule(
            word_tokenizer,
            path=Plain(),
            validation_split=0.0,
            shuffle=False,
            model_input_names=["input_ids", "attention_mask"],
        )
        dm.setup()
        batches = list(dm.train_dataloader()) + list(dm.train_dataloader())
    assert dm.data_format == "tokenized"
    assert isinstance(dm.train_collator, PruneColumnsCollator)
    assert set(batches[0]) == {"input_ids", "attention_mask", "labels"}
    assert batches[0]["input_ids"].tolist() == [[4, 5], [6, 7]]
    assert dm.dropped_columns["train"] == ["source", "idx"]
    assert caplog.text.count("keys ['source', 'idx'] are not in data.model_input_names") == 1


def test_remove_unused_columns_false_keeps_everything(word_tokenizer):
    dm = HFDataModule(
        word_tokenizer,
        path=datasets.Dataset.from_list(ROWS),
        validation_split=0.0,
        shuffle=False,
        remove_unused_columns=False,
    )
    dm.setup()
    assert set(dm.train_dataset.column_names) == {
        "input_ids",
        "attention_mask",
        "labels",
        "label",
        "text",
        "id",
    }
    batch = next(iter(dm.train_dataloader()))
    assert batch["id"].tolist() == [0, 1] and "text" not in batch  # strings cannot be batched: announced


def test_label_names_default_to_forward_label_parameters():
    class QA(nn.Module):
        def forward(self, input_ids, start_positions=None, end_positions=None):
            pass

    QA.__name__ = "TinyForQuestionAnswering"
    assert find_label_names(QA()) == ["start_positions", "end_positions"]
    assert find_label_names(Forward4()) == ["labels"]


def test_metrics_without_a_resolvable_label_key_stop_at_setup(word_tokenizer):
    rows = [{"input_ids": [4, 5], "score": 1.0}, {"input_ids": [6, 7], "score": 0.0}]

    def run(label_names, metrics):
        dm = HFDataModule(
            word_tokenizer,
            path=datasets.Dataset.from_list(rows * 3),
            validation_split=0.3,
            label_names=label_names,
            model_input_names=["input_ids"],
        )
        dm.trainer = L.Trainer(accelerator="cpu", logger=False)
        dm.trainer.strategy.connect(Holder(Forward4(), metrics=metrics))
        dm.setup()
        return dm

    with pytest.raises(ConfigError, match=r"no label key resolves: data.label_names=\['target'\].*keys \["):
        run(["target"], metrics={"acc": object()})
    # without metrics too: a label key no batch holds is a setting nothing reads
    with pytest.raises(ConfigError, match=r"^data.label_names=\['target'\]: 'target' is neither a key"):
        run(["target"], metrics=None)
    assert run(["labels"], metrics={"acc": object()}).resolved_label_names == ["labels"]
