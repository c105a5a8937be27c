"""Inputs refused before any work, naming every key involved: Lightning's clipping and accumulation knobs
(which the window loop replaces) in every value, fractions of a stream's length, a missing file or model
folder, a ``model.config`` key the model's config class does not have, and pre-tokenized rows of which only
some hold ``labels``. A command refused before any work leaves no run folder it made."""

from __future__ import annotations

import json
import re

import pytest

from hf_lightning import ConfigError, HFDataModule
from hf_lightning.config.build import check
from hf_lightning.config.schema import validate_config
from hf_lightning.core.errors import DataError, ModelError
from tests.data_support import PadOnly
from tests.errors.support import one_line_error, run_train_cli

CHAT = {"messages": [{"role": "user", "content": "a b"}, {"role": "assistant", "content": "c d"}]}


@pytest.fixture
def chats(tmp_path):
    path = tmp_path / "chats.jsonl"
    path.write_text("".join(json.dumps(CHAT) + "\n" for _ in range(8)))
    return path


@pytest.fixture
def tiny_folder(tmp_path):
    """A model folder whose ``config.json`` says ``hidden_size`` 16 (the check pass reads no weights)."""
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig

    config = LlamaConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
    )
    folder = tmp_path / "tiny"
    config.save_pretrained(folder)  # config.json: what the check pass reads
    save_file({"lm_head.weight": torch.zeros(64, 16)}, folder / "model.safetensors")  # never loaded here
    return folder


def refusal(compose_cfg, *overrides: str) -> str:
    with pytest.raises(ConfigError) as err:
        validate_config(compose_cfg("+experiment=sft", *overrides))
    return str(err.value)


# ------------------------------------------------------------------ the knobs the window loop replaces
@pytest.mark.parametrize(
    "override,says",
    [
        (
            "+trainer.gradient_clip_val=null",
            "trainer.gradient_clip_val=null: clipping is module.max_grad_norm (HF's max_grad_norm, by norm): "
            "set module.max_grad_norm=null instead (null: no clipping; unset: 1.0, HF's default)",
        ),
        (
            "++trainer.gradient_clip_val=0.5",
            "trainer.gradient_clip_val=0.5: clipping is module.max_grad_norm (HF's max_grad_norm, by norm): "
            "set module.max_grad_norm=0.5 instead (null: no clipping; unset: 1.0, HF's default)",
        ),
        (
            "+trainer.gradient_clip_val=-1",
            "trainer.gradient_clip_val=-1: clipping is module.max_grad_norm (HF's max_grad_norm, by norm), "
            "which takes null or a number >= 0; remove trainer.gradient_clip_val (null: no clipping; unset: "
            "1.0, HF's default)",
        ),
        (
            "+trainer.accumulate_grad_batches=1",
            "trainer.accumulate_grad_batches=1: the accumulation window is data.gradient_accumulation_steps "
            "(HF's gradient_accumulation_steps): set data.gradient_accumulation_steps=1 instead",
        ),
        (
            "+trainer.accumulate_grad_batches=0",
            "trainer.accumulate_grad_batches=0: the accumulation window is data.gradient_accumulation_steps "
            "(HF's gradient_accumulation_steps), which takes an integer >= 1; remove "
            "trainer.accumulate_grad_batches",
        ),
        (
            "+trainer.accumulate_grad_batches=null",
            "trainer.accumulate_grad_batches=null: the accumulation window is "
            "data.gradient_accumulation_steps (HF's gradient_accumulation_steps), which takes an integer "
            ">= 1; remove trainer.accumulate_grad_batches",
        ),
        (
            "+trainer.gradient_clip_algorithm=norm",
            "trainer.gradient_clip_algorithm='norm': clipping is module.max_grad_norm, always by the "
            "gradients' total 2-norm (HF's max_grad_norm): remove the key",
        ),
    ],
)
def test_lightnings_window_knobs_are_refused_in_every_value(compose_cfg, override, says):
    """``null`` (which once turned clipping off) and Lightning's defaults are refused like any value; the fix
    names our key with the value only where our key takes it, and that suggestion composes and passes."""
    assert refusal(compose_cfg, override) == says
    suggested = re.search(r"set (\S+=\S+) instead", says)
    if suggested:
        validate_config(compose_cfg("+experiment=sft", suggested.group(1)))  # no error


# ------------------------------------------------------------------------------- fractions of a stream
@pytest.mark.parametrize(
    "override,key,value,instead",
    [
        (
            "trainer.val_check_interval=0.5",
            "trainer.val_check_interval",
            "0.5",
            "an integer N (validate every N optimizer steps), eval_steps=N, or 1.0 (at the end of the "
            "stream)",
        ),
        (
            "+trainer.limit_train_batches=0.25",
            "trainer.limit_train_batches",
            "0.25",
            "an integer (that many optimizer steps an epoch) or 1.0",
        ),
        (
            "trainer.limit_val_batches=0.5",
            "trainer.limit_val_batches",
            "0.5",
            "an integer (that many batches) or 1.0",
        ),
    ],
)
def test_a_fraction_of_a_streams_length_is_refused_naming_both_keys(
    compose_cfg, chats, override, key, value, instead
):
    """Lightning needs the length of the loader for a fraction (its ``MisconfigurationException`` once ``fit``
    has started); a stream has none."""
    cfg = compose_cfg("+experiment=sft", f"data.path={chats}", "data.streaming=true", override)
    with pytest.raises(ConfigError) as err:
        check(cfg)
    assert str(err.value) == (
        f"data.streaming=true with {key}={value}: a stream has no length to take a fraction of (Lightning "
        f"needs a sized loader for it); give {key} {instead}, or data.streaming=false"
    )


def test_a_stream_with_step_counts_passes(compose_cfg, chats):
    """``+experiment=sft`` validates every 0.5 epoch; ``eval_steps`` replaces it (HF's steps), and counts
    pass: nothing is refused."""
    check(compose_cfg("+experiment=sft", f"data.path={chats}", "data.streaming=true", "eval_steps=2"))
    check(
        compose_cfg(
            "+experiment=sft",
            f"data.path={chats}",
            "data.streaming=true",
            "trainer.val_check_interval=3",
            "+trainer.limit_train_batches=4",
        )
    )


# ------------------------------------------------------------------------------ paths, before building
@pytest.mark.parametrize(
    "override,error,says",
    [
        ("data.path=/nope/rows.jsonl", DataError, "data.path=/nope/rows.jsonl: no such file or folder"),
        (
            "data.validation_path=/nope/val.jsonl",
            DataError,
            "data.validation_path=/nope/val.jsonl: no such file or folder",
        ),
        ("data.test_path=./nope.jsonl", DataError, "data.test_path=./nope.jsonl: no such file or folder"),
        (
            "model.name_or_path=/nope/model",
            ModelError,
            "model.name_or_path=/nope/model: not a folder (expected a local HF model folder)",
        ),
    ],
)
def test_a_missing_file_or_folder_is_refused_by_the_check_pass(compose_cfg, chats, override, error, says):
    """The cheap pass says it, so nothing (tokenizer, data, model) is loaded first."""
    with pytest.raises(error) as err:
        check(compose_cfg("+experiment=sft", f"data.path={chats}", override))
    assert str(err.value) == says


def test_a_hub_id_is_left_to_the_loaders(compose_cfg):
    """``org/name`` is not a path on disk, but it may be a hub dataset: the check pass lets it through."""
    check(compose_cfg("+experiment=sft", "data.path=someone/some-dataset"))


# ------------------------------------------------------------------------------------------ model.config
def test_a_misspelt_model_config_key_is_refused_with_the_setting_it_resembles(
    compose_cfg, chats, tiny_folder
):
    """``LlamaConfig(hiden_size=64)`` keeps the typo as an attribute nobody reads; with a pretrained folder
    the key was not even read. Both are refused naming ``hidden_size``."""
    for extra in ([], [f"model.name_or_path={tiny_folder}"]):
        cfg = compose_cfg("+experiment=sft", f"data.path={chats}", *extra, "+model.config.hiden_size=64")
        with pytest.raises(ConfigError) as err:
            check(cfg)
        assert str(err.value) == (
            "model.config.hiden_size=64: LlamaConfig has no setting hiden_size (did you mean "
            "model.config.hidden_size?); model.config takes the settings of the model's config class "
            "(LlamaConfig: the keys of its config.json)"
        )


def test_a_given_model_config_value_that_a_pretrained_folder_cannot_take_is_refused(tiny_folder):
    """The folder's weights were trained with its ``config.json`` (``hidden_size`` 16): a given value that
    differs cannot take effect; the model group's defaults (not given) are not refused, and an equal value
    is no change."""
    from hf_lightning.config.inputs import model_config_errors

    model = {"name_or_path": str(tiny_folder), "config": {"hidden_size": 64, "num_hidden_layers": 1}}
    assert model_config_errors(model, {"model.config.hidden_size"}) == [
        f"model.config.hidden_size=64 with model.name_or_path={tiny_folder}: a pretrained model keeps its "
        "config.json (hidden_size=16), with which its weights were trained, so model.config cannot take "
        "effect; drop it, or set model.name_or_path=null to build a model from model.config"
    ]
    assert model_config_errors(model, set()) == []  # the group's own keys: one INFO line


def test_the_model_groups_keys_of_another_architecture_are_not_refused_with_a_folder(tiny_folder):
    """The shipped model group's keys are a Llama's (``num_key_value_heads``); with a GPT-2 folder they are
    not used, so names GPT-2's config lacks are not refused unless the command line gives them."""
    from transformers import GPT2Config

    from hf_lightning.config.inputs import model_config_errors

    gpt2 = tiny_folder.parent / "gpt2"
    GPT2Config(n_embd=16, n_layer=1, n_head=2).save_pretrained(gpt2)
    model = {"name_or_path": str(gpt2), "config": {"num_key_value_heads": 4, "intermediate_size": 688}}
    assert model_config_errors(model, set()) == []
    (given,) = model_config_errors(model, {"model.config.num_key_value_heads"})
    assert given.startswith("model.config.num_key_value_heads=4: GPT2Config has no setting ")


def test_a_model_config_key_spelled_right_reaches_the_exported_config(tmp_path, word_tokenizer):
    """``model.config.hidden_size=64`` builds a model 64 wide whose saved ``config.json`` says 64 (read back
    from the file ``save_pretrained`` writes)."""
    from hf_lightning.models.loading import ModelLoader

    loader = ModelLoader(
        name_or_path=None,
        architecture="llama",
        config={"hidden_size": 64, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2},
    )
    model = loader.model(word_tokenizer)
    assert model.get_input_embeddings().weight.shape[1] == 64  # the width the weights were built with
    model.config.save_pretrained(tmp_path / "hf_model")  # the config.json the export writes
    assert json.loads((tmp_path / "hf_model" / "config.json").read_text())["hidden_size"] == 64


# -------------------------------------------------------------------------- labels on some rows only
def test_labels_on_one_row_only_name_the_first_row_without_them(tmp_path):
    """40 pre-tokenized rows, only line 34 with ``labels``: the refusal names line 1 (the first row without
    them in the file), not the odd row out nor a row of the shuffled split."""
    rows = [{"input_ids": [1, 2, 3, 4]} for _ in range(40)]
    rows[33]["labels"] = [1, 2, 3, 4]
    path = tmp_path / "tokens.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    dm = HFDataModule(PadOnly(), path=str(path), validation_split=0.1)
    with pytest.raises(DataError) as err:
        dm.setup("fit")
    split_row = re.search(r" line 1( \(train row \d+\)|)", str(err.value)).group(
        1
    )  # where it was shuffled to
    assert str(err.value) == (
        f"data.path={path} line 1{split_row}: field 'labels' is missing on this row while line 34 has it "
        "(39 of 40 rows have none); give every row its labels (-100 where nothing is trained on), or drop "
        "the field from every row (then every token is a target)"
    )


# ------------------------------------------------------------------------------------ the run folder
def test_a_refused_run_removes_only_a_folder_it_made_holding_nothing_else(tmp_path):
    """What Hydra writes before the task (``.hydra/``, the log, the lock) goes with a folder this process
    made, and the dated parents made with it; a folder that existed, or holds anything else, stays."""
    from hf_lightning.run.lock import (
        discard_new_run_folder,
        hold_run_folder,
        release_run_folder,
        remember_new_run_folder,
    )

    def started(run, extra=()):
        remember_new_run_folder(str(run))
        hold_run_folder(str(run))
        (run / ".hydra").mkdir()
        for name in ("config.yaml", "hydra.yaml", "overrides.yaml"):
            (run / ".hydra" / name).write_text("{}")
        (run / "train.log").write_text("error\n")
        for name in extra:
            (run / name).write_text("x")

    new = tmp_path / "outputs" / "day" / "run"
    started(new)
    assert discard_new_run_folder(str(new))
    assert list(tmp_path.iterdir()) == []  # outputs/ and outputs/day/ went with it

    worked = tmp_path / "worked"
    started(worked, ["metrics.csv"])
    assert not discard_new_run_folder(str(worked))
    release_run_folder(str(worked))
    assert (worked / "metrics.csv").exists()

    existing = tmp_path / "existing"
    existing.mkdir()
    started(existing)
    assert not discard_new_run_folder(str(existing))
    release_run_folder(str(existing))
    assert (existing / ".hydra" / "config.yaml").exists()


@pytest.mark.slow
def test_a_missing_data_path_is_refused_from_the_command_line_leaving_no_folder(tmp_path):
    """The CLI: one line, exit 2, and the run folder (and its new parent) it made is gone."""
    run = tmp_path / "new" / "run"
    line = one_line_error(run_train_cli("+experiment=sft", "data.path=/nope.jsonl", f"hydra.run.dir={run}"))
    assert line == "hf_lightning: error: data.path=/nope.jsonl: no such file or folder"
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize(
    "override,says",
    [
        (
            "+gradient_accumulation_steps=0",
            "gradient_accumulation_steps is HF's name: use data.gradient_accumulation_steps, which takes an "
            "integer >= 1 (gradient_accumulation_steps=0 is not one)",
        ),
        (
            "+max_grad_norm=-1",
            "max_grad_norm is HF's name: use module.max_grad_norm, which takes null or a number >= 0 "
            "(max_grad_norm=-1 is not one)",
        ),
        (
            "+gradient_accumulation_steps=4",
            "gradient_accumulation_steps is HF's name: use data.gradient_accumulation_steps=4",
        ),
    ],
)
def test_an_hf_name_never_suggests_a_value_our_key_refuses(compose_cfg, override, says):
    """HF's names at the top level point to our key; with the value only where our key takes it."""
    assert refusal(compose_cfg, override) == says
