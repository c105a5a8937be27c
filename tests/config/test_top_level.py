"""The top level of a config is closed: a key is a group, one of the run's settings, or refused in one line;
an HF ``TrainingArguments`` name is refused with our key for it."""

from __future__ import annotations

import dataclasses
import functools
import shlex

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf, open_dict

from hf_lightning.config import validate_config
from hf_lightning.config.hf_names import GONE, NOT_HONOURED, OURS, hf_name_error
from hf_lightning.config.schema import EVALUATE_SETTINGS, GROUPS, RUN_SETTINGS
from hf_lightning.core.errors import ConfigError


def refusal(cfg, purpose="train") -> str:
    with pytest.raises(ConfigError) as err:
        validate_config(cfg, purpose)
    assert "\n" not in str(err.value)
    return str(err.value)


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("+learning_rate=5e-5", "learning_rate is HF's name: use optim.lr=5e-05"),
        ("+num_train_epochs=1", "num_train_epochs is HF's name: use trainer.max_epochs=1"),
        (
            "+gradient_accumulation_steps=4",
            "gradient_accumulation_steps is HF's name: use data.gradient_accumulation_steps=4",
        ),
        ("+bf16=true", "bf16 is HF's name: use trainer.precision=bf16-mixed"),
        ("+adam_beta2=0.95", "adam_beta2 is HF's name: use optim.betas=[0.9,0.95]"),
        (
            "+push_to_hub=true",
            "push_to_hub is an HF TrainingArguments name not honoured here: no upload to the Hub",
        ),
        # transformers 5's warmup_steps below 1 is a ratio of the run; warmup_ratio is gone from it
        (
            "+warmup_steps=0.1",
            "warmup_steps is HF's name: use scheduler.warmup_steps=0 scheduler.warmup_ratio=0.1",
        ),
        (
            "+warmup_ratio=0.1",
            "warmup_ratio is not a top-level key: use scheduler.warmup_steps=0 scheduler.warmup_ratio=0.1 "
            "(the name older transformers gave it in TrainingArguments)",
        ),
        # HF's lr_scheduler_kwargs / optim_args are scheduler.kwargs / optim.kwargs
        (
            "+lr_scheduler_kwargs={num_decay_steps: 100}",
            "lr_scheduler_kwargs is HF's name: use scheduler.kwargs='{num_decay_steps: 100}'",
        ),
        (
            "+optim_args='amsgrad=True,foreach=false'",
            "optim_args is HF's name: use optim.kwargs='{amsgrad: true, foreach: false}'",
        ),
    ],
)
def test_an_hf_name_gets_our_key(compose_cfg, override, expected):
    assert refusal(compose_cfg("+experiment=sft", override)).startswith(expected)


def test_an_unknown_top_level_key_is_refused_with_the_allowed_ones(compose_cfg):
    message = refusal(compose_cfg("+experiment=sft", "+lerning_rate=0.1"))
    assert message.startswith("unknown top-level key lerning_rate=0.1; allowed top-level keys: model, data,")
    assert all(k in message for k in (*GROUPS, *RUN_SETTINGS))
    # evaluate's switches are evaluate's only
    assert refusal(compose_cfg("+generate=true")).startswith("unknown top-level key generate=True")


def test_evaluate_allows_its_own_switches(compose_cfg):
    values = {"generate": "true", "max_new_tokens": "8"}  # a bool and a count (each checked: test_build.py)
    assert set(values) == set(EVALUATE_SETTINGS)
    cfg = compose_cfg("+experiment=sft", *(f"+{k}={v}" for k, v in values.items()))
    validate_config(cfg, "evaluate")


def test_every_training_arguments_field_is_mapped_or_said_not_honoured():
    """A transformers upgrade that adds a field fails here, naming it; a field it removes, too."""
    from transformers import TrainingArguments

    fields = {f.name for f in dataclasses.fields(TrainingArguments) if not f.name.startswith("_")}
    assert set(OURS) & set(NOT_HONOURED) == set()
    assert sorted(fields - set(OURS) - set(NOT_HONOURED)) == []  # new in transformers: map it or say why not
    assert sorted((set(OURS) | set(NOT_HONOURED)) - fields) == []  # gone from transformers: drop it


# a value of the field's kind, for the fields whose TrainingArguments default is not one we can use
SAMPLES = {
    "report_to": "tensorboard",
    "lr_scheduler_type": "cosine",
    "activation_checkpointing": False,  # flipped below: true
    "gradient_checkpointing": False,
    "warmup_steps": 0.05,  # a ratio of the run (transformers 5)
    "warmup_ratio": 0.05,
    "lr_scheduler_kwargs": {"num_decay_steps": 100, "min_lr_ratio": 0.1},
    "optim_args": "amsgrad=True,foreach=False",
    "label_names": ["labels"],
}
# suggestions that name files or Hydra's own node (composed elsewhere)
NOT_COMPOSED = ("output_dir", "deepspeed", "fsdp", "fsdp_config", "resume_from_checkpoint")


@functools.cache
def _base(*groups: str):
    from hf_lightning.config.compose import compose_train

    return compose_train(["+experiment=sft", *groups], output_dir="/tmp/unused")


def _apply(cfg, override: str) -> None:
    """``key=value`` / ``+key=value`` as Hydra applies it: a plain key must exist, a ``+`` key must not."""
    key = override.partition("=")[0]
    exists = OmegaConf.select(cfg, key.lstrip("+"), default=_ABSENT) is not _ABSENT
    assert exists != key.startswith("+"), f"{override}: Hydra would refuse it"
    parsed = OverridesParser.create().parse_override(override).value()  # as Hydra parses the value
    with open_dict(cfg):
        OmegaConf.update(cfg, key.lstrip("+"), parsed, merge=False)


_ABSENT = object()


@pytest.mark.parametrize("field", [*sorted(set(OURS) - set(NOT_COMPOSED)), *sorted(GONE)])
def test_each_suggested_override_composes_and_passes_the_schema(field):
    """The line says ``use X``: X as written must be a command line that works (no typo in our key, a ``+``
    where the key is not in the config), read as a shell reads it."""
    from transformers import TrainingArguments

    default = {f.name: f.default for f in dataclasses.fields(TrainingArguments)}.get(field)
    value = SAMPLES.get(field, default if isinstance(default, (bool, int, float, str)) else 2)
    if isinstance(value, bool):
        value = not value
    message = hf_name_error(field, value)
    suggestion = message.split(": use ", 1)[1].split(" (")[0].split(" or ")[0].split(" for ")[0]
    overrides = [o for o in shlex.split(suggestion) if "=" in o]
    assert overrides, message
    groups = tuple(
        o for o in overrides if "." not in o.split("=")[0]
    )  # trainer=gpu, strategy=ddp, logger=...
    if any("trainer.strategy" in o for o in overrides):
        groups += ("strategy=ddp",)
    cfg = _base(*groups).copy()
    for override in overrides:
        if override not in groups:
            _apply(cfg, override)
    validate_config(cfg)
