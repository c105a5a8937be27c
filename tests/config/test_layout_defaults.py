"""The shipped experiments train in the fastest exact layout (``data.layout=auto``); a bare config does
not."""

from __future__ import annotations

import pytest
from hydra.utils import instantiate

from hf_lightning.config import validate_config
from hf_lightning.core.errors import ConfigError

EXPERIMENTS = ("sft", "clm", "seq2seq", "classification")


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_each_shipped_experiment_composes_with_the_auto_layout(experiment, compose_cfg, default_tokenizer):
    cfg = compose_cfg(f"+experiment={experiment}", "data.path=dummy.jsonl")
    validate_config(cfg)
    assert cfg.data.layout == "auto"
    # nothing chosen by hand, so auto decides at setup
    assert (cfg.data.group_by_length, cfg.data.packing, cfg.data.padding_free) == (False, False, False)
    dm = instantiate(cfg.data, _convert_="all")(tokenizer=default_tokenizer)
    assert dm.layout == "auto"


def test_the_default_sft_run_composes_and_turns_off_with_one_key(compose_cfg, default_tokenizer):
    cfg = compose_cfg("+experiment=sft")  # the README's default run: no data.path
    validate_config(cfg)
    assert cfg.data.path is None and cfg.data.layout == "auto"
    off = compose_cfg("+experiment=sft", "data.layout=null")
    validate_config(off)
    assert instantiate(off.data, _convert_="all")(tokenizer=default_tokenizer).layout is None


def test_without_an_experiment_the_layout_is_as_given(compose_cfg):
    assert compose_cfg().data.layout is None


def test_a_bad_layout_is_refused_by_the_schema(compose_cfg):
    with pytest.raises(
        ConfigError, match=r"data\.layout='fast': allowed values: auto \(the fastest .*\) or null \("
    ):
        validate_config(compose_cfg("+experiment=sft", "data.layout=fast"))
