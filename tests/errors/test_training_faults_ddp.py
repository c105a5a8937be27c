"""The non-finite guard under real DDP (two gloo processes): every rank takes the same decision.

The hard case is a loss that is NaN on one rank while every gradient stays finite (a NaN added as a constant):
the all-reduced gradients look healthy, so a guard that only looked at its own rank would skip the update on
rank 0 and apply it on rank 1, and the replicas would silently drift apart.
"""

from __future__ import annotations

import json

import datasets
import lightning as L
import pytest
import torch

from hf_lightning import HFDataModule, HFLightningModule
from hf_lightning.callbacks import NonFiniteGuard
from tests.data_support import make_word_tokenizer, tiny_llama

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

TEXTS = [" ".join("abcdefghijklmnopqrstuvwxyz"[i % 20 : i % 20 + 3 + i % 4]) for i in range(16)]
BAD_STEP = 3


class NaNLossOnRank0(HFLightningModule):
    """Rank 0's loss of step ``BAD_STEP`` is NaN; its gradients are not (the NaN is a constant)."""

    def compute_loss(self, batch, num_items_in_batch):
        loss, outputs = super().compute_loss(batch, num_items_in_batch)
        if self.global_rank == 0 and self.global_step == BAD_STEP - 1:
            loss = loss + torch.tensor(float("nan"), device=loss.device)
        return loss, outputs


class Record(L.Callback):
    def __init__(self, folder) -> None:
        self.folder = folder
        self.by_step: dict[int, list[float]] = {}

    def on_train_batch_end(self, trainer, module, *args):
        # one float64 checksum per parameter tensor: replicas are bit-identical, so the sums are equal exactly
        self.by_step[trainer.global_step] = [float(p.detach().double().sum()) for p in module.parameters()]

    def on_train_end(self, trainer, module):
        guard = next(c for c in trainer.callbacks if isinstance(c, NonFiniteGuard))
        (self.folder / f"rank{trainer.global_rank}.json").write_text(
            json.dumps({"by_step": self.by_step, "skipped": guard.skipped_steps, "step": trainer.global_step})
        )


def test_a_nan_loss_on_one_rank_skips_the_step_on_every_rank(tmp_path):
    data = HFDataModule(
        make_word_tokenizer(),
        path=datasets.Dataset.from_dict({"text": TEXTS}),
        validation_split=0.0,
        per_device_train_batch_size=2,
        shuffle=False,
    )
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp_spawn",
        max_steps=4,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        callbacks=[NonFiniteGuard(on_nonfinite="skip"), Record(tmp_path)],
    )
    module = NaNLossOnRank0(
        tiny_llama().train(), optim={"name": "adamw", "lr": 1e-2}, scheduler={"name": "constant"}
    )
    trainer.fit(module, datamodule=data)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["skipped"] for r in ranks] == [1, 1] and [r["step"] for r in ranks] == [4, 4]
    for step in map(str, range(1, 5)):
        assert ranks[0]["by_step"][step] == ranks[1]["by_step"][step]  # the replicas never drift apart
    assert (
        ranks[0]["by_step"][str(BAD_STEP)] == ranks[0]["by_step"][str(BAD_STEP - 1)]
    )  # no update in that step
    assert ranks[0]["by_step"]["4"] != ranks[0]["by_step"][str(BAD_STEP)]
