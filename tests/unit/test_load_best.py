"""``LoadBestModel`` keeps HF's rule for the best model: a real Lightning fit of a tiny Llama.

HF (``_determine_best_metric`` + ``_save_checkpoint``): a strictly better evaluation records its step; at each
save, that step's checkpoint becomes the best model if it was saved. The expected best model is worked out
here from the run's own validation values by that rule, by hand; the callback must agree, and the module must
hold the best model's weights after ``fit``.
"""

from __future__ import annotations

import logging

import datasets
import lightning as L
import pytest
import torch

from hf_lightning import HFDataModule, HFLightningModule
from hf_lightning.callbacks.hf_steps import HFSteps
from hf_lightning.callbacks.load_best import LoadBestModel
from hf_lightning.config.hf_args import StepSchedule
from hf_lightning.core.errors import ConfigError
from tests.data_support import tiny_llama

TEXTS = [" ".join("abcdefghijklmnopqrstuvwxyz"[i % 9 : i % 9 + i % 6 + 3]) for i in range(24)]


class Record(L.Callback):
    def __init__(self) -> None:
        self.val: dict[int, float] = {}
        self.weights: dict[int, dict[str, torch.Tensor]] = {}

    def on_validation_end(self, trainer, pl_module):
        self.val[trainer.global_step] = float(trainer.callback_metrics["val/loss"])
        self.weights[trainer.global_step] = {k: v.clone() for k, v in pl_module.model.state_dict().items()}


def fit(tmp_path, word_tokenizer, monitor="val/loss", mode="min", lr=0.5):
    data = HFDataModule(
        word_tokenizer,
        path=datasets.Dataset.from_dict({"text": TEXTS}),
        validation_split=0.25,
        per_device_train_batch_size=2,
        max_length=16,
    )
    module = HFLightningModule(tiny_llama(), optim={"name": "sgd", "lr": lr}, scheduler={"name": "constant"})
    steps = HFSteps(
        StepSchedule("steps", 1, "steps", 2)
    )  # evaluate every step, save every second and the last
    best = LoadBestModel(monitor, mode, str(tmp_path / "checkpoints"), steps)
    record = Record()
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=5,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        use_distributed_sampler=False,
        callbacks=[best, steps, record],
        default_root_dir=str(tmp_path),
    )
    trainer.fit(module, datamodule=data)
    return module, best, record, steps


def hf_best_model(val: dict[int, float], saved: list[int], greater: bool) -> int | None:
    best_metric, best_step, best_model = None, None, None
    for step in sorted(val):
        value = val[step]
        if best_metric is None or (value > best_metric if greater else value < best_metric):
            best_metric, best_step = value, step
        if step in saved and best_step == step:
            best_model = step
    return best_model


@pytest.mark.parametrize("mode", ["min", "max"])
def test_the_best_saved_evaluation_is_loaded_as_hf_does(tmp_path, word_tokenizer, caplog, mode):
    with caplog.at_level(logging.INFO, logger="hf_lightning.callbacks.load_best"):
        module, best, record, steps = fit(tmp_path, word_tokenizer, mode=mode)
    assert sorted(record.val) == [1, 2, 3, 4, 5] and steps.saved_steps == [2, 4, 5]
    expected = hf_best_model(record.val, [2, 4, 5], greater=mode == "max")
    assert best.best_model_step == expected
    held = module.model.state_dict()
    if expected is None:  # HF keeps the final model, and says nothing; we say it
        assert any("no evaluation at a save step was the best" in r.getMessage() for r in caplog.records)
        expected = 5
    for name, tensor in record.weights[expected].items():
        torch.testing.assert_close(held[name], tensor, rtol=0, atol=0, msg=name)


def test_a_metric_the_validation_does_not_log_names_what_it_logged(tmp_path, word_tokenizer):
    with pytest.raises(
        ConfigError,
        match=r"metric_for_best_model names val/bleu, which the validation did not log "
        r"\(it logged: val/accuracy, val/loss, val/perplexity\)",
    ):
        fit(tmp_path, word_tokenizer, monitor="val/bleu")


def test_saving_the_best_model_adds_no_lightning_line(tmp_path, word_tokenizer, caplog):
    """``trainer.save_checkpoint(path)`` without ``weights_only`` logs Lightning's "`weights_only` was not
    set, defaulting to `False`." at every save of ``best.ckpt``, beside the callback's own line."""
    with caplog.at_level(logging.INFO):
        _, best, _, _ = fit(tmp_path, word_tokenizer)
    assert best.best_model_step is not None  # best.ckpt was written
    lightning_lines = [r.getMessage() for r in caplog.records if "weights_only" in r.getMessage()]
    assert lightning_lines == []
    # final_metrics.json gets the best model's step as an integer (a step, not a measurement)
    assert best.final_metrics()["best_model_step"] == best.best_model_step
    assert type(best.final_metrics()["best_model_step"]) is int
