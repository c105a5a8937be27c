"""Faults during training: a NaN never reaches the weights, a failed save never costs a checkpoint, an
allocation failure says what to change, a stop signal ends in a checkpoint.

Faults are planted in real runs (a real ``Trainer``, a real Llama, real data): a forward hook poisons the
batches that hold one token, a gradient hook blows up one step, a real tmpfs fills up or turns read-only, a
real allocation fails, a real signal is sent to the process. Where a real fault cannot be staged (a full disk
without a mountable tmpfs) the OS error is raised by a monkeypatched ``torch.save``.
"""

from __future__ import annotations

import csv
import errno
import logging
import math
import os
import signal

import datasets
import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger

import hf_lightning.checkpointing.io as ckpt_io
from hf_lightning import ConfigError, HFDataModule, HFLightningModule, TrainingError
from hf_lightning.callbacks import NonFiniteGuard
from hf_lightning.callbacks.preemption import Preemption
from hf_lightning.checkpointing import AtomicCheckpointIO
from hf_lightning.faults import explain_faults, out_of_memory_message
from tests.data_support import tiny_llama
from tests.errors.support import remount_read_only, tiny_filesystem, trainer

POISON = 29  # "z": batches holding it get NaN activations
# 12 rows, batch 2, no shuffle: batch k = rows 2k, 2k+1; row 5 holds the poison, so batch 2 is poisoned
ROWS = [{"text": "a b c d e"}] * 5 + [{"text": "a b z d e"}] + [{"text": "b c d e f"}] * 6


def poison(model: torch.nn.Module) -> None:
    """NaN out the embeddings of every batch that holds token ``POISON`` (loss and gradients become NaN)."""

    def hook(module, inputs, output):
        return output * float("nan") if (inputs[0] == POISON).any() else output

    model.model.embed_tokens.register_forward_hook(hook)


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


def run(tmp_path, word_tokenizer, callbacks, max_steps=6, accumulate=1, optim=None, rows=ROWS, **kwargs):
    model = tiny_llama(vocab_size=32)
    poison(model)
    module = HFLightningModule(
        model,
        optim=optim or {"name": "adamw", "lr": 1e-2, "weight_decay": 0.1},
        scheduler={"name": "constant"},
    )
    dm = HFDataModule(
        tokenizer=word_tokenizer,
        path=datasets.Dataset.from_list(rows),
        validation_split=0.0,
        shuffle=False,
        per_device_train_batch_size=2,
    )
    t = trainer(
        tmp_path, max_steps=max_steps, accumulate_grad_batches=accumulate, callbacks=callbacks, **kwargs
    )
    return t, module, dm


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
    assert [(int(r["step"]), float(r["train/skipped_steps"])) for r in rows] == [(bad_step, 1.0)]


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
        "clipped to trainer.gradient_clip_val=1 before the update"
    )


def test_gradient_norm_threshold(tmp_path, word_tokenizer, caplog):
    guard = NonFiniteGuard(grad_norm_threshold=1e-9, grad_norm_spike=None)
    t, module, dm = run(tmp_path, word_tokenizer, [guard], max_steps=2, rows=ROWS[:4] * 3)
    with caplog.at_level(logging.WARNING, logger="hf_lightning"):
        t.fit(module, datamodule=dm)
    assert guard.exploding_steps == 2
    assert "is above grad_norm_threshold=1e-09; not clipped (set trainer.gradient_clip_val" in caplog.text


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"on_nonfinite": "ignore"},
            r"callbacks.nonfinite_guard.on_nonfinite='ignore'; expected one of \['stop', 'skip'\]",
        ),
        ({"max_consecutive_skips": 0}, "max_consecutive_skips must be a positive integer, got 0"),
        ({"grad_norm_spike": -1.0}, r"grad_norm_spike must be > 0 or null, got -1.0"),
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
        "trainer.accumulate_grad_batches=4: 32 examples per optimizer step per device as now, and the same "
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
        "data.per_device_train_batch_size=1 and trainer.accumulate_grad_batches=2: 2 examples per optimizer "
        "step per device as now"
    )
    assert "can't allocate memory" in str(err.value.__cause__)


# ------------------------------------------------------------------------------------------ saving
def checkpointing_run(tmp_path, word_tokenizer, callbacks, max_steps=3):
    ckpt = ModelCheckpoint(
        dirpath=tmp_path / "run" / "checkpoints", every_n_train_steps=1, save_last=True, save_top_k=1
    )
    return run(
        tmp_path,
        word_tokenizer,
        [ckpt, *callbacks],
        max_steps=max_steps,
        rows=ROWS[:4] * 3,
        plugins=[AtomicCheckpointIO()],
        enable_checkpointing=True,
    )


def checkpoint_files(folder):
    """The checkpoints in ``folder`` (each also has its ``.sha256`` sidecar, checked in
    test_checkpoint_integrity)."""
    return sorted(name for name in os.listdir(folder) if name.endswith(".ckpt"))


def assert_step_1_kept(folder):
    assert checkpoint_files(folder) in (["last.ckpt", "step=1.ckpt"], ["epoch=0-step=1.ckpt", "last.ckpt"])
    assert not [
        name for name in os.listdir(folder) if name.startswith(".tmp-")
    ]  # a failed write leaves no temp
    last = torch.load(folder / "last.ckpt", weights_only=False)
    assert last["global_step"] == 1 and "optimizer_states" in last


class AfterStep(L.Callback):
    """Run ``action`` once, after the checkpoint of step ``step`` was written (at the start of the next batch:
    Lightning runs checkpoint callbacks after all others at a batch end)."""

    def __init__(self, step, action) -> None:
        self.step, self.action, self.done = step, action, False

    def on_train_batch_start(self, trainer, *args):
        if trainer.global_step == self.step and not self.done:
            self.done = True
            self.action()


def fill(folder):
    """Write zeros into ``folder`` until the filesystem reports it is full."""
    with open(folder / "filler", "wb") as fh:
        try:
            while True:
                fh.write(b"\0" * 65536)
                fh.flush()
        except OSError as err:
            assert err.errno == errno.ENOSPC


def test_disk_full_at_save_time_keeps_the_previous_checkpoint(tmp_path, word_tokenizer):
    """A real full disk: a tmpfs filled up after the first checkpoint."""
    with tiny_filesystem(tmp_path / "run", "4m") as run_dir:
        t, module, dm = checkpointing_run(tmp_path, word_tokenizer, [AfterStep(1, lambda: fill(run_dir))])
        with pytest.raises(TrainingError) as err:
            t.fit(module, datamodule=dm)
        message = str(err.value)
        assert message.startswith(f"could not write checkpoint {run_dir}/checkpoints/")
        assert ": No space left on device (ENOSPC); " in message
        assert (
            "every other checkpoint already written is kept; free space there: 0.0 MiB. free space on that "
            "disk" in message
        )
        os.remove(run_dir / "filler")
        assert_step_1_kept(run_dir / "checkpoints")


def test_disk_full_simulated_where_no_tmpfs_can_be_mounted(tmp_path, word_tokenizer, monkeypatch):
    real_save = torch.save

    def full_disk():
        def save(*args, **kwargs):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(ckpt_io.torch, "save", save)

    t, module, dm = checkpointing_run(tmp_path, word_tokenizer, [AfterStep(1, full_disk)])
    with pytest.raises(
        TrainingError,
        match=r"No space left on device \(ENOSPC\); nothing was overwritten and every other checkpoint",
    ):
        t.fit(module, datamodule=dm)
    monkeypatch.setattr(ckpt_io.torch, "save", real_save)
    assert_step_1_kept(tmp_path / "run" / "checkpoints")


def test_output_folder_turns_read_only_at_save_time(tmp_path, word_tokenizer):
    """A real read-only filesystem (root cannot write there either)."""
    with tiny_filesystem(tmp_path / "run", "16m") as run_dir:
        t, module, dm = checkpointing_run(
            tmp_path, word_tokenizer, [AfterStep(1, lambda: remount_read_only(run_dir))]
        )
        with pytest.raises(TrainingError) as err:
            t.fit(module, datamodule=dm)
        assert "Read-only file system (EROFS)" in str(err.value)
        assert str(err.value).endswith(
            "the filesystem is read-only: make it writable again, or choose another hydra.run.dir"
        )
        assert_step_1_kept(run_dir / "checkpoints")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into folders whatever their permissions")
def test_output_folder_loses_write_permission_at_save_time(tmp_path, word_tokenizer):
    folder = tmp_path / "run" / "checkpoints"
    t, module, dm = checkpointing_run(tmp_path, word_tokenizer, [AfterStep(1, lambda: folder.chmod(0o555))])
    with pytest.raises(
        TrainingError, match=r"Permission denied \(EACCES\).*the folder is not writable by this user"
    ):
        t.fit(module, datamodule=dm)
    folder.chmod(0o755)
    assert_step_1_kept(folder)


# ------------------------------------------------------------------------------------------ signals
class SendSignal(L.Callback):
    """Send ``signum`` to this process during micro-batch ``batch`` (inside an accumulation window)."""

    def __init__(self, signum, batch) -> None:
        self.signum, self.batch = signum, batch

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        if batch_idx == self.batch:
            os.kill(os.getpid(), self.signum)


def test_ctrl_c_saves_at_the_step_boundary_then_stops(tmp_path, word_tokenizer, caplog):
    """SIGINT (Ctrl-C) sent during micro-batch 2, the first of window 2 with accumulation 2: the window
    finishes, step 2 is saved, the run stops cleanly, and the previous handler is back. (SIGTERM through the
    command line, with an exact resume afterwards, is
    tests/integration/test_resume.py::test_sigterm_saves_at_the_next_step_and_resumes.)"""
    signum = signal.SIGINT
    before = signal.getsignal(signum)
    ckpt = ModelCheckpoint(dirpath=tmp_path / "run" / "checkpoints", save_last=True, save_top_k=0)
    t, module, dm = run(
        tmp_path,
        word_tokenizer,
        [ckpt, Preemption(), SendSignal(signum, 2)],
        max_steps=6,
        accumulate=2,
        rows=ROWS[:4] * 6,
        plugins=[AtomicCheckpointIO()],
        enable_checkpointing=True,
    )
    with caplog.at_level(logging.WARNING):
        t.fit(module, datamodule=dm)
    assert t.global_step == 2 and module.preempted
    last = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=False)
    assert last["global_step"] == 2
    assert checkpoint_files(tmp_path / "run" / "checkpoints") == ["last.ckpt"]  # no second "last-v1.ckpt"
    assert (
        f"received {signal.Signals(signum).name}: saving a checkpoint at the end of the current optimizer "
        "step" in caplog.text
    )
    assert "resume with ckpt_path=last in the same run folder" in caplog.text
    assert signal.getsignal(signum) == before


def test_a_run_ending_before_any_checkpoint_leaves_one_last_ckpt(tmp_path, word_tokenizer):
    """3 steps, no validation, so ModelCheckpoint has saved nothing when training ends: ``Preemption`` writes
    ``last.ckpt`` at the final step, and Lightning's ModelCheckpoint (which also saves ``last`` at train end
    when it has not saved yet) must not add a ``last-v1.ckpt`` copy beside it."""
    folder = tmp_path / "run" / "checkpoints"
    ckpt = ModelCheckpoint(dirpath=folder, save_last=True, save_top_k=0)
    t, module, dm = run(
        tmp_path,
        word_tokenizer,
        [ckpt, Preemption()],
        max_steps=3,
        rows=ROWS[:4] * 3,
        plugins=[AtomicCheckpointIO()],
        enable_checkpointing=True,
    )
    t.fit(module, datamodule=dm)
    assert checkpoint_files(folder) == ["last.ckpt"]
    assert torch.load(folder / "last.ckpt", weights_only=False)["global_step"] == 3
