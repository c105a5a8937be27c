"""HFDataModule in somebody else's Lightning project: their own LightningModule, a plain
``lightning.Trainer``."""

from __future__ import annotations

import subprocess
import sys

import datasets
import lightning as L
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from hf_lightning import HFDataModule

TEXTS = [" ".join("abcdefghijklmnopqrstuvwxyz"[i % 7 : i % 7 + i % 5 + 2]) + " z" for i in range(22)]


class MyModule(L.LightningModule):
    """A user's module: it calls the HF model with its own loss and knows nothing of hf_lightning."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.model = LlamaForCausalLM(
            LlamaConfig(
                vocab_size=32,
                hidden_size=16,
                intermediate_size=32,
                num_hidden_layers=1,
                num_attention_heads=2,
                num_key_value_heads=2,
                max_position_embeddings=64,
                use_cache=False,
                pad_token_id=0,
            )
        )
        self.train_rows: list[list[int]] = []
        self.val_batches = 0
        self.keys: set[str] = set()

    def training_step(self, batch, batch_idx):
        self.keys |= set(batch)
        for ids, mask in zip(batch["input_ids"], batch["attention_mask"]):
            self.train_rows.append(ids[mask.bool()].tolist())
        return self.model(**batch).loss

    def validation_step(self, batch, batch_idx):
        self.val_batches += 1
        self.log("val_loss", self.model(**batch).loss)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_plain_module_and_plain_trainer(word_tokenizer, tmp_path):
    data = HFDataModule(
        word_tokenizer,
        path=datasets.Dataset.from_dict({"text": TEXTS, "id": list(range(22))}),
        validation_split=0.2,
        per_device_train_batch_size=4,
        per_device_eval_batch_size=3,
        max_length=16,
        seed=3,
    )
    module = MyModule()
    data.bind(module.model)  # the one call that tells the data its model (pruning, the checks)
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=tmp_path,
    )
    trainer.fit(module, datamodule=data)
    # the forward signature of the bound model pruned the columns; no num_items_in_batch without
    # count_loss_items
    assert module.keys == {"input_ids", "attention_mask", "labels"}
    assert data.dropped_columns == {"train": ["text", "id"], "validation": ["text", "id"]}
    # 22 rows, 5 held out (ceil(0.2 * 22)); each epoch sees the 17 training rows exactly once, in a new order
    train_ids = sorted(map(list, data.train_dataset["input_ids"]))
    assert len(train_ids) == 17
    epoch0, epoch1 = module.train_rows[:17], module.train_rows[17:]
    assert sorted(epoch0) == sorted(epoch1) == train_ids and epoch0 != epoch1
    assert module.val_batches == 2 * 2  # 5 rows in batches of 3, once per epoch


def _fit(tok, folder, max_steps=-1, ckpt_path=None) -> list[list[int]]:
    """2 epochs of the user's module (stopped at ``max_steps``), a checkpoint after every step; the rows
    trained on, in order."""
    data = HFDataModule(
        tok,
        path=datasets.Dataset.from_dict({"text": TEXTS[:10]}),
        validation_split=0.0,
        per_device_train_batch_size=3,
        max_length=16,
        seed=5,
    )
    module = MyModule()
    checkpoints = L.pytorch.callbacks.ModelCheckpoint(
        dirpath=folder, save_last=True, every_n_train_steps=1, save_top_k=-1
    )
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=2,
        max_steps=max_steps,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        callbacks=[checkpoints],
        default_root_dir=folder,
    )
    trainer.fit(module, datamodule=data, ckpt_path=ckpt_path)
    return module.train_rows


def test_a_run_resumed_inside_an_epoch_continues_it(word_tokenizer, tmp_path):
    """Lightning resumes a train loader with ``state_dict``/``load_state_dict`` only; without them the epoch
    would start again from its first batch (rows trained twice, others never)."""
    straight = _fit(word_tokenizer, tmp_path / "straight")
    assert len(straight) == 2 * 10  # 4 batches (3, 3, 3, 1) per epoch
    first = _fit(word_tokenizer, tmp_path / "stopped", max_steps=2)
    rest = _fit(word_tokenizer, tmp_path / "stopped", ckpt_path=str(tmp_path / "stopped" / "last.ckpt"))
    assert first + rest == straight


@pytest.mark.slow
def test_the_data_package_imports_without_hydra_or_a_trainer():
    """The data layer imports no trainer: no Lightning (nor transformers' trainer utilities, which bring
    accelerate) until ``HFDataModule``, a ``LightningDataModule``, is asked for; no Hydra at all."""
    code = (
        "import sys, hf_lightning.data, hf_lightning.data.collators, hf_lightning.data.sampling\n"
        "heavy = {m.split('.')[0] for m in sys.modules} & {'lightning', 'pytorch_lightning', 'accelerate', "
        "'transformers'}\n"
        "assert not heavy, heavy\n"
        "from hf_lightning import HFDataModule\n"
        "assert 'lightning' in sys.modules and 'hydra' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
