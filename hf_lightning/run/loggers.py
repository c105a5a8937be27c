"""A CSV logger that survives a resume, a kill and a full disk: ``metrics.csv`` keeps the history up to the
checkpoint's step, and a row is either written whole or not at all; and :func:`adopt_csv_header`, which keeps
any CSV logger's rows when another process wrote the file before (``strategy=ddp_spawn``).

Lightning's ``CSVLogger`` deletes an existing ``metrics.csv`` when it starts (a resumed run would lose every
row logged before the stop) and rewrites the file in place when a new column appears (a kill then leaves it
truncated). This one reads the existing header and appends; a new column, and
:meth:`ResumableCSVLogger.truncate_after` (rows logged after the step the run resumes from are logged again,
so each step appears once), rewrite the whole file atomically. Appended rows go out in one write of whole
lines: a last line without its newline is a write cut short by a kill, and is dropped when the file is next
read. A write refused by the disk is one :class:`~hf_lightning.core.errors.TrainingError` naming the file,
with the file as it was.
"""

from __future__ import annotations

import csv
import io
import os

from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.utilities import rank_zero_only

from hf_lightning.checkpointing.files import atomic_file, write_failure_message
from hf_lightning.compat import KeepingExperimentWriter, csv_experiment
from hf_lightning.core.errors import TrainingError


def read_rows(path: str) -> tuple[list[str], list[dict[str, str]]]:
    """``(header, rows)`` of a ``metrics.csv``; a last line cut short by a kill (no newline) is left out."""
    with open(path, newline="") as fh:
        text = fh.read()
    if text and not text.endswith("\n"):
        text = text[: text.rfind("\n") + 1]
    reader = csv.DictReader(io.StringIO(text, newline=""))
    rows = list(reader)
    return list(reader.fieldnames or []), rows


def read_header(path: str) -> list[str]:
    """The column names of a ``metrics.csv`` (its first line; empty for an empty file)."""
    with open(path, newline="") as fh:
        return next(csv.reader(fh), [])


@rank_zero_only
def adopt_csv_header(logger: object) -> None:
    """Teach a CSV logger's writer the columns its ``metrics.csv`` already has, before it writes a row.

    A writer knows only the columns it wrote itself. Under ``strategy=ddp_spawn`` every ``fit`` / ``test``
    call runs in new processes, each with a pickled copy of the main process's logger: the ``test`` worker's
    writer has never seen the training columns, and its first row (new columns) makes it rewrite the file with
    the header it knows. Lightning's ``ExperimentWriter`` then fails on the old rows (``csv.DictWriter``:
    "dict contains fields not in fieldnames") after emptying the file. With the file's columns adopted the
    rewrite keeps every row. Loggers other than ``CSVLogger`` (and files not yet written) are left alone.
    """
    if not isinstance(logger, CSVLogger):
        return
    writer = logger.experiment
    path = writer.metrics_file_path
    if not os.path.isfile(path):
        return
    known = set(writer.metrics_keys)
    header = read_header(path)
    if not known.issuperset(header):
        # the order Lightning's writer keeps (ExperimentWriter._record_new_keys sorts the keys)
        writer.metrics_keys = sorted(known.union(header))


def logged_at(path: str, step: int) -> set[str]:
    """The columns with a value in the rows of ``step`` (empty when the file is absent)."""
    if not os.path.isfile(path):
        return set()
    _, rows = read_rows(path)
    return {
        k
        for r in rows
        if r.get("step") not in (None, "") and int(float(r["step"])) == step
        for k, v in r.items()
        if v not in ("", None)
    }


class _AppendingWriter(KeepingExperimentWriter):
    def found_metrics_file(self) -> None:
        self.metrics_keys = sorted(read_rows(self.metrics_file_path)[0])

    def _fail(self, err: OSError) -> TrainingError:
        self.metrics = []  # Lightning's teardown saves again: the rows that could not be written are dropped
        return TrainingError(
            write_failure_message(
                "the metrics log",
                self.metrics_file_path,
                err,
                "its rows written before are intact and every checkpoint is kept",
                "then resume with ckpt_path=last (the rows after the checkpoint's step are logged again)",
            )
        )

    def _rewrite(self, fields: list[str], rows: list[dict]) -> None:
        with atomic_file(self.metrics_file_path, "w") as fh:
            writer = csv.DictWriter(fh, fieldnames=fields, lineterminator="\n")
            writer.writeheader()
            writer.writerows(rows)

    def save(self) -> None:
        """Write the rows logged since the last save (appended in one write, or the file rewritten atomically
        when a column is new or the last line is incomplete)."""
        if not self.metrics:
            return
        path = self.metrics_file_path
        keys = sorted(set(self.metrics_keys).union(*self.metrics))
        try:
            exists = os.path.isfile(path)
            whole = exists and _ends_with_newline(path)
            if keys != self.metrics_keys or not whole:
                old = read_rows(path)[1] if exists else []
                self._rewrite(keys, old + self.metrics)
            else:
                buf = io.StringIO()
                csv.DictWriter(buf, fieldnames=keys, lineterminator="\n").writerows(self.metrics)
                _append(path, buf.getvalue().encode())
        except OSError as err:
            raise self._fail(err) from err
        self.metrics_keys = keys
        self.metrics = []

    def truncate_after(self, step: int) -> None:
        self.save()
        if not os.path.isfile(self.metrics_file_path):
            return
        try:
            fields, rows = read_rows(self.metrics_file_path)
            kept = [r for r in rows if r.get("step") not in (None, "") and float(r["step"]) <= step]
            self._rewrite(fields, kept)
        except OSError as err:
            raise self._fail(err) from err


def _ends_with_newline(path: str) -> bool:
    with open(path, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        if fh.tell() == 0:
            return False
        fh.seek(-1, os.SEEK_END)
        return fh.read(1) == b"\n"


def _append(path: str, data: bytes) -> None:
    """One ``write`` of whole lines at the end of ``path``; on failure the file is cut back to its old
    size."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        size = os.fstat(fd).st_size
        try:
            written = os.write(fd, data)
            if written != len(data):
                raise OSError(28, os.strerror(28))  # a short write: the disk filled up half-way
        except OSError:
            os.ftruncate(fd, size)
            raise
    finally:
        os.close(fd)


class ResumableCSVLogger(CSVLogger):
    """``lightning.pytorch.loggers.CSVLogger`` that appends to an existing ``metrics.csv`` (same
    arguments)."""

    @property
    @rank_zero_experiment
    def experiment(self) -> ExperimentWriter:
        return csv_experiment(self, lambda log_dir: _AppendingWriter(log_dir=log_dir))

    @rank_zero_only
    def truncate_after(self, step: int) -> None:
        """Keep only rows with ``step <= step`` (0 on a fresh start: an old file's rows are dropped)."""
        self.experiment.truncate_after(step)
