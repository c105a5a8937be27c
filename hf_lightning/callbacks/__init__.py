"""Lightning callbacks of our own (everything else comes from Lightning)."""

from hf_lightning.callbacks.hf_export import HFExport

__all__ = ["HFExport"]
