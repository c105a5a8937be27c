"""``HFDataModule``: the data path of one run, as a standalone LightningDataModule.

It wires the steps, each in its own module, in the order a batch is made:

    sources      load, split, rename; tell the format from the columns
    formats      rows of each format -> input_ids / labels        (chat.py: chat templates)
    tokenize     Dataset.map (cached) with truncation/drop counts; column pruning   (on_the_fly.py: streams, torch)
    checks       token ids, labels and positions against the model (positions.py)
    packing      check_packing (every packing rule), bfd / wrapped rows
    collators    padding, classification, seq2seq, padding-free (flattening.py), column pruning per example
    samplers     seeded global order, length grouping, exact distributed split    (streams.py: streams)
    dataloaders  per-epoch worker seeds; num_items_in_batch per accumulation window; batches per epoch

What it needs from the model side arrives through :meth:`bind` (or is read once from the trainer's LightningModule
when nobody called it); what the model side needs from it is :meth:`train_batches_per_epoch`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import datasets
import lightning as L
import torch

from hf_lightning.data.chat import require_chat_template
from hf_lightning.data.checks import (
    check_data_arguments,
    check_label_range,
    check_pad_token,
    check_token_ids,
)
from hf_lightning.data.collators import PruneColumnsCollator, collator_for
from hf_lightning.data.dataloaders import (
    AccumulationWindowLoader,
    EpochDataLoader,
    batches_per_epoch,
    map_loader,
    stream_loader,
)
from hf_lightning.data.formats import FORMATS, SOURCE_COLUMNS
from hf_lightning.data.model_facts import find_label_names, resolve_model_inputs, signature_columns
from hf_lightning.data.on_the_fly import ExampleProcessor, scan_torch_dataset
from hf_lightning.data.packing import (
    Packing,
    announce_document_ends,
    check_packing,
    pack_dataset,
    packing_strategy,
)
from hf_lightning.data.placeholder import PlaceholderAwareCollator
from hf_lightning.data.positions import check_positions
from hf_lightning.data.samplers import sequence_lengths
from hf_lightning.data.sources import column_names, detect_format, is_stream, load_splits
from hf_lightning.data.streams import ShardedStream
from hf_lightning.data.tokenize import label_mapping, prune_dataset, tokenize_dataset
from hf_lightning.errors import ConfigError

log = logging.getLogger(__name__)

# HF's mega-batch multiplier cap (``get_length_grouped_indices``); streams group within buffers this many batches long
MEGA_BATCH_MULT = 50


@dataclass
class Binding:
    """What the data needs from the model side (see :meth:`HFDataModule.bind`)."""

    model: torch.nn.Module | None = None
    count_loss_items: Callable[[Mapping[str, Any]], int] | None = None
    forward_kwargs: dict[str, Any] = field(default_factory=dict)
    metrics: bool = False
    handles_placeholder_batches: bool = False


class HFDataModule(L.LightningDataModule):
    """Data for HF-style models, usable with any LightningModule and ``lightning.Trainer``.

    Args:
        tokenizer: a ``transformers`` tokenizer (needs a pad token; a chat template for chat data).
        path: a json/jsonl/csv/parquet file, a ``save_to_disk`` folder, a ``datasets`` ``Dataset`` /
            ``DatasetDict`` / ``IterableDataset``, a torch ``Dataset`` / ``IterableDataset`` of mappings, or
            ``None`` for the embedded chatterbot-corpus chat data.
        validation_path: a separate validation source (same kinds); overrides any split of ``path``.
        format: ``"auto"`` (from the schema, see :mod:`~hf_lightning.data.formats`) or one of
            ``text, prompt_completion, messages, conversations, classification, seq2seq, tokenized``.
        validation_split: share of rows held out for validation when the source has no validation split.
        max_length: tokens per example after truncation (truncated and dropped rows are counted in the log); with
            ``packing`` the row length (``wrapped`` truncates no document, ``bfd`` truncates longer ones).
        per_device_train_batch_size / per_device_eval_batch_size: examples (packed rows) per micro-batch.
        shuffle: random training order (seeded by ``seed + epoch``, the same on every rank).
        group_by_length: HF's mega-batch length grouping (map-style), a bounded sort buffer (streams).
        packing: ``False``, ``"bfd"`` (``True`` means ``"bfd"``) or ``"wrapped"`` (causal formats, map-style); packed
            ``text`` documents end with EOS (see :mod:`~hf_lightning.data.packing`).
        padding_free: flatten each batch into one row with restarting ``position_ids`` (no padding).
        streaming: read files lazily as a stream (sharded per rank and per worker).
        shuffle_buffer_size: buffer of the stream shuffle.
        remove_unused_columns: keep only the model's ``forward`` arguments and the label columns (HF default).
        model_input_names: the model's input names; default: the ``forward`` parameters of the bound model
            (:meth:`bind`), else the tokenizer's ``model_input_names``.
        label_names: the batch keys evaluation treats as labels (HF ``label_names``); default: the ``forward``
            parameters with ``label`` in their name, else ``["labels"]``.
        num_workers / pin_memory / persistent_workers / prefetch_factor / drop_last: ``DataLoader`` knobs.
        pad_to_multiple_of: round padded lengths up to this multiple.
        seed: seed of the order, of worker RNGs and of the validation hold-out.
        rename_columns: ``{source column: new name}`` applied to every split before the format is read (a
            banking77 CSV's ``category`` becomes the classification format's ``label``).

    Batches (``B`` examples, ``L`` tokens after padding to the longest row, all tensors int64):

    - causal formats: ``input_ids``, ``attention_mask``, ``labels`` ``(B, L)``; labels are -100 where nothing is
      trained on (padding, prompts, user turns);
    - padding-free: ``input_ids``, ``labels``, ``position_ids`` ``(1, T)``, ``T`` the batch's real tokens;
      packed: ``input_ids``, ``labels``, ``position_ids`` ``(B, L)``, ``L`` at most ``max_length``;
    - classification: ``input_ids``, ``attention_mask`` ``(B, L)``, ``labels`` ``(B,)`` (float32 for regression);
    - seq2seq: ``input_ids``, ``attention_mask`` ``(B, S)``, ``labels`` (and ``decoder_input_ids``) ``(B, T)``.

    With a ``count_loss_items(batch) -> int`` bound (:meth:`bind`; :class:`HFLightningModule` has one), training
    batches also carry three Python ``int`` keys (see
    :class:`~hf_lightning.data.dataloaders.AccumulationWindowLoader`): ``num_items_in_batch``, the label count of
    their whole gradient-accumulation window on this process; ``num_items_in_micro_batch``; and
    ``num_batches_in_window``.

    What it reproduces of HF ``Trainer``: ``_remove_unused_columns`` (``remove_unused_columns``, with the dropped
    names logged), ``_get_train_sampler`` (a seeded random order, or ``LengthGroupedSampler``'s
    ``get_length_grouped_indices`` with ``group_by_length``), ``get_train_dataloader`` (per-worker seeds) and
    ``get_batch_samples`` (``num_items_in_batch`` counted before the window's first forward). The collators are
    listed in :mod:`hf_lightning.data.collators`. It differs where HF's sampler repeats examples to even out
    ranks: here every example is used exactly once per epoch across ranks and workers.

    Metrics check: with ``metrics=True`` bound and no key of ``label_names`` in an evaluation batch, ``setup``
    raises :class:`ConfigError`.

    Raises:
        ConfigError: a bad argument (named), or a setting the data or model cannot honour.
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
        packing: Packing = False,
        padding_free: bool = False,
        streaming: bool = False,
        shuffle_buffer_size: int = 1000,
        remove_unused_columns: bool = True,
        model_input_names: list[str] | None = None,
        label_names: list[str] | None = None,
        num_workers: int = 0,
        pin_memory: bool = False,
        persistent_workers: bool = False,
        prefetch_factor: int | None = None,
        drop_last: bool = False,
        pad_to_multiple_of: int | None = None,
        seed: int = 42,
        rename_columns: dict[str, str] | None = None,
    ) -> None:
        super().__init__()
        check_data_arguments(locals())  # each argument of DATA_ARGUMENTS against its kind
        if format not in ("auto", *FORMATS):
            raise ConfigError(f"data.format={format!r}; expected one of {['auto', *FORMATS]}")
        if num_workers == 0 and (persistent_workers or prefetch_factor is not None):
            key = "persistent_workers" if persistent_workers else "prefetch_factor"
            raise ConfigError(
                f"data.{key} applies to worker processes only; set data.num_workers > 0 or unset it"
            )
        check_pad_token(tokenizer)
        self.tokenizer = tokenizer
        self.path = path
        self.validation_path = validation_path
        self.format = format
        self.validation_split = validation_split
        self.max_length = max_length
        self.per_device_train_batch_size = per_device_train_batch_size
        self.per_device_eval_batch_size = per_device_eval_batch_size
        self.shuffle = shuffle
        self.group_by_length = group_by_length
        self.packing = packing_strategy(packing)  # the value only; the rules: check_packing at setup
        self.padding_free = padding_free
        self.streaming = streaming
        self.shuffle_buffer_size = shuffle_buffer_size
        self.remove_unused_columns = remove_unused_columns
        self.model_input_names = list(model_input_names) if model_input_names is not None else None
        self.label_names = list(label_names) if label_names is not None else None
        self.rename_columns = dict(rename_columns) if rename_columns else None
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.persistent_workers = persistent_workers
        self.prefetch_factor = prefetch_factor
        self.drop_last = drop_last
        self.pad_to_multiple_of = pad_to_multiple_of
        self.seed = seed
        # filled by setup()
        self.train_dataset: Any = None
        self.val_dataset: Any = None
        self.data_format: str | None = None
        self.id2label: dict[int, str] | None = None
        self.dropped_columns: dict[str, list[str]] = {}
        self.resolved_label_names: list[str] = ["labels"]
        self.train_collator: Any = None
        self.eval_collator: Any = None
        self._holdout: float | None = None
        self._processor: ExampleProcessor | None = None
        self._train_lengths: list[int] | None = None
        self._bound: Binding | None = None

    def bind(
        self,
        model: torch.nn.Module | None = None,
        *,
        count_loss_items: Callable[[Mapping[str, Any]], int] | None = None,
        forward_kwargs: Mapping[str, Any] | None = None,
        metrics: bool = False,
        handles_placeholder_batches: bool = False,
    ) -> HFDataModule:
        """Tell the data what it needs from the model side; whoever builds both calls it once, before ``fit``.

        Args:
            model: the ``nn.Module`` the batches are for: its ``forward`` gives the input and label names
                (pruning), its embedding, position table and classes are checked against the data, and packed or
                padding-free rows need ``position_ids`` and an attention that keeps them apart.
            count_loss_items: ``batch -> int``, the loss's target count of a micro-batch
                (:meth:`HFLightningModule.count_loss_items`); with it training batches carry the window keys.
            forward_kwargs: what the LightningModule passes to every forward (``use_cache=False``).
            metrics: evaluation computes metrics, so an evaluation batch must carry a label key.
            handles_placeholder_batches: mark an empty rank's stand-in batch (:mod:`~hf_lightning.data.placeholder`).

        Without a call, :meth:`setup` and the loaders read the same from ``trainer.lightning_module`` (its
        ``.model``, ``count_loss_items``, ``forward_kwargs``, ``compute_metrics``/``metrics`` and
        ``handles_placeholder_batches``), so ``trainer.fit(module, datamodule=dm)`` works as it is.

        Returns:
            ``self``.
        """
        self._bound = Binding(
            model,
            count_loss_items,
            dict(forward_kwargs or {}),
            bool(metrics),
            bool(handles_placeholder_batches),
        )
        return self

    def _binding(self) -> Binding:
        """The :meth:`bind` arguments, else what the trainer's LightningModule offers (public attributes only)."""
        if self._bound is not None:
            return self._bound
        trainer = getattr(self, "trainer", None)
        module = getattr(trainer, "lightning_module", None) if trainer is not None else None
        if module is None:
            return Binding()
        model = getattr(module, "model", None)
        # HFLightningModule's forward kwargs; `_forward_extra` until it names them forward_kwargs (issue 16 module side)
        extra = getattr(module, "forward_kwargs", None)
        if extra is None:
            extra = getattr(module, "_forward_extra", None)
        return Binding(
            model if isinstance(model, torch.nn.Module) else None,
            getattr(module, "count_loss_items", None),
            dict(extra or {}),
            bool(getattr(module, "compute_metrics", None) or getattr(module, "metrics", None)),
            bool(getattr(module, "handles_placeholder_batches", False)),
        )

    # ----------------------------------------------------------------------------------------- setup
    def prepare_data(self) -> None:
        if self.path is None:
            from hf_lightning.defaults import prepare_chatterbot

            prepare_chatterbot()

    def setup(self, stage: str | None = None) -> None:
        """Load, format, tokenize, prune and pack both splits once (later calls return at once).

        Fills ``train_dataset``, ``val_dataset`` (``None`` without validation data), ``data_format``,
        ``id2label`` (classification), ``dropped_columns`` and the collators. Reads the bound model (:meth:`bind`),
        when there is one, for pruning and for the checks.

        Raises:
            ConfigError: an option the data or the model cannot honour (named).
            DataError: a source that is missing, unreadable, empty, or lacks the format's fields.
        """
        if self.train_dataset is not None:
            return
        bound = self._binding()
        model = bound.model
        path, train, val, self._holdout = load_splits(
            self.path,
            self.validation_path,
            self.validation_split,
            self.seed,
            self.streaming,
            self.rename_columns,
        )
        fmt = self.format if self.format != "auto" else detect_format(column_names(train, self.path), path)
        self.data_format = fmt
        if fmt in ("messages", "conversations"):
            require_chat_template(self.tokenizer)
        check_packing(
            self.packing,
            self.padding_free,
            fmt=fmt,
            stream=is_stream(train),
            model=model,
            forward_kwargs=bound.forward_kwargs,
        )
        label2id = label_mapping(train, path) if fmt == "classification" else None
        if label2id is not None:
            self.id2label = {i: name for name, i in label2id.items()}
        inputs, inputs_from = resolve_model_inputs(model, self.model_input_names, self.tokenizer)
        self.resolved_label_names = self.label_names or (
            find_label_names(model) if model is not None else ["labels"]
        )
        keep = signature_columns(inputs, self.resolved_label_names)
        self._processor = ExampleProcessor(
            fmt, self.tokenizer, self.max_length, label2id, self.packing, self.padding_free
        )
        announce_document_ends(self.tokenizer, fmt, self.packing)
        val_path = self.validation_path or path
        self.train_dataset = self._prepare(train, fmt, "train", path, label2id, keep, inputs, inputs_from)
        self.val_dataset = (
            self._prepare(val, fmt, "validation", val_path, label2id, keep, inputs, inputs_from)
            if val is not None
            else None
        )
        if model is not None:  # a row longer than a position table fails in the embedding, maybe hours in
            self.check_positions(model)
            # ids and classes the model has no row for fail here, not inside its forward
            for split, ds, where in (
                ("train", self.train_dataset, path),
                ("validation", self.val_dataset, val_path),
            ):
                check_token_ids(ds, model, self.tokenizer.pad_token_id, where, split)
                if fmt == "classification":
                    check_label_range(ds, model, where, split)
        base = collator_for(
            fmt, self.tokenizer.pad_token_id, model, self.packing, self.padding_free, self.pad_to_multiple_of
        )
        self.train_collator = self._pruning_collator(
            base, self.train_dataset, keep, inputs, "train", inputs_from
        )
        self.eval_collator = self._pruning_collator(
            base, self.val_dataset, keep, inputs, "validation", inputs_from
        )
        if self.group_by_length and not is_stream(self.train_dataset):
            self._train_lengths = self._lengths(self.train_dataset)
        if bound.metrics:
            self._check_label_names()

    def check_positions(self, model: Any) -> None:
        """The prepared rows against ``model``'s positions (:func:`~hf_lightning.data.positions.check_positions`)."""
        splits = {"train": self.train_dataset, "validation": self.val_dataset}
        check_positions(model, self.max_length, self.pad_to_multiple_of, self.padding_free, splits)

    def _prepare(
        self,
        ds: Any,
        fmt: str,
        split: str,
        path: Any,
        label2id: Any,
        keep: list[str],
        inputs: list[str],
        inputs_from: str,
    ) -> Any:
        if is_stream(ds):
            return ds  # tokenized on the fly by ShardedStream
        if not isinstance(ds, datasets.Dataset):
            view, lengths = scan_torch_dataset(ds, self._processor, split, path)
            if not self.packing:
                if split == "train":
                    self._train_lengths = lengths
                return view
            # packing needs the token rows side by side: the only columns it keeps, as a datasets.Dataset
            rows = [view[i] for i in range(len(view))]
            out = datasets.Dataset.from_dict(
                {
                    "input_ids": [list(r["input_ids"]) for r in rows],
                    "labels": [list(r.get("labels") or r["input_ids"]) for r in rows],
                }
            )
        else:
            out = tokenize_dataset(
                ds,
                fmt,
                self.tokenizer,
                self.max_length,
                split,
                path,
                label2id,
                packing=self.packing,
                padding_free=self.padding_free,
            )
            if self.remove_unused_columns:
                out, dropped = prune_dataset(
                    out, keep, inputs, split, inputs_from, consumed=SOURCE_COLUMNS.get(fmt, ())
                )
                self.dropped_columns[split] = dropped
        if self.packing:
            out = pack_dataset(out, self.packing, self.max_length, split)
        return out

    def _pruning_collator(
        self, base: Any, ds: Any, keep: list[str], inputs: list[str], split: str, inputs_from: str
    ) -> Any:
        """Streams and torch datasets keep their columns, so pruning happens per example in the collator.

        The first example is checked here, in the main process: the drop is logged once (not once per worker)
        and a dataset without model inputs fails at setup rather than in the first batch.
        """
        if not self.remove_unused_columns or ds is None or isinstance(ds, datasets.Dataset):
            return base
        collator = PruneColumnsCollator(base, keep, inputs, split, inputs_from)
        example = self._first_example(ds, split == "validation")
        if example is not None:
            collator.inspect(example)
        self.dropped_columns[split] = collator.dropped
        return collator

    def _lengths(self, ds: Any) -> list[int]:
        if self._train_lengths is not None:
            return self._train_lengths
        lengths = sequence_lengths(ds)
        log.info("group_by_length: measured %d training lengths once (tokens of input_ids)", len(lengths))
        return lengths

    def _first_example(self, ds: Any, holdout_keep: bool | None) -> Any:
        if is_stream(ds):
            name = (self.validation_path or self.path) if holdout_keep else self.path
            stream = ShardedStream(
                ds, self._processor, holdout=self._holdout_spec(holdout_keep), split="validation", name=name
            )
            return next(iter(stream), None)
        return ds[0] if len(ds) else None

    def _check_label_names(self) -> None:
        if self.val_dataset is None:
            return
        example = self._first_example(self.val_dataset, True)
        keys = set(self.eval_collator([example])) if example is not None else set()
        if not any(name in keys for name in self.resolved_label_names):
            raise ConfigError(
                f"metrics are configured but no label key resolves: data.label_names={self.resolved_label_names} "
                f"and an evaluation batch has the keys {sorted(keys)}. Set data.label_names to the key(s) holding "
                "the labels, or remove the metrics"
            )

    # ------------------------------------------------------------------------------------ dataloaders
    def _world(self) -> tuple[int, int]:
        trainer = getattr(self, "trainer", None)
        if trainer is None:
            return 1, 0
        return trainer.world_size, trainer.global_rank

    def _accumulation(self) -> int:
        trainer = getattr(self, "trainer", None)
        return int(getattr(trainer, "accumulate_grad_batches", 1) or 1) if trainer is not None else 1

    def _holdout_spec(self, keep: bool | None) -> tuple[float, bool] | None:
        return (self._holdout, keep) if self._holdout and keep is not None else None

    def _loader_kwargs(self) -> dict[str, Any]:
        return {
            "num_workers": self.num_workers,
            "pin_memory": self.pin_memory,
            "persistent_workers": self.persistent_workers,
            "prefetch_factor": self.prefetch_factor,
        }

    def _stream_loader(self, source: Any, train: bool) -> EpochDataLoader:
        world, rank = self._world()
        batch = self.per_device_train_batch_size if train else self.per_device_eval_batch_size
        holdout = self._holdout_spec(not train)
        trainer = getattr(self, "trainer", None)
        loader = stream_loader(
            source,
            self._processor,
            train=train,
            world=world,
            rank=rank,
            batch_size=batch,
            shuffle=self.shuffle,
            seed=self.seed,
            buffer_size=self.shuffle_buffer_size,
            length_buffer=MEGA_BATCH_MULT * batch * self._accumulation()
            if train and self.group_by_length
            else None,
            holdout=holdout,
            length=self._stream_length(source, holdout),
            name=self.path if train else self.validation_path or self.path,
            drop_last=self.drop_last,
            # the fit loop's epoch (Lightning's loop progress; issue 16 moves this read into hf_lightning/compat.py)
            epoch_fn=(lambda: trainer.fit_loop.epoch_progress.current.processed)
            if trainer is not None
            else None,
            collate_fn=self.train_collator if train else self._eval_collate(),
            **self._loader_kwargs(),
        )
        if train:
            self._require_known_epoch(loader.dataset.length)
        return loader

    def _require_known_epoch(self, length: int | None) -> None:
        trainer = getattr(self, "trainer", None)
        if length is None and trainer is not None and (trainer.max_steps is None or trainer.max_steps < 0):
            raise ConfigError(
                "the training data is a stream of unknown length, so an epoch has no known number of steps: "
                "set trainer.max_steps"
            )

    @staticmethod
    def _stream_length(source: Any, holdout: Any) -> int | None:
        return len(source) if hasattr(source, "__len__") and holdout is None else None

    def _loader(self, ds: Any, train: bool) -> EpochDataLoader:
        if is_stream(ds):
            return self._stream_loader(ds, train)
        world, rank = self._world()
        batch = self.per_device_train_batch_size if train else self.per_device_eval_batch_size
        lengths = None
        if train and self.group_by_length:
            lengths = self._train_lengths = self._lengths(ds)
        return map_loader(
            ds,
            train=train,
            world=world,
            rank=rank,
            batch_size=batch,
            shuffle=self.shuffle,
            seed=self.seed,
            drop_last=self.drop_last,
            lengths=lengths,
            group_batch_size=batch * self._accumulation(),
            collate_fn=self.train_collator if train else self._eval_collate(),
            **self._loader_kwargs(),
        )

    def _eval_collate(self) -> Any:
        """The evaluation collator; marks placeholder batches for a module that handles them
        (:mod:`~hf_lightning.data.placeholder`)."""
        if self._binding().handles_placeholder_batches:
            return PlaceholderAwareCollator(self.eval_collator)
        return self.eval_collator

    def train_batches_per_epoch(self) -> int | None:
        """``len(self.train_dataloader())`` on this rank, computed without building a loader (to size the LR
        schedule before Lightning builds the one train loader, after a checkpoint's loop state is restored).

        ``None`` for a stream of unknown length. Runs :meth:`setup` when it has not run yet.

        Raises:
            ConfigError: a stream of unknown length without ``trainer.max_steps``.
        """
        if self.train_dataset is None:
            self.setup("fit")
        ds, stream = self.train_dataset, is_stream(self.train_dataset)
        n = self._stream_length(ds, self._holdout_spec(False)) if stream else len(ds)
        if stream:
            self._require_known_epoch(n)
        return batches_per_epoch(
            n,
            stream=stream,
            world=self._world()[0],
            batch_size=self.per_device_train_batch_size,
            num_workers=self.num_workers,
            drop_last=self.drop_last,
        )

    def train_dataloader(self) -> Any:
        """Micro-batches of ``per_device_train_batch_size`` examples, this rank's share of the epoch's order.

        Wrapped in :class:`~hf_lightning.data.dataloaders.AccumulationWindowLoader` when a ``count_loss_items`` is
        bound (the window keys above); a plain loader otherwise (standalone use).

        Raises:
            ConfigError: a stream of unknown length without ``trainer.max_steps``.
        """
        if self.train_dataset is None:
            self.setup("fit")
        loader = self._loader(self.train_dataset, True)
        count = self._binding().count_loss_items
        trainer = getattr(self, "trainer", None)
        if count is None:
            return loader
        if trainer is None:  # bound but not fitting (inspect a batch): windows of accumulate_grad_batches=1
            return AccumulationWindowLoader(loader, 1, count)
        return AccumulationWindowLoader(
            loader,
            trainer.accumulate_grad_batches,
            count,
            max_batches=lambda: trainer.num_training_batches,
            # the epoch being trained: current_epoch counts it as done already when a checkpoint is written after
            # training stopped in its middle (at on_train_end), epochs started minus one does not (Lightning's
            # loop progress: issue 16 moves these reads into hf_lightning/compat.py)
            progress=lambda: (
                trainer.fit_loop.epoch_progress.current.started - 1,
                trainer.fit_loop.epoch_loop.batch_progress.current.processed,
            ),
        )

    def val_dataloader(self) -> Any:
        """Batches of ``per_device_eval_batch_size`` examples in dataset order, this rank's share without any
        padding or repetition (ranks may differ by one example; a rank with none gets one placeholder batch, see
        :mod:`~hf_lightning.data.placeholder`); ``[]`` without validation data."""
        if self.train_dataset is None:
            self.setup("validate")
        if self.val_dataset is None:
            return []
        return self._loader(self.val_dataset, False)

    def predict_dataloader(self) -> Any:
        """The validation data in dataset order (each rank its share, no padding)."""
        return self.val_dataloader()
