"""Lightning callbacks of our own (everything else comes from Lightning)."""

from hf_lightning.callbacks.hf_export import HFExport
from hf_lightning.callbacks.loss_plot import LossPlot

__all__ = ["HFExport", "LossPlot"]
