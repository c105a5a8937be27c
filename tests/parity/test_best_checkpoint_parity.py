"""The validation of the final weights competes for ``checkpoints/best.ckpt`` like any other.

HF ``Trainer`` and ``train()`` run the same job side by side: one tiny Llama saved to a folder (both load it),
the same 30 text rows in order, AdamW, a linear schedule over 13 steps, clipping at 1.0, an evaluation every
10 steps on the same 8 rows. Step 13 is not an evaluation step, so each side validates the final weights once
more (HF: ``DefaultFlowCallback`` at ``max_steps``). HF picks its best model among all evaluations; ours must
pick the same step, and the two sides' validation losses must agree (the same job, not merely the same rule).
"""

from __future__ import annotations

import csv
import json
import random

import pytest
import torch

pytestmark = pytest.mark.slow

WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "while",
    "seven",
    "tired",
    "cats",
]
LR, STEPS, EVAL_EVERY = 3e-3, 13, 10


def write_rows(path, n, seed):
    rng = random.Random(seed)
    with open(path, "w") as fh:
        for _ in range(n):
            fh.write(json.dumps({"text": " ".join(rng.choices(WORDS, k=rng.randint(4, 20)))}) + "\n")
    return path


@pytest.fixture
def job(tmp_path, default_tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(default_tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        pad_token_id=default_tokenizer.pad_token_id,
    )
    folder = tmp_path / "model"
    LlamaForCausalLM(config).save_pretrained(folder)
    default_tokenizer.save_pretrained(folder)
    return folder, write_rows(tmp_path / "train.jsonl", 30, 0), write_rows(tmp_path / "val.jsonl", 8, 1)


def run_hf(folder, train_file, val_file, out):
    """HF ``Trainer``: its eval losses by step and the step of its best model."""
    import datasets
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        DataCollatorForLanguageModeling,
        Trainer,
        TrainingArguments,
    )

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="sdpa")

    def load(path):
        ds = datasets.load_dataset("json", data_files=str(path), split="train")
        return ds.map(lambda r: tokenizer(r["text"], truncation=True, max_length=64), remove_columns=["text"])

    args = TrainingArguments(
        output_dir=str(out),
        max_steps=STEPS,
        per_device_train_batch_size=2,
        per_device_eval_batch_size=8,
        learning_rate=LR,
        weight_decay=0.0,
        lr_scheduler_type="linear",
        warmup_steps=0,
        max_grad_norm=1.0,
        optim="adamw_torch",
        eval_strategy="steps",
        eval_steps=EVAL_EVERY,
        save_strategy="steps",
        save_steps=EVAL_EVERY,
        metric_for_best_model="eval_loss",
        train_sampling_strategy="sequential",
        report_to="none",
        use_cpu=True,
        seed=42,
        disable_tqdm=True,
        logging_steps=1,
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=load(train_file),
        eval_dataset=load(val_file),
        data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False),
    )
    trainer.train()
    evals = {h["step"]: h["eval_loss"] for h in trainer.state.log_history if "eval_loss" in h}
    return evals, trainer.state.best_global_step


def test_final_validation_competes_for_best_like_hf_trainer(job, compose_cfg, tmp_path):
    from hf_lightning.train import train

    folder, train_file, val_file = job
    hf_evals, hf_best = run_hf(folder, train_file, val_file, tmp_path / "hf")
    assert sorted(hf_evals) == [EVAL_EVERY, STEPS]  # HF validated the final weights too
    assert hf_best == STEPS and hf_evals[STEPS] < hf_evals[EVAL_EVERY]  # and kept them as its best

    cfg = compose_cfg(
        "+experiment=clm",
        f"model.name_or_path={folder}",
        f"data.path={train_file}",
        f"data.validation_path={val_file}",
        "data.shuffle=false",
        "data.max_length=64",
        "data.per_device_train_batch_size=2",
        "data.per_device_eval_batch_size=8",
        f"trainer.max_steps={STEPS}",
        "trainer.max_epochs=null",
        f"trainer.val_check_interval={EVAL_EVERY}",
        "trainer.check_val_every_n_epoch=null",
        "trainer.limit_val_batches=null",
        "module.max_grad_norm=1.0",
        f"optim.lr={LR}",
        "optim.weight_decay=0.0",
        "scheduler.name=linear",
        "scheduler.warmup_steps=0",
        "metric_for_best_model=eval_loss",
    )
    train(cfg)
    with open(tmp_path / "metrics.csv") as fh:
        ours = {int(r["step"]): float(r["val/loss"]) for r in csv.DictReader(fh) if r.get("val/loss")}
    assert sorted(ours) == [EVAL_EVERY, STEPS]
    for step in ours:  # the same job on both sides
        assert ours[step] == pytest.approx(hf_evals[step], rel=1e-4), step
    best = torch.load(tmp_path / "checkpoints" / "best.ckpt", map_location="cpu", weights_only=False)
    assert best["global_step"] == hf_best
