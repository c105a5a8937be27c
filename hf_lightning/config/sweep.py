"""A Hydra callback that writes one table for a whole multirun: ``summary.csv`` at the sweep root, also
printed.

Each job's run folder holds ``.hydra/overrides.yaml`` (written by Hydra) and ``final_metrics.json`` (written
by ``hf_lightning.train.train``). The table is built from those files when the multirun ends, in the process
that started it, so it works the same with the basic launcher, joblib workers or SLURM jobs (submitit), and a
job that crashed still has its row (``status=failed``, no metrics).
"""

from __future__ import annotations

import csv
import json
import logging
import os
from pathlib import Path
from typing import Any

import yaml
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

log = logging.getLogger(__name__)

METRICS_FILE = "final_metrics.json"
SUMMARY_FILE = "summary.csv"


def collect_rows(sweep_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """One row per job folder of ``sweep_dir`` (sorted by job number): ``job``, each override ``key=value`` as
    a column, ``status`` and the final metrics."""
    rows = []
    jobs = [p for p in Path(sweep_dir).iterdir() if (p / ".hydra" / "overrides.yaml").is_file()]
    for job in sorted(
        jobs, key=lambda p: (not p.name.isdigit(), int(p.name) if p.name.isdigit() else 0, p.name)
    ):
        overrides = yaml.safe_load((job / ".hydra" / "overrides.yaml").read_text()) or []
        row: dict[str, Any] = {"job": job.name}
        for item in overrides:
            key, _, value = str(item).partition("=")
            row[key] = value
        metrics_path = job / METRICS_FILE
        if metrics_path.is_file():
            row["status"] = "completed"
            row.update(json.loads(metrics_path.read_text()))
        else:
            row["status"] = "failed"
        rows.append(row)
    return rows


def write_summary(sweep_dir: str | os.PathLike) -> tuple[Path, str]:
    """Write ``summary.csv`` in ``sweep_dir``; returns its path and the table as aligned text."""
    rows = collect_rows(sweep_dir)
    columns: list[str] = []
    for row in rows:
        columns += [k for k in row if k not in columns]
    path = Path(sweep_dir) / SUMMARY_FILE
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    return path, format_table(rows, columns)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return "" if value is None else str(value)


def format_table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    cells = [[_cell(r.get(c)) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


class SweepSummary(Callback):
    """``hydra.callbacks.sweep_summary`` in ``train.yaml``: on multirun end, write and print the summary."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = config.hydra.sweep.dir
        if not os.path.isdir(sweep_dir):
            return
        path, table = write_summary(sweep_dir)
        print(f"\nsweep summary ({path}):\n{table}\n", flush=True)
        log.info("sweep summary written to %s", path)
