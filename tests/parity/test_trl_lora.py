"""LoRA against TRL's ``SFTTrainer(peft_config=...)``, run side by side: the same tiny Llama, the same LoRA
config and init seed, the same rows in the same order, AdamW, a linear schedule, clipping at 1.0, accumulation
2.

TRL seeds with ``set_seed(args.seed)`` and then calls ``peft.get_peft_model``; ours runs ``get_peft_model``
under ``torch.manual_seed(peft.init_seed)``: with ``init_seed`` = TRL's seed the adapters start equal. Dropout
is off (each framework draws its masks from its own RNG stream). Checked: every logged step's loss and every
final adapter weight, fp32 on CPU, relative 1e-5.
"""

from __future__ import annotations

import csv

import pytest
import torch

pytestmark = pytest.mark.slow

SEED, LR, STEPS_ROWS, MICRO, ACCUMULATION = 7, 5e-3, 16, 2, 2
TOL = 1e-5


def make_model(vocab_size: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config).float()


def make_rows(tokenizer) -> list[dict]:
    """Rows of 5..40 tokens (unequal numbers of targets per micro-batch), labels = every token on both
    sides."""
    g = torch.Generator().manual_seed(1)
    rows = []
    for _ in range(STEPS_ROWS):
        n = int(torch.randint(5, 41, (1,), generator=g))
        rows.append({"input_ids": torch.randint(10, len(tokenizer), (n,), generator=g).tolist()})
    return rows


def lora_config():
    from peft import LoraConfig

    return LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM")


def run_trl(tokenizer, rows, tmp_path):
    import datasets
    from peft import get_peft_model_state_dict
    from trl import SFTTrainer

    from tests.parity.trl_config import sft_config

    args = sft_config(tmp_path / "trl", MICRO, ACCUMULATION, LR, SEED)
    trainer = SFTTrainer(
        model=make_model(len(tokenizer)),
        args=args,
        train_dataset=datasets.Dataset.from_list(rows),
        processing_class=tokenizer,
        peft_config=lora_config(),
    )
    initial = {k: v.clone() for k, v in get_peft_model_state_dict(trainer.model).items()}
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return initial, losses, get_peft_model_state_dict(trainer.model)


def run_ours(tokenizer, rows, tmp_path):
    import datasets
    import lightning as L
    from lightning.pytorch.loggers import CSVLogger
    from peft import get_peft_model_state_dict

    from hf_lightning import HFDataModule, HFLightningModule
    from hf_lightning.adapters import AdapterSettings, apply_adapters

    settings = AdapterSettings(
        r=4, lora_alpha=8, lora_dropout=0.0, target_modules="all-linear", init_seed=SEED
    )
    model = apply_adapters(make_model(len(tokenizer)), settings)
    initial = {k: v.clone() for k, v in get_peft_model_state_dict(model).items()}
    module = HFLightningModule(
        model,
        tokenizer=tokenizer,
        optim={"name": "adamw", "lr": LR, "weight_decay": 0.0},
        scheduler={"name": "linear", "warmup_steps": 0},
        max_grad_norm=1.0,
    )
    data = HFDataModule(
        tokenizer,
        path=datasets.Dataset.from_list(rows),
        format="tokenized",
        validation_split=0.0,
        per_device_train_batch_size=MICRO,
        shuffle=False,
        max_length=64,
        gradient_accumulation_steps=ACCUMULATION,
    )
    logdir = tmp_path / "ours"
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
        use_distributed_sampler=False,
        precision="32-true",
    )
    trainer.fit(module, datamodule=data)
    with open(logdir / "metrics.csv") as fh:
        losses = [float(r["train/loss"]) for r in csv.DictReader(fh) if r.get("train/loss")]
    return initial, losses, get_peft_model_state_dict(module.model)


def test_lora_losses_and_adapter_weights_equal_trl_sft_trainer(default_tokenizer, tmp_path):
    pytest.importorskip("trl")
    rows = make_rows(default_tokenizer)
    trl_initial, trl_losses, trl_final = run_trl(default_tokenizer, rows, tmp_path)
    our_initial, our_losses, our_final = run_ours(default_tokenizer, rows, tmp_path)

    assert trl_initial.keys() == our_initial.keys() and len(trl_initial) == 2 * 7 * 2
    for name in trl_initial:
        assert torch.equal(our_initial[name], trl_initial[name]), name  # the same adapter init

    assert len(trl_losses) == len(our_losses) == STEPS_ROWS // (MICRO * ACCUMULATION)
    assert our_losses == pytest.approx(trl_losses, rel=TOL)
    moved = 0.0
    for name, theirs in trl_final.items():
        diff = our_final[name] - theirs
        assert float(diff.norm() / theirs.norm()) < TOL, name
        moved = max(moved, float((theirs - trl_initial[name]).norm() / theirs.norm()))
    assert moved > 1e-2  # training moved the adapter: the comparison is not vacuous
    print("max rel loss diff", max(abs(a - b) / abs(b) for a, b in zip(our_losses, trl_losses)))
    print(
        "max rel weight diff",
        max(float((our_final[n] - t).norm() / t.norm()) for n, t in trl_final.items()),
    )
