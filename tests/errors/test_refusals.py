"""What can never train, and what would rewrite a run's history, is refused in one message naming the culprit.

Token ids that are not whole numbers >= 0 (a label may be -100), a ``labels`` field on some rows only, a
non-finite weight after an update, Lightning's own constructor refusals, a missing attention package,
``resume_weights_only`` into the run's own folder; paths compared as the file system sees them; the checkpoint
folder of ``callbacks.model_checkpoint.dirpath`` honoured by ``ckpt_path=last``. (``optim.lr`` must be finite
and ``trainer.limit_train_batches`` must leave some batches: ``tests/config/test_schema.py``.)
"""

from __future__ import annotations

import importlib.util
import json
import os

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from omegaconf import OmegaConf

from hf_lightning import ConfigError, DataError, HFDataModule, ModelError, TrainingError
from hf_lightning.callbacks import NonFiniteGuard
from hf_lightning.checkpointing import AtomicCheckpointIO, find_resume_checkpoint
from hf_lightning.run.folder import check_run_folder, checkpoint_dir, config_differences
from tests.data_support import tiny_llama
from tests.errors.support import write_jsonl
from tests.errors.test_config import compose_train, guard_exit, plant_run


# ------------------------------------------------------------------------------------------ token ids
def tokenized(tmp_path, rows, raw=None):
    return write_jsonl(tmp_path / "tokens.jsonl", rows, raw)


GOOD = {"input_ids": [4, 5, 6, 7], "labels": [-100, 5, 6, 7]}


@pytest.mark.parametrize(
    ("line", "row", "message"),
    [
        (
            '{"input_ids": [4, 4.5, 6, 7]}',
            None,
            "field 'input_ids' holds 4.5, not a whole token id; token ids are integers",
        ),
        ('{"input_ids": [4, -3, 6, 7]}', None, "field 'input_ids' holds the negative token id -3"),
        (
            '{"input_ids": [4, 5, 6, 7], "labels": [-100, 5, -7, 7]}',
            GOOD,
            "field 'labels' holds the negative token id -7 (the only negative label allowed is -100: not "
            "trained on)",
        ),
        (
            '{"input_ids": [4, 5, 6, 7], "labels": [-100, 5.25, 6, 7]}',
            GOOD,
            "field 'labels' holds 5.25, not a whole token id; token ids are integers",
        ),
        (
            '{"input_ids": [4, 5, 6, 7]}',
            GOOD,
            "field 'labels' is missing on this row while line 1 has it (1 of 6 rows have none); give every "
            "row its labels (-100 where nothing is trained on), or drop the field from every row (then every "
            "token is a target)",
        ),
    ],
    ids=["float id", "negative id", "negative label", "float label", "labels on some rows"],
)
def test_bad_token_ids_name_the_file_and_line(word_tokenizer, tmp_path, line, row, message):
    """Line 4 of the file is bad; before, a float id was truncated to an int without a word, a negative id or
    label was an IndexError in the model, and a labels field on some rows only a RuntimeError in the
    collator."""
    rows = [row or {"input_ids": [4, 5, 6, 7]}] * 6
    path = tokenized(tmp_path, rows, {3: line})
    dm = HFDataModule(tokenizer=word_tokenizer, path=str(path), validation_split=0.0, shuffle=False)
    with pytest.raises(DataError) as err:
        dm.setup("fit")
    assert str(err.value) == f"data.path={path} line 4 (train row 3): {message}"


def test_whole_float_ids_are_read_as_the_integers_they_are(word_tokenizer, tmp_path):
    """``3.0`` is the id 3 (a JSON writer's float of a whole number): nothing is lost, so nothing is
    refused."""
    path = tokenized(tmp_path, [{"input_ids": [4, 5, 6, 7]}] * 3, {1: '{"input_ids": [4.0, 5.0, 6, 7]}'})
    dm = HFDataModule(tokenizer=word_tokenizer, path=str(path), validation_split=0.0, shuffle=False)
    dm.setup("fit")
    assert [list(map(int, r)) for r in dm.train_dataset["input_ids"]] == [[4, 5, 6, 7]] * 3


# ------------------------------------------------------------------------------------------ weights
def test_a_non_finite_weight_after_an_update_stops_before_it_is_saved(tmp_path, word_tokenizer):
    """SGD at lr 1e25 with the output layer's gradient scaled by 1e15: step 1's loss and gradient norm are
    finite (about 1e14), its update (about 1e40 per unit of gradient) overflows weights to inf. Without the
    weight check, the loss guard would only see step 2's NaN loss, after checkpoint 1 had saved the inf
    weights."""
    from tests.errors.support import ROWS, run

    folder = tmp_path / "run" / "checkpoints"
    ckpt = ModelCheckpoint(dirpath=folder, every_n_train_steps=1, save_last=True, save_top_k=-1)
    t, module, dm = run(
        tmp_path,
        word_tokenizer,
        [NonFiniteGuard(), ckpt],
        max_steps=3,
        rows=ROWS[:4] * 3,
        optim={"name": "sgd", "lr": 1e25},
        plugins=[AtomicCheckpointIO()],
        enable_checkpointing=True,
    )
    module.model.lm_head.weight.register_hook(lambda grad: grad * 1e15)
    with pytest.raises(TrainingError) as err:
        t.fit(module, datamodule=dm)
    message = str(err.value)
    assert message.startswith("optimizer step 1 (epoch 0): the update made ")
    assert (
        "non-finite (NaN/inf) while the loss and the gradient norm were finite, so training stopped before "
        "anything saved them; every checkpoint already written is intact and holds finite weights" in message
    )
    assert message.endswith("Usual cause: a learning rate too high (lr=1e+25 now)")
    assert not folder.exists() or not [n for n in os.listdir(folder) if n.endswith(".ckpt")]
    assert not all(torch.isfinite(p).all() for p in module.model.parameters())  # the update did overflow


# ------------------------------------------------------------------------------------------ constructors
def test_lightning_constructor_errors_are_one_config_error(compose_cfg):
    from hf_lightning.train import train

    # a value the schema has no rule for (its range ones it refuses itself: test_schema.py)
    cfg = compose_cfg("+experiment=sft", "callbacks.model_checkpoint.mode=maxx")
    with pytest.raises(ConfigError) as err:
        train(cfg)
    assert str(err.value) == (
        "callbacks.model_checkpoint.mode=maxx: `mode` can be min, max but got maxx (refused by "
        "lightning.pytorch.callbacks.ModelCheckpoint)"
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is there: trainer.accelerator=gpu is valid")
def test_a_gpu_accelerator_without_a_gpu_is_one_config_error(compose_cfg):
    from hf_lightning.train import train

    with pytest.raises(ConfigError) as err:
        train(compose_cfg("+experiment=sft", "trainer.accelerator=gpu"))
    assert str(err.value).startswith("trainer.accelerator=gpu: ")
    assert "(refused by lightning.Trainer)" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.skipif(importlib.util.find_spec("flash_attn") is not None, reason="flash-attn is installed")
def test_a_missing_attention_package_is_named(word_tokenizer, tmp_path):
    from hf_lightning.models.loading import build_model

    config = {
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
    }
    with pytest.raises(ModelError) as err:
        build_model(word_tokenizer, config=config, attn_implementation="flash_attention_2")
    assert str(err.value) == (
        "model.attn_implementation=flash_attention_2: its package is not installed (the package for "
        "FlashAttention2 doesn't seem to be installed.); install flash-attn (pip install flash-attn, on a "
        "machine with CUDA), or use model.attn_implementation=sdpa"
    )
    # from a model folder too, where it used to blame the folder ("the folder must hold a complete
    # save_pretrained")
    tiny_llama(vocab_size=30).save_pretrained(tmp_path / "model")
    word_tokenizer.save_pretrained(tmp_path / "model")
    with pytest.raises(
        ModelError, match="^model.attn_implementation=flash_attention_2: its package is not installed"
    ):
        build_model(
            word_tokenizer, name_or_path=str(tmp_path / "model"), attn_implementation="flash_attention_2"
        )


# ------------------------------------------------------------------------------------------ run folders
def test_resume_weights_only_into_the_runs_own_folder_is_refused(tmp_path, capsys):
    """It would start a new run at step 0 over the old run's metrics.csv rows and beside its last.ckpt."""
    run_dir = tmp_path / "run"
    plant_run(run_dir)
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    message = guard_exit(
        compose_train(f"hydra.run.dir={run_dir}", "ckpt_path=last", "resume_weights_only=true"), capsys
    )
    last = run_dir / "checkpoints" / "last.ckpt"
    assert message == (
        f"resume_weights_only=true starts a new run at step 0 from the weights of {last}, and "
        f"hydra.run.dir={run_dir} already holds a run (checkpoints/last.ckpt, metrics.csv) whose history it "
        f"would overwrite. Give the new run its own folder (hydra.run.dir=NEW ckpt_path={last} "
        "resume_weights_only=true), or drop resume_weights_only to continue that run"
    )
    assert {
        p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and ".hf_lightning.lock" not in p.name
    } == {p: b for p, b in before.items()}
    with pytest.raises(
        ConfigError, match="^resume_weights_only=true starts a new run at step 0"
    ):  # train()'s check
        check_run_folder(str(run_dir), "last", str(run_dir / "checkpoints"), weights_only=True)
    check_run_folder(str(tmp_path / "new"), str(last), None, weights_only=True)  # a new folder: fine


def test_paths_are_compared_as_the_file_system_sees_them(tmp_path, monkeypatch):
    """The same data file given relative, or a folder with a trailing '/', is the same run."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x.jsonl").write_text('{"text": "a"}\n')
    saved = OmegaConf.create({"data": {"path": "data/x.jsonl", "validation_path": str(tmp_path / "data")}})
    same = OmegaConf.create(
        {"data": {"path": str(tmp_path / "data" / "x.jsonl"), "validation_path": "data/"}}
    )
    other = OmegaConf.create({"data": {"path": "data/y.jsonl", "validation_path": "data/"}})
    assert config_differences(saved, same) == []
    assert config_differences(saved, other) == [
        "data.path: " + repr(str(tmp_path / "data" / "x.jsonl")) + " -> 'data/y.jsonl'"
    ]


def test_ckpt_path_last_reads_the_configured_checkpoint_folder(tmp_path, compose_cfg):
    elsewhere = tmp_path / "elsewhere"
    cfg = compose_cfg("+experiment=sft", f"callbacks.model_checkpoint.dirpath={elsewhere}")
    assert checkpoint_dir(cfg, str(tmp_path)) == str(elsewhere)
    assert checkpoint_dir(compose_cfg("+experiment=sft"), str(tmp_path)) == str(tmp_path / "checkpoints")
    elsewhere.mkdir()
    state = {
        "state_dict": {},
        "optimizer_states": [{}],
        "lr_schedulers": [{}],
        "loops": {"fit_loop": {}},
        "global_step": 2,
    }
    torch.save(state, elsewhere / "last.ckpt")
    assert find_resume_checkpoint("last", str(tmp_path), checkpoint_dir=str(elsewhere)) == str(
        elsewhere / "last.ckpt"
    )


def test_a_run_stopped_before_its_first_checkpoint_starts_again(tmp_path, capsys):
    """``ckpt_path=last`` in a folder that holds a started run (its config, its log) but no checkpoint yet:
    step 0, said; the message of a fresh start there points to ckpt_path=last, which then works (they never
    point at each other)."""
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "config.yaml").write_text("seed: 1\n")
    (tmp_path / "metrics.csv").write_text("step,train/loss\n1,2.0\n")
    with pytest.raises(ConfigError, match="or ckpt_path=last to resume that run"):
        check_run_folder(str(tmp_path), None)
    assert find_resume_checkpoint("last", str(tmp_path)) is None
    assert capsys.readouterr().err == (
        f"hf_lightning: note: ckpt_path=last: {tmp_path} holds no checkpoint yet (the run stopped before its "
        "first one): the run starts again from step 0\n"
    )
    # a finished run whose checkpoints were deleted is not restarted over its export
    (tmp_path / "final_metrics.json").write_text(json.dumps({"global_step": 3}))
    with pytest.raises(ConfigError) as err:
        find_resume_checkpoint("last", str(tmp_path))
    assert str(err.value) == (
        f"ckpt_path=last: there is no checkpoint in {tmp_path}/checkpoints, and {tmp_path} holds a finished "
        "run (final_metrics.json) with none left to resume from; start a new run in a new hydra.run.dir"
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("override", "start"),
    [
        (
            "callbacks.model_checkpoint.mode=maxx",
            "callbacks.model_checkpoint.mode=maxx: `mode` can be min, max but got maxx (refused by "
            "lightning.pytorch.callbacks.ModelCheckpoint)",
        ),
        ("trainer.accelerator=gpu", "trainer.accelerator=gpu: "),
        # before: Lightning's seed_everything ValueError; a ZeroDivisionError at the end of step 1
        ("seed=-1", "seed=-1: allowed values: an integer in [0, 4294967295]"),
        (
            "trainer.val_check_interval=0",
            "trainer.val_check_interval=0: allowed values: null (once per epoch)",
        ),
        ("optim.lr=inf", "optim.lr=inf: allowed values: a finite number >= 0"),
        (
            "trainer.limit_train_batches=0",
            "trainer.limit_train_batches=0: allowed values: null (every batch)",
        ),
    ],
    ids=["model_checkpoint", "gpu", "seed", "val_check_interval", "lr", "limit_train_batches"],
)
def test_the_command_line_says_each_in_one_line(tmp_path, override, start):
    """Before: Hydra's multi-line error and exit status 1 (the first two), a traceback (the next two); a
    run that trained on, or 0 steps."""
    from tests.errors.support import one_line_error, run_train_cli

    if override == "trainer.accelerator=gpu" and torch.cuda.is_available():
        pytest.skip("a GPU is there: trainer.accelerator=gpu is valid")
    line = one_line_error(
        run_train_cli("+experiment=sft", "trainer.max_steps=2", override, f"hydra.run.dir={tmp_path}")
    )
    assert line.startswith(f"hf_lightning: error: {start}")
    # refused before any work: the run folder holds what Hydra and the log write, no checkpoint or row
    assert not (tmp_path / "checkpoints").exists() and not (tmp_path / "metrics.csv").exists()
