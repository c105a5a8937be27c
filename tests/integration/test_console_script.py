"""``hf-lightning``, the console script: declared in pyproject.toml, and each subcommand is its ``python -m``
command (the same output for the same arguments), with Hydra's completion answered per subcommand."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hf_lightning.cli.main import main

REPO = Path(__file__).resolve().parents[2]


def test_the_console_script_is_declared():
    tomllib = pytest.importorskip("tomllib")  # the standard library from Python 3.11
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"hf-lightning": "hf_lightning.cli.main:main"}


def test_help_lists_the_four_commands(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for command, module in (
        ("train", "hf_lightning.train"),
        ("evaluate", "hf_lightning.evaluate"),
        ("inspect", "hf_lightning.inspect_batch"),
        ("migrate", "hf_lightning.migrate"),
    ):
        assert f"python -m {module}" in out and f"  {command} " in out


@pytest.mark.parametrize(
    "line,expected", [("hf-lightning ", "train evaluate inspect migrate"), ("hf-lightning in", "inspect")]
)
def test_the_subcommand_word_completes(line, expected, monkeypatch, capsys):
    monkeypatch.setenv("COMP_LINE", line)
    assert main(["-sc", "query=bash"]) == 0
    assert capsys.readouterr().out.split() == expected.split()


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args],
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_a_subcommand_is_its_python_m_command():
    """``train ... --cfg job`` prints the config ``python -m hf_lightning.train`` prints; Hydra's help too."""
    args = ["+experiment=sft", "optim.lr=3e-4", "--cfg", "job"]
    ours = run("-m", "hf_lightning.cli.main", "train", *args)
    theirs = run("-m", "hf_lightning.train", *args)
    assert ours.returncode == theirs.returncode == 0, ours.stderr[-2000:]
    assert ours.stdout == theirs.stdout and "lr: 0.0003" in ours.stdout
    bad = run("-m", "hf_lightning.cli.main", "train", "+experiment=sft", "data.max_lenght=3")
    assert bad.returncode == 2
    assert (
        bad.stderr.strip()
        .splitlines()[-1]
        .startswith("hf_lightning: error: unknown config key data.max_lenght")
    )


@pytest.mark.slow
def test_hydra_completion_through_the_subcommand():
    """Hydra's bash query, answered by the train app: the experiments starting with ``s`` (the files of
    conf/experiment), and Hydra's install script registers ``hf-lightning``."""
    env = {**os.environ, "COMP_LINE": "hf-lightning train +experiment=s", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "hf_lightning.cli.main", "-sc", "query=bash"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    expected = sorted(
        f"+experiment={p.stem}"
        for p in (REPO / "hf_lightning" / "conf" / "experiment").glob("*.yaml")
        if p.stem.startswith("s")
    )
    assert sorted(proc.stdout.split()) == expected
    install = run("-m", "hf_lightning.cli.main", "-sc", "install=bash")
    assert install.stdout.strip().splitlines()[-1].endswith("-F hydra_bash_completion hf-lightning")
