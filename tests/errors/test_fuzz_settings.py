"""Hypothesis-driven random settings: junk ``HFDataModule`` constructor arguments and random config overrides
either build what they name or fail with an :class:`~hf_lightning.core.errors.HFLightningError` naming the
key.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import datasets
import pytest
import torch
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from hf_lightning import ConfigError, HFDataModule, HFLightningError

# ------------------------------------------------------------------------------------------ constructor
# arguments
JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-2, 3),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=4),
    st.lists(st.integers(0, 3), max_size=2),
)
ARGUMENTS = {
    "format": st.one_of(st.sampled_from(["auto", "tokenized", "text"]), JUNK),
    "validation_split": st.one_of(st.sampled_from([0.0, 0.25]), JUNK),
    "max_length": st.one_of(st.just(8), JUNK),
    "per_device_train_batch_size": st.one_of(st.just(2), JUNK),
    "per_device_eval_batch_size": st.one_of(st.just(2), JUNK),
    "shuffle": st.one_of(st.booleans(), JUNK),
    "group_by_length": st.one_of(st.booleans(), JUNK),
    "packing": st.one_of(st.sampled_from([False, True, "bfd", "wrapped"]), JUNK),
    "padding_free": st.one_of(st.booleans(), JUNK),
    "pack_buffer": st.one_of(st.none(), st.just(3), JUNK),
    "shuffle_buffer_size": st.one_of(st.just(10), JUNK),
    "remove_unused_columns": st.one_of(st.booleans(), JUNK),
    "model_input_names": st.one_of(st.none(), st.just(["input_ids"]), JUNK),
    "label_names": st.one_of(st.none(), st.just(["labels"]), JUNK),
    "num_workers": st.one_of(st.just(0), JUNK),
    "drop_last": st.one_of(st.booleans(), JUNK),
    "pad_to_multiple_of": st.one_of(st.none(), st.just(4), JUNK),
    "seed": st.one_of(st.just(3), JUNK),
}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.fixed_dictionaries({}, optional=ARGUMENTS))
def test_random_datamodule_arguments(kwargs):
    """Any combination either builds batches or raises an HFLightningError that names a ``data.`` key."""
    assume(kwargs)
    rows = [{"input_ids": list(range(1, 2 + i % 5)), "labels": list(range(1, 2 + i % 5))} for i in range(10)]
    tok = SimpleNamespace(
        pad_token_id=0, eos_token_id=None, model_input_names=["input_ids", "attention_mask"]
    )
    try:
        dm = HFDataModule(tok, path=datasets.Dataset.from_list(rows), **kwargs)
        dm.setup("fit")
        next(iter(dm.train_dataloader()))
    except HFLightningError as err:
        assert "data." in str(err), str(err)
    except Exception as err:  # noqa: BLE001 - the property under test
        pytest.fail(f"{type(err).__name__}: {err} for {kwargs!r}")


# ------------------------------------------------------------------------------------------ config overrides
VALUES = [
    "0",
    "-1",
    "1",
    "2",
    "1.5",
    "-0.5",
    "1e30",
    "nan",
    "inf",
    "true",
    "false",
    "null",
    "abc",
    "''",
    "[1,2]",
    "{a: 1}",
    "bfd",
    "wrapped",
    "adamw",
    "linear",
    "stop",
    "skip",
]


@functools.cache
def _leaf_keys():
    cfg = OmegaConf.to_container(_base(), resolve=False)
    keys = []
    for group in ("data", "optim", "scheduler", "module", "model", "callbacks.nonfinite_guard", "trainer"):
        node = cfg
        for part in group.split("."):
            node = node[part]
        keys += [f"{group}.{k}" for k, v in node.items() if not isinstance(v, dict) and not k.startswith("_")]
    return sorted(keys) + ["seed"]


@functools.cache
def _base():
    from hf_lightning.config.compose import compose_train

    return compose_train(["+experiment=sft"], output_dir="/tmp/unused")


LEAF_KEYS = st.deferred(lambda: st.sampled_from(_leaf_keys()))  # composed on first use, not at collection


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(LEAF_KEYS, st.sampled_from(VALUES)), min_size=1, max_size=4, unique_by=lambda kv: kv[0]
    )
)
def test_random_overrides_through_the_schema(overrides):
    """Any override either fails the schema with a ConfigError naming the key, or builds every object the
    config names without another kind of error (a value the schema lets through must be one the code
    accepts)."""
    from hf_lightning.config import validate_config
    from hf_lightning.config.build import instantiate  # our errors as themselves, as the builder raises them
    from tests.data_support import PadOnly

    cfg = _base().copy()  # composed once; each value is parsed as YAML, as Hydra parses an override value
    for key, value in overrides:
        OmegaConf.update(cfg, key, yaml.safe_load(value), merge=False)
    try:
        validate_config(cfg)
    except ConfigError as err:
        assert any(k in str(err) for k, _ in overrides) or "required" in str(err), (str(err), overrides)
        return
    model = torch.nn.Linear(2, 2)
    try:
        # what the builder does with each group's _target_ (hf_lightning.config.build)
        instantiate(cfg.data, _convert_="all")(tokenizer=PadOnly())
        optim = instantiate(cfg.optim, _convert_="all")
        scheduler = instantiate(cfg.scheduler, _convert_="all")
        scheduler(optim(model), 10)
        instantiate(cfg.callbacks.nonfinite_guard)
        instantiate(cfg.module, _convert_="all")(model, optim=optim, scheduler=scheduler)
    except HFLightningError as err:
        # a cross-field or range rule the constructors enforce: still a message naming a key it is about
        assert any(k.rsplit(".", 1)[-1] in str(err) for k, _ in overrides), (str(err), overrides)
    except Exception as err:  # noqa: BLE001 - the property under test
        pytest.fail(f"{overrides} passed the schema but {type(err).__name__}: {err}")
