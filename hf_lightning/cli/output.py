"""What the command-line entry points print: only lines a user needs, once, from rank 0.

Installed by ``python -m hf_lightning.train`` / ``evaluate`` at start (:func:`quiet_known_noise`) and once
Hydra has configured logging (:func:`speak_for_the_run`); never at library import time, so a Python user of
``HFDataModule`` / ``HFLightningModule`` keeps every library message.

- Lightning's "💡 Tip" advertisements (litlogger, litmodels): nothing to act on.
- transformers' "We strongly recommend passing in an `attention_mask`": packed and padding-free batches carry
  ``position_ids`` without an ``attention_mask`` on purpose (the positions separate the documents).
- Lightning's "Checkpoint directory ... exists and is not empty": a fresh run into a folder that holds a run
  is refused before any work (:mod:`hf_lightning.run.folder`), so it can only be a resume, where it is
  expected.
- Ranks other than 0 of a multi-process run print errors only: rank 0 speaks for the run on the console
  (Lightning relaunches the command line per rank, and every rank would print each line); each rank's own log
  file keeps its lines.
- Progress bars (the training bar, ``datasets``' and ``transformers``' bars) draw on a terminal only: written
  into a file they are megabytes of carriage returns.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import warnings
from typing import Any

TIP_PREFIX = "💡 Tip:"
ATTENTION_MASK_ADVICE = "We strongly recommend passing in an `attention_mask`"


class _DropMessages(logging.Filter):
    """Drops records whose message starts with one of ``prefixes``."""

    def __init__(self, *prefixes: str) -> None:
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.getMessage()).startswith(self.prefixes)


def rank() -> int:
    """This process's global rank as the launcher set it (``RANK``, ``LOCAL_RANK``, ``SLURM_PROCID``); 0
    without."""
    from hf_lightning.compat import launcher_rank  # the env keys Lightning itself reads

    return launcher_rank()


_IMPORTED = time.perf_counter()


def command_seconds() -> float:
    """Seconds since this process started (what ``time`` reports for the command; Linux reads ``/proc``),
    else since this module was imported."""
    try:
        with open("/proc/self/stat") as fh:
            started_ticks = float(fh.read().rsplit(")", 1)[1].split()[19])  # field 22: starttime
        with open("/proc/uptime") as fh:
            uptime = float(fh.read().split()[0])
        return max(uptime - started_ticks / os.sysconf("SC_CLK_TCK"), 0.0)
    except (OSError, ValueError, IndexError):
        return time.perf_counter() - _IMPORTED


_job = {"start": None, "first": True, "by_cli": False}


def begin_job(cli: bool = False) -> None:
    """Start the clock of one training job. The command line's first job counts from the process start (the
    imports and the config are part of what the user waits for); a sweep's later jobs and a ``train(cfg)``
    call from Python count from here. ``train()`` calls it unless ``main`` already did for this job."""
    if not cli and _job["by_cli"]:
        _job["by_cli"] = False  # main began this job
        return
    before = command_seconds() if cli and _job["first"] else 0.0
    _job.update(start=time.perf_counter() - before, first=False, by_cli=cli)


def job_seconds() -> float:
    """Seconds since :func:`begin_job` (the done line's wall time)."""
    start = _job["start"]
    return time.perf_counter() - start if start is not None else command_seconds()


def stdout_is_terminal() -> bool:
    return bool(getattr(sys.stdout, "isatty", lambda: False)())


def quiet_known_noise() -> None:
    """Warning and log filters for the messages listed in the module docstring (entry points only)."""
    warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(_DropMessages(TIP_PREFIX))
    logging.getLogger("transformers.modeling_utils").addFilter(_DropMessages(ATTENTION_MASK_ADVICE))
    if not stdout_is_terminal():
        _progress_bars_off()


def _progress_bars_off() -> None:
    """``datasets``' ``Map`` bars and ``transformers``' ``Writing model shards`` bar, off (no terminal)."""
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        import datasets

        datasets.disable_progress_bars()
    except ImportError:  # pragma: no cover - a dependency
        pass
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def speak_for_the_run() -> None:
    """Ranks other than 0 print errors only: their console handlers go to ERROR (call it after Hydra
    configured logging). Their log files (``train_rank_N.log``, :mod:`hf_lightning.strategies.launch`) keep
    every line."""
    if rank() != 0:
        for handler in logging.getLogger().handlers:
            if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
                handler.setLevel(logging.ERROR)
        warnings.filterwarnings("ignore")


def progress_bar_wanted(given: bool, explicit: bool) -> bool:
    """The training bar: as configured on a terminal; off when stdout is not one, unless the command line set
    ``trainer.enable_progress_bar=true`` itself."""
    return bool(given) and (explicit or stdout_is_terminal())


def progress_bar(trainer_cfg: Any, logger: logging.Logger) -> bool:
    """``trainer.enable_progress_bar`` of a Hydra job: off when stdout is not a terminal unless the command
    line gave it (said at INFO); as configured outside a Hydra job."""
    from hf_lightning.config.run_length import command_line_overrides, given_keys

    given = bool(trainer_cfg.get("enable_progress_bar", True))
    overrides = command_line_overrides()
    explicit = overrides is None or "trainer.enable_progress_bar" in given_keys(overrides)
    bar = progress_bar_wanted(given, explicit)
    if given and not bar:
        logger.info(
            "no progress bar: the output is not a terminal (trainer.enable_progress_bar=true draws it "
            "anyway); the log lines show the progress"
        )
    return bar


# notes said before the job's log file existed (Hydra's run callbacks), for :func:`log_early_notes`
_EARLY_NOTES: list[str] = []


def note(message: str, logger: logging.Logger) -> None:
    """``hf_lightning: note: MESSAGE`` once on stderr; the message goes into the log file (``train.log``)
    only, at INFO (information, not a warning): a log record would reach Hydra's console handler too and be
    printed a second time (``[HYDRA] MESSAGE`` before the job starts). Said before the job's log file exists
    (a Hydra callback), it is written there by :func:`log_early_notes`."""
    print(f"hf_lightning: note: {message}", file=sys.stderr)
    if _file_handlers():
        _to_log_files(logger, logging.INFO, message)
    else:
        _EARLY_NOTES.append(message)


def log_early_notes(logger: logging.Logger) -> None:
    """Write the notes :func:`note` said before the job's log file existed into it, once (call it when Hydra
    has configured the job's logging)."""
    while _EARLY_NOTES:
        _to_log_files(logger, logging.INFO, _EARLY_NOTES.pop(0))


def _to_log_files(logger: logging.Logger, level: int, message: Any) -> None:
    record = logger.makeRecord(logger.name, level, __file__, 0, "%s", (message,), None)
    for handler in _file_handlers():
        if record.levelno >= handler.level:
            handler.handle(record)


def report_error(err: BaseException, logger: logging.Logger) -> None:
    """``hf_lightning: error: ...`` once on stderr; the same line goes into the log file (``train.log``)
    only."""
    print(f"hf_lightning: error: {err}", file=sys.stderr)
    _to_log_files(logger, logging.ERROR, err)


def _file_handlers() -> list[Any]:
    return [h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)]
