"""Evaluation: exact token-weighted val/loss, HF-compatible metric hooks, order and shards."""

from __future__ import annotations

import math

import datasets
import lightning as L
import numpy as np
import pytest
import torch

from hf_lightning import HFDataModule, HFLightningModule
from hf_lightning.data.sampling import ExactDistributedSampler
from hf_lightning.module.eval_metrics import PredictionCollector, estimate_logits_bytes
from tests.data_support import PadOnly, tiny_llama
from tests.unit.test_loss_exactness import TableLM, row_losses

# 5 rows (not a multiple of the eval batch 2), causal targets 3, 1, 2, 1, 2
ROWS = [
    {"input_ids": [0, 1, 0, 1], "labels": [0, 1, 0, 1]},
    {"input_ids": [1, 1, 0, 0], "labels": [-100, -100, -100, 0]},
    {"input_ids": [1, 0, 1, 1], "labels": [-100, 0, 1, -100]},
    {"input_ids": [0, 0, 1, 0], "labels": [-100, -100, 1, -100]},
    {"input_ids": [1, 0, 0, 1], "labels": [-100, -100, 0, 1]},
]


def validate(module, rows, eval_batch=2, **dm_kwargs):
    dm = HFDataModule(
        PadOnly(),
        path=datasets.Dataset.from_list(rows),
        validation_path=datasets.Dataset.from_list(rows),
        per_device_eval_batch_size=eval_batch,
        **dm_kwargs,
    )
    trainer = L.Trainer(
        accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False
    )
    trainer.validate(module, datamodule=dm, verbose=False)
    return {k: float(v) for k, v in trainer.callback_metrics.items()}, trainer, dm


def test_val_loss_is_the_token_mean_over_the_whole_set():
    per_row = [row_losses(r) for r in ROWS]
    assert [len(x) for x in per_row] == [3, 1, 2, 1, 2]
    exact = sum(map(sum, per_row)) / 9
    metrics, _, _ = validate(HFLightningModule(TableLM()), ROWS)
    assert metrics["val/loss"] == pytest.approx(exact, rel=1e-6)
    assert metrics["val/perplexity"] == pytest.approx(math.exp(exact), rel=1e-6)
    # HF Trainer's eval_loss: per-batch token means, weighted by batch size -> differs on this set
    batches = [per_row[0:2], per_row[2:4], per_row[4:5]]
    hf_style = sum(len(b) * sum(map(sum, b)) / sum(map(len, b)) for b in batches) / 5
    assert abs(hf_style - exact) > 1e-3


def test_token_accuracy_uses_the_causal_shift():
    # TableLM predicts argmax(W[a]): token 0 -> 0, token 1 -> 1
    correct = total = 0
    for r in ROWS:
        for i in range(1, 4):
            if r["labels"][i] != -100:
                total += 1
                correct += int(r["input_ids"][i - 1] == r["labels"][i])
    metrics, _, _ = validate(HFLightningModule(TableLM()), ROWS)
    assert metrics["val/accuracy"] == pytest.approx(correct / total)


def _equal_target_rows(n=8, length=12, vocab=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (n, length), generator=g).tolist()
    return [{"input_ids": x, "labels": x} for x in ids]


def _hf_trainer(model, rows, tmp_path, **kwargs):
    from transformers import Trainer, TrainingArguments

    args = TrainingArguments(
        output_dir=str(tmp_path / "hf"),
        per_device_eval_batch_size=2,
        report_to=[],
        use_cpu=True,
        **kwargs.pop("args", {}),
    )
    ds = datasets.Dataset.from_list(rows)
    return Trainer(model=model, args=args, eval_dataset=ds, **kwargs)


def test_same_eval_loss_as_hf_trainer_when_batches_hold_equal_targets(tmp_path):
    rows = _equal_target_rows()
    hf = _hf_trainer(tiny_llama(vocab_size=64), rows, tmp_path).evaluate()
    ours, _, _ = validate(HFLightningModule(tiny_llama(vocab_size=64)), rows)
    assert ours["val/loss"] == pytest.approx(hf["eval_loss"], rel=1e-5)


def test_compute_metrics_with_argmax_preprocessing_matches_hf_trainer(tmp_path):
    rows = _equal_target_rows(n=7, seed=1)  # 7 rows: a ragged last batch
    rows[3] = {"input_ids": rows[3]["input_ids"][:7], "labels": rows[3]["labels"][:7]}  # a shorter row

    def preprocess(logits, labels):
        return logits.argmax(-1)

    seen = {}

    def compute_metrics(p):
        preds, labels = p.predictions, p.label_ids
        seen["shape"] = preds.shape
        mask = labels[:, 1:] != -100
        return {"accuracy": float((preds[:, :-1] == labels[:, 1:])[mask].mean()), "n": float(len(preds))}

    hf = _hf_trainer(
        tiny_llama(vocab_size=64),
        rows,
        tmp_path,
        compute_metrics=compute_metrics,
        preprocess_logits_for_metrics=preprocess,
        data_collator=lambda feats: _hf_pad(feats),
    ).evaluate()
    hf_shape = seen["shape"]
    module = HFLightningModule(
        tiny_llama(vocab_size=64), compute_metrics=compute_metrics, preprocess_logits_for_metrics=preprocess
    )
    ours, _, _ = validate(module, rows)
    assert seen["shape"] == hf_shape == (7, 12)
    assert ours["val/accuracy"] == pytest.approx(hf["eval_accuracy"], rel=1e-6)
    assert ours["val/n"] == hf["eval_n"] == 7


def _hf_pad(features):
    """Pad like our collator (labels -100 by position) so both sides see identical batches."""
    from hf_lightning.data.collators import PaddingCollator

    return PaddingCollator(0)(features)


def test_batch_eval_metrics_calls_per_batch_and_logs_the_last_result():
    calls = []

    def compute_metrics(p, compute_result):
        calls.append((len(p.predictions), compute_result))
        return {"batches": float(len(calls))}

    ours, _, _ = validate(
        HFLightningModule(TableLM(), compute_metrics=compute_metrics, batch_eval_metrics=True), ROWS
    )
    assert calls == [(2, False), (2, False), (1, True)]
    assert ours["val/batches"] == 3.0


def test_batch_eval_metrics_requires_compute_result():
    from hf_lightning.core.errors import ConfigError

    with pytest.raises(ConfigError, match="compute_result"):
        HFLightningModule(TableLM(), compute_metrics=lambda p: {}, batch_eval_metrics=True)


def test_prediction_order_is_dataset_order_even_with_shuffled_training():
    rows = ROWS
    module = HFLightningModule(TableLM())
    dm = HFDataModule(
        PadOnly(),
        path=datasets.Dataset.from_list(rows),
        validation_path=datasets.Dataset.from_list(rows),
        per_device_eval_batch_size=2,
        shuffle=True,
    )
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False)
    dm.setup("predict")
    out = [r for b in trainer.predict(module, dataloaders=dm.predict_dataloader()) for r in b]
    assert [o["label_ids"] for o in out] == [[t for t in r["labels"][1:] if t != -100] for r in rows]


def test_eval_shards_cover_every_example_once():
    for n in range(0, 12):
        for world in (1, 2, 3, 4):
            samplers = [
                ExactDistributedSampler(range(n), world, r, shuffle=False, top_up=False) for r in range(world)
            ]
            shards = [list(s) for s in samplers]
            # strided (what gather() undoes); a rank with no example gets one placeholder, ~0
            assert shards == [list(range(r, n, world)) or ([~0] if n else []) for r in range(world)]
            assert sorted(i for s in shards for i in s if i >= 0) == list(range(n))
            assert [len(s) for s in samplers] == [len(s) for s in shards]


def test_collector_pads_ragged_batches_with_minus_100_and_restores_order():
    # rank 0 holds rows 0, 2, 4; rank 1 holds rows 1, 3 (strided shards)
    r0, r1 = PredictionCollector(), PredictionCollector(eval_accumulation_steps=2)
    r0.add(torch.tensor([[1, 1], [3, 3]]), torch.tensor([[1, 1], [3, 3]]))
    r0.add(torch.tensor([[5, 5, 5]]), torch.tensor([[5, 5, 5]]))
    r1.add(torch.tensor([[2], [4]]), torch.tensor([[2], [4]]))
    parts = [r0.local_arrays(), r1.local_arrays()]  # what all_gather_object returns on every rank
    preds, _ = r0.gather(2, lambda obj: parts)
    expected = np.array([[1, 1, -100], [2, -100, -100], [3, 3, -100], [4, -100, -100], [5, 5, 5]])
    np.testing.assert_array_equal(preds, expected)


def test_logits_memory_estimate():
    assert estimate_logits_bytes(2000, 512, 32000, torch.float32) == 2000 * 512 * 32000 * 4  # ~131 GB


def test_classification_reports_example_accuracy_and_macro_f1():
    from transformers import LlamaConfig, LlamaForSequenceClassification

    torch.manual_seed(0)
    model = LlamaForSequenceClassification(
        LlamaConfig(
            vocab_size=32,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
            num_labels=3,
            pad_token_id=0,
        )
    ).eval()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 32, (9, 5), generator=g).tolist()
    rows = [{"input_ids": x, "labels": i % 3} for i, x in enumerate(ids)]
    with torch.no_grad():
        preds = [int(model(input_ids=torch.tensor([x])).logits.argmax(-1)) for x in ids]
    labels = [r["labels"] for r in rows]
    f1s = []
    for c in range(3):
        tp = sum(p == c and y == c for p, y in zip(preds, labels))
        fp = sum(p == c and y != c for p, y in zip(preds, labels))
        fn = sum(p != c and y == c for p, y in zip(preds, labels))
        f1s.append(0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn))
    metrics, _, _ = validate(HFLightningModule(model), rows, eval_batch=4, format="tokenized")
    assert metrics["val/accuracy"] == pytest.approx(sum(p == y for p, y in zip(preds, labels)) / 9)
    assert metrics["val/f1"] == pytest.approx(sum(f1s) / 3, abs=1e-6)
    assert "val/perplexity" not in metrics
