"""Config faults: unknown keys, bad values, combinations that cannot work, and a run folder that cannot hold
this run. Each stops before any work with a message naming the key (``data.packing``,
``hydra.run.dir``...)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import datasets
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from hf_lightning import ConfigError, HFDataModule, HFLightningModule
from hf_lightning.callbacks.best_model import resolve_monitor
from hf_lightning.checkpointing import find_resume_checkpoint
from hf_lightning.config.schema import check_keys
from hf_lightning.module.optim import build_optimizer, build_scheduler
from hf_lightning.run.folder import RunFolderGuard, check_run_folder
from tests.data_support import PadOnly, tiny_llama
from tests.errors.support import fit, remount_read_only, tiny_filesystem

CONF = Path(__file__).resolve().parents[2] / "hf_lightning" / "conf"
TOKENIZED = [{"input_ids": [1, 2, 3, 4][: 2 + i % 3]} for i in range(8)]


def dm(path=None, **kwargs):
    return HFDataModule(
        PadOnly(),
        path=datasets.Dataset.from_list(TOKENIZED) if path is None else path,
        **{"validation_split": 0.0, **kwargs},
    )


# ------------------------------------------------------------------------------------------ keys and values
def test_unknown_key_lists_the_allowed_ones():
    node = OmegaConf.create({"per_device_train_batch_size": 2, "batch_sise": 4})
    with pytest.raises(ConfigError) as err:
        check_keys(node, HFDataModule.__init__, "data", skip=("tokenizer",))
    assert str(err.value).startswith(
        "unknown config key data.batch_sise; allowed keys of data: path, validation_path, test_path, format, "
        "validation_split, max_length, per_device_train_batch_size,"
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"per_device_train_batch_size": 0},
            "data.per_device_train_batch_size=0: allowed values: an integer >= 1",
        ),
        ({"max_length": 12.5}, "data.max_length=12.5: allowed values: an integer >= 1"),
        (
            {"per_device_eval_batch_size": True},
            "data.per_device_eval_batch_size=true: allowed values: an integer >= 1",
        ),
        ({"validation_split": 1.0}, r"data.validation_split=1.0: allowed values: a number in \[0, 1\)"),
        ({"validation_split": "0.1"}, r"data.validation_split='0.1': allowed values: a number in \[0, 1\)"),
        (
            {"format": "chat"},
            "data.format='chat': allowed values: auto, text, prompt_completion, messages,",
        ),
        (
            {"packing": "greedy"},
            r"data.packing='greedy': allowed values: false, true \(= bfd\), bfd, wrapped",
        ),
        ({"shuffle": "yes"}, "data.shuffle='yes': allowed values: true or false"),
        ({"num_workers": -1}, "data.num_workers=-1: allowed values: an integer >= 0"),
        (
            {"persistent_workers": True},
            "data.persistent_workers applies to worker processes only; set data.num_workers > 0",
        ),
        ({"label_names": "labels"}, "data.label_names='labels': allowed values: null or a list of names"),
        ({"seed": None}, "data.seed=null: allowed values: an integer >= 0"),
        ({"seed": -1}, "data.seed=-1: allowed values: an integer >= 0"),
    ],
)
def test_bad_data_values(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        dm(**kwargs)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda m: build_optimizer(m, name="adam"),
            "optim.name='adam': allowed values: adamw, adamw_torch, adamw_torch_fused, adafactor, sgd,",
        ),
        (
            lambda m: build_optimizer(m, lr=-1e-3),
            "optim.lr=-0.001: allowed values: a finite number >= 0",
        ),
        (
            lambda m: build_optimizer(m, lr=float("inf")),
            "optim.lr=inf: allowed values: a finite number >= 0",
        ),
        (
            lambda m: build_scheduler(torch.optim.SGD(m.parameters(), lr=0.1), 10, name="step"),
            "scheduler.name='step': allowed values: linear, cosine, cosine_with_restarts, polynomial,",
        ),
        (
            lambda m: build_scheduler(torch.optim.SGD(m.parameters(), lr=0.1), 10, warmup_ratio=2.0),
            r"scheduler.warmup_ratio=2.0: allowed values: a number in \[0, 1\]",
        ),
    ],
)
def test_bad_optimizer_and_schedule_values(call, message):
    with pytest.raises(ConfigError, match=message):
        call(torch.nn.Linear(2, 2))


def test_metric_for_best_model_needs_a_direction():
    with pytest.raises(
        ConfigError, match="metric_for_best_model='accuracy' does not end in 'loss': set greater_is_better"
    ):
        resolve_monitor("accuracy")


# ------------------------------------------------------------------------------------------ combinations
def test_packing_an_encoder_decoder_format(word_tokenizer):
    rows = [{"source": "a b", "target": "c d"}] * 4
    d = HFDataModule(
        word_tokenizer, path=datasets.Dataset.from_list(rows), validation_split=0.0, packing=True
    )
    with pytest.raises(
        ConfigError, match="^data.packing='bfd' packs causal-LM rows; the 'seq2seq' format cannot be packed$"
    ):
        d.setup("fit")


def test_padding_free_classification(word_tokenizer):
    rows = [{"text": "a b", "label": i % 2} for i in range(4)]
    d = HFDataModule(
        word_tokenizer, path=datasets.Dataset.from_list(rows), validation_split=0.0, padding_free=True
    )
    with pytest.raises(
        ConfigError, match="data.padding_free=true flattens causal-LM rows; the 'classification' format"
    ):
        d.setup("fit")


def test_packing_a_stream_of_known_length_without_max_steps(tmp_path):
    """A stream is packed as it is read: even with a known number of rows, the packed rows (hence the steps of
    an epoch) are known only once read, so training needs trainer.max_steps."""
    source = datasets.Dataset.from_list(TOKENIZED).to_iterable_dataset()

    class Sized(torch.utils.data.IterableDataset):
        def __len__(self):
            return len(TOKENIZED)

        def __iter__(self):
            yield from TOKENIZED

    for stream in (source, Sized()):
        with pytest.raises(
            ConfigError,
            match=r"^data.packing=wrapped on a stream: the stream is packed as it is read, so the number of "
            r"packed rows, hence of steps in an epoch, is known only once it is read: set trainer.max_steps$",
        ):
            fit(
                tmp_path,
                tiny_llama(vocab_size=32),
                dm(path=stream, packing="wrapped"),
                max_steps=-1,
                max_epochs=1,
            )


def test_group_by_length_on_a_stream_sorts_within_a_bounded_buffer(caplog):
    """HF silently ignores group_by_length for an IterableDataset; here it works within a buffer and says
    so."""
    d = dm(
        path=datasets.Dataset.from_list(TOKENIZED).to_iterable_dataset(),
        group_by_length=True,
        per_device_train_batch_size=2,
    )
    d.setup("fit")
    with caplog.at_level(logging.INFO, logger="hf_lightning"):
        batches = list(d.train_dataloader())
    assert (
        "group_by_length on a stream: sorting by length within buffers of 100 examples per reader"
        in caplog.text
    )
    lengths = [int(n) for b in batches for n in b["attention_mask"].sum(1)]
    assert lengths == sorted(lengths, reverse=True)  # 8 rows < one buffer: one sorted run


def test_stream_of_unknown_length_without_max_steps(tmp_path):
    class Rows(torch.utils.data.IterableDataset):
        def __iter__(self):
            yield from TOKENIZED

    with pytest.raises(
        ConfigError, match="the training data is a stream of unknown length, .*: set trainer.max_steps"
    ):
        fit(tmp_path, tiny_llama(vocab_size=32), dm(path=Rows()), max_steps=-1, max_epochs=1)


def test_metrics_without_a_label_key(tmp_path):
    module = HFLightningModule(tiny_llama(vocab_size=32), compute_metrics=lambda p: {"x": 0.0})
    import lightning as L

    t = L.Trainer(
        accelerator="cpu",
        max_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        default_root_dir=str(tmp_path),
        num_sanity_val_steps=0,
    )
    with pytest.raises(
        ConfigError, match=r"metrics are configured but no label key resolves: data.label_names=\['answer'\]"
    ):
        t.fit(module, datamodule=dm(validation_split=0.25, label_names=["answer"]))


# ------------------------------------------------------------------------------------------ checkpoints and
# run folders
def test_resume_last_without_a_checkpoint(tmp_path):
    with pytest.raises(
        ConfigError,
        match=r"ckpt_path=last: no checkpoint at .*/checkpoints/last.ckpt, and .* holds no "
        r"stopped run to resume. Resume needs the folder of that run \(hydra.run.dir=...\); to start a "
        "new run here instead, drop ckpt_path",
    ):
        find_resume_checkpoint("last", str(tmp_path))


def compose_train(*overrides):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("train", overrides=list(overrides), return_hydra_config=True)


def guard_exit(config, capsys):
    with pytest.raises(SystemExit) as exit_:
        RunFolderGuard().on_run_start(config)
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("hf_lightning: error: ") and "\n" not in err
    return err.removeprefix("hf_lightning: error: ")


def plant_run(run_dir, *overrides):
    """A previous run's folder as train leaves it: its .hydra/config.yaml and a checkpoint."""
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / "checkpoints").mkdir()
    # the keys a resume needs (the guard checks the file before the settings)
    torch.save(
        {
            "state_dict": {},
            "optimizer_states": [{}],
            "lr_schedulers": [{}],
            "loops": {"fit_loop": {}},
            "global_step": 3,
        },
        run_dir / "checkpoints" / "last.ckpt",
    )
    (run_dir / "metrics.csv").write_text("step\n")
    saved = compose_train(*overrides)
    OmegaConf.save(
        OmegaConf.masked_copy(saved, [k for k in saved if k != "hydra"]), run_dir / ".hydra" / "config.yaml"
    )


def test_fresh_run_in_a_folder_holding_a_run(tmp_path, capsys):
    run_dir = tmp_path / "run"
    plant_run(run_dir)
    message = guard_exit(compose_train(f"hydra.run.dir={run_dir}"), capsys)
    assert message == (
        f"hydra.run.dir={run_dir} already holds a run (checkpoints/last.ckpt, metrics.csv); a fresh run "
        "there would overwrite it. Use a new hydra.run.dir, or ckpt_path=last to resume that run"
    )
    before = (run_dir / "checkpoints" / "last.ckpt").read_bytes()
    guard_exit(compose_train(f"hydra.run.dir={run_dir}"), capsys)
    assert (run_dir / "checkpoints" / "last.ckpt").read_bytes() == before
    with pytest.raises(
        ConfigError, match="already holds a run"
    ):  # train() repeats it for callers without Hydra
        check_run_folder(str(run_dir), None)


def test_resume_into_a_folder_holding_a_different_run(tmp_path, capsys):
    run_dir = tmp_path / "run"
    plant_run(run_dir, "model.config.hidden_size=64", "optim.lr=1e-3")
    message = guard_exit(
        compose_train(f"hydra.run.dir={run_dir}", "ckpt_path=last", "model.config.hidden_size=32"), capsys
    )
    assert message == (
        f"ckpt_path=last: hydra.run.dir={run_dir} holds a different run (model.config.hidden_size: 64 -> 32; "
        "optim.lr: 0.001 -> 0.0003). Resume it with its own settings, or start a new run folder from its "
        f"weights and state with ckpt_path={run_dir}/checkpoints/last.ckpt"
    )


def test_a_resume_that_forgets_the_run_length_says_how_to_keep_it(tmp_path, capsys):
    """A new user resumed a 10-step run without its ``trainer.max_steps=10``: the run went on for the
    experiment's epochs. The note gives the override that keeps the old length."""
    run_dir = tmp_path / "run"
    plant_run(run_dir, "trainer.max_steps=10")
    RunFolderGuard().on_run_start(compose_train(f"hydra.run.dir={run_dir}", "ckpt_path=last"))
    err = capsys.readouterr().err
    assert "resuming with a new run length (trainer.max_steps: 10 -> -1" in err
    assert err.count("to keep the old length, give trainer.max_steps=10") == 1
    # where it continues: the planted checkpoint's global_step
    assert (
        err.count(f"hf_lightning: note: resuming from {run_dir}/checkpoints/last.ckpt at optimizer step 3")
        == 1
    )


def test_a_resume_says_each_note_once_and_writes_it_into_the_log_file(tmp_path, capsys):
    """The run-folder guard speaks before the job's log file exists, under Hydra's own logging (a console
    handler, ``[HYDRA]``): a note logged there was printed a second time by that handler and never reached
    ``train.log``. Each note is now on stderr once, and in the log file once it exists."""
    from hydra.core.utils import configure_log

    from hf_lightning.cli.output import log_early_notes

    run_dir = tmp_path / "run"
    plant_run(run_dir, "trainer.max_steps=10")
    config = compose_train(f"hydra.run.dir={run_dir}", "ckpt_path=last")
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        configure_log(config.hydra.hydra_logging)  # Hydra's logging while its callbacks run
        RunFolderGuard().on_run_start(config)
        out, err = capsys.readouterr()
        notes = [line for line in err.splitlines() if line.startswith("hf_lightning: note: ")]
        assert len(notes) == 3 and len(set(notes)) == 3  # the run length, the checkpoint, the kept settings
        assert f"resuming from {run_dir}/checkpoints/last.ckpt at optimizer step 3" in err
        assert "resuming from" not in out and "[HYDRA]" not in out + err  # Hydra's console said nothing
        log_file = tmp_path / "train.log"
        root.addHandler(logging.FileHandler(log_file))  # the job's log file, as hydra.job_logging adds it
        log_early_notes(logging.getLogger("hf_lightning.train"))
        log_early_notes(logging.getLogger("hf_lightning.train"))  # once
        assert log_file.read_text().splitlines() == [n.removeprefix("hf_lightning: note: ") for n in notes]
        assert "resuming from" not in capsys.readouterr().out
    finally:  # the test process's logging as it was
        for handler in root.handlers[:]:
            if handler not in saved[0]:
                handler.close()
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])


def test_resume_with_the_same_run_and_a_longer_schedule_is_allowed(tmp_path, capsys):
    """Allowed, and said: the schedule follows the new length; the previous settings are kept, since Hydra is
    about to rewrite .hydra/ with this command line (a user trial found the first segment's overrides
    lost)."""
    run_dir = tmp_path / "run"
    plant_run(run_dir, "trainer.max_steps=10")
    saved = (run_dir / ".hydra" / "config.yaml").read_text()
    RunFolderGuard().on_run_start(
        compose_train(
            f"hydra.run.dir={run_dir}", "ckpt_path=last", "trainer.max_steps=20", "data.num_workers=1"
        )
    )
    err = capsys.readouterr().err
    assert (
        "hf_lightning: note: resuming with a new run length (trainer.max_steps: 10 -> 20): the learning-rate "
        "schedule is rebuilt for it from the checkpoint's step on; to keep the old length, give "
        "trainer.max_steps=10" in err
    )
    assert (
        f"hf_lightning: note: the previous settings of this run are kept in {run_dir}/.hydra/previous-1"
        in err
    )
    assert (run_dir / ".hydra" / "previous-1" / "config.yaml").read_text() == saved
    # a second resume keeps the first copy and adds the next one
    RunFolderGuard().on_run_start(
        compose_train(f"hydra.run.dir={run_dir}", "ckpt_path=last", "trainer.max_steps=10")
    )
    assert (run_dir / ".hydra" / "previous-1" / "config.yaml").read_text() == saved
    assert (run_dir / ".hydra" / "previous-2" / "config.yaml").is_file()


def test_resume_with_the_same_length_says_nothing_about_it(tmp_path, capsys):
    run_dir = tmp_path / "run"
    plant_run(run_dir, "trainer.max_steps=10")
    RunFolderGuard().on_run_start(
        compose_train(f"hydra.run.dir={run_dir}", "ckpt_path=last", "trainer.max_steps=10")
    )
    assert "new run length" not in capsys.readouterr().err


def test_unwritable_run_folder(tmp_path, capsys):
    with tiny_filesystem(tmp_path / "disk", "1m") as disk:
        remount_read_only(disk)
        message = guard_exit(compose_train(f"hydra.run.dir={disk}/run"), capsys)
    assert message == (
        f"hydra.run.dir={disk}/run is not writable (Read-only file system): checkpoints, metrics and the "
        "exported model could not be saved; choose another hydra.run.dir"
    )


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into folders whatever their permissions")
def test_run_folder_without_write_permission(tmp_path, capsys):
    (tmp_path / "locked").mkdir(mode=0o555)
    message = guard_exit(compose_train(f"hydra.run.dir={tmp_path}/locked/run"), capsys)
    assert "is not writable (Permission denied)" in message
