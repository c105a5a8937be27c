"""Proof 4: the three ways to define the loss get the right count; the fallback, its warning; empty windows.

Expected values are by hand from the bigram table of ``hand_case.py`` (rows with 3, 1, 2, 1 targets).
"""

from __future__ import annotations

import logging

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from hf_lightning import ConfigError, HFLightningModule
from hf_lightning.data.collators import PaddingCollator
from hf_lightning.data.sampling import WindowLoader
from tests.unit.hand_case import ROWS, TableLM, W, exact_loss, fallback_loss, fit, table_datamodule

LOGGER = "hf_lightning.module.lightning_module"


def sgd(lr: float = 0.0, **kw):
    """SGD without momentum; lr 0 by default so that every step's loss is computed from the table ``W``."""
    return {"optim": {"name": "sgd", "lr": lr}, "scheduler": {"name": "constant"}, **kw}


def ce_sum(outputs, labels):
    """A user's token loss, written out: sum of causal CE over the targets."""
    logits = outputs.logits[:, :-1]
    return F.cross_entropy(
        logits.reshape(-1, 2), labels[:, 1:].reshape(-1), ignore_index=-100, reduction="sum"
    )


# ------------------------------------------------------------------------------- compute_loss_func
def test_compute_loss_func_receives_the_window_count(tmp_path):
    seen = []

    def loss_func(outputs, labels, num_items_in_batch):
        seen.append(num_items_in_batch)
        return ce_sum(outputs, labels) / num_items_in_batch

    module = HFLightningModule(TableLM(), compute_loss_func=loss_func, **sgd())
    assert module.loss_source == "compute_loss_func"
    # micro-batch 1 x accumulation 2: windows (rows 0, 1: 3 + 1 targets) and (rows 2, 3: 2 + 1)
    rows = fit(module, table_datamodule(ROWS, 1), 2, tmp_path)
    assert seen == [4, 4, 3, 3]
    assert [float(r["train/loss"]) for r in rows] == pytest.approx(
        [exact_loss(ROWS[:2]), exact_loss(ROWS[2:])]
    )


def test_compute_loss_func_without_the_count_is_hf_fallback_with_one_warning(tmp_path, caplog):
    def mean_loss(outputs, labels):  # no num_items_in_batch: a per-micro-batch mean
        return ce_sum(outputs, labels) / (labels[:, 1:] != -100).sum()

    module = HFLightningModule(TableLM(), compute_loss_func=mean_loss, **sgd())
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        rows = fit(module, table_datamodule(ROWS, 1), 2, tmp_path)
    expected = [fallback_loss([ROWS[0:1], ROWS[1:2]]), fallback_loss([ROWS[2:3], ROWS[3:4]])]
    assert [float(r["train/loss"]) for r in rows] == pytest.approx(expected)
    assert expected[0] != pytest.approx(exact_loss(ROWS[:2]), rel=1e-3)  # the fallback is biased here
    warnings = [r.getMessage() for r in caplog.records if "mean over each micro-batch" in r.getMessage()]
    assert len(warnings) == 1 and "compute_loss_func has no num_items_in_batch parameter" in warnings[0]


def test_compute_loss_func_taking_only_kwargs_is_not_trusted_with_the_count():
    def loss_func(outputs, labels, **kwargs):
        return ce_sum(outputs, labels)

    assert HFLightningModule(TableLM(), compute_loss_func=loss_func).loss_is_share is False


# ------------------------------------------------------------------------------- compute_loss override
class SumOverCount(HFLightningModule):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[int] = []

    def compute_loss(self, batch, num_items_in_batch):
        self.seen.append(num_items_in_batch)
        outputs = self(batch)
        return ce_sum(outputs, batch["labels"]) / num_items_in_batch, outputs


def test_compute_loss_override_receives_the_window_count(tmp_path):
    module = SumOverCount(TableLM(), **sgd())
    assert module.loss_source == "compute_loss"
    rows = fit(module, table_datamodule(ROWS, 2), 2, tmp_path)  # one window of 2 micro-batches, 7 targets
    assert module.seen == [7, 7]
    assert [float(r["train/loss"]) for r in rows] == pytest.approx([exact_loss(ROWS)])


# ------------------------------------------------------------------------------- the model's own loss
class KwargsTableLM(TableLM):
    """HF's footgun: ``**kwargs`` in forward, yet the loss is a per-batch mean that ignores the count."""

    def __init__(self) -> None:
        super().__init__()
        self.kwargs_seen: list[set] = []

    def forward(self, input_ids, attention_mask=None, labels=None, **kwargs):
        self.kwargs_seen.append(set(kwargs))
        out = super().forward(input_ids)
        if labels is not None:
            out.loss = ce_sum(out, labels) / (labels[:, 1:] != -100).sum()
        return out


class DeclaredTableLM(TableLM):
    """Declared to honour the count: its loss is sum / num_items_in_batch."""

    accepts_loss_kwargs = True

    def __init__(self) -> None:
        super().__init__()
        self.counts_seen: list = []

    def forward(self, input_ids, attention_mask=None, labels=None, num_items_in_batch=None):
        self.counts_seen.append(num_items_in_batch)
        out = super().forward(input_ids)
        if labels is not None:
            out.loss = ce_sum(out, labels) / num_items_in_batch
        return out


def test_a_declared_model_gets_the_count_and_its_loss_is_used(tmp_path):
    model = DeclaredTableLM()
    module = HFLightningModule(model, **sgd())
    assert module.loss_source == "model" and module.model_accepts_loss_kwargs
    rows = fit(module, table_datamodule(ROWS, 1), 4, tmp_path)
    assert model.counts_seen == [7, 7, 7, 7]
    assert [float(r["train/loss"]) for r in rows] == pytest.approx([exact_loss(ROWS)])


def test_kwargs_in_forward_is_not_a_declaration(tmp_path, caplog):
    model = KwargsTableLM()
    assert HFLightningModule(model).loss_source == "token_cross_entropy"  # default: our loss from the logits
    module = HFLightningModule(model, use_model_loss=True, **sgd())
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        rows = fit(module, table_datamodule(ROWS, 2), 2, tmp_path)
    assert all("num_items_in_batch" not in kw for kw in model.kwargs_seen)
    # HF would pass the count, the model would ignore it, and the step would be 2x too large (HF's bug);
    # here the model's mean is divided by the window length, HF's fallback, with a warning
    assert [float(r["train/loss"]) for r in rows] == pytest.approx([fallback_loss([ROWS[:2], ROWS[2:]])])
    assert sum("is not declared to honour num_items_in_batch" in r.getMessage() for r in caplog.records) == 1


def test_a_real_llama_is_not_declared_although_its_forward_takes_kwargs():
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=32,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
        )
    )
    module = HFLightningModule(model)
    assert not module.model_accepts_loss_kwargs and module.loss_source == "token_cross_entropy"
    assert module.causal  # HF's rule: loss_type ForCausalLM
    assert HFLightningModule(model, model_accepts_loss_kwargs=True).loss_source == "model"


# ------------------------------------------------------------------------------- label smoothing
@pytest.mark.parametrize("micro_batch,accumulation", [(4, 1), (2, 2), (1, 4)])
def test_label_smoothing_honours_the_window_count(tmp_path, micro_batch, accumulation):
    module = HFLightningModule(TableLM(), label_smoothing_factor=0.1, **sgd())
    rows = fit(module, table_datamodule(ROWS, micro_batch), accumulation, tmp_path)
    assert [float(r["train/loss"]) for r in rows] == pytest.approx([exact_loss(ROWS, eps=0.1)], rel=1e-6)
    assert exact_loss(ROWS, eps=0.1) != pytest.approx(exact_loss(ROWS), rel=1e-3)


# ------------------------------------------------------------------------------- a window without targets
class WindowedRows(L.LightningDataModule):
    """Rows as they are (HFDataModule would drop rows without targets), in accumulation windows."""

    def __init__(self, rows, micro_batch: int) -> None:
        super().__init__()
        self.rows, self.micro_batch = rows, micro_batch
        self.gradient_accumulation_steps = 1

    def train_dataloader(self):
        trainer = self.trainer
        loader = DataLoader(self.rows, batch_size=self.micro_batch, collate_fn=PaddingCollator(0))
        return WindowLoader(
            loader,
            self.gradient_accumulation_steps,
            trainer.lightning_module.count_loss_items,
            max_windows=lambda: trainer.num_training_batches,
        )


EMPTY = {"input_ids": [1, 0, 1, 0], "labels": [0, -100, -100, -100]}  # only position 0: no causal target


class RecordWeights(L.Callback):
    def __init__(self) -> None:
        self.weights, self.grads = [], []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.grads.append(pl_module.model.table.weight.grad.detach().clone())

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.weights.append(pl_module.model.table.weight.detach().clone())


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {
            "compute_loss_func": lambda outputs, labels: (
                ce_sum(outputs, labels) / (labels[:, 1:] != -100).sum()
            )
        },
    ],
    ids=["token_loss", "fallback_mean"],
)
def test_a_window_without_targets_has_zero_loss_and_zero_gradient(tmp_path, caplog, kwargs):
    rows = [ROWS[0], ROWS[1], EMPTY, EMPTY, ROWS[2], ROWS[3]]
    record = RecordWeights()
    module = HFLightningModule(TableLM(), **sgd(lr=1.0, **kwargs))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        logged = fit(module, WindowedRows(rows, 1), 2, tmp_path, callbacks=[record])
    losses = [float(r["train/loss"]) for r in logged]
    assert [int(r["step"]) for r in logged] == [1, 2, 3]
    assert losses[1] == 0.0 and all(torch.isfinite(torch.tensor(losses)))
    assert torch.equal(record.grads[1], torch.zeros(2, 2))
    assert torch.equal(record.weights[0], record.weights[1])  # SGD without momentum: step 2 moved nothing
    assert not torch.equal(torch.tensor(W), record.weights[0])  # step 1 did move
    messages = [r.getMessage() for r in caplog.records if "no label targets" in r.getMessage()]
    assert len(messages) == 1 and messages[0].startswith("optimizer step 2:")


# ------------------------------------------------------------------------------- bad arguments
@pytest.mark.parametrize(
    "kwargs,key",
    [
        ({"label_smoothing_factor": 1.0}, "module.label_smoothing_factor"),
        ({"label_smoothing_factor": 0.1, "compute_loss_func": ce_sum}, "module.label_smoothing_factor"),
        ({"label_smoothing_factor": 0.1, "use_model_loss": True}, "module.label_smoothing_factor"),
        ({"compute_loss_func": ce_sum, "use_model_loss": True}, "module.compute_loss_func"),
        ({"compute_loss_func": "not a function"}, "module.compute_loss_func"),
    ],
)
def test_conflicting_loss_arguments_are_refused(kwargs, key):
    with pytest.raises(ConfigError, match=key):
        HFLightningModule(TableLM(), **kwargs)


def test_a_model_loss_that_is_missing_is_an_error(tmp_path):
    from hf_lightning import ModelError

    class NoLoss(TableLM):
        def forward(self, input_ids, attention_mask=None, labels=None, num_items_in_batch=None):
            return super().forward(input_ids)

    module = HFLightningModule(NoLoss(), use_model_loss=True, model_accepts_loss_kwargs=True, **sgd())
    with pytest.raises(ModelError, match="returned no scalar loss"):
        module.compute_loss({"input_ids": torch.tensor([[0, 1]]), "labels": torch.tensor([[0, 1]])}, 1)


def test_no_window_count_is_hf_not_counted_path(tmp_path, caplog):
    """A plain DataLoader (no windows): each batch is a window of one micro-batch, normalised by its own
    count."""

    class Plain(L.LightningDataModule):
        def train_dataloader(self):
            return DataLoader(ROWS, batch_size=2, collate_fn=PaddingCollator(0))

    module = HFLightningModule(TableLM(), **sgd())
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        logged = fit(module, Plain(), 1, tmp_path, max_steps=1)
    assert [float(r["train/loss"]) for r in logged] == pytest.approx([fallback_loss([ROWS[:2]])])
    assert sum("carry no num_items_in_batch" in r.getMessage() for r in caplog.records) == 1


def test_tuple_outputs_are_read_by_position(tmp_path):
    class TupleLM(TableLM):
        def forward(self, input_ids, attention_mask=None):
            return (self.table(input_ids),)

    rows = fit(HFLightningModule(TupleLM(), **sgd()), table_datamodule(ROWS, 2), 2, tmp_path)
    assert [float(r["train/loss"]) for r in rows] == pytest.approx([exact_loss(ROWS)])


def test_compute_loss_func_from_the_config_is_a_dotted_path():
    from hf_lightning.config.instantiate import resolve_function

    assert resolve_function("tests.unit.hand_case.fallback_loss", "module.compute_loss_func") is fallback_loss
    with pytest.raises(ConfigError, match=r"module.compute_loss_func=nope.loss: not an importable function"):
        resolve_function("nope.loss", "module.compute_loss_func")
