"""Faults during training: a NaN never reaches the weights, an allocation failure says what to change.

Faults are planted in real runs (a real ``Trainer``, a real Llama, real data): a forward hook poisons the
batches that hold one token, a gradient hook blows up one step, a real allocation fails. Faults at save time
and stop signals are in ``test_save_faults.py``.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import re

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger

from hf_lightning import ConfigError, TrainingError
from hf_lightning.callbacks import NonFiniteGuard
from hf_lightning.checkpointing import AtomicCheckpointIO
from hf_lightning.run.faults import explain_faults, out_of_memory_message
from tests.errors.support import ROWS, run


class Weights(L.Callback):
    """The model's parameters after every optimizer step, by step (step 0: before training)."""

    def __init__(self) -> None:
        self.by_step: dict[int, dict[str, torch.Tensor]] = {}

    def _take(self, trainer, module):
        self.by_step[trainer.global_step] = {
            k: v.detach().clone() for k, v in module.model.named_parameters()
        }

    def on_train_start(self, trainer, module):
        self._take(trainer, module)

    def on_train_batch_end(self, trainer, module, *args):
        self._take(trainer, module)


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)


# ------------------------------------------------------------------------------------------ NaN / inf
def test_without_the_guard_a_nan_step_poisons_every_weight(tmp_path, word_tokenizer):
    """The control: what the guard prevents."""
    weights = Weights()
    t, module, dm = run(tmp_path, word_tokenizer, [weights])
    t.fit(module, datamodule=dm)
    assert all(torch.isfinite(v).all() for v in weights.by_step[2].values())
    assert all(
        torch.isnan(v).any() for v in weights.by_step[3].values()
    )  # every tensor (unused embedding rows aside)


def test_nan_loss_stops_before_the_update_and_keeps_the_checkpoints(tmp_path, word_tokenizer):
    weights = Weights()
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=1, save_last=True, save_top_k=-1)
    t, module, dm = run(
        tmp_path,
        word_tokenizer,
        [NonFiniteGuard(), weights, ckpt],
        plugins=[AtomicCheckpointIO()],
        enable_checkpointing=True,
    )
    with pytest.raises(TrainingError) as err:
        t.fit(module, datamodule=dm)
    assert str(err.value) == (
        "optimizer step 3 (epoch 0): the loss is nan and the gradient norm is nan, so the update was not "
        "applied and training stopped; the weights are those after step 2 and every checkpoint already "
        "written is intact. usual causes: a learning rate too high (lr=0.01 now), fp16 overflow (try "
        "trainer.precision=bf16-mixed), or a broken batch. To skip such steps instead, set "
        "callbacks.nonfinite_guard.on_nonfinite=skip"
    )
    now = {k: v.detach() for k, v in module.model.named_parameters()}
    assert same(now, weights.by_step[2])
    last = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=False)
    assert last["global_step"] == 2
    assert all(torch.equal(last["state_dict"]["model." + k], v) for k, v in weights.by_step[2].items())


@pytest.mark.parametrize("accumulate", [1, 2])
def test_nan_loss_skips_the_step_and_counts_it(tmp_path, word_tokenizer, accumulate, caplog):
    """Skipped: no parameter moves in that step (AdamW moments and weight decay included); the next steps
    train.

    With accumulation 2 the poisoned micro-batch (batch 2) is the first of window 2: the window's step is
    skipped."""
    weights = Weights()
    guard = NonFiniteGuard(on_nonfinite="skip")
    logger = CSVLogger(tmp_path, name="", version="")
    bad_step = 3 if accumulate == 1 else 2
    t, module, dm = run(
        tmp_path,
        word_tokenizer,
        [guard, weights],
        max_steps=5,
        accumulate=accumulate,
        logger=logger,
        rows=ROWS + ROWS[6:] * 2 * (accumulate - 1),
    )
    with caplog.at_level(logging.WARNING, logger="hf_lightning"):
        t.fit(module, datamodule=dm)
    assert t.global_step == 5 and guard.skipped_steps == 1
    assert same(weights.by_step[bad_step], weights.by_step[bad_step - 1])
    for step in range(1, 6):
        if step != bad_step:
            assert not same(weights.by_step[step], weights.by_step[step - 1])
    assert all(torch.isfinite(v).all() for v in weights.by_step[5].values())
    assert (
        f"optimizer step {bad_step} (epoch 0): the loss is nan and the gradient norm is nan; the update was "
        "skipped (1 skipped so far)" in caplog.text
    )
    with open(tmp_path / "metrics.csv") as fh:
        rows = [r for r in csv.DictReader(fh) if r.get("train/skipped_steps")]
    # the run's one train row (log_every_n_steps=50 > max_steps): the count so far
    assert [(int(r["step"]), float(r["train/skipped_steps"])) for r in rows] == [(5, 1.0)]


def test_a_skipped_step_leaves_no_nan_in_the_log(tmp_path, word_tokenizer, caplog):
    """A row every step; step 3's batch holds the poisoned token. Before: that row read ``grad_norm=nan``,
    ``train/loss=nan`` (in metrics.csv and in the log line). Now its grad_norm and train/loss cells are empty,
    every other cell is finite, and ``train/skipped_steps`` counts the skips in every row.

    The oracle for the other rows: a run on the same rows without the poisoned batch. A skipped step moves no
    weight, no AdamW moment and no step count, so its steps 1, 2, 3, 4 are this run's steps 1, 2, 4, 5."""
    logger = CSVLogger(tmp_path / "skip", name="", version="")
    t, module, dm = run(
        tmp_path / "skip",
        word_tokenizer,
        [NonFiniteGuard(on_nonfinite="skip")],
        max_steps=5,
        logger=logger,
        log_every_n_steps=1,
    )
    with caplog.at_level(logging.INFO, logger="hf_lightning"):
        t.fit(module, datamodule=dm)
    control_logger = CSVLogger(tmp_path / "control", name="", version="")
    t2, control, dm2 = run(
        tmp_path / "control",
        word_tokenizer,
        [],
        max_steps=4,
        logger=control_logger,
        log_every_n_steps=1,
        rows=ROWS[:4] + ROWS[6:],  # batch 2 (rows 4 and 5) left out
    )
    t2.fit(control, datamodule=dm2)

    def read(folder):
        with open(folder / "metrics.csv") as fh:
            return {int(r["step"]): r for r in csv.DictReader(fh)}

    rows, expected = read(tmp_path / "skip"), read(tmp_path / "control")
    assert sorted(rows) == [1, 2, 3, 4, 5]
    assert rows[3]["grad_norm"] == "" and rows[3]["train/loss"] == ""
    assert [rows[s]["train/skipped_steps"] for s in (1, 2, 3, 4, 5)] == ["0.0", "0.0", "1.0", "1.0", "1.0"]
    for step, same_as in ((1, 1), (2, 2), (4, 3), (5, 4)):
        for key in ("train/loss", "grad_norm"):
            want = float(expected[same_as][key])
            assert float(rows[step][key]) == pytest.approx(want, rel=1e-5), (step, key)
    cells = [v for r in rows.values() for v in r.values() if v != ""]
    assert all(math.isfinite(float(v)) for v in cells)
    assert all(math.isfinite(v) for v in module.last_logged.values())
    lines = [r.getMessage() for r in caplog.records if r.name == "hf_lightning.module.train_log"]
    # 12 rows in batches of 2: 6 steps an epoch, so step 3 ends half of it (HF's state.epoch = 3 / 6)
    line = r"step 3 of 5 \[\d\d:\d\d<\d\d:\d\d\]: lr=0\.01 train/skipped_steps=1 epoch=0\.5"
    assert re.fullmatch(line, lines[2]), lines[2]
    assert not [line for line in lines if "nan" in line or "inf" in line]


def test_skipped_steps_survive_a_checkpoint(tmp_path, word_tokenizer):
    guard = NonFiniteGuard(on_nonfinite="skip")
    t, module, dm = run(tmp_path, word_tokenizer, [guard], max_steps=4)
    t.fit(module, datamodule=dm)
    restored = NonFiniteGuard(on_nonfinite="skip")
    restored.load_state_dict(guard.state_dict())
    assert restored.skipped_steps == 1 and restored.state_dict() == guard.state_dict()


def test_too_many_consecutive_skips_stop_the_run(tmp_path, word_tokenizer):
    rows = [{"text": "z z z"}] * 12  # every batch poisoned: the run has diverged
    t, module, dm = run(
        tmp_path, word_tokenizer, [NonFiniteGuard(on_nonfinite="skip", max_consecutive_skips=3)], rows=rows
    )
    with pytest.raises(
        TrainingError,
        match=r"^optimizer step 3 \(epoch 0\): 3 optimizer steps in a row had a non-finite loss or gradient",
    ):
        t.fit(module, datamodule=dm)


def test_inf_gradient_with_a_finite_loss(tmp_path, word_tokenizer):
    weights = Weights()
    t, module, dm = run(tmp_path, word_tokenizer, [NonFiniteGuard(), weights], rows=ROWS[:4] * 3)
    calls = []
    module.model.lm_head.weight.register_hook(
        lambda g: g * math.inf if len(calls.append(1) or calls) == 2 else g
    )
    with pytest.raises(
        TrainingError,
        match=r"^optimizer step 2 \(epoch 0\): the gradient norm is inf, so the update was not applied",
    ):
        t.fit(module, datamodule=dm)
    assert same({k: v.detach() for k, v in module.model.named_parameters()}, weights.by_step[1])


def test_learning_rate_divergence_is_stopped(tmp_path, word_tokenizer):
    """A real divergence: SGD at lr 1e30 makes step 2's logits overflow."""
    t, module, dm = run(
        tmp_path, word_tokenizer, [NonFiniteGuard()], optim={"name": "sgd", "lr": 1e30}, rows=ROWS[:4] * 3
    )
    with pytest.raises(
        TrainingError,
        match=r"^optimizer step 2 \(epoch 0\): the loss is (nan|inf).*a learning rate too high \(lr=1e\+30 "
        r"now\)",
    ):
        t.fit(module, datamodule=dm)


def test_exploding_gradient_norm_is_reported(tmp_path, word_tokenizer, caplog):
    guard = NonFiniteGuard(grad_norm_spike=10.0, min_history=3)
    t, module, dm = run(tmp_path, word_tokenizer, [guard], rows=ROWS[:4] * 3, gradient_clip_val=1.0)
    calls = []
    module.model.lm_head.weight.register_hook(lambda g: g * 1e4 if len(calls.append(1) or calls) == 5 else g)
    with caplog.at_level(logging.WARNING, logger="hf_lightning"):
        t.fit(module, datamodule=dm)
    assert guard.exploding_steps == 1
    reports = [r.getMessage() for r in caplog.records if "gradient norm" in r.getMessage()]
    assert len(reports) == 1
    assert reports[0].startswith("optimizer step 5: gradient norm ")
    assert "the median" in reports[0] and reports[0].endswith(
        "clipped to module.max_grad_norm=1 before the update"
    )


def test_gradient_norm_threshold(tmp_path, word_tokenizer, caplog):
    guard = NonFiniteGuard(grad_norm_threshold=1e-9, grad_norm_spike=None)
    t, module, dm = run(tmp_path, word_tokenizer, [guard], max_steps=2, rows=ROWS[:4] * 3)
    with caplog.at_level(logging.WARNING, logger="hf_lightning"):
        t.fit(module, datamodule=dm)
    assert guard.exploding_steps == 2
    assert "is above grad_norm_threshold=1e-09; not clipped (set module.max_grad_norm" in caplog.text


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"on_nonfinite": "ignore"},
            "callbacks.nonfinite_guard.on_nonfinite='ignore': allowed values: stop, skip",
        ),
        (
            {"max_consecutive_skips": 0},
            "callbacks.nonfinite_guard.max_consecutive_skips=0: allowed values: an integer >= 1",
        ),
        (
            {"grad_norm_spike": -1.0},
            "callbacks.nonfinite_guard.grad_norm_spike=-1.0: allowed values: null or a number > 0",
        ),
    ],
)
def test_guard_settings_are_checked(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        NonFiniteGuard(**kwargs)


# ------------------------------------------------------------------------------------------ out of memory
def test_gpu_out_of_memory_message_gives_the_exact_trade():
    err = torch.OutOfMemoryError(
        "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which "
        "1.06 GiB is free."
    )
    gib = 2**30
    message = out_of_memory_message(
        err,
        16,
        2,
        2048,
        device="cuda:0",
        memory={"allocated": 70 * gib, "reserved": 77.5 * gib, "total": 79.19 * gib},
    )
    assert message == (
        "out of memory on cuda:0 during training (an allocation of 2.00 GiB failed; 70.00 GiB allocated, "
        "77.50 GiB reserved of 79.19 GiB). To fit: set data.per_device_train_batch_size=8 and "
        "data.gradient_accumulation_steps=4: 32 examples per optimizer step per device as now, and the same "
        "loss and gradients, because the loss is normalised over the whole accumulation window; lower "
        "data.max_length (now 2048) or set data.padding_free=true (no padding tokens); use "
        "trainer.precision=bf16-mixed; enable gradient checkpointing on the model; or shard the model across "
        "devices (strategy=fsdp)"
    )


def test_out_of_memory_with_a_micro_batch_of_one_and_in_validation():
    err = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 512.00 MiB.")
    assert out_of_memory_message(err, 1, 1, 512).startswith(
        "out of memory during training (an allocation of 512.00 MiB failed). To fit: lower data.max_length "
        "(now 512)"
    )
    assert (
        "lower data.per_device_eval_batch_size (now 8); evaluation results do not depend on it"
        in out_of_memory_message(err, 8, 1, 512, stage="validation")
    )


class Greedy(L.Callback):
    """A real allocation the machine cannot satisfy (1 PiB), in the middle of a training step."""

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        if batch_idx == 1:
            torch.empty(2**50, dtype=torch.uint8)


def test_real_allocation_failure_in_fit_becomes_a_hint(tmp_path, word_tokenizer):
    t, module, dm = run(tmp_path, word_tokenizer, [Greedy()], rows=ROWS[:4] * 3)
    with pytest.raises(TrainingError) as err, explain_faults(t, dm):
        t.fit(module, datamodule=dm)
    assert str(err.value).startswith(
        "out of memory on cpu during training (an allocation of 1048576.00 GiB failed). To fit: set "
        "data.per_device_train_batch_size=1 and data.gradient_accumulation_steps=2: 2 examples per optimizer "
        "step per device as now"
    )
    assert "can't allocate memory" in str(err.value.__cause__)


@pytest.mark.slow
def test_the_cli_logs_a_skipped_step_without_a_nan(tmp_path):
    """A real CLI run whose step 2 turns NaN (:class:`tests.fault_points.NaNLossAt`), with
    ``on_nonfinite=skip`` (before: ``grad_norm=nan`` and ``train/loss=nan`` in metrics.csv and train.log).
    Nothing non-finite in metrics.csv, train.log or final_metrics.json; the skipped step is counted in every
    row, in final_metrics.json and in the done line."""
    from tests.errors.support import run_train_cli

    run_dir = tmp_path / "run"
    proc = run_train_cli(
        "+experiment=sft",
        f"hydra.run.dir={run_dir}",
        "trainer.max_steps=3",
        "trainer.log_every_n_steps=1",
        "trainer.limit_val_batches=1",
        "trainer.enable_progress_bar=false",
        "callbacks.nonfinite_guard.on_nonfinite=skip",
        "+callbacks.nan._target_=tests.fault_points.NaNLossAt",
        "+callbacks.nan.step=2",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(run_dir / "metrics.csv") as fh:
        rows = {int(r["step"]): r for r in csv.DictReader(fh) if r.get("lr")}
    assert sorted(rows) == [1, 2, 3]
    assert rows[2]["grad_norm"] == "" and rows[2]["train/loss"] == ""
    assert [rows[s]["train/skipped_steps"] for s in (1, 2, 3)] == ["0.0", "1.0", "1.0"]
    with open(run_dir / "metrics.csv") as fh:
        cells = [v for r in csv.DictReader(fh) for v in r.values() if v]
    assert all(math.isfinite(float(v)) for v in cells)
    final = json.loads((run_dir / "final_metrics.json").read_text())
    assert final["train/skipped_steps"] == 1.0 and all(math.isfinite(v) for v in final.values())
    log_text = (run_dir / "train.log").read_text()
    assert "=nan" not in log_text and "=inf" not in log_text
    (row_2,) = [line for line in log_text.splitlines() if re.search(r"step 2 of 3 \[[^]]*\]: ", line)]
    assert "train/loss" not in row_2 and "grad_norm" not in row_2 and " train/skipped_steps=1 " in row_2
    done = "done: 3 optimizer steps, 1 of them skipped (a non-finite loss or gradient: no update) in "
    assert done in log_text
