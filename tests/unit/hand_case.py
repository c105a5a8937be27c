"""The hand case shared by the loss tests: a two-class bigram "model" whose every per-token loss is known.

``logits[b, t] = W[input_ids[b, t]]``, so CE(a -> t) = log(exp(W[a,0]) + exp(W[a,1])) - W[a,t]. The four rows
hold 3, 1, 2 and 1 causal targets (``labels[t]`` is predicted from ``input_ids[t-1]``).
"""

from __future__ import annotations

import csv
import math
from types import SimpleNamespace

import datasets
import lightning as L
import torch
from lightning.pytorch.loggers import CSVLogger
from torch import nn
from transformers.modeling_outputs import CausalLMOutput

W = [[2.0, 0.0], [0.0, 1.0]]
ROWS = [
    {"input_ids": [0, 1, 0, 1], "labels": [0, 1, 0, 1]},
    {"input_ids": [1, 1, 0, 0], "labels": [-100, -100, -100, 0]},
    {"input_ids": [1, 0, 1, 1], "labels": [-100, 0, 1, -100]},
    {"input_ids": [0, 0, 1, 0], "labels": [-100, -100, 1, -100]},
]


def ce(a: int, t: int, eps: float = 0.0) -> float:
    """Cross-entropy of target ``t`` after token ``a``; with ``eps``, HF's label-smoothed term."""
    logz = math.log(math.exp(W[a][0]) + math.exp(W[a][1]))
    nll = logz - W[a][t]
    uniform = sum(logz - w for w in W[a]) / len(W[a])
    return (1 - eps) * nll + eps * uniform


def row_losses(row, eps: float = 0.0) -> list[float]:
    ids, labels = row["input_ids"], row["labels"]
    return [ce(ids[i - 1], labels[i], eps) for i in range(1, len(ids)) if labels[i] != -100]


def exact_loss(rows, eps: float = 0.0) -> float:
    """Total CE over every target of ``rows`` / number of targets."""
    terms = [x for r in rows for x in row_losses(r, eps)]
    return sum(terms) / len(terms)


def fallback_loss(micro_batches) -> float:
    """HF's fallback: each micro-batch's token mean, divided by the number of micro-batches."""
    return sum(exact_loss(mb) for mb in micro_batches) / len(micro_batches)


class TableLM(nn.Module):
    """logits[b, t] = W[input_ids[b, t]]: a bigram table with chosen values."""

    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Embedding(2, 2)
        with torch.no_grad():
            self.table.weight.copy_(torch.tensor(W))

    def forward(self, input_ids, attention_mask=None):
        return CausalLMOutput(logits=self.table(input_ids))


def table_datamodule(rows, micro_batch: int):
    from hf_lightning import HFDataModule

    return HFDataModule(
        SimpleNamespace(pad_token_id=0),
        path=datasets.Dataset.from_list(rows),
        format="tokenized",
        validation_split=0.0,
        per_device_train_batch_size=micro_batch,
        shuffle=False,
    )


def fit(module, datamodule, accumulation: int, logdir, max_steps: int = -1, callbacks=()) -> list[dict]:
    """A real ``lightning.Trainer`` run (CPU, one process), windows of ``accumulation`` micro-batches, no
    clipping; returns the ``train/loss`` rows of metrics.csv."""
    datamodule.gradient_accumulation_steps = accumulation
    module.max_grad_norm = None
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=max_steps,
        max_epochs=1,
        logger=CSVLogger(logdir, name="", version=""),
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        use_distributed_sampler=False,
        callbacks=list(callbacks),
    )
    trainer.fit(module, datamodule=datamodule)
    with open(f"{logdir}/metrics.csv") as fh:
        return [r for r in csv.DictReader(fh) if r.get("train/loss")]
