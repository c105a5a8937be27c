"""``HFDataModule``: the data path of one run, as a standalone LightningDataModule.

It wires the steps, each in its own module, in the order a batch is made, and hands out the loaders:

    sources      load, split, rename; tell the format from the columns; where in a file a row is
    formats      rows of each format -> input_ids / labels, the row report   (chat.py: chat templates;
                 class_labels.py: the classification format's classes)
    tokenize     Dataset.map (cached), streams and torch datasets per example; truncation/drop counts;
                 column pruning
    checks       token ids, labels and positions against the model
    packing      check_packing (every packing rule), the RowPlan the option means, bfd / wrapped rows
    collators    padded, padding-free, packed, packed per batch, classification, seq2seq
                 (layout.py: the data.layout choice and collator_for)
    sampling     seeded global order, length grouping, exact distributed split; accumulation windows and
                 their num_items_in_batch                                         (streams.py: streams)
    dataloaders  per-epoch worker seeds, a plain loop's position, batches per epoch

What it needs from the model side arrives through :meth:`bind`, or, when nobody called it, from the trainer's
LightningModule's ``data_binding()``; what the model side needs from it is :meth:`train_batches_per_epoch`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any

import datasets
import lightning as L
import torch
import torch.distributed as dist

from hf_lightning.core.arguments import (
    FRACTION,
    NAMES,
    NON_NEGATIVE_INT,
    OPTIONAL_POSITIVE_INT,
    POSITIVE_INT,
    RENAMES,
    check_call,
)
from hf_lightning.core.batch import Window, to_device
from hf_lightning.core.errors import ConfigError, DataError
from hf_lightning.data.chat import require_chat_template, warn_end_of_turn
from hf_lightning.data.checks import (
    check_fits_one_batch,
    check_given_label_names,
    check_label_key,
    check_pad_token,
    check_positions,
    check_rows_fit_model,
)
from hf_lightning.data.class_labels import (
    ClassLabels,
    check_head,
    encode_labels,
    label_column_name,
    read_labels,
)
from hf_lightning.data.collators import PlaceholderAwareCollator
from hf_lightning.data.dataloaders import (
    EpochDataLoader,
    LoaderPosition,
    batches_per_epoch,
    data_signature,
    describe_differences,
)
from hf_lightning.data.formats import FORMAT, check_columns
from hf_lightning.data.layout import (
    LAYOUT,
    Layout,
    LayoutChoice,
    announce,
    apply_layout,
    check_documents_apart,
    collator_for,
    document_column,
)
from hf_lightning.data.packing import (
    PACK_BUFFER,
    PACKING,
    Packing,
    RowPlan,
    StreamPacking,
    announce_document_ends,
    check_packing,
    packing_strategy,
    row_plan,
)
from hf_lightning.data.sampling import (
    AccumulationWindowLoader,
    CountUse,
    ExactDistributedSampler,
    ResumableLoader,
    TopUpDataset,
    WindowBatch,
    WindowLoader,
    sequence_lengths,
    warn_no_count,
)
from hf_lightning.data.sources import (
    DEFAULT_MAX_ROW_BYTES,
    column_names,
    detect_format,
    is_stream,
    load_splits,
    load_test,
    load_validation,
)
from hf_lightning.data.streams import ShardedStream
from hf_lightning.data.tokenize import (
    Columns,
    ExampleProcessor,
    find_label_names,
    prepare_split,
    prune_per_example,
    resolve_columns,
)

log = logging.getLogger(__name__)
# stages that read only the validation split (trainer.validate / test / predict)
EVAL_STAGES = ("validate", "test", "predict")
# which side of a stream's validation hold-out each split reads (None: the split is a source of its own)
HOLDOUT_KEEPS = {"train": False, "validation": True, "test": None}
# HF's mega-batch multiplier cap (``get_length_grouped_indices``); streams group within buffers this many
# batches long
MEGA_BATCH_MULT = 50
# the keys of state_dict() (LoaderPosition.state_dict)
POSITION_KEYS = ("epoch", "batches_consumed")


@dataclass
class Binding:
    """What the data needs from the model side (see :meth:`HFDataModule.bind`)."""

    model: torch.nn.Module | None = None
    count_loss_items: Callable[[Mapping[str, Any]], int] | None = None
    forward_kwargs: dict[str, Any] = field(default_factory=dict)
    metrics: bool = False
    handles_placeholder_batches: bool = False
    steps_windows: bool = False


def binding_from_trainer(trainer: Any) -> Binding:
    """What ``trainer.lightning_module`` declares for the data: its ``data_binding()``, a mapping of
    :meth:`HFDataModule.bind`'s keyword arguments (:class:`~hf_lightning.HFLightningModule` has one). Nothing
    else of the module is read: a module without ``data_binding`` (or no trainer, no module) binds nothing."""
    module = getattr(trainer, "lightning_module", None) if trainer is not None else None
    declare = getattr(module, "data_binding", None)
    return make_binding(**declare()) if callable(declare) else Binding()


def make_binding(
    model: torch.nn.Module | None = None,
    *,
    count_loss_items: Callable[[Mapping[str, Any]], int] | None = None,
    forward_kwargs: Mapping[str, Any] | None = None,
    metrics: bool = False,
    handles_placeholder_batches: bool = False,
    steps_windows: bool = False,
) -> Binding:
    """A :class:`Binding` of :meth:`HFDataModule.bind`'s arguments (described there)."""
    return Binding(
        model,
        count_loss_items,
        dict(forward_kwargs or {}),
        bool(metrics),
        bool(handles_placeholder_batches),
        bool(steps_windows),
    )


class HFDataModule(L.LightningDataModule):
    """Data for HF-style models, usable with any LightningModule and ``lightning.Trainer``.

    Args:
        tokenizer: a ``transformers`` tokenizer (needs a pad token; a chat template for chat data), or the
            folder or hub id of one (``AutoTokenizer.from_pretrained``; a missing pad token becomes the eos
            token, with a WARNING), so that a config can name it: ``tokenizer: DIR``, or a ``_target_`` node.
        path: a json/jsonl/csv/parquet file, a ``save_to_disk`` folder, a hub dataset id (``org/name``), a
            ``datasets`` ``Dataset`` / ``DatasetDict`` / ``IterableDataset``, a torch ``Dataset`` /
            ``IterableDataset`` of mappings, or ``None`` for the embedded chatterbot-corpus chat data.
        validation_path: a separate validation source (same kinds); overrides any split of ``path``.
        test_path: the test data of ``trainer.test`` (same kinds); default: the ``test_split_name`` split of a
            ``path`` with splits. Without either, :meth:`test_dataloader` raises :class:`ConfigError`.
        format: ``"auto"`` (from the schema, see :mod:`~hf_lightning.data.formats`) or one of
            ``text, prompt_completion, messages, conversations, classification, seq2seq, tokenized``.
        validation_split: share of rows held out for validation when the source has no validation split.
        max_length: tokens per example after truncation (truncated and dropped rows are counted in the log);
            with ``packing`` the row length (``wrapped`` truncates no document, ``bfd`` truncates longer
            ones).
        per_device_train_batch_size / per_device_eval_batch_size: examples (packed rows) per micro-batch.
        gradient_accumulation_steps: micro-batches per optimizer step (HF's name). For a module that steps
            windows (``HFLightningModule``) each training batch is a
            :class:`~hf_lightning.core.batch.Window` of this many micro-batches (the last of an epoch may
            hold fewer); a module on Lightning's automatic optimization gets micro-batches and accumulates
            with ``Trainer(accumulate_grad_batches=...)`` instead, so this must stay 1 for it.
        shuffle: random training order (seeded by ``seed + epoch``, the same on every rank).
        group_by_length: HF's mega-batch length grouping (map-style), a bounded sort buffer (streams).
        packing: ``False``, ``"bfd"`` (``True`` means ``"bfd"``) or ``"wrapped"`` (causal formats); packed
            ``text`` documents end with EOS (see :mod:`~hf_lightning.data.packing`). A stream is packed as
            it is read, split over ranks x workers by packed rows (:mod:`~hf_lightning.data.streams`; the
            number of packed rows is known only once read, so training needs ``trainer.max_steps``).
        pack_buffer: documents a stream is packed within by ``bfd`` (``None``:
            :data:`~hf_lightning.data.packing.PACK_BUFFER`); given for anything else, one INFO line says it
            does not apply.
        padding_free: flatten each batch into one row with restarting ``position_ids`` (no padding).
        layout: ``None`` (the three settings above as given) or ``"auto"``: the fastest layout that keeps the
            loss exact, chosen at setup from the format and the model when none of the three is set, and said
            in one INFO line (:mod:`~hf_lightning.data.layout`).
        streaming: read files lazily as a stream (sharded per rank and per worker).
        shuffle_buffer_size: buffer of the stream shuffle.
        remove_unused_columns: keep only the model's ``forward`` arguments and the label columns (HF default).
        model_input_names: the model's input names; default: the ``forward`` parameters of the bound model
            (:meth:`bind`), else the tokenizer's ``model_input_names``.
        label_names: the batch keys evaluation treats as labels (HF ``label_names``); default: the ``forward``
            parameters with ``label`` in their name, else ``["labels"]``. Given, each must be a key of the
            batches (HF counts a batch as labelled only when it holds all of them): ``setup`` refuses one that
            is not, naming the batch keys and the source's columns.
        num_workers / pin_memory / persistent_workers / prefetch_factor / drop_last: ``DataLoader`` knobs.
        num_proc: processes of ``Dataset.map`` for tokenizing a map-style split (``datasets``' ``num_proc``,
            TRL's ``dataset_num_proc``); ``None``: one. Streams and torch datasets tokenize on the fly (a log
            line says so).
        pad_to_multiple_of: round padded lengths up to this multiple.
        seed: seed of the order, of worker RNGs and of the validation hold-out.
        rename_columns: ``{source column: new name}`` applied to every split before the format is read (a
            banking77 CSV's ``category`` becomes the classification format's ``label``).
        name / revision: a hub dataset's config name and revision when ``path`` is a hub id
            (``load_dataset``'s ``name`` and ``revision``; resolved through the ``datasets`` cache,
            ``HF_HUB_OFFLINE=1`` reads it only).
        split / validation_split_name: the training split of a dataset with splits (a hub dataset, a
            ``DatasetDict``; default ``train``) and its validation split (default: the first of
            validation/valid/val/test; none: ``validation_split`` of the rows is held out).
        max_row_bytes: the most bytes one row may hold; ``None``: no bound. A longer line of a JSON Lines
            or CSV file is refused before ``datasets`` reads it, and a row of a ``datasets.Dataset`` with
            more text before it is tokenized (:mod:`~hf_lightning.data.checks`): such a row is read and
            tokenized whole, in memory many times its size.
        test_split_name: the split of ``path`` that ``trainer.test`` reads when ``test_path`` is not given
            (default ``test``, when ``path`` has one).

    Batches (``B`` examples, ``L`` tokens after padding to the longest row, all tensors int64):

    - causal formats: ``input_ids``, ``attention_mask``, ``labels`` ``(B, L)``; labels are -100 where nothing
      is trained on (padding, prompts, user turns);
    - padding-free: ``input_ids``, ``labels``, ``position_ids`` ``(1, T)``, ``T`` the batch's real tokens;
      packed: ``input_ids``, ``labels``, ``position_ids`` ``(B, L)``, ``L`` at most ``max_length``;
    - classification: ``input_ids``, ``attention_mask`` ``(B, L)``, ``labels`` ``(B,)`` (float32 for
      regression);
    - seq2seq: ``input_ids``, ``attention_mask`` ``(B, S)``, ``labels`` (and ``decoder_input_ids``) ``(B,
      T)``.

    With a ``count_loss_items(batch) -> int`` bound (:meth:`bind`; :class:`HFLightningModule` has one),
    training batches also carry three Python ``int`` keys (see
    :class:`~hf_lightning.data.sampling.AccumulationWindowLoader`): ``num_items_in_batch``, the label count of
    their whole gradient-accumulation window on this process; ``num_items_in_micro_batch``; and
    ``num_batches_in_window``.

    What it reproduces of HF ``Trainer``: ``_remove_unused_columns`` (``remove_unused_columns``, with the
    dropped names logged), ``_get_train_sampler`` (a seeded random order, or ``LengthGroupedSampler``'s
    ``get_length_grouped_indices`` with ``group_by_length``), ``get_train_dataloader`` (per-worker seeds) and
    ``get_batch_samples`` (``num_items_in_batch`` counted before the window's first forward). The collators
    are listed in :mod:`hf_lightning.data.collators`. It differs where HF's sampler repeats examples to even
    out ranks: here every example is used exactly once per epoch across ranks and workers.

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
        test_path: Any = None,
        format: Annotated[str, FORMAT] = "auto",
        validation_split: Annotated[float, FRACTION] = 0.05,
        max_length: Annotated[int, POSITIVE_INT] = 512,
        per_device_train_batch_size: Annotated[int, POSITIVE_INT] = 8,
        per_device_eval_batch_size: Annotated[int, POSITIVE_INT] = 8,
        gradient_accumulation_steps: Annotated[int, POSITIVE_INT] = 1,
        shuffle: bool = True,
        group_by_length: bool = False,
        packing: Annotated[Packing, PACKING] = False,
        pack_buffer: Annotated[int | None, OPTIONAL_POSITIVE_INT] = None,
        padding_free: bool = False,
        streaming: bool = False,
        shuffle_buffer_size: Annotated[int, POSITIVE_INT] = 1000,
        remove_unused_columns: bool = True,
        model_input_names: Annotated[list[str] | None, NAMES] = None,
        label_names: Annotated[list[str] | None, NAMES] = None,
        num_workers: Annotated[int, NON_NEGATIVE_INT] = 0,
        pin_memory: bool = False,
        persistent_workers: bool = False,
        prefetch_factor: Annotated[int | None, OPTIONAL_POSITIVE_INT] = None,
        drop_last: bool = False,
        pad_to_multiple_of: Annotated[int | None, OPTIONAL_POSITIVE_INT] = None,
        seed: Annotated[int, NON_NEGATIVE_INT] = 42,
        rename_columns: Annotated[dict[str, str] | None, RENAMES] = None,
        name: str | None = None,
        split: str = "train",
        validation_split_name: str | None = None,
        test_split_name: str | None = None,
        revision: str | None = None,
        num_proc: Annotated[int | None, OPTIONAL_POSITIVE_INT] = None,
        layout: Annotated[LayoutChoice, LAYOUT] = None,
        max_row_bytes: Annotated[int | None, OPTIONAL_POSITIVE_INT] = DEFAULT_MAX_ROW_BYTES,
    ) -> None:
        super().__init__()
        check_call(HFDataModule.__init__, locals(), "data")  # the annotations' value rules
        if num_workers == 0 and (persistent_workers or prefetch_factor is not None):
            key = "persistent_workers" if persistent_workers else "prefetch_factor"
            raise ConfigError(
                f"data.{key} applies to worker processes only; set data.num_workers > 0 or unset it"
            )
        if isinstance(tokenizer, (str, os.PathLike)):  # a folder or hub id, as a config gives it
            from hf_lightning.models.loading import tokenizer_from

            tokenizer = tokenizer_from(tokenizer, "data.tokenizer")
        check_pad_token(tokenizer)
        self.tokenizer = tokenizer
        self.path = path
        self.validation_path = validation_path
        self.test_path = test_path
        self.format = format
        self.validation_split = validation_split
        self.max_length = max_length
        self.per_device_train_batch_size = per_device_train_batch_size
        self.per_device_eval_batch_size = per_device_eval_batch_size
        self.gradient_accumulation_steps = gradient_accumulation_steps
        self.shuffle = shuffle
        self.group_by_length = group_by_length
        #: each accumulation window's documents sorted by length across its micro-batches (set by
        #: ``data.layout=auto``)
        self.sort_windows = False
        self._sort_lengths: list[int] | None = None
        self.packing = packing_strategy(packing)  # the value only; the rules: check_packing at setup
        self.pack_buffer = pack_buffer
        self.padding_free = padding_free
        # data.layout and the three settings as given (setup replaces the three with the chosen layout's)
        self.layout = layout
        self._given_layout = (group_by_length, self.packing, padding_free)
        self.streaming = streaming
        self.shuffle_buffer_size = shuffle_buffer_size
        self.remove_unused_columns = remove_unused_columns
        self.model_input_names = list(model_input_names) if model_input_names is not None else None
        self.label_names = list(label_names) if label_names is not None else None
        self.rename_columns = dict(rename_columns) if rename_columns else None
        self.num_workers = num_workers
        self.num_proc = num_proc
        self.pin_memory = pin_memory
        self.persistent_workers = persistent_workers
        self.prefetch_factor = prefetch_factor
        self.drop_last = drop_last
        self.pad_to_multiple_of = pad_to_multiple_of
        self.seed = seed
        # a hub dataset's config, revision and the splits to read
        self.name, self.revision = name, revision
        self.split, self.validation_split_name = split, validation_split_name
        self.max_row_bytes = max_row_bytes
        self.test_split_name = test_split_name
        # filled by setup()
        self.train_dataset: Any = None
        self.val_dataset: Any = None
        self.test_dataset: Any = None
        self.data_format: str | None = None
        self.id2label: dict[int, str] | None = None
        self.class_labels: ClassLabels | None = None
        self.dropped_columns: dict[str, list[str]] = {}
        self.resolved_label_names: list[str] = ["labels"]
        self.train_collator: Any = None
        self.eval_collator: Any = None
        self.test_collator: Any = None
        self._rows: Any = None
        self._label2id: dict[str, int] | None = None
        self._no_test_data: str | None = None
        self._holdout: float | None = None
        self._processor: ExampleProcessor | None = None
        self._plan: RowPlan | None = None
        self._train_lengths: list[int] | None = None
        self._columns: Columns | None = None
        # a loop without a Lightning trainer: its epoch and batches handed out (state_dict / load_state_dict)
        self._position = LoaderPosition()
        self._saved_signature: dict[str, Any] | None = None
        # the splits read_classes loaded, handed to the next setup (which reads them once)
        self._loaded: tuple[Any, Any, Any, Any] | None = None
        # what bind() was told (None: ask the trainer's LightningModule, _binding)
        self._bound: Binding | None = None
        # whether the first training step read num_items_in_batch (set by train_dataloader)
        self._count_use: CountUse | None = None
        # the train loader under a Lightning trainer, whose position counts the batches trained
        self._train_loader: ResumableLoader | None = None
        self._said_no_count = False

    # ----------------------------------------------------------------------------------------- setup
    def prepare_data(self) -> None:
        if self.path is None:
            from hf_lightning.defaults import prepare_chatterbot

            prepare_chatterbot()

    def read_classes(self) -> dict[int, str] | None:
        """The ``{id: name}`` of a ``classification`` training split's class names (``None`` for another
        format, or labels that are not names), read before any model exists, so that the model's head can be
        sized from the data.

        Only the source is loaded and its label column read (:attr:`class_labels`, from
        :func:`~hf_lightning.data.class_labels.read_labels`); nothing is tokenized or pruned, so the next
        :meth:`setup` (which reuses the loaded splits) prepares the rows for the model bound by then.

        Raises:
            DataError: a source that cannot be read, lacks the format's columns, or holds bad labels.
        """
        if self.train_dataset is not None or self._loaded is not None:
            return self.id2label
        self._loaded = self._splits()
        path, train = self._loaded[:2]
        if self._format_of(train, path) != "classification":
            return None
        self.class_labels = self._read_labels(train, path)
        label2id = self.class_labels.label2id
        self.id2label = {i: name for name, i in label2id.items()} if label2id is not None else None
        return self.id2label

    def _read_labels(self, train: Any, path: Any) -> ClassLabels:
        """The training split's labels, after checking that it has the columns of the format."""
        if isinstance(train, datasets.Dataset):  # a stream or torch dataset is checked as it is tokenized
            check_columns(train.column_names, "classification", path, "train")
        return read_labels(train, path, label_column_name(self.rename_columns))

    def _splits(self, eval_only: bool = False) -> tuple[Any, Any, Any, Any]:
        """``(path, train, validation, hold-out)``; ``eval_only``: the validation file alone, no train
        split. The splits :meth:`read_classes` loaded are used once instead of loading them again."""
        if self._loaded is not None and not eval_only:
            loaded, self._loaded = self._loaded, None
            return loaded
        if eval_only:
            return (
                self.path,
                None,
                load_validation(
                    self.validation_path, self.streaming, self.rename_columns, self.max_row_bytes
                ),
                None,
            )
        return load_splits(
            self.path,
            self.validation_path,
            self.validation_split,
            self.seed,
            self.streaming,
            self.rename_columns,
            name=self.name,
            revision=self.revision,
            split=self.split,
            validation_split_name=self.validation_split_name,
            max_row_bytes=self.max_row_bytes,
        )

    def setup(self, stage: str | None = None) -> None:
        """Load, format, tokenize, prune and pack the splits once (later calls return at once).

        Fills ``train_dataset``, ``val_dataset`` (``None`` without validation data), ``data_format``,
        ``id2label`` (classification), ``dropped_columns`` and the collators; ``stage="test"`` fills
        ``test_dataset`` when there is test data (``test_path``, or the ``test_split_name`` split of
        ``path``), reading no train split unless the classes come from it, and sets up the validation split
        otherwise. Reads the bound model (:meth:`bind`), when there is one, for pruning and for the checks.

        Raises:
            ConfigError: an option the data or the model cannot honour (named).
            DataError: a source that is missing, unreadable, empty, or lacks the format's fields.
        """
        if stage == "test" and self._setup_test():
            return
        if self.train_dataset is not None or (self.val_dataset is not None and stage in EVAL_STAGES):
            return
        bound = self._binding()
        model = bound.model
        # an evaluation-only setup (trainer.validate / predict with a validation file) prepares no train split
        eval_only = stage in EVAL_STAGES and self.validation_path is not None
        path, train, val, self._holdout = self._splits(eval_only)
        fmt = self._format_of(*((val, self.validation_path) if eval_only else (train, path)))
        if eval_only and fmt == "classification":  # the class ids come from the training split
            path, train, val, self._holdout = self._splits()
            eval_only = False
        layout = self._configure(
            fmt, train, path, is_stream(val if eval_only else train), bound, val if eval_only else train
        )
        val_path = self.validation_path or path
        self.train_dataset = None if eval_only else self._prepare(train, "train", path)
        self.val_dataset = self._prepare(val, "validation", val_path) if val is not None else None
        if model is not None:  # a row longer than a position table fails in the embedding, maybe hours in
            self.check_positions(model)
            splits = {"train": (self.train_dataset, path), "validation": (self.val_dataset, val_path)}
            check_rows_fit_model(splits, model, self.tokenizer.pad_token_id, fmt == "classification")
            if fmt == "classification":
                check_head(self.class_labels, getattr(getattr(model, "config", None), "num_labels", None))
        self.train_collator = self._pruning_collator(self._rows, self.train_dataset, "train")
        self.eval_collator = self._pruning_collator(self._rows, self.val_dataset, "validation")
        if self.group_by_length and self.train_dataset is not None and not is_stream(self.train_dataset):
            self._train_lengths = self._lengths(self.train_dataset)
        tokenized = self.train_dataset
        sorting = self.sort_windows and tokenized is not None and not is_stream(tokenized)
        window_lengths = self._window_lengths(tokenized) if sorting else None
        announce(layout, self, self._train_lengths, self._accumulation(), window_lengths)
        if bound.metrics:
            self._check_label_names()
        if self.label_names is not None:
            source = (val, self.validation_path) if eval_only else (train, path)
            self._check_given_label_names(column_names(source[0], source[1]), source[1], fmt)

    def _format_of(self, ds: Any, path: Any) -> str:
        """``format``, or the one detected from ``ds``'s columns."""
        return self.format if self.format != "auto" else detect_format(column_names(ds, path), path)

    def _configure(
        self, fmt: str, train: Any, path: Any, stream: bool, bound: Binding, source: Any = None
    ) -> Layout:
        """What every split shares: the format, the layout and packing rules, the classes (from ``train``),
        the columns to keep, the row plan, the tokenizing processor and the batch collator (``_rows``).
        ``source``: the split the format was read from (``train`` when not given), whose columns say whether
        its rows hold several documents each (:func:`~hf_lightning.data.layout.document_column`)."""
        source = train if source is None else source
        model = bound.model
        self.data_format = fmt
        self._sort_lengths = None
        if fmt in ("messages", "conversations"):
            require_chat_template(self.tokenizer)
            warn_end_of_turn(self.tokenizer)  # an end-of-turn generation cannot stop on
        layout = apply_layout(
            self, self._given_layout, fmt, model, bound.forward_kwargs, self._accumulation(), stream
        )  # data.layout=auto: sets the three keys (and sort_windows)
        check_packing(
            self.packing,
            self.padding_free,
            fmt=fmt,
            model=model,
            forward_kwargs=bound.forward_kwargs,
        )
        documents = document_column(fmt, column_names(source, path)) if fmt == "tokenized" else None
        if documents is not None:  # pre-packed rows (trl.pack_dataset's seq_lengths): kept apart
            check_documents_apart(documents, path, self.packing, model, bound.forward_kwargs)
        self._label2id = None
        if fmt == "classification":  # the class ids come from the training split
            self.class_labels = self._read_labels(train, path)
            self._label2id = self.class_labels.label2id
        if self._label2id is not None:
            self.id2label = {i: name for name, i in self._label2id.items()}
        self.resolved_label_names = self.label_names or (
            find_label_names(model) if model is not None else ["labels"]
        )
        columns = resolve_columns(model, self.model_input_names, self.resolved_label_names, self.tokenizer)
        self._columns = columns if self.remove_unused_columns else None
        self._plan = row_plan(self.packing, self.padding_free, self.max_length)  # read from here on
        if self.pack_buffer is not None and not (self.packing == "bfd" and stream):
            log.info(
                "data.pack_buffer=%d does not apply: it bounds the documents a stream is packed within by "
                "data.packing=bfd, and %s",
                self.pack_buffer,
                (f"this run has data.packing={self.packing}" if self.packing else "this run packs nothing")
                if stream
                else "this source is map-style (packed whole)",
            )
        self._processor = ExampleProcessor(fmt, self.tokenizer, self.max_length, self._label2id, self._plan)
        announce_document_ends(self.tokenizer, fmt, self.packing)
        base = collator_for(
            fmt,
            self.tokenizer.pad_token_id,
            model,
            self._plan,
            self.pad_to_multiple_of,
            documents=documents is not None,
        )
        # packed per batch: evaluation too (one flat row of the batch would cost a dense (T, T) attention)
        self._rows = layout.batch_collator(base, self.tokenizer.pad_token_id, self.pad_to_multiple_of)
        return layout

    def _setup_test(self) -> bool:
        """Prepare the test split; ``False`` when there is no test data (:func:`load_test`).

        Raises:
            DataError: as :meth:`setup`; a ``test_path`` source is named ``data.test_path=...``.
        """
        if self.test_dataset is not None:
            return True
        try:
            return self._prepare_test()
        except DataError as err:
            if not isinstance(self.test_path, (str, os.PathLike)):
                raise
            # the loaders and formats name every source data.path=...; this one is the test file
            given = os.fspath(self.test_path)
            message = str(err).replace(f"data.path={given}", f"data.test_path={given}")
            raise DataError(message) from err

    def _prepare_test(self) -> bool:
        test, source = load_test(
            self.path,
            self.test_path,
            self.test_split_name,
            self.streaming,
            self.rename_columns,
            name=self.name,
            revision=self.revision,
            max_row_bytes=self.max_row_bytes,
        )
        if test is None:
            self._no_test_data = source
            return False
        if self._processor is None:  # nothing set up (trainer.test in a fresh process): the test data alone
            fmt = self._format_of(test, source)
            if fmt == "classification":
                self.setup("fit")  # the class ids come from the training split
            else:
                self._configure(fmt, None, self.path, is_stream(test), self._binding(), test)
        self.test_dataset = self._prepare(test, "test", source)
        model = self._binding().model
        if model is not None:
            splits = {"test": self.test_dataset}
            check_positions(model, self.max_length, self.pad_to_multiple_of, self.padding_free, splits)
            check_rows_fit_model(
                {"test": (self.test_dataset, source)},
                model,
                self.tokenizer.pad_token_id,
                self.data_format == "classification",
            )
        self.test_collator = self._pruning_collator(self._rows, self.test_dataset, "test")
        return True

    def check_positions(self, model: Any) -> None:
        """The prepared rows against ``model``'s positions
        (:func:`~hf_lightning.data.checks.check_positions`)."""
        splits = {"train": self.train_dataset, "validation": self.val_dataset}
        check_positions(model, self.max_length, self.pad_to_multiple_of, self.padding_free, splits)

    def _prepare(self, ds: Any, split: str, path: Any) -> Any:
        if self.data_format == "classification" and self.class_labels is not None:
            ds = encode_labels(ds, self.class_labels, path, split)
        out, dropped, lengths = prepare_split(
            ds,
            self.data_format,
            split,
            path,
            tokenizer=self.tokenizer,
            max_length=self.max_length,
            processor=self._processor,
            columns=self._columns,
            plan=self._plan,
            label2id=self._label2id,
            num_proc=self.num_proc,
        )
        if dropped is not None:
            self.dropped_columns[split] = dropped
        if split == "train" and lengths is not None:
            self._train_lengths = lengths
        return out

    def _pruning_collator(self, base: Any, ds: Any, split: str) -> Any:
        """``base``, pruning per example where the dataset keeps its columns (streams, torch datasets)."""
        if self._columns is None or ds is None or isinstance(ds, datasets.Dataset):
            return base
        if self.packing is not None and is_stream(ds):
            return base  # packed rows hold input_ids, labels and seq_lengths only (the rest is named)
        example = self._first_example(ds, split)
        collator = prune_per_example(base, self._columns, example, split)
        self.dropped_columns[split] = collator.dropped
        return collator

    def _check_given_label_names(self, source_columns: list[str], path: Any, fmt: str) -> None:
        """``data.label_names`` as given against the keys of one batch (an evaluation one when there is
        validation data)."""
        val = self.val_dataset is not None
        ds = self.val_dataset if val else self.train_dataset
        example = self._first_example(ds, "validation" if val else "train") if ds is not None else None
        if example is None:
            return
        collator = self.eval_collator if val else self.train_collator
        keys = collator([example]).keys()
        renamed = bool(self.rename_columns)
        check_given_label_names(self.label_names or [], keys, source_columns, path, fmt, renamed)

    def _check_label_names(self) -> None:
        if self.val_dataset is not None:
            example = self._first_example(self.val_dataset, "validation")
            check_label_key(self.eval_collator, example, self.resolved_label_names)

    # ------------------------------------------------------------------------------------------ bind
    def bind(
        self,
        model: torch.nn.Module | None = None,
        *,
        count_loss_items: Callable[[Mapping[str, Any]], int] | None = None,
        forward_kwargs: Mapping[str, Any] | None = None,
        metrics: bool = False,
        handles_placeholder_batches: bool = False,
        steps_windows: bool = False,
    ) -> HFDataModule:
        """Tell the data what it needs from the model side; whoever builds both calls it once, before ``fit``.

        Args:
            model: the ``nn.Module`` the batches are for: its ``forward`` gives the input and label names
                (pruning), its embedding, position table and classes are checked against the data, and packed
                or padding-free rows need ``position_ids`` and an attention that keeps them apart.
            count_loss_items: ``batch -> int``, the loss's target count of a micro-batch
                (:func:`hf_lightning.module.loss.count_loss_items`, which
                :meth:`HFLightningModule.count_loss_items` calls); with it training batches carry the window
                keys (``num_items_in_batch``...), and a module whose first ``training_step`` does not read
                ``num_items_in_batch`` gets one WARNING when a window spans micro-batches or processes
                (:class:`~hf_lightning.data.sampling.CountUse`).
            forward_kwargs: what the LightningModule passes to every forward (``use_cache=False``).
            metrics: evaluation computes metrics, so an evaluation batch must carry a label key.
            handles_placeholder_batches: mark an empty rank's stand-in batch
            (:class:`~hf_lightning.data.collators.PlaceholderAwareCollator`).
            steps_windows: the module's ``training_step`` takes one
                :class:`~hf_lightning.core.batch.Window` per optimizer step and steps it itself
                (:class:`HFLightningModule` does); otherwise training batches are micro-batches.

        Without a call, :meth:`setup` and the loaders ask the trainer's LightningModule, once per call, for
        these arguments through its ``data_binding()`` method, if it has one (:class:`HFLightningModule` does:
        ``trainer.fit(module, datamodule=dm)`` needs no call, and a config-only project neither). Nothing else
        of the module is read: a module of one's own without ``data_binding`` binds nothing (pruning then
        follows the tokenizer's input names, and batches carry no window count, each said in one WARNING).

        Returns:
            ``self``.
        """
        self._bound = make_binding(
            model,
            count_loss_items=count_loss_items,
            forward_kwargs=forward_kwargs,
            metrics=metrics,
            handles_placeholder_batches=handles_placeholder_batches,
            steps_windows=steps_windows,
        )
        return self

    def _binding(self) -> Binding:
        """The :meth:`bind` arguments, else what the trainer's LightningModule declares (its
        ``data_binding()``, read at each call)."""
        return self._bound if self._bound is not None else binding_from_trainer(self.trainer)

    # --------------------------------------------------------------------------------------- loaders
    # Map-style splits go through ExactDistributedSampler (training: seeded order or length groups, masked
    # top-up; evaluation: dataset order, no padding), streams through ShardedStream (exact per-reader split).
    def _lengths(self, ds: Any) -> list[int]:
        if self._train_lengths is not None:
            return self._train_lengths
        lengths = sequence_lengths(ds)
        log.info("group_by_length: measured %d training lengths once (tokens of input_ids)", len(lengths))
        return lengths

    def _window_lengths(self, ds: Any) -> list[int]:
        """What each window's documents are sorted by: their tokens (a seq2seq row's source and target)."""
        if self._sort_lengths is None:
            lengths = sequence_lengths(ds)
            if self.data_format == "seq2seq":
                lengths = [a + b for a, b in zip(lengths, sequence_lengths(ds, "labels"))]
            self._sort_lengths = lengths
        return self._sort_lengths

    def _first_example(self, ds: Any, split: str) -> Any:
        if is_stream(ds):
            stream = ShardedStream(
                ds,
                self._processor,
                holdout=self._holdout_spec(HOLDOUT_KEEPS[split]),
                split="validation" if split == "train" else split,
                name=self._source_name(split),
                packing=self._stream_packing(buffer=1),  # a packed row's keys, from the first documents
            )
            return next(iter(stream), None)
        return ds[0] if len(ds) else None

    def _source_name(self, split: str) -> Any:
        """Where ``split``'s rows come from, for messages."""
        if split == "test":
            return self.test_path if self.test_path is not None else self.path
        if split == "validation":
            return self.validation_path or self.path
        return self.path

    def _world(self) -> tuple[int, int]:
        """``(world size, rank)``: the Lightning trainer's, else the initialized ``torch.distributed`` process
        group's (HF ``Trainer``, a plain DDP loop), else ``(1, 0)``."""
        trainer = self.trainer
        if trainer is not None:
            return trainer.world_size, trainer.global_rank
        if dist.is_available() and dist.is_initialized():
            return dist.get_world_size(), dist.get_rank()
        return 1, 0

    def _plain_loop_position(self) -> LoaderPosition | None:
        """The position shared by the train loaders of a loop without a Lightning trainer (``None`` under one:
        Lightning sets the epoch and keeps the position)."""
        if self.trainer is not None:
            return None
        saved, self._saved_signature = self._saved_signature, None
        if saved is not None:
            current = data_signature(self, self._world()[0])
            # a setting unknown when the state was saved (the data not set up yet) is not compared
            known = [k for k in current if saved.get(k) is not None]
            diffs = describe_differences({k: saved[k] for k in known}, {k: current[k] for k in known})
            if diffs:
                log.warning(
                    "resuming with data settings that changed since the state was saved, so the loop cannot "
                    "continue exactly as it would have: %s",
                    "; ".join(diffs),
                )
        world, rank = self._world()
        if world > 1:
            log.info(
                "no Lightning trainer: the training data is split across the %d processes of "
                "torch.distributed (this is rank %d)",
                world,
                rank,
            )
        return self._position

    def state_dict(self) -> dict[str, Any]:
        """The resume point of the training data in a loop without a Lightning trainer (a plain PyTorch
        loop): ``{"epoch": e, "batches_consumed": k, "signature": {...}}``, ``k`` batches of epoch ``e``
        handed out on this process, and the data settings they depend on. Save it with the model and the
        optimizer; :meth:`load_state_dict` on a new DataModule makes its train loaders continue with batch
        ``k + 1`` of epoch ``e``, as the loop that never stopped would.

        Under a Lightning trainer ``{}``: Lightning's loop state and the train loader's ``state_dict`` hold
        the position (Lightning saves a DataModule's non-empty state in its checkpoints).
        """
        if self.trainer is not None:
            return {}
        return {**self._position.state_dict(), "signature": data_signature(self, self._world()[0])}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict`: the next pass of the train loader is the rest of its epoch.

        A data setting that changed since (batch size, max length, seed, world size, the dataset) is named in
        a warning when the next train loader is built. ``{}`` does nothing (a Lightning checkpoint's).

        Raises:
            ConfigError: a mapping that is not a state of this method's kind.
        """
        if not state_dict:
            return
        epoch, consumed = (state_dict.get(k) if isinstance(state_dict, dict) else None for k in POSITION_KEYS)
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (epoch, consumed)):
            found = sorted(state_dict) if isinstance(state_dict, dict) else type(state_dict).__name__
            raise ConfigError(
                "HFDataModule.load_state_dict: expected the dict of HFDataModule.state_dict() (non-negative "
                f"int 'epoch' and 'batches_consumed'), got {found}"
            )
        self._position.load_state_dict({"epoch": epoch, "batches_consumed": consumed})
        self._saved_signature = state_dict.get("signature")

    def _accumulation(self) -> int:
        """Micro-batches per optimizer step: ``gradient_accumulation_steps`` for a module that steps windows,
        else Lightning's ``accumulate_grad_batches`` (a module on automatic optimization with
        ``gradient_accumulation_steps > 1`` is refused by :meth:`train_dataloader`)."""
        if self._binding().steps_windows:
            return self.gradient_accumulation_steps
        trainer = self.trainer
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

    def _stream_loader(self, source: Any, split: str, batch: int, collate_fn: Callable) -> EpochDataLoader:
        train = split == "train"
        world, rank = self._world()
        length_buffer = (
            MEGA_BATCH_MULT * batch * self._accumulation() if train and self.group_by_length else None
        )
        if length_buffer:
            log.info(
                "group_by_length on a stream: sorting by length within buffers of %d examples per reader "
                "(the whole stream cannot be sorted)",
                length_buffer,
            )
        holdout = self._holdout_spec(HOLDOUT_KEEPS[split])
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
            length=self._stream_length(source, holdout),
            top_up=train,
            split=split,
            name=self._source_name(split),
            packing=self._stream_packing(),
        )
        if train:
            # here, before the workers copy it: each shard's rows counted once
            stream.plan_readers(self.num_workers, batch, self.drop_last)
            if stream.length is not None:
                check_fits_one_batch(stream.per_reader(self.num_workers), batch, self.drop_last)
            self._require_known_epoch(stream.length if self.packing is None else None)
        trainer = self.trainer
        # the epoch being trained (Lightning's own counter, moved on after the epoch-end hooks)
        epoch_fn = (lambda: trainer.current_epoch) if trainer is not None else None
        return EpochDataLoader(
            stream,
            seed=self.seed,
            rank=rank,
            epoch_fn=epoch_fn,
            position=self._plain_loop_position() if train else None,
            batch_size=batch,
            collate_fn=collate_fn,
            drop_last=self.drop_last if train else False,
            **self._loader_kwargs(),
        )

    def _stream_packing(self, buffer: int | None = None) -> StreamPacking | None:
        """How a stream is packed as it is read (``None``: not packed); ``buffer`` overrides
        ``pack_buffer``."""
        if self.packing is None:
            return None
        size = buffer or self.pack_buffer or PACK_BUFFER
        return StreamPacking(self.packing, self.max_length, size)

    def _require_known_epoch(self, length: int | None) -> None:
        trainer = self.trainer
        if length is None and trainer is not None and (trainer.max_steps is None or trainer.max_steps < 0):
            if self.packing is not None:
                raise ConfigError(
                    f"data.packing={self.packing} on a stream: the stream is packed as it is read, so the "
                    "number of packed rows, hence of steps in an epoch, is known only once it is read: set "
                    "trainer.max_steps"
                )
            raise ConfigError(
                "the training data is a stream of unknown length, so an epoch has no known number of steps: "
                "set trainer.max_steps"
            )

    @staticmethod
    def _stream_length(source: Any, holdout: Any) -> int | None:
        return len(source) if hasattr(source, "__len__") and holdout is None else None

    def _loader(self, ds: Any, split: str) -> EpochDataLoader:
        train = split == "train"
        batch = self.per_device_train_batch_size if train else self.per_device_eval_batch_size
        collate_fn = self.train_collator if train else self._eval_collate(split)
        if is_stream(ds):
            return self._stream_loader(ds, split, batch, collate_fn)
        world, rank = self._world()
        lengths = None
        if train and self.group_by_length:
            lengths = self._train_lengths = self._lengths(ds)
        drop_last = self.drop_last if train else False
        sampler = ExactDistributedSampler(
            ds,
            num_replicas=world,
            rank=rank,
            shuffle=train and self.shuffle,
            seed=self.seed,
            drop_last=drop_last,
            lengths=lengths,
            group_batch_size=batch * self._accumulation(),
            top_up=train,
            window_lengths=self._window_lengths(ds) if train and self.sort_windows else None,
            window_size=batch * self._accumulation(),
        )
        if train:
            check_fits_one_batch(len(sampler), batch, self.drop_last)
        return EpochDataLoader(
            TopUpDataset(ds, placeholder=not train) if sampler.needs_top_up else ds,
            seed=self.seed,
            rank=rank,
            position=self._plain_loop_position() if train else None,
            sampler=sampler,
            batch_size=batch,
            collate_fn=collate_fn,
            drop_last=drop_last,
            **self._loader_kwargs(),
        )

    def _eval_collate(self, split: str) -> Any:
        """The evaluation collator of ``split`` (``validation`` or ``test``); marks placeholder batches for a
        module that handles them (:class:`~hf_lightning.data.collators.PlaceholderAwareCollator`)."""
        collator = self.test_collator if split == "test" else self.eval_collator
        if self._binding().handles_placeholder_batches:
            return PlaceholderAwareCollator(collator)
        return collator

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
        if stream and self.packing is not None:
            n = None  # known only once the stream is packed
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
        """This rank's share of the epoch's order, in micro-batches of ``per_device_train_batch_size``
        examples.

        For a module that steps windows (``steps_windows`` bound, :class:`HFLightningModule`): one
        :class:`~hf_lightning.core.batch.Window` of ``gradient_accumulation_steps`` micro-batches per
        optimizer step, with their target counts (:class:`~hf_lightning.data.sampling.WindowLoader`), resumed
        in windows.
        Otherwise micro-batches: wrapped in :class:`~hf_lightning.data.sampling.AccumulationWindowLoader` when
        a ``count_loss_items`` is bound (the window keys above); under a Lightning trainer without one (your
        own LightningModule), in :class:`~hf_lightning.data.sampling.ResumableLoader`, so that a run resumed
        inside an epoch continues it; without a trainer the loader itself (its position: :meth:`state_dict`).

        Raises:
            ConfigError: a stream of unknown length without ``trainer.max_steps``;
                ``gradient_accumulation_steps > 1`` for a module on Lightning's automatic optimization.
        """
        if self.train_dataset is None:
            self.setup("fit")
        loader = self._loader(self.train_dataset, "train")
        binding = self._binding()
        count = binding.count_loss_items
        trainer = self.trainer
        if binding.steps_windows:
            windows = WindowLoader(
                loader,
                self.gradient_accumulation_steps,
                count,
                max_windows=(lambda: trainer.num_training_batches) if trainer is not None else None,
            )
            self._train_loader = windows if trainer is not None else None
            return windows
        if self.gradient_accumulation_steps > 1:
            raise ConfigError(
                f"data.gradient_accumulation_steps={self.gradient_accumulation_steps} needs a module that "
                "steps accumulation windows (HFLightningModule); a module on Lightning's automatic "
                "optimization accumulates with Trainer(accumulate_grad_batches=N): set that, and "
                "data.gradient_accumulation_steps=1"
            )
        if trainer is None:
            # bound but not fitting (inspect a batch): windows of accumulate_grad_batches=1
            return loader if count is None else AccumulationWindowLoader(loader, 1, count)

        if count is None:
            if trainer.is_global_zero and not self._said_no_count:
                self._said_no_count = True
                warn_no_count(trainer.accumulate_grad_batches, trainer.world_size)
            self._train_loader = ResumableLoader(loader)
            return self._train_loader
        self._count_use = CountUse(
            type(trainer.lightning_module).__name__,
            trainer.accumulate_grad_batches,
            trainer.world_size,
            speaks=trainer.is_global_zero,
        )
        self._train_loader = AccumulationWindowLoader(
            loader,
            trainer.accumulate_grad_batches,
            count,
            max_batches=lambda: trainer.num_training_batches,
        )
        return self._train_loader

    def val_dataloader(self) -> Any:
        """Batches of ``per_device_eval_batch_size`` examples in dataset order, this rank's share without any
        padding or repetition (ranks may differ by one example; a rank with none gets one placeholder batch,
        see :class:`~hf_lightning.data.collators.PlaceholderAwareCollator`); ``[]`` without validation
        data."""
        if self.train_dataset is None:
            self.setup("validate")
        if self.val_dataset is None:
            return []
        return self._loader(self.val_dataset, "validation")

    def test_dataloader(self) -> Any:
        """Batches of the test data (``test_path``, or the ``test_split_name`` split of ``path``, default
        ``test``) as :meth:`val_dataloader` batches the validation data: dataset order, this rank's share.

        Raises:
            ConfigError: no test data (names ``data.test_path`` and why ``path`` gives none).
        """
        if self.test_dataset is None:
            self.setup("test")
        if self.test_dataset is None:
            raise ConfigError(
                f"trainer.test needs test data, and there is none: {self._no_test_data}. Set data.test_path "
                "(a file, folder or dataset, as data.path), or data.test_split_name to a split of data.path"
            )
        return self._loader(self.test_dataset, "test")

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        """A flat ``dict`` batch (every batch of this DataModule) moves in one comprehension.

        Lightning's default walks the batch with ``apply_to_collection``, whose fast path needs a dict of
        tensors only; the window counts (``int``) send every batch down its slow path (ABC ``isinstance``
        checks per value, per micro-batch; docs/benchmarks.md has the timing). Any other batch type keeps
        Lightning's behaviour. Here rather than in the LightningModule: Lightning warns on every fit when both
        define it. A training batch moves on the train loader's resume position
        (:meth:`~hf_lightning.data.sampling.ResumableLoader.handed_out`): Lightning moves it right before its
        step.
        """
        trainer = self.trainer
        if self._train_loader is not None and trainer is not None and trainer.training:
            self._train_loader.handed_out()
        kind = type(batch)
        if kind is Window:
            return batch  # the module moves each micro-batch as it computes it
        if kind is not dict and kind is not WindowBatch:
            return super().transfer_batch_to_device(batch, device, dataloader_idx)
        if self._count_use is not None:
            self._count_use.handed_out(batch)  # the previous training batch's step has run by now
        moved = to_device(batch, device)
        return moved if kind is dict else WindowBatch(moved)

    def teardown(self, stage: str) -> None:
        """At the end of ``fit``: say whether the module read the window count, if no second training batch
        did (:class:`~hf_lightning.data.sampling.CountUse`)."""
        if stage == "fit" and self._count_use is not None:
            self._count_use.finish()

    def predict_dataloader(self) -> Any:
        """The validation data in dataset order (each rank its share, no padding)."""
        return self.val_dataloader()
