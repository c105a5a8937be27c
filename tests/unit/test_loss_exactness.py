"""The step loss is total token CE / total targets of the window, whatever the micro-batch split.

A two-class "model" whose logits are a lookup table of the input token makes every per-token loss
computable by hand: CE(a -> t) = log(exp(W[a,0]) + exp(W[a,1])) - W[a,t].
"""

from __future__ import annotations

import csv
import math
from types import SimpleNamespace

import datasets
import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger
from torch import nn
from transformers.modeling_outputs import CausalLMOutput

from hf_lightning import HFDataModule, HFLightningModule

W = [[2.0, 0.0], [0.0, 1.0]]
# causal targets per row: 3, 1, 2, 1 (labels[t] is predicted from input_ids[t-1])
ROWS = [
    {"input_ids": [0, 1, 0, 1], "labels": [0, 1, 0, 1]},
    {"input_ids": [1, 1, 0, 0], "labels": [-100, -100, -100, 0]},
    {"input_ids": [1, 0, 1, 1], "labels": [-100, 0, 1, -100]},
    {"input_ids": [0, 0, 1, 0], "labels": [-100, -100, 1, -100]},
]


def ce(a: int, t: int) -> float:
    return math.log(math.exp(W[a][0]) + math.exp(W[a][1])) - W[a][t]


def row_losses(row):
    ids, labels = row["input_ids"], row["labels"]
    return [ce(ids[i - 1], labels[i]) for i in range(1, len(ids)) if labels[i] != -100]


class TableLM(nn.Module):
    """logits[b, t] = W[input_ids[b, t]]: a bigram table with chosen values."""

    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Embedding(2, 2)
        with torch.no_grad():
            self.table.weight.copy_(torch.tensor(W))

    def forward(self, input_ids, attention_mask=None):
        return CausalLMOutput(logits=self.table(input_ids))


def run_one_step(tmp_path, micro_batch: int, accumulation: int):
    module = HFLightningModule(TableLM(), optim={"name": "sgd", "lr": 1.0}, scheduler={"name": "constant"})
    data = HFDataModule(
        SimpleNamespace(pad_token_id=0),
        path=datasets.Dataset.from_list(ROWS),
        validation_split=0.0,
        per_device_train_batch_size=micro_batch,
        shuffle=False,
    )
    logdir = tmp_path / f"mb{micro_batch}_acc{accumulation}"
    trainer = L.Trainer(
        accelerator="cpu", max_steps=1, accumulate_grad_batches=accumulation, logger=CSVLogger(logdir, name="", version=""),
        log_every_n_steps=1, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        limit_val_batches=0, num_sanity_val_steps=0, use_distributed_sampler=False, gradient_clip_val=None,
    )
    trainer.fit(module, datamodule=data)
    with open(logdir / "metrics.csv") as fh:
        rows = list(csv.DictReader(fh))
    losses = [float(r["train/loss"]) for r in rows if r.get("train/loss")]
    steps = [int(r["step"]) for r in rows if r.get("train/loss")]
    return losses, steps, module.model.table.weight.detach().clone()


def expected_gradient():
    """d(total CE / 7)/dW with plain autograd, no code from hf_lightning."""
    w = torch.tensor(W, requires_grad=True)
    total = 0.0
    for row in ROWS:
        ids, labels = row["input_ids"], row["labels"]
        for i in range(1, len(ids)):
            if labels[i] != -100:
                total = total - torch.log_softmax(w[ids[i - 1]], -1)[labels[i]]
    (total / 7).backward()
    return w.grad


@pytest.mark.parametrize("micro_batch,accumulation", [(4, 1), (2, 2), (1, 4)])
def test_step_loss_is_total_ce_over_total_targets(tmp_path, micro_batch, accumulation):
    per_row = [row_losses(r) for r in ROWS]
    assert [len(x) for x in per_row] == [3, 1, 2, 1]
    expected = sum(sum(x) for x in per_row) / 7
    losses, steps, weight = run_one_step(tmp_path, micro_batch, accumulation)
    assert steps == [1]  # the x-axis is optimizer steps done
    assert losses == pytest.approx([expected], rel=1e-6)
    # SGD with lr=1: the update is minus the gradient of the window loss
    torch.testing.assert_close(torch.tensor(W) - weight, expected_gradient(), rtol=1e-5, atol=1e-7)


def test_the_exact_loss_differs_from_mean_of_means_and_from_the_sum():
    per_row = [row_losses(r) for r in ROWS]
    exact = sum(sum(x) for x in per_row) / 7
    mb = [per_row[0] + per_row[1], per_row[2] + per_row[3]]  # micro-batches of 2 rows
    mean_of_means = sum(sum(x) / len(x) for x in mb) / 2
    sum_of_means = sum(sum(x) / len(x) for x in mb)
    assert abs(exact - mean_of_means) > 1e-3 and abs(exact - sum_of_means) > 1e-3
