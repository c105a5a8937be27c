"""The memory benchmarks' peak reading belongs to the probe process, not to the process that started it.

``getrusage().ru_maxrss`` carries a parent's peak across ``fork`` + ``exec`` on Linux: the lean-loss memory
test, run from a pytest process holding ~1.5 GB, once read both sides' peaks as the same 959 MiB.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
CHILD = (
    f"import sys; sys.path.insert(0, {str(SCRIPTS)!r}); import resource; from bench_support import "
    "proc_status_kib; print(proc_status_kib('VmHWM'), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
)


def test_a_probe_started_from_a_large_parent_reads_its_own_peak():
    ballast = bytearray(400 * 2**20)
    ballast[::4096] = b"\x01" * len(ballast[::4096])  # touch every page: 400 MiB resident in this process
    out = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, check=True
    ).stdout.split()
    own_peak, inherited = int(out[0]), int(out[1])
    assert inherited > 400 * 1024  # the control: ru_maxrss reports this parent's ballast
    assert own_peak < 200 * 1024  # a bare interpreter: tens of MiB
    del ballast
