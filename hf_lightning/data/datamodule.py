"""``HFDataModule``: load, format, tokenize, collate and sample, as a standalone LightningDataModule."""

from __future__ import annotations

import logging
from typing import Any

import datasets
import lightning as L
from torch.utils.data import DataLoader, DistributedSampler

from hf_lightning.data.collators import PaddingCollator
from hf_lightning.data.eval_sampler import EvalShardSampler
from hf_lightning.data.formatting import FORMATS, SOURCE_COLUMNS, TOKENIZERS, detect_format
from hf_lightning.data.loading import load_source, split_train_validation
from hf_lightning.data.windows import AccumulationWindowLoader
from hf_lightning.errors import ConfigError, DataError
from hf_lightning.module.loss import IGNORE_INDEX

log = logging.getLogger(__name__)


class HFDataModule(L.LightningDataModule):
    """Data for causal-LM fine-tuning, usable with any LightningModule and ``lightning.Trainer``.

    Args:
        tokenizer: a ``transformers`` tokenizer (needs a pad token, and a chat template for chat data).
        path: a json/jsonl/csv/parquet file, a ``save_to_disk`` folder, a ``datasets.Dataset`` /
            ``DatasetDict``, or ``None`` for the embedded chatterbot-corpus chat data.
        validation_path: a separate validation source (same kinds as ``path``); overrides any split of ``path``.
        format: ``"auto"`` (from the column names), ``"messages"``, ``"text"`` or ``"tokenized"``.
        validation_split: share of rows held out for validation when the source has no validation split.
        max_length: tokens per example after truncation (truncated rows are counted in the log).
        per_device_train_batch_size / per_device_eval_batch_size: examples per micro-batch per process.
        shuffle: random training order (seeded by ``seed + epoch``, the same on every rank).
        group_by_length / packing / streaming: reserved for the full data path; ``True`` raises
            :class:`ConfigError` until they land rather than being silently ignored.
        num_workers / pin_memory / persistent_workers / prefetch_factor / drop_last: ``DataLoader`` knobs.
        pad_to_multiple_of: round padded lengths up to this multiple.
        seed: seed of the shuffle order and of the validation hold-out.

    Batches are ``{"input_ids", "attention_mask", "labels"}``, int64 tensors of shape ``(B, L)``; labels are
    ``-100`` at padding and at every position that is not trained on. When the attached LightningModule
    defines ``count_loss_items(batch) -> int`` (as :class:`HFLightningModule` does), training batches also
    carry ``num_items_in_batch``, the label count of their whole gradient-accumulation window
    (see :class:`~hf_lightning.data.windows.AccumulationWindowLoader`).

    Raises:
        ConfigError: a bad argument (named).
        DataError: a source that is missing, unreadable, empty, or lacks the expected fields.
    """

    def __init__(
        self,
        tokenizer: Any,
        path: Any = None,
        validation_path: Any = None,
        format: str = "auto",
        validation_split: float = 0.05,
        max_length: int = 512,
        per_device_train_batch_size: int = 8,
        per_device_eval_batch_size: int = 8,
        shuffle: bool = True,
        group_by_length: bool = False,
        packing: bool | str = False,
        streaming: bool = False,
        num_workers: int = 0,
        pin_memory: bool = False,
        persistent_workers: bool = False,
        prefetch_factor: int | None = None,
        drop_last: bool = False,
        pad_to_multiple_of: int | None = None,
        seed: int = 42,
    ) -> None:
        super().__init__()
        for key, value in (
            ("per_device_train_batch_size", per_device_train_batch_size),
            ("per_device_eval_batch_size", per_device_eval_batch_size),
            ("max_length", max_length),
        ):
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"data.{key} must be a positive integer, got {value!r}")
        if format not in ("auto", *FORMATS):
            raise ConfigError(f"data.format={format!r}; expected one of {['auto', *FORMATS]}")
        if not 0 <= validation_split < 1:
            raise ConfigError(f"data.validation_split must be in [0, 1), got {validation_split!r}")
        for key, value in (("group_by_length", group_by_length), ("packing", packing), ("streaming", streaming)):
            if value:
                raise ConfigError(
                    f"data.{key}={value!r} is not implemented in this version; it would be ignored, so it is "
                    "refused instead (set it to false)"
                )
        if getattr(tokenizer, "pad_token_id", None) is None:
            raise ConfigError(
                "the tokenizer has no pad token; set tokenizer.pad_token (for example to its eos_token) "
                "and save it into the model folder"
            )
        self.tokenizer = tokenizer
        self.path = path
        self.validation_path = validation_path
        self.format = format
        self.validation_split = validation_split
        self.max_length = max_length
        self.per_device_train_batch_size = per_device_train_batch_size
        self.per_device_eval_batch_size = per_device_eval_batch_size
        self.shuffle = shuffle
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.persistent_workers = persistent_workers and num_workers > 0
        self.prefetch_factor = prefetch_factor if num_workers > 0 else None
        self.drop_last = drop_last
        self.seed = seed
        self.collator = PaddingCollator(tokenizer.pad_token_id, pad_to_multiple_of=pad_to_multiple_of)
        self.train_dataset: datasets.Dataset | None = None
        self.val_dataset: datasets.Dataset | None = None

    # ----------------------------------------------------------------------------------------- setup
    def prepare_data(self) -> None:
        if self.path is None:
            from hf_lightning.defaults import prepare_chatterbot

            prepare_chatterbot()

    def setup(self, stage: str | None = None) -> None:
        if self.train_dataset is not None:
            return
        path = self.path
        if path is None:
            from hf_lightning.defaults import prepare_chatterbot

            files = prepare_chatterbot()
            path, validation_path = files["train"], files["validation"]
        else:
            validation_path = self.validation_path
        train, val = split_train_validation(
            load_source(path), 0.0 if validation_path is not None else self.validation_split, self.seed, path
        )
        if validation_path is not None:
            val = load_source(validation_path)
            if isinstance(val, datasets.DatasetDict):
                val = next(iter(val.values()))
        fmt = self.format if self.format != "auto" else detect_format(train.column_names, path)
        self.train_dataset = self._tokenize(train, fmt, path, "train")
        self.val_dataset = self._tokenize(val, fmt, validation_path or path, "validation") if val else None

    def _tokenize(self, ds: datasets.Dataset, fmt: str, path: Any, split: str) -> datasets.Dataset:
        needed = SOURCE_COLUMNS[fmt][0]
        if needed not in ds.column_names:
            raise DataError(
                f"data.path={path}: format {fmt!r} needs a {needed!r} field; the {split} split has "
                f"{ds.column_names}"
            )
        extra = [c for c in ds.column_names if c not in SOURCE_COLUMNS[fmt]]
        if extra:
            log.warning("%s: columns %s are not used by the %r format and are dropped", split, extra, fmt)
        fn = TOKENIZERS[fmt]
        try:
            out = ds.map(
                fn,
                batched=True,
                remove_columns=ds.column_names,
                fn_kwargs={"tokenizer": self.tokenizer, "max_length": self.max_length},
                desc=f"tokenizing {split} ({fmt})",
            )
        except DataError as err:
            raise DataError(f"data.path={path} ({split}): {err}") from err
        n_trunc = sum(out["truncated"])
        if n_trunc:
            log.warning(
                "%s: %d of %d rows were longer than data.max_length=%d and were truncated",
                split, n_trunc, len(out), self.max_length,
            )
        out = out.remove_columns("truncated")
        if "labels" in out.column_names:
            before = len(out)
            out = out.filter(
                lambda labels: any(t != IGNORE_INDEX for t in labels[1:]), input_columns="labels",
                desc=f"dropping {split} rows without targets",
            )
            if len(out) < before:
                log.warning(
                    "%s: dropped %d of %d rows with no trained-on token (all labels -100 after truncation)",
                    split, before - len(out), before,
                )
        if len(out) == 0:
            raise DataError(f"data.path={path}: the {split} split is empty after tokenization")
        log.info("%s: %d examples (%s format)", split, len(out), fmt)
        return out

    # ------------------------------------------------------------------------------------ dataloaders
    def _world(self) -> tuple[int, int]:
        trainer = self.trainer
        if trainer is None:
            return 1, 0
        return trainer.world_size, trainer.global_rank

    def _loader(self, ds: datasets.Dataset, batch_size: int, shuffle: bool, drop_last: bool) -> DataLoader:
        world, rank = self._world()
        # One sampler for both cases: with world=1 it is a seeded random (or sequential) order; with
        # world>1 every rank draws the same permutation (seed + epoch) and takes its own stride.
        sampler = DistributedSampler(
            ds, num_replicas=world, rank=rank, shuffle=shuffle, seed=self.seed, drop_last=drop_last
        )
        return DataLoader(
            ds,
            batch_size=batch_size,
            sampler=sampler,
            collate_fn=self.collator,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            persistent_workers=self.persistent_workers,
            prefetch_factor=self.prefetch_factor,
            drop_last=drop_last,
        )

    def train_dataloader(self) -> Any:
        if self.train_dataset is None:
            self.setup("fit")
        loader = self._loader(self.train_dataset, self.per_device_train_batch_size, self.shuffle, self.drop_last)
        trainer = self.trainer
        module = trainer.lightning_module if trainer is not None else None
        count = getattr(module, "count_loss_items", None)
        if count is None:
            return loader
        return AccumulationWindowLoader(
            loader, trainer.accumulate_grad_batches, count, max_batches=lambda: trainer.num_training_batches
        )

    def val_dataloader(self) -> Any:
        if self.train_dataset is None:
            self.setup("validate")
        if self.val_dataset is None:
            return []
        return self._eval_loader(self.val_dataset)

    def predict_dataloader(self) -> Any:
        """The validation set in dataset order (length grouping and shuffling are train-only)."""
        return self.val_dataloader()

    def _eval_loader(self, ds: Any) -> DataLoader:
        world, rank = self._world()
        # unpadded strided shards: no example evaluated twice (DistributedSampler repeats the tail)
        return DataLoader(
            ds,
            batch_size=self.per_device_eval_batch_size,
            sampler=EvalShardSampler(len(ds), world, rank),
            collate_fn=self.collator,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            persistent_workers=self.persistent_workers,
            prefetch_factor=self.prefetch_factor,
        )
