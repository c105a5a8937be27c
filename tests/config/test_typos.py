"""A key the composed config lacks, given without a leading ``+``: Hydra would refuse it as ``Could not
override``, exit 1, advising to add it; :func:`~hf_lightning.config.typos.misspelt_override` gives the line
the schema gives the same key with a ``+`` (``validate_config``, the independent path), plus the closest
key."""

from __future__ import annotations

import pytest

from hf_lightning.config.compose import compose_train
from hf_lightning.config.schema import validate_config
from hf_lightning.config.typos import misspelt_override
from hf_lightning.errors import ConfigError


def _schema_says(*overrides: str) -> str:
    with pytest.raises(ConfigError) as err:
        validate_config(compose_train(overrides, output_dir="run"))  # nothing is written there
    return str(err.value)


@pytest.mark.parametrize(
    "override, closest",
    [
        ("data.max_lenght=128", "data.max_length"),
        ("optim.lrr=0.1", "optim.lr"),
        ("callbacks.model_checkpoint.save_top_kk=2", "callbacks.model_checkpoint.save_top_k"),
    ],
)
def test_a_misspelt_key_gets_the_schemas_line_and_the_closest_key(override, closest):
    line = misspelt_override(["+experiment=sft", override])
    key = override.split("=")[0]
    assert line.startswith(f"unknown config key {key} (did you mean {closest}?); allowed keys of ")
    # the schema's own line for the key added with a leading +
    assert line in _schema_says("+experiment=sft", "+" + override)


def test_an_hf_name_gets_our_key_as_with_a_plus():
    line = misspelt_override(["+experiment=sft", "learning_rate=1e-4"])
    assert line == "learning_rate is HF's name: use optim.lr=0.0001"
    assert line in _schema_says("+experiment=sft", "+learning_rate=1e-4")


def test_a_node_that_does_not_exist_is_named_with_its_closest_group():
    line = misspelt_override(["+experiment=sft", "dat.max_length=3"])
    assert line.startswith("unknown config key dat.max_length: no node dat (did you mean data.max_length?);")


@pytest.mark.parametrize(
    "args",
    [
        ["+experiment=sft", "data.max_length=128", "optim.lr=1e-4", "trainer.max_steps=3"],  # all exist
        ["+experiment=sft", "+data.max_lenght=128"],  # added on purpose: the schema's own check refuses it
        ["-m", "+experiment=sft", "data.max_lenght=128"],  # a multirun: Hydra composes each job
        ["+experiment=sft", "optim.lr=1e-3,1e-4"],  # a sweep
        ["+experiment=sft", "hydra.run.dir=/tmp/x"],
        ["+experiment=sft", "data.path='unterminated"],  # malformed: Hydra's parser error says it
        ["+experiment=sft", "data"],  # no '='
    ],
)
def test_what_composes_or_is_left_to_hydra_gets_none(args):
    assert misspelt_override(args) is None


@pytest.mark.parametrize(
    "args, line",
    [
        # Hydra: "In 'train': Could not find 'experiment/sfy'", the options, the search path; exit 1
        (
            ["+experiment=sfy"],
            "experiment=sfy: no such option (did you mean experiment=sft?); allowed values: classification, "
            "clm, seq2seq, sft",
        ),
        (
            ["+experiment=sft", "scheduler=cosin"],
            "scheduler=cosin: no such option (did you mean scheduler=cosine?); allowed values: constant, "
            "cosine, cosine_with_min_lr, linear, reduce_lr_on_plateau",
        ),
        # Hydra: "Could not override 'experiment'. No match in the defaults list."; our schema used to say
        # "unknown top-level key experiment=None (did you mean export?)"
        (
            ["experiment=sft"],
            "experiment=sft: experiment is not in the defaults, so it takes a leading +: +experiment=sft",
        ),
        # Hydra: "Could not append to config. An item is already at 'trainer.max_steps'."
        (
            ["+experiment=sft", "+trainer.max_steps=5"],
            "+trainer.max_steps=5: trainer.max_steps is already in the config, so it is set without the +: "
            "trainer.max_steps=5",
        ),
    ],
)
def test_hydras_composition_errors_a_newcomer_meets_are_one_line(args, line):
    assert misspelt_override(args) == line


def test_the_options_are_the_config_folders_files():
    # independent of Hydra's list: the group folder's YAML files
    from pathlib import Path

    from hf_lightning.config.compose import CONF_DIR

    options = sorted(p.stem for p in (Path(CONF_DIR) / "optim").glob("*.yaml"))
    line = misspelt_override(["+experiment=sft", "optim=adamx"])
    assert line.endswith(f"allowed values: {', '.join(options)}") and "(did you mean optim=adamw?)" in line


def test_an_hf_name_inside_a_group_names_our_key_as_the_schema_does():
    line = misspelt_override(["+experiment=sft", "optim.learning_rate=1e-4"])
    assert line.startswith("unknown config key optim.learning_rate (HF's name: did you mean optim.lr?);")
    assert line in _schema_says("+experiment=sft", "+optim.learning_rate=1e-4")
