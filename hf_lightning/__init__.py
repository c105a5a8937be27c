"""hf_lightning: the Hugging Face ``Trainer`` training and evaluation path on PyTorch Lightning and Hydra.

The library imports and runs without Hydra; only the entry points (``hf_lightning.train``) use it.
"""

from hf_lightning.core.errors import ConfigError, DataError, HFLightningError, ModelError, TrainingError
from hf_lightning.data import HFDataModule
from hf_lightning.module import HFLightningModule

__all__ = [
    "ConfigError",
    "DataError",
    "HFDataModule",
    "HFLightningError",
    "HFLightningModule",
    "ModelError",
    "TrainingError",
]
__version__ = "0.1.0"
