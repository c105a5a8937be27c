"""``HFDataModule.train_batches_per_epoch()`` (the LR schedule's length, computed without a loader) equals the
length of the loader Lightning builds, and the number of batches that loader really yields, for map-style and
stream data, with and without ``drop_last``, on 1 to 3 ranks, with 0 and 2 workers."""

from __future__ import annotations

import datasets
import pytest
from torch.utils.data import IterableDataset

from hf_lightning import HFDataModule

N = 10  # divisible neither by the world sizes 3 nor by the batch size 3


class SizedStream(IterableDataset):
    """A torch stream of known length (``len``), yielding the full stream in every reader."""

    def __iter__(self):
        for i in range(N):
            yield {"input_ids": [4 + i % 5, 5, 6]}

    def __len__(self) -> int:
        return N


def _datamodule(word_tokenizer, kind: str, drop_last: bool, workers: int) -> HFDataModule:
    source = (
        datasets.Dataset.from_dict({"input_ids": [[4 + i % 5, 5, 6] for i in range(N)]})
        if kind == "map"
        else SizedStream()
    )
    dm = HFDataModule(
        word_tokenizer,
        path=source,
        validation_split=0.0,
        per_device_train_batch_size=3,
        drop_last=drop_last,
        num_workers=workers,
        shuffle=False,
    )
    dm.setup("fit")
    return dm


def _expected(kind: str, drop_last: bool, world: int, workers: int) -> int:
    """By hand: map-style ranks get ceil(N / world) rows (masked top-up) or N // world (drop_last); a stream's
    readers (world x workers) get ceil(N / readers) rows each and batch them on their own."""
    if kind == "map":
        rows = N // world if drop_last else -(-N // world)
        return rows // 3 if drop_last else -(-rows // 3)
    readers = world * max(workers, 1)
    rows = -(-N // readers)
    return (rows // 3 if drop_last else -(-rows // 3)) * max(workers, 1)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("kind", ["map", "stream"])
def test_train_batches_per_epoch_equals_the_loader(word_tokenizer, kind, drop_last, workers):
    dm = _datamodule(word_tokenizer, kind, drop_last, workers)
    for world in (1, 2, 3):
        for rank in range(world):
            dm._world = lambda world=world, rank=rank: (world, rank)  # the rank seam the loaders read
            expected = _expected(kind, drop_last, world, workers)
            if expected == 0:  # a stream reader with fewer rows than one batch under drop_last: refused
                continue
            assert dm.train_batches_per_epoch() == expected
            loader = dm.train_dataloader()
            assert len(loader) == expected
            if workers == 0 or (world, rank) == (3, 1):  # worker processes are slow to start: one case
                assert sum(1 for _ in loader) == expected


def test_the_train_loader_is_built_once_per_fit(word_tokenizer):
    """The LR schedule's length comes from train_batches_per_epoch: Lightning's fit builds the loader once."""
    import lightning as L

    from hf_lightning import HFLightningModule
    from tests.data_support import tiny_llama

    dm = _datamodule(word_tokenizer, "map", False, 0)
    built = []
    original = dm.train_dataloader
    dm.train_dataloader = lambda: built.append(1) or original()
    module = HFLightningModule(tiny_llama(len(word_tokenizer)), tokenizer=word_tokenizer)
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )
    trainer.fit(module, datamodule=dm)
    assert len(built) == 1
