"""The tutorial model of docs/migration.md (GPT-2 from a config) against HF ``Trainer`` on the same rows.

HF ``Trainer`` decides whether labels are shifted from ``model.loss_type``; ``GPT2LMHeadModel`` has none,
so ``Trainer`` counts ``num_items_in_batch`` as every ``labels != -100`` (one target too many per row) while
the model's loss still compares logit ``t`` with label ``t + 1``. Its logged ``loss`` and ``eval_loss`` are
therefore the token sum over that larger count. hf_lightning divides by the real number of targets. With
dropout off, the trajectories are the same, so every HF number times ``counted / real targets`` is ours, step
by step: this checks the data order, the optimizer and schedule, and the claim in docs/migration.md at once.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("HF_LIGHTNING_SHARED_DATA", REPO / ".." / "shared" / "data"))
TEXTS = [
    "Q: What is the capital of France? A: Paris.",
    "Q: What colour is grass? A: Green.",
    "Q: How many legs does a spider have? A: Eight.",
    "Q: What do bees make? A: Honey.",
    "Q: Which planet is known as the red planet? A: Mars.",
    "Q: What is the largest ocean on Earth? A: The Pacific Ocean.",
    "Q: Who wrote Romeo and Juliet? A: William Shakespeare.",
    "Q: What is two plus two? A: Four.",
    "Q: What is the boiling point of water at sea level? A: One hundred degrees Celsius.",
    "Q: What gas do plants take in? A: Carbon dioxide.",
]
STEPS = 6


def test_hf_trainer_gpt2_loss_is_ours_times_its_count_ratio(tmp_path):
    path = SHARED / "gpt2-tokenizer" / "tokenizer.json"
    if not path.is_file():
        pytest.skip(f"{path} not found (set HF_LIGHTNING_SHARED_DATA)")
    import lightning as L
    import torch
    from datasets import Dataset
    from lightning.pytorch.loggers import CSVLogger
    from transformers import (
        DataCollatorForLanguageModeling,
        GPT2Config,
        GPT2LMHeadModel,
        PreTrainedTokenizerFast,
        Trainer,
        TrainingArguments,
        set_seed,
    )

    from hf_lightning import HFDataModule, HFLightningModule

    tok = PreTrainedTokenizerFast(
        tokenizer_file=str(path), eos_token="<|endoftext|>", pad_token="<|endoftext|>"
    )

    def gpt2():
        set_seed(42)
        config = GPT2Config(
            vocab_size=len(tok),
            n_positions=64,
            n_embd=32,
            n_layer=1,
            n_head=2,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            eos_token_id=tok.eos_token_id,
        )
        return GPT2LMHeadModel(config)

    rows = Dataset.from_dict({"text": TEXTS}).map(
        lambda b: tok(b["text"], truncation=True, max_length=64), batched=True, remove_columns=["text"]
    )
    val = rows.select(range(4))
    counts: list[tuple[int, int]] = []  # (what HF counts, real targets) per training step

    class Recording(Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            if model.training:
                labels = inputs["labels"]
                counts.append((int((labels != -100).sum()), int((labels[:, 1:] != -100).sum())))
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    hf = Recording(
        model=gpt2(),
        args=TrainingArguments(
            output_dir=str(tmp_path / "hf"),
            max_steps=STEPS,
            per_device_train_batch_size=4,
            learning_rate=5e-3,
            logging_steps=1,
            report_to="none",
            save_strategy="no",
            seed=42,
            use_cpu=True,
            disable_tqdm=True,
        ),
        train_dataset=rows,
        data_collator=DataCollatorForLanguageModeling(tok, mlm=False),
    )
    hf.train()
    hf_losses = [r["loss"] for r in hf.state.log_history if "loss" in r]
    hf_eval = hf.evaluate(eval_dataset=val)["eval_loss"]

    L.seed_everything(42)
    module = HFLightningModule(
        gpt2(),
        tok,
        optim={"name": "adamw", "lr": 5e-3, "weight_decay": 0.0},
        scheduler={"name": "linear", "warmup_steps": 0},
        max_grad_norm=1.0,
    )
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=STEPS,
        log_every_n_steps=1,
        limit_val_batches=0,
        logger=CSVLogger(tmp_path, name="ours", version=""),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=False,
    )
    trainer.fit(
        module,
        datamodule=HFDataModule(
            tok, path=rows, validation_split=0.0, per_device_train_batch_size=4, max_length=64, seed=42
        ),
    )
    with open(tmp_path / "ours" / "metrics.csv") as fh:
        ours = [float(r["train/loss"]) for r in csv.DictReader(fh) if r.get("train/loss")]

    assert len(counts) == len(hf_losses) == len(ours) == STEPS
    assert all(counted > real for counted, real in counts)  # one extra "target" per row
    expected = [loss * counted / real for loss, (counted, real) in zip(hf_losses, counts)]
    assert ours == pytest.approx(expected, rel=2e-5)
    assert ours[-1] < ours[0] - 0.5  # it trained: the comparison is not between two idle runs

    # evaluation: the same count, on the model both runs reached
    evaluation = L.Trainer(
        accelerator="cpu", logger=False, enable_progress_bar=False, use_distributed_sampler=False
    )
    evaluation.validate(
        module,
        datamodule=HFDataModule(
            tok, path=rows, validation_path=val, per_device_eval_batch_size=8, max_length=64
        ),
    )
    counted = sum(len(x) for x in val["input_ids"])
    real = counted - len(val)
    assert float(evaluation.callback_metrics["val/loss"]) == pytest.approx(hf_eval * counted / real, rel=2e-5)
    # the same weights, up to float32 rounding (HF's gradient is scaled by its count, which clipping and AdamW
    # almost cancel)
    torch.testing.assert_close(
        module.model.transformer.wte.weight, hf.model.transformer.wte.weight, rtol=1e-4, atol=1e-5
    )
