"""Hub ids through the entry points, as a user with internet runs them: nothing of ours sets
``HF_HUB_OFFLINE``.

The stand-in hub on 127.0.0.1 (``HF_ENDPOINT``) records what it is asked for and knows no repository: the
entry point must ask it (before: every entry point forced ``HF_HUB_OFFLINE=1`` and said "not a folder"), then
say in one line which id, which cache, and the ``hf download`` command.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.errors.support import one_line_error
from tests.hub_support import StandInHub

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("entry", ["train", "evaluate", "inspect_batch"])
def test_entry_points_ask_the_hub_and_explain_a_missing_id(entry, tmp_path):
    hub = StandInHub()
    try:
        env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
        env.update(HF_ENDPOINT=hub.url, HF_HOME=str(tmp_path / "home"), HF_HUB_DISABLE_TELEMETRY="1")
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                f"hf_lightning.{entry}",
                "+experiment=sft",
                "model.name_or_path=hf-lightning-test/absent",
                f"hydra.run.dir={tmp_path / 'run'}",
            ],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
            cwd=tmp_path,
        )
    finally:
        hub.close()
    line = one_line_error(proc)
    assert line.startswith(
        "hf_lightning: error: model.name_or_path=hf-lightning-test/absent: not a local folder"
    )
    assert "no such repository on the hub" in line
    assert str(tmp_path / "home" / "hub") in line
    assert "`hf download hf-lightning-test/absent`" in line
    assert any("hf-lightning-test/absent" in path for path in hub.requests), hub.requests
