"""Lightning callbacks of our own (everything else comes from Lightning)."""

from hf_lightning.callbacks.hf_export import HFExport
from hf_lightning.callbacks.loss_plot import LossPlot
from hf_lightning.callbacks.nonfinite import NonFiniteGuard
from hf_lightning.callbacks.preemption import Preemption
from hf_lightning.callbacks.resume_state import ResumeState
from hf_lightning.callbacks.throughput import Throughput

__all__ = ["HFExport", "LossPlot", "NonFiniteGuard", "Preemption", "ResumeState", "Throughput"]
