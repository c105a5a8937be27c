"""``loss.png`` in the run folder: training and validation loss against the optimizer step.

The curves are read back from ``metrics.csv`` (the CSV logger's file) once training has finished, so the plot
shows exactly the logged numbers, including the rows kept from before a resume. Drawing needs matplotlib
(``pip install matplotlib``, or the ``plot`` extra); without it the run logs one note and writes no plot.
"""

from __future__ import annotations

import csv
import logging
import os
from collections.abc import Sequence

import lightning as L

log = logging.getLogger(__name__)

CURVES = ("train/loss", "val/loss")


def read_curves(
    metrics_csv: str | os.PathLike, keys: Sequence[str] = CURVES
) -> dict[str, tuple[list[int], list[float]]]:
    """``{key: (steps, values)}`` for every key of ``keys`` that has at least one value in ``metrics_csv``.

    Args:
        metrics_csv: a Lightning ``CSVLogger`` file, one row per logging call, a ``step`` column (optimizer
            steps done) and one column per metric (empty where that call did not log it).
        keys: the metric columns to read.

    Returns:
        Steps as ``int`` and values as ``float`` (nats per target token for the losses), in file order.

    Raises:
        FileNotFoundError: ``metrics_csv`` does not exist.
    """
    curves: dict[str, tuple[list[int], list[float]]] = {k: ([], []) for k in keys}
    with open(metrics_csv, newline="") as fh:
        for row in csv.DictReader(fh):
            step = row.get("step")
            if step in (None, ""):
                continue
            for key in keys:
                value = row.get(key)
                if value not in (None, ""):
                    curves[key][0].append(int(float(step)))
                    curves[key][1].append(float(value))
    return {k: v for k, v in curves.items() if v[0]}


def plot_losses(
    metrics_csv: str | os.PathLike, path: str | os.PathLike, title: str | None = None
) -> dict[str, tuple[list[int], list[float]]]:
    """Draw ``train/loss`` (line) and ``val/loss`` (line with markers) against the step into the PNG ``path``.

    Uses matplotlib's object API (no ``pyplot`` state, no backend switch), so it is safe inside a notebook
    or a training process.

    Returns:
        The curves drawn, as :func:`read_curves` gives them; empty when the file holds neither curve (then
        nothing is written).

    Raises:
        ImportError: matplotlib is not installed.
        FileNotFoundError: ``metrics_csv`` does not exist.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    curves = read_curves(metrics_csv)
    if not curves:
        return curves
    fig = Figure(figsize=(7, 4), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    styles = {"train/loss": {"linewidth": 1.2}, "val/loss": {"marker": "o", "linewidth": 1.5}}
    for key, (steps, values) in curves.items():
        ax.plot(steps, values, label=key, **styles.get(key, {}))
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss (nats per target token)")
    if title:
        ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    from hf_lightning.checkpointing.files import atomic_file

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with atomic_file(os.fspath(path), "wb") as fh:  # a kill leaves the previous plot, not half a PNG
        fig.savefig(fh, format=os.path.splitext(os.fspath(path))[1].lstrip(".") or "png")
    return curves


def _csv_logger_file(trainer: L.Trainer) -> str | None:
    from lightning.pytorch.loggers import CSVLogger

    for logger in trainer.loggers:
        if isinstance(logger, CSVLogger):
            return os.path.join(logger.log_dir, "metrics.csv")
    return None


class LossPlot(L.Callback):
    """At the end of a finished ``fit`` (and of a ``validate`` after it), write ``path`` (``loss.png``) from
    the run's ``metrics.csv`` (rank 0).

    Args:
        path: the PNG to write (the config puts it at ``${output_dir}/loss.png``).
        metrics_csv: the metrics file to read; ``None`` finds the trainer's ``CSVLogger`` file.

    Runs in ``teardown``, after the LightningModule's ``on_train_end`` has logged the last steps. A missing
    matplotlib, a run without a CSV logger or a file without loss rows is logged once and skips the plot; so
    does a drawing error (a plot never turns a finished training into a failed one).
    """

    def __init__(self, path: str, metrics_csv: str | None = None) -> None:
        self.path = path
        self.metrics_csv = metrics_csv
        self._available: bool | None = None
        # the curves drawn by the last plot (empty until then), for a caller that wants the numbers
        self.curves: dict[str, tuple[list[int], list[float]]] = {}

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit" or not trainer.is_global_zero:
            return
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            self._available = False
            log.info(
                "matplotlib is not installed, so this run writes no %s (pip install matplotlib, or the plot "
                "extra: pip install -e '.[plot]')",
                os.path.basename(self.path),
            )
            return
        self._available = True

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # "validate": the final validation train() runs after fit adds a val/loss point: draw again
        if stage not in ("fit", "validate") or not trainer.is_global_zero or not self._available:
            return
        source = self.metrics_csv or _csv_logger_file(trainer)
        if source is None or not os.path.isfile(source):
            log.info("no metrics.csv to plot (a CSV logger writes it: logger=csv): %s not written", self.path)
            return
        # the run folder's last two parts (outputs/<date>/<time>) tell runs apart when plots are compared
        run_dir = os.path.dirname(os.path.abspath(self.path))
        title = os.path.join(os.path.basename(os.path.dirname(run_dir)), os.path.basename(run_dir))
        try:
            self.curves = plot_losses(source, self.path, title=title)
        except Exception as err:  # a plot must not fail a finished run; the error is logged instead
            log.warning("could not write %s: %s: %s", self.path, type(err).__name__, err)
            return
        if not self.curves:
            log.info("%s has no train/loss or val/loss rows: %s not written", source, self.path)
        else:
            log.info("wrote %s (%s against the optimizer step)", self.path, " and ".join(self.curves))
