"""The data path: loading, formatting, collation, accumulation windows, and the DataModule."""

from hf_lightning.data.collators import PaddingCollator
from hf_lightning.data.datamodule import HFDataModule
from hf_lightning.data.windows import AccumulationWindowLoader

__all__ = ["AccumulationWindowLoader", "HFDataModule", "PaddingCollator"]
