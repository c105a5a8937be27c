"""Models loaded from a folder train as HF Trainer trains them: in train mode, and GPT-2 with the causal
shift."""

from __future__ import annotations

import datasets
import lightning as L
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from hf_lightning import HFDataModule, HFLightningModule


class RecordModes(L.Callback):
    def __init__(self) -> None:
        self.train_modes: list[bool] = []
        self.val_modes: list[bool] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.train_modes.append(all(m.training for m in pl_module.model.modules()))

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        self.val_modes.append(any(m.training for m in pl_module.model.modules()))


def test_a_model_saved_and_loaded_in_eval_mode_trains_with_dropout(word_tokenizer, tmp_path):
    torch.manual_seed(0)
    GPT2LMHeadModel(
        GPT2Config(vocab_size=32, n_positions=32, n_embd=16, n_layer=1, n_head=2)
    ).save_pretrained(tmp_path)
    model = GPT2LMHeadModel.from_pretrained(tmp_path)  # transformers returns it in eval mode
    assert not model.training and model.config.resid_pdrop == 0.1
    texts = ["a b c d e f", "b c d e", "c d e f g h", "d e f"] * 3
    data = HFDataModule(
        word_tokenizer,
        path=datasets.Dataset.from_dict({"text": texts}),
        validation_split=0.25,
        per_device_train_batch_size=3,
        per_device_eval_batch_size=3,
        max_length=16,
    )
    modes = RecordModes()
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=3,
        val_check_interval=2,
        num_sanity_val_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=False,
        callbacks=[modes],
    )
    trainer.fit(HFLightningModule(model, word_tokenizer, optim={"name": "sgd", "lr": 0.1}), datamodule=data)
    assert modes.train_modes == [True, True, True]  # every module, including after the validation at step 2
    assert modes.val_modes and not any(modes.val_modes)  # evaluation still runs without dropout


def test_gpt2_loss_is_shifted_like_its_own_loss():
    """``GPT2LMHeadModel`` has no ``loss_type`` (its class name has no ``ForCausalLM``); its own loss still
    shifts."""
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=32, n_positions=32, n_embd=16, n_layer=1, n_head=2)).eval()
    assert model.loss_type is None
    module = HFLightningModule(model)
    assert module.causal
    batch = {
        "input_ids": torch.tensor([[5, 6, 7, 8, 9], [10, 11, 12, 0, 0]]),
        "attention_mask": torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]),
        "labels": torch.tensor([[5, 6, 7, 8, 9], [10, 11, 12, -100, -100]]),
    }
    n = module.count_loss_items(batch)
    assert n == 4 + 2  # labels[:, 1:] != -100
    ours, _ = module.compute_loss(batch, n)
    torch.testing.assert_close(ours, model(**batch).loss, rtol=1e-6, atol=1e-6)  # HF's mean over its targets
