"""A key the composed config lacks, given without a leading ``+``: Hydra would refuse it as ``Could not
override``, exit 1, advising to add it; :func:`~hf_lightning.config.typos.misspelt_override` gives the line
the schema gives the same key with a ``+`` (``validate_config``, the independent path), plus the closest
key."""

from __future__ import annotations

import pytest

from hf_lightning.config.compose import compose_train
from hf_lightning.config.schema import validate_config
from hf_lightning.config.typos import misspelt_override
from hf_lightning.core.errors import ConfigError


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


# --------------------------------------------------------------------------- mapping settings: every spelling
def _hydra_composes(overrides: list[str]) -> dict:
    """Hydra's own composition of ``overrides`` (no check of ours in between)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from hf_lightning.config.compose import CONF_DIR

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return OmegaConf.to_container(compose("train", overrides=overrides), resolve=False)


# (a mapping setting, a key it lacks by default, the key's value as an override writes it)
MAPPINGS = [
    ("data.rename_columns", "question", "prompt"),
    ("scheduler.kwargs", "num_decay_steps", "100"),
    ("optim.kwargs", "amsgrad", "true"),
    ("model.config", "rope_theta", "500000.0"),
]


@pytest.mark.parametrize("key, sub, value", MAPPINGS)
@pytest.mark.parametrize(
    "spelling",
    [
        "{key}={{{sub}: {value}}}",
        "+{key}={{{sub}: {value}}}",
        "{key}.{sub}={value}",
        "+{key}.{sub}={value}",
        "++{key}.{sub}={value}",
        "++{key}={{{sub}: {value}}}",
    ],
)
def test_a_mapping_setting_takes_every_spelling_of_a_new_key(key, sub, value, spelling):
    from hf_lightning.train import check_command_line

    override = spelling.format(key=key, sub=sub, value=value)
    args = check_command_line(["+experiment=sft", override])  # no exit: every spelling is taken
    # the expected config: Hydra's own composition of the spelling it documents for adding a key; a mapping
    # given whole (with a + or without) replaces a shipped one (model.config), Hydra's ~KEY then +KEY
    expected = [f"++{key}.{sub}={value}"]
    if spelling.endswith("{key}={{{sub}: {value}}}") and key == "model.config":
        expected = [f"~{key}", f"+{key}={{{sub}: {value}}}"]
    assert _hydra_composes(args) == _hydra_composes(["+experiment=sft", *expected])


@pytest.mark.parametrize("key, sub, value", MAPPINGS)
def test_hydra_itself_refuses_the_plain_spellings(key, sub, value):
    """What the test above accepts is not Hydra's doing: Hydra refuses both plain spellings of a new key
    (except for a setting whose default is null, which a whole mapping replaces)."""
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException, match="Could not override"):
        _hydra_composes(["+experiment=sft", f"{key}.{sub}={value}"])
    if key != "data.rename_columns":
        with pytest.raises(ConfigCompositionException, match="Could not override"):
            _hydra_composes(["+experiment=sft", f"{key}={{{sub}: {value}}}"])


def test_a_whole_mapping_replaces_the_default_one():
    """What the user wrote is what runs (before: merged, as Hydra merges mappings: the YAML's min_lr_rate kept
    beside the two keys given)."""
    from hf_lightning.config.typos import checked_command_line

    args = checked_command_line(
        ["+experiment=sft", "scheduler=cosine_with_min_lr", "scheduler.kwargs={min_lr: 1e-5, x: 1}"],
        "train",
        "train",
    )
    assert _hydra_composes(args)["scheduler"]["kwargs"] == {"min_lr": 1e-5, "x": 1}
    # one key by its dotted name: the YAML's other keys stay
    args = checked_command_line(
        ["+experiment=sft", "scheduler=cosine_with_min_lr", "scheduler.kwargs.x=1"], "train", "train"
    )
    assert _hydra_composes(args)["scheduler"]["kwargs"] == {"min_lr_rate": 0.1, "x": 1}


@pytest.mark.parametrize(
    "args, rewritten",
    [
        # a multirun and a sweep of a new key: each job gets the spelling Hydra takes
        (
            ["-m", "+experiment=sft", "scheduler.kwargs.num_decay_steps=50,100"],
            ["-m", "+experiment=sft", "++scheduler.kwargs.num_decay_steps=50,100"],
        ),
        # --cfg job prints the config the run would have
        (
            ["+experiment=sft", "--cfg", "job", "optim.kwargs.amsgrad=true"],
            ["+experiment=sft", "--cfg", "job", "++optim.kwargs.amsgrad=true"],
        ),
        # a mapping with a comma is one value, not a sweep
        (
            ["+experiment=sft", "scheduler.kwargs={a: 1, b: 2}"],
            ["+experiment=sft", "++scheduler.kwargs={a: 1, b: 2}"],
        ),
        # other keys are left as given (a misspelt one is refused by misspelt_override)
        (
            ["+experiment=sft", "data.max_lenght=3", "optim.lr=1e-4"],
            ["+experiment=sft", "data.max_lenght=3", "optim.lr=1e-4"],
        ),
        # a config folder of the user's own: left to Hydra
        (["--config-dir", "/tmp", "scheduler.kwargs.a=1"], ["--config-dir", "/tmp", "scheduler.kwargs.a=1"]),
    ],
)
def test_the_rewrite_keeps_everything_else_as_given(args, rewritten):
    from hf_lightning.config.typos import mapping_spellings

    assert mapping_spellings(args) == rewritten


def test_a_mapping_given_whole_to_a_node_names_the_key_it_lacks():
    line = misspelt_override(
        ["+experiment=sft", "callbacks.model_checkpoint={save_top_k: 1, save_top_kk: 2}"]
    )
    assert line.startswith(
        "unknown config key callbacks.model_checkpoint.save_top_kk (did you mean "
        "callbacks.model_checkpoint.save_top_k?); allowed keys of callbacks.model_checkpoint: "
    )
    assert line in _schema_says("+experiment=sft", "+callbacks.model_checkpoint.save_top_kk=2")


def test_a_key_below_a_plain_value_is_one_line():
    # Hydra: "Could not override 'data.validation_path.a'", exit 1; with a +, it would make the path a mapping
    line = misspelt_override(["+experiment=sft", "data.validation_path.a=b"])
    assert line == (
        "unknown config key data.validation_path.a: data.validation_path is a value (null), not a node with "
        "keys; set it as data.validation_path=..."
    )
