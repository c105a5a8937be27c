"""Compose the ``train`` config from Python (notebooks, tests), as the command line would."""

from __future__ import annotations

import os
from collections.abc import Sequence

from omegaconf import DictConfig, open_dict

CONF_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "conf")


def compose_train(
    overrides: Sequence[str] = (),
    output_dir: str | os.PathLike | None = None,
    return_hydra_config: bool = False,
) -> DictConfig:
    """The config of ``python -m hf_lightning.train OVERRIDES`` (a group named in ``overrides`` wins over the
    experiment's keys, as on the command line: :mod:`hf_lightning.config.choices`).

    Args:
        overrides: command-line overrides (``+experiment=sft``, ``optim.lr=1e-4``, ``strategy=ddp``).
        output_dir: the run folder to write to (``${hydra:runtime.output_dir}`` has no value outside a Hydra
        run). return_hydra_config: keep the ``hydra`` node (launcher, sweeper).

    Raises:
        hydra.errors.HydraException: an override that does not compose (unknown group option, unknown key).
    """
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("train", overrides=list(overrides), return_hydra_config=return_hydra_config)
    from hf_lightning.config.choices import apply_group_precedence, say

    say(
        apply_group_precedence(cfg, overrides)
    )  # as the command line's run does (hydra.callbacks.group_choices)
    if output_dir is not None:
        with open_dict(cfg):
            cfg.output_dir = os.fspath(output_dir)
    return cfg
