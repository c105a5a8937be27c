"""Lightning callbacks of our own (everything else comes from Lightning)."""

from hf_lightning.callbacks.hf_export import HFExport
from hf_lightning.callbacks.nonfinite import NonFiniteGuard

__all__ = ["HFExport", "NonFiniteGuard"]
