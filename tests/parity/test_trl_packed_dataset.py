"""A dataset packed by ``trl.pack_dataset`` (``bfd``: ``input_ids`` + ``seq_lengths``), trained by TRL's
``SFTTrainer`` (``padding_free=True``: each batch one flat row, positions restarting at each document) and by
ours, side by side: the same tiny Llama, the same rows in the same order, AdamW, a linear schedule, clipping
at 1.0, accumulation 2. Ours keeps ``seq_lengths`` (before, column pruning dropped it with a WARNING and the
documents of a row attended to each other) and gives the same loss at every step, in its padding-free layout
(TRL's) and in its default one (the packed rows padded per batch, no ``attention_mask``). fp32 on CPU,
relative 1e-5 at the first step (the same weights and rows: the per-document attention and loss; the
gradient against the documents run one by one), 1e-3 after.

Open: TRL's step-1 gradient norm (1.1194) differs by about 1e-3 relative from ours (1.1204) and from the
oracle of the documents run one by one through the HF model (1.1204, checked here), while the three step-1
losses agree to 1e-6; so TRL's later losses drift from ours by up to 1.4e-4 (step 3; compared at 1e-3). Not
explained yet (``gradient_checkpointing`` off, ``cu_seq_lens`` passed or not: the same).

The documents: 28 Alpaca records (``shared/data/alpaca-tiny``, the rendered ``text``) tokenized by the default
tokenizer, cut to 20..59 tokens so that a 96-token row holds several (12 rows: 3 whole windows).
"""

from __future__ import annotations

import csv
import itertools
import json

import pytest

from tests.parity.test_trl_lora import make_model

pytestmark = pytest.mark.slow

SEED, LR, MICRO, ACCUMULATION, ROW = 7, 5e-3, 2, 2, 96
TOL = 1e-5


def packed_rows(tokenizer, shared_data):
    import datasets

    trl = pytest.importorskip("trl")
    with open(f"{shared_data}/alpaca-tiny/alpaca_tiny.json") as fh:
        records = json.load(fh)[:28]
    docs = [tokenizer(r["text"])["input_ids"][: 20 + (7 * i) % 40] for i, r in enumerate(records)]
    return trl.pack_dataset(datasets.Dataset.from_dict({"input_ids": docs}), ROW, "bfd")


def run_trl(tokenizer, rows, tmp_path):
    from trl import SFTTrainer

    from tests.parity.trl_config import sft_config

    args = sft_config(tmp_path / "trl", MICRO, ACCUMULATION, LR, SEED, padding_free=True)
    trainer = SFTTrainer(
        model=make_model(len(tokenizer)), args=args, train_dataset=rows, processing_class=tokenizer
    )
    trainer.train()
    return [h["loss"] for h in trainer.state.log_history if "loss" in h], trainer.model


def run_ours(tokenizer, rows, tmp_path, padding_free):
    import lightning as L
    from lightning.pytorch.loggers import CSVLogger

    from hf_lightning import HFDataModule, HFLightningModule

    module = HFLightningModule(
        make_model(len(tokenizer)),
        tokenizer=tokenizer,
        optim={"name": "adamw", "lr": LR, "weight_decay": 0.0},
        scheduler={"name": "linear", "warmup_steps": 0},
        max_grad_norm=1.0,
    )
    data = HFDataModule(
        tokenizer,
        path=rows,
        validation_split=0.0,
        per_device_train_batch_size=MICRO,
        shuffle=False,
        max_length=ROW,
        gradient_accumulation_steps=ACCUMULATION,
        padding_free=padding_free,
    )
    logdir = tmp_path / f"ours-{padding_free}"
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        logger=CSVLogger(str(logdir), name="", version=""),
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        precision="32-true",
    )
    trainer.fit(module, datamodule=data)
    if "seq_lengths" in rows.column_names:
        assert data.train_dataset["seq_lengths"] == rows["seq_lengths"]
    with open(logdir / "metrics.csv") as fh:
        logged = [r for r in csv.DictReader(fh) if r.get("train/loss")]
    return [float(r["train/loss"]) for r in logged], float(logged[0]["grad_norm"])


def documents_one_by_one(tokenizer, rows):
    """The oracle of step 1: each document of the first window's 4 rows run alone through the HF model (its
    own loss with ``num_items_in_batch``, the window's target count), summed: ``(loss, gradient norm)``."""
    import torch

    model = make_model(len(tokenizer))
    docs = []
    for row in rows.select(range(MICRO * ACCUMULATION)):
        starts = [0, *itertools.accumulate(row["seq_lengths"])]
        docs += [row["input_ids"][a:b] for a, b in zip(starts, starts[1:])]
    count = sum(len(d) - 1 for d in docs)
    loss = 0.0
    for doc in docs:
        ids = torch.tensor([doc])
        out = model(input_ids=ids, labels=ids, num_items_in_batch=count, use_cache=False)
        out.loss.backward()
        loss += float(out.loss)
    return loss, float(torch.sqrt(sum(p.grad.pow(2).sum() for p in model.parameters())))


def test_trl_packed_dataset_trains_as_under_trl(default_tokenizer, shared_data, tmp_path):
    rows = packed_rows(default_tokenizer, shared_data)
    assert len(rows) >= 8 and all(len(s) > 1 for s in rows["seq_lengths"][:4])  # several documents a row
    trl_losses, trl_model = run_trl(default_tokenizer, rows, tmp_path)
    assert len(rows) == 12 and len(trl_losses) == 3
    loss, grad_norm = documents_one_by_one(default_tokenizer, rows)
    assert trl_losses[0] == pytest.approx(loss, rel=TOL)
    for padding_free in (True, False):
        losses, first_norm = run_ours(default_tokenizer, rows, tmp_path, padding_free)
        # step 1: the same weights and rows, so TRL's loss; and the gradient of the documents run alone
        assert losses[0] == pytest.approx(trl_losses[0], rel=TOL), padding_free
        assert first_norm == pytest.approx(grad_norm, rel=TOL), padding_free
        # the steps after: within 1e-3 of TRL's (see the module docstring)
        assert losses == pytest.approx(trl_losses, rel=1e-3), padding_free
    # before: seq_lengths pruned, every row one causal sequence, the documents attending to each other
    joined = rows.remove_columns("seq_lengths")
    losses, _ = run_ours(default_tokenizer, joined, tmp_path, False)
    assert abs(losses[0] - trl_losses[0]) > 10 * TOL * trl_losses[0]
    print("TRL losses", trl_losses)
