"""Errors that name the culprit.

Every failure caused by the user's input (a file, a field, a config key, a model folder) is raised as
a subclass of :class:`HFLightningError`. The command-line entry points print its message on one line and
exit with status 2 instead of a traceback.
"""


class HFLightningError(Exception):
    """Base class: a problem with the user's input, explained in the message."""


class DataError(HFLightningError, ValueError):
    """A data source is missing, unreadable, empty or lacks the expected fields."""


class ConfigError(HFLightningError, ValueError):
    """A config key is unknown or holds a value that cannot work."""


class ModelError(HFLightningError, ValueError):
    """A model or tokenizer folder is missing or incomplete."""


class TrainingError(HFLightningError, RuntimeError):
    """Training hit a fault it cannot continue through: a non-finite loss or gradient, out of memory, or a
    checkpoint that cannot be written. The message says what was kept and what to change."""


class UnsafeCheckpointError(ConfigError):
    """A checkpoint, weights or state file names a pickled type outside the allow-list of what our
    checkpoints hold (:mod:`hf_lightning.checkpointing.safe_load`): it is refused before any of it is
    unpickled, since unpickling it could run code."""
