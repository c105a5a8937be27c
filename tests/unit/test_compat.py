"""One test per Lightning function of ``hf_lightning/compat.py``, on the installed Lightning (the functions
reading transformers, datasets, torch and DeepSpeed internals are tested in ``test_compat_hf_torch.py``).

An upgrade that renames or drops one of the internals we read fails the test named after it. Expected values
come from Lightning's documented behaviour (a fit of known length, a file on disk), or from its own public
computation side by side.
"""

from __future__ import annotations

import os

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from hf_lightning import compat

BATCHES, EPOCHS, K = 5, 2, 2


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.seen: list[dict] = []

    def training_step(self, batch, batch_idx):
        trainer = self.trainer
        self.seen.append(
            {
                "attached": compat.attached_trainer(self) is trainer,
                "batch_idx": batch_idx,
                "epoch_batch_index": compat.epoch_batch_index(trainer),
            }
        )
        return self.layer(batch).sum()

    def validation_step(self, batch, batch_idx):
        self.log("val/x", self.layer(batch).sum())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _loader(n: int = BATCHES) -> DataLoader:
    return DataLoader(torch.randn(n, 2), batch_size=1)


def _trainer(tmp_path, **kwargs) -> L.Trainer:
    options = dict(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
        default_root_dir=str(tmp_path),
    )
    options.update(kwargs)
    return L.Trainer(**options)


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    module = Tiny()
    trainer = _trainer(
        tmp_path_factory.mktemp("fit"),
        max_epochs=EPOCHS,
        accumulate_grad_batches=K,
        val_check_interval=2,
        limit_val_batches=1,
    )
    trainer.fit(module, _loader(), _loader(2))
    return module.seen


def test_epoch_batch_index(fitted):
    """The index of the batch in its epoch, what Lightning hands training_step, from 0 in each epoch."""
    assert [s["epoch_batch_index"] for s in fitted] == list(range(BATCHES)) * EPOCHS
    assert [s["epoch_batch_index"] for s in fitted] == [s["batch_idx"] for s in fitted]


def test_attached_trainer(fitted):
    assert len(fitted) == BATCHES * EPOCHS and all(s["attached"] for s in fitted)
    assert compat.attached_trainer(Tiny()) is None


@pytest.mark.parametrize(
    ("env", "expected"),
    [({}, 0), ({"RANK": "3"}, 3), ({"LOCAL_RANK": "2"}, 2), ({"SLURM_PROCID": "5"}, 5)],
)
def test_launcher_rank(monkeypatch, env, expected):
    for key in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert compat.launcher_rank() == expected


def test_evaluation_results(tmp_path):
    """The list read at ``on_validation_epoch_end`` is the one ``trainer.validate()`` returns (the loop swaps
    it out before ``on_validation_end``, where HFLightningModule adds its values)."""

    class Adds(Tiny):
        def on_validation_epoch_end(self):
            self.results = compat.evaluation_results(self.trainer.validate_loop)

        def on_validation_end(self):
            self.results[0]["probe"] = 1.0

    returned = _trainer(tmp_path).validate(Adds(), _loader(2), verbose=False)
    assert returned[0]["probe"] == 1.0 and "val/x" in returned[0]


def test_uses_script_launcher():
    assert compat.uses_script_launcher(L.Trainer(accelerator="cpu", devices=2, strategy="ddp").strategy)
    assert not compat.uses_script_launcher(
        L.Trainer(accelerator="cpu", devices=2, strategy="ddp_spawn").strategy
    )
    assert not compat.uses_script_launcher(L.Trainer(accelerator="cpu", devices=1).strategy)


def _checkpoint_trainer(tmp_path, callbacks, **kwargs):
    return _trainer(tmp_path, enable_checkpointing=True, callbacks=callbacks, limit_val_batches=0, **kwargs)


def test_save_last_checkpoint(tmp_path):
    """Written now, at step 1, through the callback: its ``last_model_path`` names the file."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True, save_top_k=0)
    written = {}

    class SaveAtOne(L.Callback):
        def on_train_batch_end(self, trainer, *args):
            if trainer.global_step == 1:
                compat.save_last_checkpoint(checkpoint, trainer)
                written["path"] = checkpoint.last_model_path
                written["step"] = torch.load(checkpoint.last_model_path, weights_only=False)["global_step"]

    _checkpoint_trainer(tmp_path, [SaveAtOne(), checkpoint], max_steps=2).fit(Tiny(), _loader())
    assert os.path.basename(written["path"]) == "last.ckpt" and written["step"] == 1


def test_last_saved_step_and_mark_saved_at(tmp_path):
    """``mark_saved_at`` makes Lightning skip the periodic save of that step; ``last_saved_step`` reads it
    back."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=2, save_top_k=-1)

    class MarkTwo(L.Callback):  # runs before ModelCheckpoint (Lightning runs checkpoint callbacks last)
        def on_train_batch_end(self, trainer, *args):
            if trainer.global_step == 2:
                compat.mark_saved_at(checkpoint, 2)
                assert compat.last_saved_step(checkpoint) == 2

    _checkpoint_trainer(tmp_path, [MarkTwo(), checkpoint], max_steps=4).fit(Tiny(), _loader())
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["epoch=0-step=4.ckpt"]
    assert compat.last_saved_step(checkpoint) == 4
    assert compat.last_saved_step(L.Callback()) == -1


def test_keeping_experiment_writer(tmp_path):
    """Lightning's writer deletes an existing ``metrics.csv`` at start-up; ours keeps it and calls the
    hook."""
    from lightning.pytorch.loggers.csv_logs import ExperimentWriter

    metrics = tmp_path / "metrics.csv"
    metrics.write_text("step,loss\n1,2.0\n")
    found = []

    class Writer(compat.KeepingExperimentWriter):
        def found_metrics_file(self):
            found.append(self.metrics_file_path)

    Writer(log_dir=str(tmp_path))
    assert found == [str(metrics)] and metrics.read_text() == "step,loss\n1,2.0\n"
    with pytest.warns(UserWarning, match="exists and is not empty"):
        ExperimentWriter(log_dir=str(tmp_path))
    assert not metrics.exists()  # the behaviour the subclass exists to avoid is still Lightning's


def test_csv_experiment(tmp_path):
    from lightning.pytorch.loggers import CSVLogger
    from lightning.pytorch.loggers.csv_logs import ExperimentWriter

    logger = CSVLogger(str(tmp_path), name="run", version=0)
    made = []

    def make(log_dir):
        made.append(log_dir)
        return ExperimentWriter(log_dir=log_dir)

    writer = compat.csv_experiment(logger, make)
    assert compat.csv_experiment(logger, make) is writer and made == [logger.log_dir]
    assert logger.experiment is writer  # Lightning's own property serves the cached writer


def test_acts_after_every_validation():
    """The attributes exist on the installed classes (a rename would make the assignment a silent no-op)."""
    from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint

    checkpoint, stopping = ModelCheckpoint(monitor="val/loss"), EarlyStopping(monitor="val/loss")
    assert hasattr(checkpoint, "_save_on_train_epoch_end") and hasattr(stopping, "_check_on_train_epoch_end")
    compat.acts_after_every_validation(checkpoint)
    compat.acts_after_every_validation(stopping)
    assert checkpoint._save_on_train_epoch_end is False and stopping._check_on_train_epoch_end is False


def test_stop_own_triggers_and_save_checkpoint_now(tmp_path):
    """With its triggers off, a ``ModelCheckpoint(every_n_train_steps=1)`` saves only when told to (step
    2)."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=1, save_top_k=-1)
    assert all(
        hasattr(checkpoint, a) for a in ("_every_n_train_steps", "_every_n_epochs", "_train_time_interval")
    )

    class Decides(L.Callback):  # runs before ModelCheckpoint (Lightning runs checkpoint callbacks last)
        def on_fit_start(self, trainer, pl_module):
            compat.stop_own_triggers(checkpoint)

        def on_train_batch_end(self, trainer, *args):
            if trainer.global_step == 2:
                compat.save_checkpoint_now(checkpoint, trainer)
                compat.save_checkpoint_now(checkpoint, trainer)  # skipped: saved at this step already

    _checkpoint_trainer(tmp_path, [Decides(), checkpoint], max_steps=3).fit(Tiny(), _loader())
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["epoch=0-step=2.ckpt"]


def test_set_model_parallel_sizes():
    from lightning.pytorch.strategies import ModelParallelStrategy

    strategy = ModelParallelStrategy()
    compat.set_model_parallel_sizes(strategy, 4, 1)
    # the two sizes ModelParallelStrategy.setup_environment builds its mesh from
    assert (strategy._data_parallel_size, strategy._tensor_parallel_size) == (4, 1)
    assert set(vars(ModelParallelStrategy()).keys()) >= {"_data_parallel_size", "_tensor_parallel_size"}


def test_saves_distributed_checkpoint():
    from lightning.pytorch.strategies import ModelParallelStrategy

    from hf_lightning.compat import saves_distributed_checkpoint

    assert saves_distributed_checkpoint(ModelParallelStrategy()) is True
    assert saves_distributed_checkpoint(ModelParallelStrategy(save_distributed_checkpoint=False)) is False


class _Regression(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        return torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.mark.slow  # a DeepSpeed engine's start-up
def test_set_deepspeed_engine_setup(monkeypatch):
    """Lightning builds its DeepSpeed engine through the method set here: a CPU fit calls the function (with
    the strategy, the module and the optimizer) and trains through the engine it returns."""
    deepspeed = pytest.importorskip("deepspeed")
    from hf_lightning.strategies.deepspeed import HFDeepSpeedStrategy

    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    calls = []

    def setup(strategy, model, optimizer, lr_scheduler=None):
        calls.append((type(strategy), type(optimizer)))
        engine, ds_optimizer, _, _ = deepspeed.initialize(
            args=None,  # DeepSpeed then takes the device rank from LOCAL_RANK
            config=strategy.config,
            model=model,
            optimizer=optimizer,
            dist_init_required=False,
        )
        return engine, ds_optimizer

    class Probe(HFDeepSpeedStrategy):
        pass

    compat.set_deepspeed_engine_setup(Probe, setup)
    config = {"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 2}}
    config["zero_allow_untested_optimizer"] = True
    module = _Regression()
    before = module.layer.weight.detach().clone()
    x = torch.randn(8, 2, generator=torch.Generator().manual_seed(0))
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        strategy=Probe(config=config),
        max_steps=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, DataLoader(list(zip(x, x.sum(1, keepdim=True))), batch_size=4))
    assert calls == [(Probe, torch.optim.SGD)]
    assert isinstance(trainer.strategy.model, deepspeed.DeepSpeedEngine)
    assert trainer.global_step == 2 and not torch.equal(module.layer.weight.detach(), before)
