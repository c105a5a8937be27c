"""``scripts/fetch_shared_data.sh`` fetches the shared data files from their pinned commits and checks each
one's SHA-256: run here against a ``file://`` mirror laid out as GitHub's raw files are
(owner/repo/commit/path) from the shared data folder, whose files are the upstream blobs."""

from __future__ import annotations

import filecmp
import os
import subprocess
from pathlib import Path

from tests.data_support import shared_data

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "fetch_shared_data.sh"


def mirror(root: Path, source: Path, corrupt: str | None = None) -> list[str]:
    """The mirror of every file the script lists; ``corrupt``: that file's copy gets one byte changed."""
    text = SCRIPT.read_text()
    listed = text.split("<<'FILES'\n", 1)[1].split("\nFILES", 1)[0].splitlines()
    locals_ = []
    for line in listed:
        local, repo, commit, path, _ = line.split()
        target = root / repo / commit / path
        target.parent.mkdir(parents=True, exist_ok=True)
        data = (source / local).read_bytes()
        target.write_bytes(data + b"x" if local == corrupt else data)
        locals_.append(local)
    return locals_


def test_the_files_are_fetched_and_checked(tmp_path):
    source = shared_data()
    files = mirror(tmp_path / "mirror", source)
    assert len(files) == 14
    env = {**os.environ, "BASE_URL": f"file://{tmp_path / 'mirror'}"}
    proc = subprocess.run(
        ["bash", str(SCRIPT), str(tmp_path / "data")], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    for local in files:
        assert filecmp.cmp(tmp_path / "data" / local, source / local, shallow=False), local


def test_a_file_whose_digest_differs_is_refused(tmp_path):
    source = shared_data()
    mirror(tmp_path / "mirror", source, corrupt="banking77/train.csv")
    env = {**os.environ, "BASE_URL": f"file://{tmp_path / 'mirror'}"}
    proc = subprocess.run(
        ["bash", str(SCRIPT), str(tmp_path / "data")], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 1
    assert proc.stderr.startswith("fetch_shared_data: banking77/train.csv: SHA-256 ")
    assert not (tmp_path / "data" / "banking77" / "train.csv").exists()
