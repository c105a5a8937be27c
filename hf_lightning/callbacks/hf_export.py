"""Export the trained model and its tokenizer with ``save_pretrained`` at the end of training."""

from __future__ import annotations

import logging
import os

import lightning as L

log = logging.getLogger(__name__)


class HFExport(L.Callback):
    """Write ``dirpath/`` with ``model.save_pretrained`` and ``tokenizer.save_pretrained`` (rank 0 only).

    The folder loads with ``AutoModelForCausalLM.from_pretrained`` / ``AutoTokenizer.from_pretrained`` and
    keeps the tokenizer's chat template.

    Args:
        dirpath: the export folder (created).
    """

    def __init__(self, dirpath: str) -> None:
        self.dirpath = dirpath

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        if getattr(pl_module, "preempted", False):
            log.warning("training was stopped by a signal: no hf_model/ export until the run finishes")
            return
        os.makedirs(self.dirpath, exist_ok=True)
        pl_module.model.save_pretrained(self.dirpath)
        tokenizer = getattr(pl_module, "tokenizer", None)
        if tokenizer is not None:
            tokenizer.save_pretrained(self.dirpath)
        log.info("exported the model and tokenizer to %s", self.dirpath)
