"""The data path: sources, formats, tokenize, checks, packing, collators, sampling, streams, loaders, the
DataModule."""

from typing import TYPE_CHECKING, Any

from hf_lightning.data.collators import (
    ClassificationCollator,
    PackedCollator,
    PaddingCollator,
    PaddingFreeCollator,
    Seq2SeqCollator,
)
from hf_lightning.data.sampling import (
    AccumulationWindowLoader,
    ExactDistributedSampler,
    length_grouped_indices,
)
from hf_lightning.data.streams import ShardedStream

if TYPE_CHECKING:
    from hf_lightning.data.datamodule import HFDataModule


def __getattr__(name: str) -> Any:
    """``HFDataModule`` on first use: it is a ``LightningDataModule``, and the rest of the data layer (the
    collators, samplers and streams a ``DataLoader`` worker unpickles) imports no Lightning."""
    if name == "HFDataModule":
        from hf_lightning.data.datamodule import HFDataModule

        globals()[name] = HFDataModule
        return HFDataModule
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AccumulationWindowLoader",
    "ClassificationCollator",
    "ExactDistributedSampler",
    "HFDataModule",
    "PackedCollator",
    "PaddingCollator",
    "PaddingFreeCollator",
    "Seq2SeqCollator",
    "ShardedStream",
    "length_grouped_indices",
]
