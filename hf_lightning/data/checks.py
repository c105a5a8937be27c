"""Checks of the data against the model, run once at ``setup``, so that a mismatch stops with a message
instead of an ``IndexError`` inside an embedding (on a GPU: a device-side assert that kills the process) or a
silent mistake (zero training steps; packed sequences that attend to each other).

Each check names the split, the row and the value, and says what to change. What they read of the model: its
``forward`` parameters (through ``torch.compile`` and PEFT wrappers, :func:`forward_parameters`), its
embeddings, its position table and whether its attention keeps packed sequences apart.

Positions (:func:`check_positions`): the longest row a model can take, checked against ``data.max_length``. A
model with a *learned* absolute position table (GPT-2's ``wpe``, GPT-Neo, OPT, BART, BERT/RoBERTa) or a
precomputed table of rotary angles (GPT-J, CodeGen) has one row per position: a longer sequence indexes past
it, and the first such batch dies with ``IndexError: index out of range in self`` (on a GPU a device-side
assert that kills the process), possibly hours into a run. Those limits are refused at setup. Rotary models
that compute their angles on the fly (Llama, Qwen, Mistral, GPT-NeoX, ...) run past
``max_position_embeddings`` without any error (transformers does too); there the field only says what the
model was trained on, so a longer ``max_length`` is a WARNING, not an error. Models with relative positions
(T5) or ALiBi (BLOOM) have no limit and are not checked.

The limit is read from the model itself: the position table whose row count matches one of the config fields
of :data:`POSITION_FIELDS` (less the rows its positions skip: OPT and BART start at 2, RoBERTa after its
padding index). HF's ``run_clm.py`` caps ``block_size`` at ``tokenizer.model_max_length`` instead; the model's
table is what fails.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import datasets
import pyarrow as pa
import pyarrow.compute as pc
import torch
from torch import nn

from hf_lightning.compat import attention_backend, unwrap_compiled
from hf_lightning.core.batch import IGNORE_INDEX
from hf_lightning.core.errors import ConfigError, DataError
from hf_lightning.data.sampling import sequence_lengths

log = logging.getLogger(__name__)

#: config fields that hold a model's number of positions, in the order they are looked up
POSITION_FIELDS = ("n_positions", "max_position_embeddings", "n_ctx", "max_sequence_length", "seq_length")


# ------------------------------------------------------------------------------ the model's facts
def unwrap_model(model: Any) -> Any:
    """The module whose ``forward`` defines the inputs: through ``torch.compile`` and PEFT wrappers."""
    model = unwrap_compiled(model)
    if hasattr(model, "get_base_model"):
        model = model.get_base_model()
    return model


def is_sequence_classifier(model: Any) -> bool:
    """A ``*ForSequenceClassification`` model (one class per row, not token labels)."""
    return model is not None and type(model).__name__.endswith("ForSequenceClassification")


def forward_parameters(model: Any) -> list[str]:
    """Parameter names of ``model.forward`` (``**kwargs`` and ``*args`` excluded)."""
    params = inspect.signature(unwrap_model(model).forward).parameters.values()
    return [p.name for p in params if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]


# ------------------------------------------------------------------------------ the checks
def check_pad_token(tokenizer: Any) -> None:
    """Refuse a tokenizer without a pad token (saying what to set).

    Raises:
        ConfigError: no ``pad_token_id``.
    """
    if getattr(tokenizer, "pad_token_id", None) is not None:
        return
    if getattr(tokenizer, "eos_token", None) is not None:
        hint = "set tokenizer.pad_token (for example to its eos_token)"
    else:
        # nothing to fall back on: the model folder's tokenizer needs a token named for padding
        hint = (
            "it has no eos_token either: set tokenizer.pad_token and tokenizer.eos_token (for example "
            "both to its end-of-text token, such as '<|endoftext|>' for GPT-2)"
        )
    raise ConfigError(f"the tokenizer has no pad token; {hint} and save it into the model folder")


def check_fits_one_batch(n_per_rank: int, batch_size: int, drop_last: bool, split: str = "train") -> None:
    """A ``DataLoader`` with ``drop_last`` and fewer examples than one batch yields nothing: Lightning then
    "trains" for zero steps and reports success. Refuse instead.

    Raises:
        DataError: ``drop_last`` and ``n_per_rank < batch_size``.
    """
    if drop_last and n_per_rank < batch_size:
        raise DataError(
            f"the {split} split gives each rank {n_per_rank} example{'s' if n_per_rank != 1 else ''}, fewer "
            f"than one batch of data.per_device_train_batch_size={batch_size}, and data.drop_last=true drops "
            "that partial batch: no training step would run. Lower the batch size or set "
            "data.drop_last=false"
        )


def _flat_values(arr: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    while pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type):
        arr = pc.list_flatten(arr)
    return arr


def _column_max(ds: datasets.Dataset, column: str, skip: int | None = None) -> int | None:
    """Largest value of a (nested) integer list column, ``skip`` values excluded; ``None`` if the column is
    empty or not numeric (a ``Json`` column of mixed values is checked row by row by the collator instead)."""
    best = None
    for table in ds.select_columns([column]).with_format("arrow").iter(batch_size=10_000):
        values = _flat_values(table.column(column))
        if not (pa.types.is_integer(values.type) or pa.types.is_floating(values.type)):
            return None
        if skip is not None:
            values = pc.filter(values, pc.not_equal(values, skip))
        value = pc.max(values).as_py()
        if value is not None:
            best = value if best is None else max(best, value)
    return None if best is None else int(best)


def _first_row_above(
    ds: datasets.Dataset, column: str, limit: int, skip: int | None = None
) -> tuple[int, int]:
    """``(row, value)`` of the first row of ``column`` holding a value ``>= limit`` (error path only)."""
    for i, row in enumerate(ds[column]):
        values = torch.as_tensor(row).reshape(-1)
        if skip is not None:
            values = values[values != skip]
        if values.numel() and int(values.max()) >= limit:
            return i, int(values.max())
    raise AssertionError("no such row")  # only called after _column_max found one


def _embedding_rows(model: Any) -> int | None:
    get = getattr(model, "get_input_embeddings", None)
    emb = get() if callable(get) else None
    return getattr(emb, "num_embeddings", None)


def _output_classes(model: Any) -> int | None:
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    return getattr(head, "out_features", None)


def check_token_ids(ds: Any, model: Any, pad_token_id: int | None, path: Any, split: str) -> None:
    """Every ``input_ids`` value (and the pad id) must have a row in the model's input embedding, and every
    token label a column in its output layer.

    Checked for a ``datasets.Dataset`` (one vectorised pass over Arrow); streams and plain torch datasets are
    not scanned.

    Raises:
        DataError: a token id ``>=`` the embedding size (names the split row and the id); a pad id too large.
    """
    rows = _embedding_rows(model)
    if rows is None or not isinstance(ds, datasets.Dataset):
        return
    name = type(model).__name__
    if pad_token_id is not None and pad_token_id >= rows:
        raise DataError(
            f"the tokenizer's pad_token_id={pad_token_id} is outside {name}'s input embedding ({rows} rows); "
            "the tokenizer does not belong to this model (or call "
            "model.resize_token_embeddings(len(tokenizer)))"
        )
    limits = [("input_ids", rows, None, "input embedding")]
    classes = _output_classes(model)
    if classes is not None and "labels" in ds.column_names:
        limits.append(("labels", classes, IGNORE_INDEX, "output layer"))
    for column, limit, skip, what in limits:
        if column not in ds.column_names:
            continue
        top = _column_max(ds, column, skip)
        if top is not None and top >= limit:
            row, value = _first_row_above(ds, column, limit, skip)
            raise DataError(
                f"data.path={path} ({split} row {row}): {column} holds token id {value}, but {name}'s {what} "
                f"has only {limit} entries (ids 0..{limit - 1}); the data was tokenized with a larger "
                "vocabulary than the model's. Use the model's own tokenizer, or resize the model "
                "(model.resize_token_embeddings)"
            )


def check_label_range(ds: Any, model: Any, path: Any, split: str) -> None:
    """Integer class labels must lie in ``[0, model.config.num_labels)`` (``-100`` is allowed: ignored).

    Raises:
        DataError: a label outside that range (names the split row, the value, and ``num_labels``).
    """
    num_labels = getattr(getattr(model, "config", None), "num_labels", None)
    if not num_labels or not isinstance(ds, datasets.Dataset):
        return
    column = next((c for c in ("label", "labels", "label_ids") if c in ds.column_names), None)
    if column is None:
        return
    values = ds[column]
    for i, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, int) or value == IGNORE_INDEX:
            continue
        if not 0 <= value < num_labels:
            raise DataError(
                f"data.path={path} ({split} row {i}): class label {value} is outside the model's "
                f"{num_labels} classes (config.num_labels={num_labels}, labels 0..{num_labels - 1}); "
                "build the model with num_labels set to the number of classes in the data"
            )


def _probe_ids(vocab: int | None, n: int, offset: int) -> list[int]:
    top = vocab if vocab else 100
    return [(offset + 7 * k) % max(top - 1, 1) + 1 for k in range(n)]


def _eager() -> Any:
    """``torch.compiler.set_stance("force_eager")`` where torch has it (2.6+), else nothing."""
    set_stance = getattr(torch.compiler, "set_stance", None)
    return set_stance("force_eager") if set_stance is not None else contextlib.nullcontext()


def packed_sequences_isolated(model: Any, atol: float = 1e-4) -> bool | None:
    """Whether ``model`` keeps packed sequences apart, measured: two one-row batches that pack a different
    first sequence before the same second one (``position_ids`` restarting at 0, no ``attention_mask``, no KV
    cache), and the second sequence's logits compared. An attention backend that honours the boundaries gives
    the same logits (up to ``atol`` relative to their scale); one that does not lets the first sequence leak
    in.

    Returns:
        ``True``/``False``, or ``None`` when the model cannot be probed here (parameters not materialised,
        e.g. on the meta device or partitioned by DeepSpeed ZeRO-3).
    """
    params = list(model.parameters())
    if not params or any(p.is_meta or p.numel() == 0 for p in params):
        return None
    device = params[0].device
    vocab = _embedding_rows(model)
    second = _probe_ids(vocab, 3, 11)
    rows = [_probe_ids(vocab, 6, offset) + second for offset in (1, 4)]
    position_ids = torch.tensor([list(range(6)) + list(range(3))], device=device)
    # through PEFT / torch.compile wrappers, whose own forward does not name use_cache
    extra = {"use_cache": False} if "use_cache" in forward_parameters(model) else {}
    was_training = model.training
    model.eval()
    try:
        # eagerly under model.compile=true: a compilation of this one-off no-grad call would cost as much as
        # the training graph's
        with torch.no_grad(), _eager():
            logits = [
                model(input_ids=torch.tensor([r], device=device), position_ids=position_ids, **extra)
                .logits[0, 6:]
                .float()
                for r in rows
            ]
    finally:
        model.train(was_training)
    scale = max(float(logits[0].abs().max()), 1.0)
    return bool((logits[0] - logits[1]).abs().max() <= atol * scale)


def check_sequence_isolation(model: Any, option: str) -> None:
    """Refuse packing / padding-free batches for a model whose attention lets packed sequences see each other.

    Raises:
        ConfigError: the probe of :func:`packed_sequences_isolated` shows a leak (names the attention
        backend).
    """
    isolated = packed_sequences_isolated(model)
    if isolated is None:
        log.info(
            "%s: the model's parameters are not materialised here; sequence isolation was not probed", option
        )
        return
    if not isolated:
        backend = attention_backend(model)
        raise ConfigError(
            f"{option}: {type(model).__name__} with attention backend {backend!r} lets packed sequences "
            "attend to each other (probed: the second sequence's logits change with the first one). "
            "transformers separates packed sequences by position_ids only for the backends it builds masks "
            "for (sdpa, eager, flash_attention_*, flex_attention). Use one of those "
            "(model.attn_implementation=sdpa), or set data.packing=false and data.padding_free=false"
        )


def check_rows_fit_model(
    splits: Mapping[str, tuple[Any, Any]], model: Any, pad_token_id: int | None, classes: bool
) -> None:
    """:func:`check_token_ids` (and :func:`check_label_range` when ``classes``) on each ``{split: (rows,
    path)}``: ids and classes the model has no row for fail here, not inside its forward.

    Raises:
        DataError: see the two checks.
    """
    for split, (ds, path) in splits.items():
        check_token_ids(ds, model, pad_token_id, path, split)
        if classes:
            check_label_range(ds, model, path, split)


def check_label_key(collator: Any, example: Mapping[str, Any] | None, label_names: list[str]) -> None:
    """With metrics configured, an evaluation batch (``collator([example])``) must carry a key of
    ``label_names`` (HF ``label_names``).

    Raises:
        ConfigError: no key of ``label_names`` in the batch (names the keys it has).
    """
    keys = set(collator([example])) if example is not None else set()
    if not any(name in keys for name in label_names):
        raise ConfigError(
            "metrics are configured but no label key resolves: "
            f"data.label_names={label_names} and an evaluation batch has the keys "
            f"{sorted(keys)}. Set data.label_names to the key(s) holding the labels, or remove the "
            "metrics"
        )


def check_given_label_names(
    label_names: list[str],
    batch_keys: Iterable[str],
    source_columns: Iterable[str],
    path: Any,
    fmt: str,
    renamed: bool = False,
) -> None:
    """Every key of a ``data.label_names`` the user gave must be a key of the batches: HF ``Trainer`` treats
    a batch as labelled only when it holds all of them (``prediction_step``'s ``has_labels``), and the
    columns they name are kept through pruning.

    ``renamed``: the source columns are those after ``data.rename_columns``.

    Raises:
        ConfigError: a name that is no batch key (names it, the batch keys and the source's columns).
    """
    keys = sorted(batch_keys)
    columns = sorted(source_columns)
    missing = [name for name in label_names if name not in keys]
    if not missing:
        return
    names = ", ".join(repr(m) for m in missing)
    path = path if isinstance(path, (str, os.PathLike)) else "<in-memory dataset>"
    if all(m in columns for m in missing):
        what = f"{names} is a column of data.path={path} but no key of its batches ({keys})"
    else:
        what = f"{names} is neither a key of the batches ({keys}) nor a column of data.path={path} "
        what += f"(columns{' after data.rename_columns' if renamed else ''}: {columns})"
    source = (
        "the classification format reads its labels from the 'label' column"
        if fmt == "classification"
        else f"the {fmt} format makes its targets"
    )
    raise ConfigError(
        f"data.label_names={label_names}: {what}. data.label_names names the batch keys that hold the labels "
        f"(HF label_names); {source} and batches them as 'labels': leave data.label_names unset, or name "
        "keys the batches have"
    )


# ------------------------------------------------------------------------------ positions
@dataclass(frozen=True)
class PositionLimit:
    """``tokens``: the longest sequence the model takes; ``field`` / ``value``: the config field it comes
    from; ``hard``: a longer sequence fails (a position table) rather than runs untrained (rotary angles on
    the fly)."""

    tokens: int
    field: str
    value: int
    hard: bool


def _config_limit(config: Any) -> tuple[str, int] | None:
    for field in POSITION_FIELDS:
        value = getattr(config, field, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return field, value
    return None


def _skipped_rows(table: nn.Embedding) -> int:
    """Rows of a position table that no position uses: OPT/BART's ``offset`` (2), RoBERTa's padding index +
    1."""
    offset = getattr(table, "offset", None)
    if isinstance(offset, int):
        return offset
    return table.padding_idx + 1 if table.padding_idx is not None else 0


def position_limit(model: Any) -> PositionLimit | None:
    """The position limit of ``model`` (see the module docstring), or ``None`` when it has none to check."""
    found = _config_limit(getattr(model, "config", None))
    if found is None or not isinstance(model, nn.Module):
        return None
    field, value = found
    tokens = set()
    for get in ("get_input_embeddings", "get_output_embeddings"):
        fn = getattr(model, get, None)
        tokens.add(id(fn() if callable(fn) else None))
    limits = []
    for name, module in model.named_modules():
        if isinstance(module, nn.Embedding) and id(module) not in tokens and "relative" not in name:
            rows, skipped = module.num_embeddings, _skipped_rows(module)
            if value in (rows, rows - skipped):
                limits.append(rows - skipped)
    for _, buffer in model.named_buffers():
        if buffer.dim() >= 2 and buffer.shape[0] == value:  # sin/cos of every position, computed once (GPT-J)
            limits.append(value)
    if limits:
        return PositionLimit(min(limits), field, value, hard=True)
    if any("Rotary" in type(m).__name__ for m in model.modules()):
        return PositionLimit(value, field, value, hard=False)
    return None


def longest_row(max_length: int, pad_to_multiple_of: int | None, padding_free: bool) -> int:
    """Positions of the longest row a batch can hold: ``max_length`` rounded up to ``pad_to_multiple_of``
    (padded and packed batches; a padding-free row restarts its ``position_ids`` per sequence and is never
    rounded)."""
    if padding_free or not pad_to_multiple_of:
        return max_length
    return -(-max_length // pad_to_multiple_of) * pad_to_multiple_of


def longest_measured(splits: Mapping[str, Any]) -> tuple[int, str] | None:
    """``(tokens, split)`` of the longest row over the splits (``input_ids``, and list ``labels`` such as
    seq2seq targets), read from Arrow; ``None`` when a split cannot be measured ahead (a stream, a torch
    dataset)."""
    best: tuple[int, str] = (0, "")
    for split, ds in splits.items():
        if ds is None:
            continue
        if not isinstance(ds, datasets.Dataset):
            return None
        for column in ("input_ids", "labels"):
            if column not in ds.column_names or not hasattr(ds.features[column], "feature"):
                continue  # a class label is one value, not a row
            lengths = sequence_lengths(ds, column)
            if lengths and max(lengths) > best[0]:
                best = (max(lengths), split)
    return best


def check_positions(
    model: Any,
    max_length: int,
    pad_to_multiple_of: int | None = None,
    padding_free: bool = False,
    splits: Mapping[str, Any] | None = None,
) -> None:
    """Refuse rows the model's position table cannot hold; warn past a rotary model's trained length.

    Nothing to check while ``data.max_length`` (rounded up to ``pad_to_multiple_of``) fits. Past that, the
    rows of ``splits`` (the prepared, tokenized or packed datasets) are measured: when every one fits, one
    WARNING says that ``data.max_length`` exceeds the model's positions (a longer row would fail); when one
    does not, or the data cannot be measured ahead (streams, torch datasets, ``splits`` not given), the run is
    refused.

    Raises:
        ConfigError: names the longest row (when measured), ``data.max_length`` (and
            ``data.pad_to_multiple_of`` when the rounding is what goes past), the model's limit, the config
            field it comes from, and what fits.
    """
    limit = position_limit(model)
    if limit is None or longest_row(max_length, pad_to_multiple_of, padding_free) <= limit.tokens:
        return
    name = type(model).__name__
    field = f"config.{limit.field}={limit.value}"
    if limit.tokens != limit.value:
        field += f", less {limit.value - limit.tokens} rows its positions skip"
    measured = longest_measured(splits) if splits is not None else None
    if measured is not None:
        tokens, split = measured
        padded = longest_row(tokens, pad_to_multiple_of, padding_free)
        if padded <= limit.tokens:
            if not limit.hard:
                return  # within what the rotary model was trained on: nothing to say
            log.warning(
                "data.max_length=%d is longer than %s's %d positions (%s); no row of this data is (the "
                "longest has %d tokens%s), so nothing fails now, but a longer row would: set "
                "data.max_length=%d",
                max_length, name, limit.tokens, field, tokens,
                (
                    f", {padded} padded to data.pad_to_multiple_of={pad_to_multiple_of}"
                    if padded != tokens
                    else ""
                ),
                limit.tokens,
            )  # fmt: skip
            return
        what = f"The longest {split} row ({tokens} tokens after truncation to data.max_length={max_length}"
        what += (
            f", padded to {padded} by data.pad_to_multiple_of={pad_to_multiple_of})"
            if padded != tokens
            else ")"
        )
    else:
        padded = longest_row(max_length, pad_to_multiple_of, padding_free)
        what = f"data.max_length={max_length}"
        if padded != max_length:
            what += f" rounded up to data.pad_to_multiple_of={pad_to_multiple_of} ({padded})"
        if splits is not None:
            what += " (the rows of a stream or a torch dataset are not measured ahead)"
    if not limit.hard:
        log.warning(
            "%s is longer than %s's %d positions (%s): its rotary positions go on without an error, but the "
            "model was not trained past position %d, so longer rows may be modelled badly; set "
            "data.max_length=%d to stay within them",
            what, name, limit.tokens, field, limit.tokens, limit.tokens,
        )  # fmt: skip
        return
    rounds = bool(pad_to_multiple_of) and not padding_free
    fits = limit.tokens // pad_to_multiple_of * pad_to_multiple_of if rounds else limit.tokens
    fix = f"Set data.max_length={fits} or less" if fits else "Set"
    if rounds and limit.tokens % pad_to_multiple_of:
        fix += f"{', or' if fits else ''} a data.pad_to_multiple_of that divides {limit.tokens}"
    raise ConfigError(
        f"{what} is longer than the {limit.tokens} positions {name} has ({field}): its "
        f"position table has no row past that, so that batch would fail (IndexError; on a GPU a device-side "
        f"assert). {fix}"
    )
