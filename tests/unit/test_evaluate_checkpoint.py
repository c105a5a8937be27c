"""``python -m hf_lightning.evaluate ckpt_path=...`` reads the checkpoint as ``train`` reads it: ``last`` is
the run folder's ``last.ckpt`` (or ``callbacks.model_checkpoint.dirpath``'s), else its newest intact
checkpoint, with train's refusals (before: ``ckpt_path=last: no such file`` while
``RUN/checkpoints/last.ckpt`` existed).

``evaluate(cfg)`` runs in process on a real tiny model, real data and real checkpoint files; the oracle for
``last`` is the same evaluation given the checkpoint's path, which evaluate has always read.
"""

from __future__ import annotations

import json

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from hf_lightning.config.build import build
from hf_lightning.config.compose import CONF_DIR
from hf_lightning.core.errors import ConfigError
from hf_lightning.evaluate import evaluate
from tests.conftest import SHRINK


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "eval.jsonl"
    path.write_text("".join(json.dumps({"text": f"Sentence number {i} is here."}) + "\n" for i in range(6)))
    return path


def compose_evaluate(run_dir, text_file, *overrides):
    """The config of ``python -m hf_lightning.evaluate +experiment=clm ... hydra.run.dir=RUN_DIR``."""
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(
            "evaluate", overrides=[*SHRINK, "+experiment=clm", f"data.path={text_file}", *overrides]
        )
    OmegaConf.set_struct(cfg, False)
    cfg.output_dir = str(run_dir)
    return cfg


def save_weights(run_dir, text_file, seed: int, path, step: int) -> None:
    """A checkpoint with the weights of the experiment's model built with ``seed`` (what evaluate reads)."""
    module = build(compose_evaluate(run_dir, text_file, f"seed={seed}"), "evaluate").module
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"state_dict": module.state_dict(), "global_step": step}, path)


def test_ckpt_path_last_evaluates_the_runs_last_checkpoint(tmp_path, text_file):
    run = tmp_path / "run"
    last = run / "checkpoints" / "last.ckpt"
    save_weights(run, text_file, 3, last, 4)
    by_path = evaluate(compose_evaluate(run, text_file, f"ckpt_path={last}"))
    assert evaluate(compose_evaluate(run, text_file, "ckpt_path=last")) == by_path


def test_ckpt_path_last_reads_the_configured_checkpoint_folder(tmp_path, text_file):
    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    save_weights(run, text_file, 3, elsewhere / "last.ckpt", 4)
    by_path = evaluate(compose_evaluate(run, text_file, f"ckpt_path={elsewhere / 'last.ckpt'}"))
    where = f"callbacks.model_checkpoint.dirpath={elsewhere}"
    assert evaluate(compose_evaluate(run, text_file, "ckpt_path=last", where)) == by_path


def test_ckpt_path_last_without_last_ckpt_evaluates_the_newest_intact_one(tmp_path, text_file, capsys):
    run = tmp_path / "run"
    folder = run / "checkpoints"
    save_weights(run, text_file, 4, folder / "step000002.ckpt", 2)
    by_path = evaluate(compose_evaluate(run, text_file, f"ckpt_path={folder / 'step000002.ckpt'}"))
    capsys.readouterr()
    assert evaluate(compose_evaluate(run, text_file, "ckpt_path=last")) == by_path
    assert capsys.readouterr().err == (
        f"hf_lightning: note: ckpt_path=last: there is no {folder / 'last.ckpt'} (the run stopped before "
        f"writing it): evaluating the newest intact checkpoint, {folder / 'step000002.ckpt'} (step 2)\n"
    )


def test_ckpt_path_last_is_refused_as_train_refuses_it(tmp_path, text_file):
    """A ``last.ckpt`` that is a directory names the newest intact checkpoint; a folder without a training run
    says what evaluate needs. Nothing is written."""
    run = tmp_path / "run"
    folder = run / "checkpoints"
    save_weights(run, text_file, 4, folder / "step000002.ckpt", 2)
    (folder / "last.ckpt").mkdir()
    with pytest.raises(ConfigError) as err:
        evaluate(compose_evaluate(run, text_file, "ckpt_path=last"))
    named = folder / "step000002.ckpt"
    assert str(err.value) == (
        f"ckpt_path=last: cannot evaluate: {folder / 'last.ckpt'} is a directory, not a checkpoint file; the "
        f"newest intact checkpoint there is {named} (step 2): evaluate it with ckpt_path={named}"
    )
    empty = tmp_path / "empty"
    with pytest.raises(ConfigError) as err:
        evaluate(compose_evaluate(empty, text_file, "ckpt_path=last"))
    assert str(err.value) == (
        f"ckpt_path=last: no checkpoint at {empty / 'checkpoints' / 'last.ckpt'}, and {empty} holds no "
        "training run; give the run folder of a training run (hydra.run.dir=RUN, with the run's overrides), "
        "or ckpt_path=FILE"
    )
    assert not (run / "eval_metrics.json").exists() and not empty.exists()


def test_a_run_without_a_checkpoint_has_nothing_to_evaluate(tmp_path):
    """Where train would start again from step 0 (a run stopped before its first checkpoint) or refuse (no
    checkpoint left intact), evaluate refuses, naming the export when the run has one."""
    from hf_lightning.checkpointing.resume import resolve_ckpt_path

    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "config.yaml").write_text("seed: 1\n")
    folder = run / "checkpoints"
    with pytest.raises(ConfigError) as err:
        resolve_ckpt_path("last", str(run), purpose="evaluate")
    assert str(err.value) == (
        f"ckpt_path=last: there is no checkpoint in {folder}: the run in {run} has none to evaluate"
    )
    (run / "hf_model").mkdir()
    with pytest.raises(ConfigError) as err:
        resolve_ckpt_path("last", str(run), purpose="evaluate")
    assert str(err.value).endswith(f"; evaluate its export with model.name_or_path={run / 'hf_model'}")
    folder.mkdir()
    (folder / "step000002.ckpt").write_bytes(b"")
    with pytest.raises(ConfigError) as err:
        resolve_ckpt_path("last", str(run), purpose="evaluate")
    assert str(err.value) == (
        f"ckpt_path=last: there is no {folder / 'last.ckpt'}, and no checkpoint in {folder} can be evaluated "
        "(step000002.ckpt is damaged: it is empty (0 bytes), not a checkpoint); evaluate its export with "
        f"model.name_or_path={run / 'hf_model'}"
    )


def trained_run(run_dir, text_file, seed: int, *overrides: str):
    """A training run's folder as evaluate meets it: ``.hydra/config.yaml`` and ``checkpoints/last.ckpt``."""
    saved = run_dir / ".hydra" / "config.yaml"
    saved.parent.mkdir(parents=True)
    OmegaConf.save(compose_evaluate(run_dir, text_file, f"seed={seed}", *overrides), saved)
    save_weights(run_dir, text_file, seed, run_dir / "checkpoints" / "last.ckpt", 2)
    return run_dir / "checkpoints" / "last.ckpt"


def test_another_runs_checkpoint_is_refused_naming_both_folders(tmp_path, text_file):
    """Before: the weights of run B were evaluated and written into run A's folder as A's results."""
    run_a, run_b = tmp_path / "a", tmp_path / "b"
    trained_run(run_a, text_file, 3)
    other = trained_run(run_b, text_file, 4)
    (run_a / "eval_metrics.json").write_text('{"val/loss": 1.5}')  # A's own evaluation, kept
    with pytest.raises(ConfigError) as err:
        evaluate(compose_evaluate(run_a, text_file, f"ckpt_path={other}"))
    assert str(err.value) == (
        f"ckpt_path={other} is a checkpoint of the run in {run_b}, not of the run in hydra.run.dir={run_a}, "
        "which this evaluation would write its eval_metrics.json and predictions.jsonl into as that run's; "
        f"evaluate it in its own run folder (hydra.run.dir={run_b} ckpt_path=last, with that run's "
        f"overrides), or in a new folder (hydra.run.dir=NEW ckpt_path={other})"
    )
    assert (run_a / "eval_metrics.json").read_text() == '{"val/loss": 1.5}'
    assert not (run_a / "predictions.jsonl").exists()
    # each named fix evaluates: its own folder, or a folder without a run
    assert evaluate(compose_evaluate(run_b, text_file, "ckpt_path=last"))["val/loss"] > 0
    assert evaluate(compose_evaluate(tmp_path / "new", text_file, f"ckpt_path={other}"))["val/loss"] > 0


def test_the_runs_checkpoint_with_other_model_settings_is_refused_naming_them(tmp_path, text_file):
    """Same shapes, another model (before: its weights evaluated under a model the run never trained)."""
    run = tmp_path / "run"
    last = trained_run(run, text_file, 3)
    with pytest.raises(ConfigError) as err:
        evaluate(compose_evaluate(run, text_file, "ckpt_path=last", "+model.config.rms_norm_eps=0.001"))
    assert str(err.value) == (
        f"ckpt_path={last}: the run in hydra.run.dir={run} was trained with other model settings "
        f"(model.config.rms_norm_eps: null -> 0.001); evaluate it with that run's overrides "
        f"({run}/.hydra/overrides.yaml)"
    )
    # how the model runs may change (load_model_weights refuses weights of another shape)
    eager = "model.attn_implementation=eager"
    assert evaluate(compose_evaluate(run, text_file, "ckpt_path=last", eager))["val/loss"] > 0
