"""``HFDataModule``: load, format, tokenize, prune, pack, collate and sample, as a standalone LightningDataModule.

The pieces live in their own modules; this class only wires them:

    loading      source -> datasets / torch objects, train/validation split
    formatting   schema -> format; rows -> input_ids / labels        (chat.py for chat formats)
    preprocess   Dataset.map (cached) + truncation/drop counts; on-the-fly path for streams and torch data
    pruning      columns vs the model's forward signature
    packing      bfd / wrapped rows
    collators    padding, classification, seq2seq             (flattening.py: padding-free)
    samplers     seeded global order, length grouping, exact distributed split
    iterable     streams sharded per rank and per worker
    loader       per-epoch worker seeds and stream epochs
    windows      num_items_in_batch per gradient-accumulation window
"""

from __future__ import annotations

import logging
from typing import Any

import datasets
import lightning as L
import torch

from hf_lightning.data.chat import require_chat_template
from hf_lightning.data.checks import (
    check_arguments,
    check_fits_one_batch,
    check_label_range,
    check_sequence_isolation,
    check_token_ids,
)
from hf_lightning.data.collators import ClassificationCollator, PaddingCollator, Seq2SeqCollator
from hf_lightning.data.end_of_turn import warn_end_of_turn
from hf_lightning.data.file_errors import read_error
from hf_lightning.data.flattening import PaddingFreeCollator
from hf_lightning.data.formatting import CAUSAL_FORMATS, FORMATS, SOURCE_COLUMNS, detect_format
from hf_lightning.data.iterable import ShardedStream
from hf_lightning.data.loader import EpochDataLoader
from hf_lightning.data.loading import is_stream, load_source, split_train_validation
from hf_lightning.data.packing import STRATEGIES, PackedCollator, announce_document_ends, pack_dataset
from hf_lightning.data.placeholder import PlaceholderAwareCollator
from hf_lightning.data.positions import check_positions
from hf_lightning.data.preprocess import ExampleProcessor, label_mapping, scan_torch_dataset, tokenize_dataset
from hf_lightning.data.pruning import (
    PruneColumnsCollator,
    find_label_names,
    forward_parameters,
    prune_dataset,
    resolve_model_inputs,
    signature_columns,
)
from hf_lightning.data.samplers import ExactDistributedSampler, TopUpDataset, sequence_lengths
from hf_lightning.data.windows import AccumulationWindowLoader
from hf_lightning.errors import ConfigError, DataError

log = logging.getLogger(__name__)
# stages that read only the validation split (trainer.validate / test / predict)
EVAL_STAGES = ("validate", "test", "predict")

# HF's mega-batch multiplier cap (``get_length_grouped_indices``); streams group within buffers this many batches long
MEGA_BATCH_MULT = 50


def _is_sequence_classifier(model: Any) -> bool:
    return model is not None and type(model).__name__.endswith("ForSequenceClassification")


class HFDataModule(L.LightningDataModule):
    """Data for HF-style models, usable with any LightningModule and ``lightning.Trainer``.

    Args:
        tokenizer: a ``transformers`` tokenizer (needs a pad token; a chat template for chat data).
        path: a json/jsonl/csv/parquet file, a ``save_to_disk`` folder, a ``datasets`` ``Dataset`` /
            ``DatasetDict`` / ``IterableDataset``, a torch ``Dataset`` / ``IterableDataset`` of mappings, or
            ``None`` for the embedded chatterbot-corpus chat data.
        validation_path: a separate validation source (same kinds); overrides any split of ``path``.
        format: ``"auto"`` (from the schema, see :mod:`~hf_lightning.data.formatting`) or one of
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
        model_input_names: the model's input names; default: the ``forward`` parameters of the attached
            LightningModule's ``.model``, else the tokenizer's ``model_input_names``.
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

    When the attached LightningModule defines ``count_loss_items(batch) -> int`` (as :class:`HFLightningModule`
    does), training batches also carry three Python ``int`` keys (see
    :class:`~hf_lightning.data.windows.AccumulationWindowLoader`): ``num_items_in_batch``, the label count of
    their whole gradient-accumulation window on this process; ``num_items_in_micro_batch``; and
    ``num_batches_in_window``.

    What it reproduces of HF ``Trainer``: ``_remove_unused_columns`` (``remove_unused_columns``, with the dropped
    names logged), ``_get_train_sampler`` (a seeded random order, or ``LengthGroupedSampler``'s
    ``get_length_grouped_indices`` with ``group_by_length``), ``get_train_dataloader`` (per-worker seeds) and
    ``get_batch_samples`` (``num_items_in_batch`` counted before the window's first forward). The collators are
    listed in :mod:`hf_lightning.data.collators`. It differs where HF's sampler repeats examples to even out
    ranks: here every example is used exactly once per epoch across ranks and workers.

    Metrics check: when the attached module has a truthy ``compute_metrics`` or ``metrics`` attribute and no
    key of ``label_names`` appears in an evaluation batch, ``setup`` raises :class:`ConfigError`.

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
        packing: bool | str = False,
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
        check_arguments(
            "data",
            {
                "per_device_train_batch_size": (per_device_train_batch_size, "positive int"),
                "per_device_eval_batch_size": (per_device_eval_batch_size, "positive int"),
                "max_length": (max_length, "positive int"),
                "shuffle_buffer_size": (shuffle_buffer_size, "positive int"),
                "validation_split": (validation_split, "fraction"),
                "num_workers": (num_workers, "int >= 0"),
                "prefetch_factor": (prefetch_factor, "positive int or null"),
                "pad_to_multiple_of": (pad_to_multiple_of, "positive int or null"),
                "seed": (seed, "int >= 0"),  # numpy and torch generators refuse negative seeds
                "model_input_names": (model_input_names, "names or null"),
                "label_names": (label_names, "names or null"),
                **{
                    k: (v, "bool")
                    for k, v in (
                        ("shuffle", shuffle),
                        ("group_by_length", group_by_length),
                        ("padding_free", padding_free),
                        ("streaming", streaming),
                        ("remove_unused_columns", remove_unused_columns),
                        ("pin_memory", pin_memory),
                        ("persistent_workers", persistent_workers),
                        ("drop_last", drop_last),
                    )
                },
            },
        )
        if format not in ("auto", *FORMATS):
            raise ConfigError(f"data.format={format!r}; expected one of {['auto', *FORMATS]}")
        if packing is True:
            packing = "bfd"
        if packing is not False and packing is not None and packing not in STRATEGIES:
            raise ConfigError(
                f"data.packing={packing!r}; expected false, true (= bfd) or one of {list(STRATEGIES)}"
            )
        if num_workers == 0 and (persistent_workers or prefetch_factor is not None):
            key = "persistent_workers" if persistent_workers else "prefetch_factor"
            raise ConfigError(
                f"data.{key} applies to worker processes only; set data.num_workers > 0 or unset it"
            )
        if getattr(tokenizer, "pad_token_id", None) is None:
            if getattr(tokenizer, "eos_token", None) is not None:
                hint = "set tokenizer.pad_token (for example to its eos_token)"
            else:
                # nothing to fall back on: the model folder's tokenizer needs a token named for padding
                hint = (
                    "it has no eos_token either: set tokenizer.pad_token and tokenizer.eos_token (for example "
                    "both to its end-of-text token, such as '<|endoftext|>' for GPT-2)"
                )
            raise ConfigError(f"the tokenizer has no pad token; {hint} and save it into the model folder")
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
        self.packing = packing or None
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

    # ----------------------------------------------------------------------------------------- setup
    def prepare_data(self) -> None:
        if self.path is None:
            from hf_lightning.defaults import prepare_chatterbot

            prepare_chatterbot()

    def _attached_model(self) -> Any:
        """The attached LightningModule's ``.model`` (an ``nn.Module``), or ``None`` when standalone."""
        trainer = getattr(self, "trainer", None)
        module = getattr(trainer, "lightning_module", None) if trainer is not None else None
        model = getattr(module, "model", None)
        return model if isinstance(model, torch.nn.Module) else None

    def _sources(self, eval_only: bool = False) -> tuple[Any, Any, Any]:
        path, validation_path = self.path, self.validation_path
        if eval_only:  # the validation file alone (no train split is read)
            val = load_source(validation_path, streaming=self.streaming)
            if isinstance(val, (datasets.DatasetDict, datasets.IterableDatasetDict)):
                val = next(iter(val.values()))
            return path, None, self._renamed(val, validation_path) if self.rename_columns else val
        if path is None:
            from hf_lightning.defaults import prepare_chatterbot

            files = prepare_chatterbot()
            path, validation_path = files["train"], files["validation"]
        loaded = load_source(path, streaming=self.streaming)
        split = 0.0 if validation_path is not None else self.validation_split
        train, val, self._holdout = split_train_validation(loaded, split, self.seed, path)
        if validation_path is not None:
            val = load_source(validation_path, streaming=self.streaming)
            if isinstance(val, (datasets.DatasetDict, datasets.IterableDatasetDict)):
                val = next(iter(val.values()))
        if self.rename_columns:
            train = self._renamed(train, path)
            val = self._renamed(val, self.validation_path or path) if val is not None else None
        return path, train, val

    def _renamed(self, ds: Any, path: Any) -> Any:
        """``ds`` with ``data.rename_columns`` applied (datasets sources only)."""
        if not hasattr(ds, "rename_columns"):
            raise ConfigError(
                f"data.rename_columns needs a datasets source; data.path={path} is {type(ds).__name__}"
            )
        columns = self._columns(ds)
        missing = [c for c in self.rename_columns if c not in columns]
        if missing:
            raise DataError(f"data.rename_columns: {missing} not in data.path={path} (columns: {columns})")
        return ds.rename_columns(self.rename_columns)

    def _columns(self, ds: Any) -> list[str]:
        """The schema's column names; a source without a schema (torch data, some streams) shows its first row."""
        names = getattr(ds, "column_names", None)
        if names:
            return list(names)
        try:
            first = next(iter(ds)) if is_stream(ds) else ds[0]
        except (DataError, StopIteration):
            raise
        except Exception as err:  # a stream reads its file only now: a broken line shows here first
            raise read_error(self.path, "train", err) from err
        if not isinstance(first, dict):
            raise DataError(
                f"data.path={self.path}: examples must be mappings of column -> value, got {type(first).__name__}"
            )
        log.info("the source has no schema; reading the column names from its first row: %s", sorted(first))
        return list(first)

    def setup(self, stage: str | None = None) -> None:
        """Load, format, tokenize, prune and pack both splits once (later calls return at once).

        Fills ``train_dataset``, ``val_dataset`` (``None`` without validation data), ``data_format``,
        ``id2label`` (classification), ``dropped_columns`` and the collators. Reads the attached
        LightningModule's ``.model`` (when there is one) for pruning and for the packing checks.

        Raises:
            ConfigError: an option the data or the model cannot honour (named).
            DataError: a source that is missing, unreadable, empty, or lacks the format's fields.
        """
        if self.train_dataset is not None or (self.val_dataset is not None and stage in EVAL_STAGES):
            return
        model = self._attached_model()
        # an evaluation-only setup (trainer.validate / predict with a validation file) prepares no train split
        eval_only = stage in EVAL_STAGES and self.validation_path is not None
        path, train, val = self._sources(eval_only)
        fmt = self.format
        if fmt == "auto":
            fmt = detect_format(self._columns(val if eval_only else train), self.validation_path or path)
        if eval_only and fmt == "classification":  # the class ids come from the training split
            path, train, val = self._sources()
            eval_only = False
        self.data_format = fmt
        self._check_options(fmt, val if eval_only else train, model)
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

        self.train_dataset = (
            None
            if eval_only
            else self._prepare(train, fmt, "train", path, label2id, keep, inputs, inputs_from)
        )
        self.val_dataset = (
            self._prepare(
                val, fmt, "validation", self.validation_path or path, label2id, keep, inputs, inputs_from
            )
            if val is not None
            else None
        )
        if model is not None:  # a row longer than a position table fails in the embedding, maybe hours in
            self.check_positions(model)
        if model is not None:  # ids and classes the model has no row for fail here, not inside its forward
            for split, ds, where in (
                ("train", self.train_dataset, path),
                ("validation", self.val_dataset, self.validation_path or path),
            ):
                check_token_ids(ds, model, self.tokenizer.pad_token_id, where, split)
                if fmt == "classification":
                    check_label_range(ds, model, where, split)
        base = self._base_collator(fmt, model)
        self.train_collator = self._pruning_collator(
            base, self.train_dataset, keep, inputs, "train", inputs_from
        )
        self.eval_collator = self._pruning_collator(
            base, self.val_dataset, keep, inputs, "validation", inputs_from
        )
        if self.group_by_length and self.train_dataset is not None and not is_stream(self.train_dataset):
            self._train_lengths = self._lengths(self.train_dataset)
        self._check_label_names()

    def check_positions(self, model: Any) -> None:
        """The prepared rows against ``model``'s positions (:func:`~hf_lightning.data.positions.check_positions`)."""
        splits = {"train": self.train_dataset, "validation": self.val_dataset}
        check_positions(model, self.max_length, self.pad_to_multiple_of, self.padding_free, splits)

    def _check_options(self, fmt: str, train: Any, model: Any) -> None:
        stream = is_stream(train)
        if fmt in ("messages", "conversations"):
            require_chat_template(self.tokenizer)
            warn_end_of_turn(self.tokenizer)  # an end-of-turn generation cannot stop on
        if self.packing and fmt not in CAUSAL_FORMATS:
            raise ConfigError(
                f"data.packing={self.packing!r} packs causal-LM rows; the {fmt!r} format cannot be packed"
            )
        if self.packing and stream:
            # packing on the fly would give each rank a content-dependent number of rows, so ranks would run
            # different numbers of steps (DDP hangs) and the exact per-rank split would be lost
            raise ConfigError(
                f"data.packing={self.packing!r} needs the whole dataset (a map-style source) so that every rank "
                "gets the same number of packed rows; this source is a stream. Use data.padding_free=true for "
                "streams (no padding either), or data.streaming=false"
            )
        if self.padding_free and fmt not in CAUSAL_FORMATS:
            raise ConfigError(
                f"data.padding_free=true flattens causal-LM rows; the {fmt!r} format cannot be flattened"
            )
        if (self.packing or self.padding_free) and model is not None:
            if "position_ids" not in forward_parameters(model):
                raise ConfigError(
                    f"{type(model).__name__}.forward takes no position_ids, so packed or padding-free batches "
                    "cannot mark where sequences start; set data.packing=false and data.padding_free=false"
                )
            check_sequence_isolation(model, "data.packing" if self.packing else "data.padding_free")
            if getattr(getattr(model, "config", None), "use_cache", False):
                trainer = getattr(self, "trainer", None)
                module = getattr(trainer, "lightning_module", None) if trainer is not None else None
                # HFLightningModule turns the cache off itself: nothing for its user to do (no line); any other
                # LightningModule must do it, or packed sequences attend to each other (WARNING)
                handled = getattr(module, "_forward_extra", {}).get("use_cache") is False
                if not handled:
                    log.warning(
                        "packed/padding-free batches: transformers only separates sequences by position_ids when "
                        "no KV cache is built; %s.config.use_cache is true, so the LightningModule must call the "
                        "model with use_cache=False (HFLightningModule does) or sequences will attend to each other",
                        type(model).__name__,
                    )

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

    def _base_collator(self, fmt: str, model: Any) -> Any:
        pad = self.tokenizer.pad_token_id
        # pre-tokenized rows for a sequence classifier carry one class per row, not token labels
        if fmt == "classification" or (fmt == "tokenized" and _is_sequence_classifier(model)):
            return ClassificationCollator(pad, self.pad_to_multiple_of)
        if fmt == "seq2seq":
            return Seq2SeqCollator(pad, model=model, pad_to_multiple_of=self.pad_to_multiple_of)
        if self.padding_free:
            return PaddingFreeCollator()
        if self.packing:
            return PackedCollator(pad, self.pad_to_multiple_of)
        return PaddingCollator(pad, pad_to_multiple_of=self.pad_to_multiple_of)

    def _first_example(self, ds: Any, holdout_keep: bool | None) -> Any:
        if is_stream(ds):
            name = (self.validation_path or self.path) if holdout_keep else self.path
            stream = ShardedStream(
                ds, self._processor, holdout=self._holdout_spec(holdout_keep), split="validation", name=name
            )
            return next(iter(stream), None)
        return ds[0] if len(ds) else None

    def _check_label_names(self) -> None:
        trainer = getattr(self, "trainer", None)
        module = getattr(trainer, "lightning_module", None) if trainer is not None else None
        if module is None or not (
            getattr(module, "compute_metrics", None) or getattr(module, "metrics", None)
        ):
            return
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
        length_buffer = None
        if train and self.group_by_length:
            length_buffer = MEGA_BATCH_MULT * batch * self._accumulation()
            log.info(
                "group_by_length on a stream: sorting by length within buffers of %d examples per reader "
                "(the whole stream cannot be sorted)",
                length_buffer,
            )
        holdout = self._holdout_spec(not train)
        sized = hasattr(source, "__len__") and holdout is None
        stream = ShardedStream(
            source,
            self._processor,
            rank=rank,
            world_size=world,
            shuffle=train and self.shuffle,
            seed=self.seed,
            buffer_size=self.shuffle_buffer_size,
            length_buffer=length_buffer,
            holdout=holdout,
            length=len(source) if sized else None,
            top_up=train,
            split="train" if train else "validation",
            name=self.path if train else self.validation_path or self.path,
        )
        if train and stream.length is not None:
            check_fits_one_batch(stream.per_reader(self.num_workers), batch, self.drop_last)
        trainer = getattr(self, "trainer", None)
        if (
            train
            and stream.length is None
            and trainer is not None
            and (trainer.max_steps is None or trainer.max_steps < 0)
        ):
            raise ConfigError(
                "the training data is a stream of unknown length, so an epoch has no known number of steps: "
                "set trainer.max_steps"
            )
        epoch_fn = (
            (lambda: trainer.fit_loop.epoch_progress.current.processed) if trainer is not None else None
        )
        return EpochDataLoader(
            stream,
            seed=self.seed,
            rank=rank,
            epoch_fn=epoch_fn,
            batch_size=batch,
            collate_fn=self.train_collator if train else self._eval_collate(),
            drop_last=self.drop_last if train else False,
            **self._loader_kwargs(),
        )

    def _map_loader(self, ds: Any, train: bool) -> EpochDataLoader:
        world, rank = self._world()
        batch = self.per_device_train_batch_size if train else self.per_device_eval_batch_size
        lengths = None
        if train and self.group_by_length:
            lengths = self._lengths(ds)
            self._train_lengths = lengths
        sampler = ExactDistributedSampler(
            ds,
            num_replicas=world,
            rank=rank,
            shuffle=train and self.shuffle,
            seed=self.seed,
            drop_last=self.drop_last if train else False,
            lengths=lengths,
            group_batch_size=batch * self._accumulation(),
            top_up=train,
        )
        if train:
            check_fits_one_batch(len(sampler), batch, self.drop_last)
        return EpochDataLoader(
            TopUpDataset(ds, placeholder=not train) if sampler.needs_top_up else ds,
            seed=self.seed,
            rank=rank,
            sampler=sampler,
            batch_size=batch,
            collate_fn=self.train_collator if train else self._eval_collate(),
            drop_last=self.drop_last if train else False,
            **self._loader_kwargs(),
        )

    def _eval_collate(self) -> Any:
        """The evaluation collator; marks placeholder batches for a module that handles them
        (:mod:`~hf_lightning.data.placeholder`)."""
        trainer = getattr(self, "trainer", None)
        module = getattr(trainer, "lightning_module", None) if trainer is not None else None
        if getattr(module, "handles_placeholder_batches", False):
            return PlaceholderAwareCollator(self.eval_collator)
        return self.eval_collator

    def train_dataloader(self) -> Any:
        """Micro-batches of ``per_device_train_batch_size`` examples, this rank's share of the epoch's order.

        Wrapped in :class:`~hf_lightning.data.windows.AccumulationWindowLoader` when the attached module counts
        loss items (the window keys above); a plain loader otherwise (standalone use).

        Raises:
            ConfigError: a stream of unknown length without ``trainer.max_steps``.
        """
        if self.train_dataset is None:
            self.setup("fit")
        ds = self.train_dataset
        loader = self._stream_loader(ds, True) if is_stream(ds) else self._map_loader(ds, True)
        trainer = getattr(self, "trainer", None)
        module = trainer.lightning_module if trainer is not None else None
        count = getattr(module, "count_loss_items", None)
        if count is None:
            return loader
        return AccumulationWindowLoader(
            loader,
            trainer.accumulate_grad_batches,
            count,
            max_batches=lambda: trainer.num_training_batches,
            # the epoch being trained: current_epoch counts it as done already when a checkpoint is written after
            # training stopped in its middle (at on_train_end), epochs started minus one does not
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
        ds = self.val_dataset
        return self._stream_loader(ds, False) if is_stream(ds) else self._map_loader(ds, False)

    def predict_dataloader(self) -> Any:
        """The validation data in dataset order (each rank its share, no padding)."""
        return self.val_dataloader()
