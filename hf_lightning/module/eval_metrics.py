"""Evaluation metrics that stay flat in memory, with HF's ``compute_metrics`` hooks still working.

The default path keeps only metric states (sums and counts, torchmetrics: synced across ranks, never a tensor
of logits kept): :class:`TokenMeanLoss`, :class:`TokenAccuracy`. An HF-style
``compute_metrics(EvalPrediction)`` needs predictions for the whole set; :class:`PredictionCollector` collects
them the way HF ``Trainer.evaluation_loop`` does (after ``preprocess_logits_for_metrics``, padded with
``-100`` along dim 1, moved to the CPU every ``eval_accumulation_steps`` batches), with one difference:
evaluation samplers never pad a rank's shard, so no example is counted twice and nothing needs de-duplicating.

Also here: the metrics of one stage (:func:`stage_metrics`, with macro F1 for a classifier:
:func:`sequence_classes`), the warning before every logit of a set is kept (:func:`warn_if_logits_kept`), and
the list ``trainer.validate()`` / ``.test()`` returns (:func:`returned_results`); ``HFLightningModule``'s
evaluation hooks use them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn
from torchmetrics import Metric
from torchmetrics.classification import MulticlassF1Score

from hf_lightning.compat import evaluation_results
from hf_lightning.core.batch import IGNORE_INDEX

log = logging.getLogger(__name__)


class TokenMeanLoss(Metric):
    """Token-weighted mean loss over a whole evaluation set: ``sum of token CE / number of targets``.

    HF ``Trainer.evaluate`` reports the sample-weighted mean of per-batch means, which differs when batches
    hold different numbers of targets; this is the exact mean over all targets of all ranks.

    ``update(loss_sum, count)``: a 0-dim float tensor (summed CE, nats) and the number of targets.
    ``compute()``: 0-dim float32 mean in nats (0 when no target was seen).
    """

    full_state_update = False

    def __init__(self) -> None:
        super().__init__()
        self.add_state("loss_sum", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, loss_sum: torch.Tensor, count: torch.Tensor | int) -> None:
        self.loss_sum += loss_sum.detach().double()
        self.count += int(count) if not isinstance(count, torch.Tensor) else count.to(self.count)

    def compute(self) -> torch.Tensor:
        return (self.loss_sum / self.count.clamp(min=1)).float()


class TokenAccuracy(Metric):
    """Share of target positions whose argmax prediction equals the label.

    Causal LMs compare ``argmax(logits[:, t])`` with ``labels[:, t + 1]`` (the training shift); others
    compare position by position. ``-100`` labels are skipped. States sync across ranks.
    """

    full_state_update = False

    def __init__(self, causal: bool = True) -> None:
        super().__init__()
        self.causal = causal
        self.add_state("correct", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("total", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(
        self,
        logits: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        correct: torch.Tensor | int | None = None,
        total: torch.Tensor | int | None = None,
    ) -> None:
        """``update(logits (B, L, V), labels (B, L))``, or ``update(correct=, total=)`` with counts computed
        elsewhere (the lean path's argmax per chunk of tokens)."""
        if correct is not None:
            self.correct += correct
            self.total += total
            return
        preds = logits.argmax(-1)
        if self.causal:
            preds, labels = preds[..., :-1], labels[..., 1:]
        mask = labels != IGNORE_INDEX
        self.correct += ((preds == labels) & mask).sum()
        self.total += mask.sum()

    def compute(self) -> torch.Tensor:
        return self.correct.float() / self.total.clamp(min=1).float()


#: the evaluation stages whose metrics the module keeps
STAGES = ("val", "test")


def sequence_classes(model: nn.Module) -> int | None:
    """Classes of a single-label ``*ForSequenceClassification`` model (``config.num_labels`` >= 2), else
    ``None``.

    Regression (one label) and multi-label problems get no F1 here (a user ``compute_metrics`` can add
    theirs).
    """
    if not type(model).__name__.endswith("ForSequenceClassification"):
        return None
    config = model.config
    num = int(getattr(config, "num_labels", 0) or 0)
    if num < 2 or getattr(config, "problem_type", None) not in (None, "single_label_classification"):
        return None
    return num


def stage_metrics(causal: bool, num_classes: int | None) -> dict[str, Metric]:
    """One stage's metrics: ``loss`` (:class:`TokenMeanLoss`), ``accuracy`` (:class:`TokenAccuracy`, with the
    causal shift when ``causal``) and, for a classifier of ``num_classes``, macro ``f1`` (accuracy is then
    per example: labels ``(B,)``, no shift)."""
    metrics: dict[str, Metric] = {"loss": TokenMeanLoss(), "accuracy": TokenAccuracy(causal)}
    if num_classes:
        metrics["f1"] = MulticlassF1Score(num_classes, average="macro", ignore_index=IGNORE_INDEX)
    return metrics


WARN_BYTES = 2**30  # warn when keeping every logit would take more than 1 GiB


def estimate_logits_bytes(num_examples: int, max_length: int, vocab_size: int, dtype: torch.dtype) -> int:
    """Bytes that keeping every evaluation logit would take: ``N x L x V x sizeof(dtype)``.

    2,000 sequences x 512 tokens x 32,000 vocab in float32 is 131 GB.
    """
    return int(num_examples) * int(max_length) * int(vocab_size) * torch.finfo(dtype).bits // 8


def warn_if_logits_kept(stage: str, dataset: Any, model: nn.Module) -> None:
    """One WARNING when keeping every logit of ``dataset`` (``compute_metrics`` without
    ``preprocess_logits_for_metrics``) would take more than :data:`WARN_BYTES` of host memory; nothing when
    the size is unknown (no length, or a model config without ``vocab_size``)."""
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    if dataset is None or vocab is None or not hasattr(dataset, "__len__"):
        return
    lengths = dataset["input_ids"] if hasattr(dataset, "column_names") else None
    max_len = max(len(x) for x in lengths) if lengths is not None else 1
    dtype = next(model.parameters()).dtype
    need = estimate_logits_bytes(len(dataset), max_len, vocab, dtype)
    if need > WARN_BYTES:
        log.warning(
            "compute_metrics without preprocess_logits_for_metrics keeps every logit of the %s set: "
            "%d examples x %d tokens x %d vocab x %d bytes = %.1f GiB in host memory. Pass "
            "preprocess_logits_for_metrics (e.g. lambda logits, labels: logits.argmax(-1)) or set "
            "batch_eval_metrics=true",
            stage,
            len(dataset),
            max_len,
            vocab,
            torch.finfo(dtype).bits // 8,
            need / 2**30,
        )


def position_wise_problem(chunked: torch.Tensor, whole: Any) -> str | None:
    """Why ``preprocess_logits_for_metrics``'s predictions from chunks of positions (``chunked``) are not its
    result on the same rows' whole logits (``whole``), or ``None``: the same shape, and equal (integers,
    booleans) or equal to float rounding (relative 1e-4: the head's product in chunks rounds differently).
    """
    if not isinstance(whole, torch.Tensor):
        return f"on the whole logits it returned a {type(whole).__name__}, not a tensor"
    if whole.shape != chunked.shape:
        return f"on the whole logits it returned shape {tuple(whole.shape)}, on chunks {tuple(chunked.shape)}"
    whole = whole.to(chunked.device)
    if chunked.is_floating_point() or chunked.is_complex():
        same = torch.allclose(chunked, whole.to(chunked.dtype), rtol=1e-4, atol=1e-6, equal_nan=True)
    else:
        same = torch.equal(chunked, whole.to(chunked.dtype))
    return None if same else "its results on chunks of positions differ from those on the whole logits"


def returned_results(trainer: Any, stage: str) -> list[dict[str, float]] | None:
    """The list ``trainer.validate()`` / ``.test()`` will return (one dict per dataloader), while it is being
    built; ``None`` inside ``fit`` (which returns nothing) or when ``stage`` is not the one running.

    Lightning fills it from metrics logged with ``logger=True``; ``HFLightningModule`` writes its evaluation
    metrics to the loggers itself (at HF's step), so it adds them to this list at ``on_{stage}_end``, after
    Lightning has sent its own (then empty) row to the loggers. Read through
    :func:`~hf_lightning.compat.evaluation_results`.
    """
    from lightning.pytorch.trainer.states import TrainerFn

    loop = {TrainerFn.VALIDATING: trainer.validate_loop, TrainerFn.TESTING: trainer.test_loop}.get(
        trainer.state.fn
    )
    if loop is None or (stage == "test") != (trainer.state.fn == TrainerFn.TESTING):
        return None
    return evaluation_results(loop)


def all_gather_object(obj: Any, world_size: int) -> list[Any]:
    """``obj`` of every rank of the initialized process group (``torch.distributed.all_gather_object``)."""
    import torch.distributed as dist

    out: list[Any] = [None] * world_size
    dist.all_gather_object(out, obj)
    return out


def _pad_concat(chunks: Sequence[np.ndarray], pad: int = IGNORE_INDEX) -> np.ndarray:
    """Concatenate along dim 0, padding dim 1 to the longest chunk (HF ``nested_concat`` semantics)."""
    if chunks[0].ndim < 2:
        return np.concatenate(chunks, axis=0)
    length = max(c.shape[1] for c in chunks)
    out = []
    for c in chunks:
        if c.shape[1] < length:
            width = [(0, 0), (0, length - c.shape[1])] + [(0, 0)] * (c.ndim - 2)
            c = np.pad(c, width, constant_values=pad)
        out.append(c)
    return np.concatenate(out, axis=0)


class PredictionCollector:
    """Predictions and labels of one evaluation pass, for ``compute_metrics``.

    Args:
        eval_accumulation_steps: move to the CPU every this many batches (HF's argument). ``None``
            moves every batch at once: on an accelerator nothing accumulates in device memory.
    """

    def __init__(self, eval_accumulation_steps: int | None = None) -> None:
        self.eval_accumulation_steps = eval_accumulation_steps or 1
        self._staged: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._preds: list[np.ndarray] = []
        self._labels: list[np.ndarray] = []

    def reset(self) -> None:
        self._staged, self._preds, self._labels = [], [], []

    def add(self, preds: torch.Tensor, labels: torch.Tensor) -> None:
        self._staged.append((preds.detach(), labels.detach()))
        if len(self._staged) >= self.eval_accumulation_steps:
            self._to_cpu()

    def _to_cpu(self) -> None:
        for p, lab in self._staged:
            self._preds.append(p.cpu().numpy())
            self._labels.append(lab.cpu().numpy())
        self._staged = []

    def local_arrays(self) -> tuple[np.ndarray | None, np.ndarray | None]:
        self._to_cpu()
        if not self._preds:
            return None, None
        return _pad_concat(self._preds), _pad_concat(self._labels)

    def gather(self, world_size: int, all_gather_object: Callable[[Any], list] | None = None):
        """Arrays over the whole set, in dataset order.

        With ``world_size > 1`` every rank holds the strided shard ``rank, rank + W, ...`` (the evaluation
        order of :class:`~hf_lightning.data.sampling.ExactDistributedSampler`); rows are put back in dataset
        order.
        """
        preds, labels = self.local_arrays()
        if world_size == 1:
            return preds, labels
        parts = all_gather_object((preds, labels))
        total = sum(len(p) for p, _ in parts if p is not None)
        return _interleave([p for p, _ in parts], total), _interleave([lab for _, lab in parts], total)


def _interleave(shards: list[np.ndarray | None], total: int) -> np.ndarray:
    world = len(shards)
    present = [s for s in shards if s is not None]
    if present[0].ndim < 2:
        out = np.empty((total, *present[0].shape[1:]), dtype=present[0].dtype)
    else:
        length = max(s.shape[1] for s in present)
        out = np.full((total, length, *present[0].shape[2:]), IGNORE_INDEX, dtype=present[0].dtype)
    for rank, shard in enumerate(shards):
        if shard is None:
            continue
        if shard.ndim < 2:
            out[rank::world] = shard
        else:
            out[rank::world, : shard.shape[1]] = shard
    return out
