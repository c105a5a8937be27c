"""hf_lightning: the Hugging Face ``Trainer`` training and evaluation path on PyTorch Lightning and Hydra.

The library imports and runs without Hydra; only the entry points (``hf_lightning.train``) use it.
"""

from typing import TYPE_CHECKING, Any

from hf_lightning.core.errors import ConfigError, DataError, HFLightningError, ModelError, TrainingError

if TYPE_CHECKING:
    from hf_lightning.data import HFDataModule
    from hf_lightning.module import HFLightningModule

# imported on first use: both are Lightning classes, and a process that needs only part of the package (the
# data layer's collators in a DataLoader worker, the migrate tool) imports no Lightning
_LAZY = {"HFDataModule": "hf_lightning.data.datamodule", "HFLightningModule": "hf_lightning.module"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = globals()[name] = getattr(importlib.import_module(_LAZY[name]), name)
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
