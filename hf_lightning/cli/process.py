"""What the command-line entry points (``train``, ``evaluate``, ``inspect_batch``) set up for their process.

The library itself installs no process-wide warning filter (an application that imports ``hf_lightning`` keeps
its own); the commands hide the library warnings that are wrong or not actionable for their runs.
"""

from __future__ import annotations

import logging
import warnings

#: ``(message regex, category)`` of the warnings the commands hide, each with the reason
HIDDEN_WARNINGS = (
    # Lightning's batch flattening calls a torch pytree API deprecated in newer torch, once per fit: nothing a
    # user can act on (Lightning's to fix; lightning/pytorch/utilities/_pytree.py)
    (r"`isinstance\(treespec, LeafSpec\)` is deprecated", FutureWarning),
    # peft's get_peft_model reads transformers' deprecated is_gradient_checkpointing (peft/peft_model.py),
    # once per peft=lora run: peft's to fix
    (r"`is_gradient_checkpointing` is deprecated", FutureWarning),
    # Lightning counts log_every_n_steps within an epoch; HFLightningModule logs every n optimizer steps
    # across epochs (HF's logging_steps), so Lightning's warning that short epochs log nothing is wrong here
    (r"The number of training batches \(\d+\) is smaller than the logging interval", Warning),
    # ModelCheckpoint(every_n_train_steps) under manual optimization warns at every save that the checkpoint
    # holds the weights after the optimizer step: for HFLightningModule, which steps once per training batch,
    # that is the checkpoint of that step (HF saves the same), so the warning is wrong here
    (r"Using ModelCheckpoint with manual optimization and every_n_train_steps", UserWarning),
)


#: ``(logger name, message start)`` of the log records the commands hide, each with the reason
HIDDEN_RECORDS = (
    # DeepSpeed logs this WARNING when it is imported on a machine without a GPU, and accelerate and
    # transformers import it whenever it is installed, so every CPU run printed it without asking for
    # DeepSpeed (a run that asks for it on the CPU is told what it runs on by the strategy's own check)
    ("DeepSpeed", "Setting accelerator to CPU"),
)


class _HiddenRecords(logging.Filter):
    def __init__(self, starts: tuple[str, ...]) -> None:
        super().__init__()
        self.starts = starts

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.getMessage()).startswith(self.starts)


def hide_library_warnings() -> None:
    """Install the filters of :data:`HIDDEN_WARNINGS` and :data:`HIDDEN_RECORDS` in this process. Calling it
    again (a Hydra multirun runs each job's ``main`` in the same process) adds nothing:
    ``warnings.filterwarnings`` replaces an equal filter, and a logger keeps one filter of ours."""
    for message, category in HIDDEN_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)
    for name in {name for name, _ in HIDDEN_RECORDS}:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _HiddenRecords) for f in logger.filters):
            logger.addFilter(_HiddenRecords(tuple(start for n, start in HIDDEN_RECORDS if n == name)))
