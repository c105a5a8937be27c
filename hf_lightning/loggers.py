"""A CSV logger that survives a resume: ``metrics.csv`` keeps the history up to the checkpoint's step.

Lightning's ``CSVLogger`` deletes an existing ``metrics.csv`` when it starts, so a resumed run loses every row
logged before the stop. This one reads the existing header and appends; :meth:`ResumableCSVLogger.truncate_after`
drops rows logged after the step the run resumes from (they are logged again), so each step appears once.
"""

from __future__ import annotations

import csv
import os

from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.utilities import rank_zero_only


class _AppendingWriter(ExperimentWriter):
    def _check_log_dir_exists(self) -> None:
        if os.path.isfile(self.metrics_file_path):
            with open(self.metrics_file_path, newline="") as fh:
                self.metrics_keys = sorted(next(csv.reader(fh), []))

    def truncate_after(self, step: int) -> None:
        self.save()
        if not os.path.isfile(self.metrics_file_path):
            return
        with open(self.metrics_file_path, newline="") as fh:
            reader = csv.DictReader(fh)
            fields = list(reader.fieldnames or [])
            rows = [r for r in reader if r.get("step") not in (None, "") and float(r["step"]) <= step]
        tmp = self.metrics_file_path + ".tmp"
        with open(tmp, "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=fields)
            writer.writeheader()
            writer.writerows(rows)
        os.replace(tmp, self.metrics_file_path)


class ResumableCSVLogger(CSVLogger):
    """``lightning.pytorch.loggers.CSVLogger`` that appends to an existing ``metrics.csv`` (same arguments)."""

    @property
    @rank_zero_experiment
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _AppendingWriter(log_dir=self.log_dir)
        return self._experiment

    @rank_zero_only
    def truncate_after(self, step: int) -> None:
        """Keep only rows with ``step <= step`` (0 on a fresh start: an old file's rows are dropped)."""
        self.experiment.truncate_after(step)
