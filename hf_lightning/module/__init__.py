"""The model side: the token loss, optimizers and schedules, metrics, and the LightningModule."""

from hf_lightning.module.lightning_module import HFLightningModule
from hf_lightning.module.loss import count_loss_items, token_cross_entropy_sum

__all__ = ["HFLightningModule", "count_loss_items", "token_cross_entropy_sum"]
