"""The data path: sources, formats, tokenize, checks, packing, collators, sampling, streams, loaders, the
DataModule."""

from hf_lightning.data.collators import PackedCollator, PaddingCollator, PaddingFreeCollator
from hf_lightning.data.datamodule import HFDataModule
from hf_lightning.data.sampling import (
    AccumulationWindowLoader,
    ExactDistributedSampler,
    length_grouped_indices,
)
from hf_lightning.data.streams import ShardedStream
from hf_lightning.data.task_collators import ClassificationCollator, Seq2SeqCollator

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
