"""A non-editable install must carry every Hydra config: the wheel holds the whole conf/ tree."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_wheel_ships_every_config(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (wheel,) = tmp_path.glob("hf_lightning-*.whl")
    shipped = {n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".yaml")}
    expected = {
        str(p.relative_to(ROOT / "hf_lightning").as_posix())
        for p in (ROOT / "hf_lightning" / "conf").rglob("*.yaml")
    }
    assert expected and {f"hf_lightning/{e}" for e in expected} == shipped
