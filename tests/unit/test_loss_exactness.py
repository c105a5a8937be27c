"""Proof 1: the step loss is total token CE / total targets of the window, whatever the micro-batch split.

The hand case (``hand_case.py``): four rows with 3, 1, 2 and 1 targets whose per-token losses differ, so the
exact loss (total CE / 7) differs from the mean of micro-batch means and from their sum.
"""

from __future__ import annotations

import pytest
import torch

from hf_lightning import HFLightningModule
from tests.unit.hand_case import ROWS, TableLM, W, exact_loss, fit, row_losses, table_datamodule


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
    module = HFLightningModule(TableLM(), optim={"name": "sgd", "lr": 1.0}, scheduler={"name": "constant"})
    rows = fit(module, table_datamodule(ROWS, micro_batch), accumulation, tmp_path, max_steps=1)
    assert [int(r["step"]) for r in rows] == [1]  # the x-axis is optimizer steps done
    assert [float(r["train/loss"]) for r in rows] == pytest.approx([expected], rel=1e-6)
    # SGD with lr=1: the update is minus the gradient of the window loss
    weight = module.model.table.weight.detach()
    torch.testing.assert_close(torch.tensor(W) - weight, expected_gradient(), rtol=1e-5, atol=1e-7)


def test_the_exact_loss_differs_from_mean_of_means_and_from_the_sum():
    per_row = [row_losses(r) for r in ROWS]
    exact = exact_loss(ROWS)
    mb = [per_row[0] + per_row[1], per_row[2] + per_row[3]]  # micro-batches of 2 rows
    mean_of_means = sum(sum(x) / len(x) for x in mb) / 2
    sum_of_means = sum(sum(x) / len(x) for x in mb)
    assert abs(exact - mean_of_means) > 1e-3 and abs(exact - sum_of_means) > 1e-3


def test_a_shorter_last_window_is_normalised_by_its_own_count(tmp_path):
    # 4 rows, micro-batch 1, accumulation 3: windows (rows 0-2: 6 targets) and (row 3: 1 target)
    module = HFLightningModule(TableLM(), optim={"name": "sgd", "lr": 0.0}, scheduler={"name": "constant"})
    rows = fit(module, table_datamodule(ROWS, 1), 3, tmp_path)
    assert [int(r["step"]) for r in rows] == [1, 2]
    assert [float(r["train/loss"]) for r in rows] == pytest.approx(
        [exact_loss(ROWS[:3]), exact_loss(ROWS[3:])], rel=1e-6
    )


class NoHostReads(HFLightningModule):
    """Counts every read of a tensor's value on the host (``.item()``, ``int()``, ``bool()``, ...) made inside
    ``training_step``: on an accelerator each is a host-device sync, which the count on the host avoids."""

    READS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__")

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.host_reads: list[str] = []

    def training_step(self, batch, batch_idx):
        originals = {name: getattr(torch.Tensor, name) for name in self.READS}

        def spy(name):
            def read(tensor, *args):
                self.host_reads.append(name)
                return originals[name](tensor, *args)

            return read

        try:
            for name in self.READS:
                setattr(torch.Tensor, name, spy(name))
            return super().training_step(batch, batch_idx)
        finally:
            for name, fn in originals.items():
                setattr(torch.Tensor, name, fn)


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_training_step_never_reads_a_tensor_on_the_host(tmp_path, label_smoothing):
    module = NoHostReads(
        TableLM(),
        optim={"name": "sgd", "lr": 0.0},
        scheduler={"name": "constant"},
        label_smoothing_factor=label_smoothing,
    )
    rows = fit(module, table_datamodule(ROWS, 1), 2, tmp_path)
    assert len(rows) == 2 and module.host_reads == []


class ReadsOnce(NoHostReads):
    """The control: a training step that does read its loss on the host (once per micro-batch)."""

    def compute_loss(self, batch, num_items_in_batch):
        loss, outputs = super().compute_loss(batch, num_items_in_batch)
        loss.item()
        return loss, outputs


def test_the_host_read_spy_sees_a_read(tmp_path):
    module = ReadsOnce(TableLM(), optim={"name": "sgd", "lr": 0.0}, scheduler={"name": "constant"})
    fit(module, table_datamodule(ROWS, 1), 2, tmp_path)
    assert module.host_reads.count("item") == len(ROWS)  # one per micro-batch: batches of one row
