"""``trainer.accelerator=cpu`` with DeepSpeed while DeepSpeed picked another accelerator (a GPU machine
without ``DS_ACCELERATOR=cpu``): one line naming both and the variable to set, before any process group
starts.

The other accelerator is DeepSpeed's own CUDA one, set with its public ``set_accelerator`` (this machine has
no GPU for DeepSpeed to find)."""

from __future__ import annotations

import lightning as L
import pytest
import torch

from hf_lightning.core.errors import ConfigError

deepspeed = pytest.importorskip("deepspeed")


class Regression(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_cpu_trainer_with_deepspeed_on_another_accelerator_is_one_line():
    import torch.distributed as dist
    from deepspeed.accelerator import get_accelerator, set_accelerator
    from deepspeed.accelerator.cuda_accelerator import CUDA_Accelerator

    from hf_lightning.strategies.deepspeed import deepspeed_strategy

    before = get_accelerator()
    set_accelerator(CUDA_Accelerator())
    try:
        trainer = L.Trainer(
            accelerator="cpu",
            devices=1,
            strategy=deepspeed_strategy(2, 2, 1, None, "32-true", devices=1),
            max_steps=1,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
        )
        with pytest.raises(ConfigError) as err:
            trainer.fit(Regression(), torch.utils.data.DataLoader(torch.ones(4, 2), batch_size=2))
    finally:
        set_accelerator(before)
    assert str(err.value) == (
        "trainer.accelerator=cpu with DeepSpeed, but DeepSpeed picked the 'cuda' accelerator; set "
        "DS_ACCELERATOR=cpu in the environment to run it on CPU, or trainer.accelerator=gpu"
    )
    assert not dist.is_initialized()
