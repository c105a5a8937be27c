"""Validation, test and prediction steps of :class:`~hf_lightning.HFLightningModule`."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn
from torchmetrics import Metric
from torchmetrics.classification import MulticlassF1Score

from hf_lightning.compat import evaluation_results
from hf_lightning.core.batch import PLACEHOLDER_KEY
from hf_lightning.core.errors import ConfigError
from hf_lightning.module.eval_metrics import (
    PredictionCollector,
    TokenAccuracy,
    TokenMeanLoss,
    estimate_logits_bytes,
)
from hf_lightning.module.loss import IGNORE_INDEX, ComputeLoss, loss_targets, token_cross_entropy_sum

log = logging.getLogger(__name__)

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


WARN_BYTES = 2**30  # warn when keeping every logit would take more than 1 GiB


class EvalStepsMixin:
    """Evaluation for a LightningModule that has ``self.model``, ``self.causal``, ``self.lean`` (a
    :class:`~hf_lightning.module.lean_loss.LeanLoss`), ``_say_lean()`` and ``forward(batch)``.

    Per stage (``val``, ``test``): ``{stage}/loss`` is the token-weighted mean over the whole set and all
    ranks (sum of token CE / number of targets; HF's ``eval_loss`` is a sample-weighted mean of per-batch
    means and differs when batches hold different numbers of targets), ``{stage}/perplexity`` =
    ``exp(loss)``, ``{stage}/accuracy`` the token accuracy with the causal shift. For a
    ``*ForSequenceClassification`` model: ``{stage}/loss`` (mean CE per example), ``{stage}/accuracy`` (per
    example) and ``{stage}/f1`` (macro over ``config.num_labels`` classes) instead of perplexity. A user
    ``compute_metrics`` adds its keys under the same prefix. Without ``compute_metrics``, a causal LM's loss
    and accuracy come from the lean path when it is on (the argmax per chunk of tokens, no logits held).

    The values go to the loggers at ``step`` = optimizer steps done, and ``lightning.Trainer.validate()`` /
    ``.test()`` return them as Lightning does: ``[{"val/loss": float, ...}]``, the same floats.
    """

    def _init_evaluation(
        self,
        compute_metrics: Callable[..., Mapping[str, float]] | None,
        preprocess_logits_for_metrics: Callable[[torch.Tensor, torch.Tensor], Any] | None,
        eval_accumulation_steps: int | None,
        batch_eval_metrics: bool,
    ) -> None:
        #: the optimizer step whose weights the newest validation measured (``None``: not validated yet)
        self.last_validated_step: int | None = None
        takes_result = (
            compute_metrics is not None and "compute_result" in inspect.signature(compute_metrics).parameters
        )
        if batch_eval_metrics and compute_metrics is not None and not takes_result:
            raise ConfigError(
                "batch_eval_metrics=true calls compute_metrics(eval_pred, compute_result=...) per batch; "
                "the given compute_metrics takes no compute_result argument (as in HF Trainer)"
            )
        self.compute_metrics = compute_metrics
        self.preprocess_logits_for_metrics = preprocess_logits_for_metrics
        self.batch_eval_metrics = batch_eval_metrics
        num_classes = sequence_classes(self.model)
        self.eval_metrics = nn.ModuleDict(
            {s: nn.ModuleDict(self._stage_metrics(num_classes)) for s in STAGES}
        )
        self._collector = PredictionCollector(eval_accumulation_steps)
        self._lean_eval_said = False

    def _stage_metrics(self, num_classes: int | None) -> dict[str, Metric]:
        metrics: dict[str, Metric] = {"loss": TokenMeanLoss(), "accuracy": TokenAccuracy(self.causal)}
        if num_classes:
            # classification: accuracy above is per example (labels (B,), no shift); add macro F1
            metrics["f1"] = MulticlassF1Score(num_classes, average="macro", ignore_index=IGNORE_INDEX)
        return metrics

    # ----------------------------------------------------------------------------------- the steps
    def _eval_step(self, batch: Mapping[str, Any], batch_idx: int, stage: str) -> None:
        metrics = self.eval_metrics[stage]
        if self.lean.active and self.compute_metrics is None and self._lean_eval_step(batch, metrics):
            return
        outputs = self(batch)
        logits, labels = outputs.logits, batch["labels"]
        loss_sum = token_cross_entropy_sum(
            logits, labels, causal=self.causal, shift_labels=batch.get("shift_labels")
        )
        # a placeholder (hf_lightning.data.collators.PlaceholderAwareCollator) has no target: it adds 0 to
        # these sums, and nothing below
        metrics["loss"].update(loss_sum, self.count_loss_items(batch))
        metrics["accuracy"].update(logits, labels)
        if "f1" in metrics:
            metrics["f1"].update(logits.argmax(-1), labels)
        if self.compute_metrics is None or batch.get(PLACEHOLDER_KEY):
            return
        preds = logits
        if self.preprocess_logits_for_metrics is not None:
            preds = self.preprocess_logits_for_metrics(logits, labels)
        if self.batch_eval_metrics:
            from transformers import EvalPrediction

            last = batch_idx == self._num_eval_batches(stage) - 1
            result = self.compute_metrics(
                EvalPrediction(predictions=preds.detach().cpu().numpy(), label_ids=labels.cpu().numpy()),
                compute_result=last,
            )
            if last:
                self._user_metrics = dict(result or {})
        else:
            self._collector.add(preds, labels)

    def _lean_eval_step(self, batch: Mapping[str, Any], metrics: Mapping[str, Metric]) -> bool:
        """Loss and token accuracy from the hidden states and the LM head, chunk by chunk (no logits held);
        ``False`` when the model turned out not to fit (the caller takes the plain path)."""
        targets = loss_targets(batch["labels"], self.causal, batch.get("shift_labels"))
        lean = self.lean.forward(lambda: self(batch), targets.shape)
        if lean is None:
            self._say_lean()
            return False
        count = int((targets != IGNORE_INDEX).sum())
        loss_sum, correct = self.lean.stats(lean[1], targets, count)
        # the loss is averaged over the module's own target rule: the same count unless a subclass redefines
        # it
        own_count = type(self).count_loss_items is ComputeLoss.count_loss_items
        metrics["loss"].update(loss_sum, count if own_count else self.count_loss_items(batch))
        metrics["accuracy"].update(correct=correct, total=count)
        return True

    def _num_eval_batches(self, stage: str) -> int:
        counts = self.trainer.num_val_batches if stage == "val" else self.trainer.num_test_batches
        return int(counts[0])

    def validation_step(self, batch: Mapping[str, Any], batch_idx: int) -> None:
        self._eval_step(batch, batch_idx, "val")

    def test_step(self, batch: Mapping[str, Any], batch_idx: int) -> None:
        self._eval_step(batch, batch_idx, "test")

    # ------------------------------------------------------------------------------ epoch bounds
    def _eval_start(self, stage: str) -> None:
        self._collector.reset()
        self._user_metrics: dict[str, float] = {}
        if self.compute_metrics is not None and self.lean.active and not self._lean_eval_said:
            self._lean_eval_said = True
            if self.trainer.is_global_zero:
                log.info(
                    "evaluation computes the full logits: compute_metrics needs them (training stays lean)"
                )
        if (
            self.compute_metrics is None
            or self.preprocess_logits_for_metrics is not None
            or self.batch_eval_metrics
        ):
            return
        loader = self.trainer.val_dataloaders if stage == "val" else self.trainer.test_dataloaders
        dataset = getattr(loader, "dataset", None)
        vocab = getattr(getattr(self.model, "config", None), "vocab_size", None)
        if dataset is None or vocab is None or not hasattr(dataset, "__len__"):
            return
        lengths = dataset["input_ids"] if hasattr(dataset, "column_names") else None
        max_len = max(len(x) for x in lengths) if lengths is not None else 1
        dtype = next(self.model.parameters()).dtype
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

    def on_validation_start(self) -> None:
        self._eval_start("val")

    def on_test_start(self) -> None:
        self._eval_start("test")

    def _eval_epoch_end(self, stage: str) -> dict[str, float]:
        metrics = self.eval_metrics[stage]
        loss = metrics["loss"].compute()
        values = {f"{stage}/loss": loss, f"{stage}/accuracy": metrics["accuracy"].compute()}
        if "f1" in metrics:
            values[f"{stage}/f1"] = metrics["f1"].compute()
        else:
            values[f"{stage}/perplexity"] = torch.exp(loss)
        for m in metrics.values():
            m.reset()
        if self.compute_metrics is not None and not self.batch_eval_metrics:
            preds, labels = self._collector.gather(self.trainer.world_size, self._all_gather_object)
            self._collector.reset()
            if preds is not None:
                from transformers import EvalPrediction

                self._user_metrics = dict(
                    self.compute_metrics(EvalPrediction(predictions=preds, label_ids=labels))
                )
        for key, value in getattr(self, "_user_metrics", {}).items():
            name = key.removeprefix("eval_")
            values[f"{stage}/{name}"] = torch.as_tensor(float(value))
        # the values are already the same on every rank (the metrics sync their states); a max over ranks
        # keeps them exact and tells Lightning so (it warns about epoch-level values logged without sync_dist)
        synced = self.trainer.world_size > 1
        for key, value in values.items():
            self.log(
                key, value, prog_bar=key == f"{stage}/loss", logger=False, sync_dist=synced, reduce_fx="max"
            )
        floats = {k: float(v) for k, v in values.items()}
        if not self.trainer.sanity_checking:
            self.log_to_loggers(floats)
            if stage == "val":
                self.last_validated_step = self.global_step
            self._returned_results = (self._results_list(stage), floats)
        return floats

    def _results_list(self, stage: str) -> list[dict[str, float]] | None:
        """The list ``trainer.validate()`` / ``.test()`` will return (one dict per dataloader), while it is
        being built; ``None`` inside ``fit`` (which returns nothing).

        Lightning fills it from metrics logged with ``logger=True``; these metrics are written to the loggers
        by :meth:`log_to_loggers` instead (at HF's step), so they are added to it at ``on_{stage}_end``, after
        Lightning has sent its own (then empty) row to the loggers. Private attribute of Lightning's
        ``_EvaluationLoop``: ``_logged_outputs`` (the list object it swaps out and returns).
        """
        from lightning.pytorch.trainer.states import TrainerFn

        trainer = self.trainer
        loop = {TrainerFn.VALIDATING: trainer.validate_loop, TrainerFn.TESTING: trainer.test_loop}.get(
            trainer.state.fn
        )
        if loop is None or (stage == "test") != (trainer.state.fn == TrainerFn.TESTING):
            return None
        return evaluation_results(loop)

    def _fill_returned_results(self) -> None:
        results, floats = getattr(self, "_returned_results", (None, {}))
        self._returned_results = (None, {})
        if results is None:
            return
        if not results:
            results.append({})
        for outputs in results:
            outputs.update(floats)

    def _all_gather_object(self, obj: Any) -> list[Any]:
        import torch.distributed as dist

        out: list[Any] = [None] * self.trainer.world_size
        dist.all_gather_object(out, obj)
        return out

    def on_validation_epoch_end(self) -> None:
        self._eval_epoch_end("val")

    def on_test_epoch_end(self) -> None:
        self._eval_epoch_end("test")

    def on_validation_end(self) -> None:
        """``trainer.validate()`` returns ``[{"val/loss": ..., ...}]``: the values the loggers received."""
        self._fill_returned_results()

    def on_test_end(self) -> None:
        """``trainer.test()`` returns ``[{"test/loss": ..., ...}]``: the values the loggers received."""
        self._fill_returned_results()

    # ------------------------------------------------------------------------------------ predict
    def predict_step(self, batch: Mapping[str, Any], batch_idx: int) -> list[dict[str, Any]]:
        """Per example: the argmax token at every target position (causal shift), and the label there.

        Returns a list (one dict per example, in batch order) of ``{"positions", "predicted_ids",
        "label_ids"}``; positions index the label sequence. Every target is there (every assistant turn of a
        chat, the tokens ``val/loss`` averages over): HF ``Trainer.predict``'s predictions and ``label_ids``
        at the labels that are not -100. A placeholder batch (a rank with no example of the
        set, :class:`~hf_lightning.data.collators.PlaceholderAwareCollator`) returns ``[]``.
        """
        if batch.get(PLACEHOLDER_KEY):
            return []
        logits = self(batch).logits
        preds = logits.argmax(-1)
        labels = batch["labels"]
        if self.causal:
            preds = torch.nn.functional.pad(preds[..., :-1], (1, 0), value=IGNORE_INDEX)
        out = []
        for p, lab in zip(preds.cpu(), labels.cpu()):
            pos = (lab != IGNORE_INDEX).nonzero().flatten()
            if self.causal:
                pos = pos[pos > 0]
            out.append(
                {"positions": pos.tolist(), "predicted_ids": p[pos].tolist(), "label_ids": lab[pos].tolist()}
            )
        return out
