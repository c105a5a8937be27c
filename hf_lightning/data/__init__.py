"""The data path: sources, formats, tokenize, checks, packing, collators, sampling, streams, loaders, the
DataModule."""

from hf_lightning.data.collators import (
    ClassificationCollator,
    PackedCollator,
    PaddingCollator,
    PaddingFreeCollator,
    Seq2SeqCollator,
)
from hf_lightning.data.datamodule import HFDataModule
from hf_lightning.data.sampling import (
    AccumulationWindowLoader,
    ExactDistributedSampler,
    length_grouped_indices,
)
from hf_lightning.data.streams import ShardedStream

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
