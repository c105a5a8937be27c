"""``tests.fork_server.run_module`` ends as ``subprocess.run([python, "-m", ...])`` does: exit status,
stdout, stderr, ``sys.argv``, working folder, ``sys.path[0]``, ``__main__.__spec__``, a timeout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fork_server import run_module

REPO = str(Path(__file__).resolve().parents[2])
ENV = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}


def plain(args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "tests.fork_server_case", *args],
        capture_output=True,
        text=True,
        env=ENV,
        cwd=cwd,
        timeout=60,
    )


@pytest.mark.parametrize("action", ["ok", "exit3", "raise", "interrupt", "kill", "term"])
def test_a_forked_run_ends_as_a_fresh_process(action, tmp_path):
    forked = run_module("tests.fork_server_case", [action], env=ENV, cwd=str(tmp_path), timeout=60)
    fresh = plain([action], str(tmp_path))
    assert (forked.returncode, forked.stdout) == (fresh.returncode, fresh.stdout)
    expected = {"ok": 0, "exit3": 3, "raise": 1, "interrupt": -2, "kill": -9, "term": -15}[action]
    assert forked.returncode == expected
    if action == "raise":  # the traceback's frames differ (runpy's and the server's), not its last line
        assert forked.stderr.splitlines()[-1] == fresh.stderr.splitlines()[-1] == "ValueError: raised"
        assert forked.stderr.startswith("to stderr\nTraceback")
    elif action == "interrupt":
        assert forked.stderr.splitlines()[-1] == fresh.stderr.splitlines()[-1] == "KeyboardInterrupt"
    else:
        assert forked.stderr == fresh.stderr == "to stderr\n"


def test_a_folder_that_shadows_an_imported_module_runs_a_plain_process(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "__init__.py").write_text("")
    (tmp_path / "tests" / "fork_server_case.py").write_text("print('the shadow')\n")
    forked = run_module("tests.fork_server_case", ["ok"], env=ENV, cwd=str(tmp_path), timeout=60)
    assert forked.stdout == plain(["ok"], str(tmp_path)).stdout == "the shadow\n"


def test_a_run_past_its_timeout_is_killed(tmp_path):
    with pytest.raises(subprocess.TimeoutExpired):
        run_module("tests.fork_server_case", ["sleep"], env=ENV, cwd=str(tmp_path), timeout=1)
