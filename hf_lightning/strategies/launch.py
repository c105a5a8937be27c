"""Multirun x DDP: refuse the combination that Lightning's script launcher cannot survive.

Lightning starts ranks 1..N-1 of a DDP/FSDP/DeepSpeed job by re-running the script's command line
(``_SubprocessScriptLauncher``; with Hydra it appends ``hydra.run.dir=...``). Under ``-m`` that command line
is the whole sweep: each child would start a sweep of its own, and the sweep's next job would find the first
job's ``LOCAL_RANK`` in the environment and wait forever for ranks that never start. A sweep over
multi-process jobs needs a launcher that starts the ranks itself: ``hydra/launcher=slurm`` (submitit, one
SLURM task per device; Lightning's SLURM environment then launches nothing), or ``torchrun`` around single
runs.

The same launcher leaves the rendezvous variables it wrote in rank 0's environment (Lightning relies on them
to not relaunch at a later ``trainer.test``); after a one-process run, where nothing is relaunched, our
strategies put them back (:func:`restore_rendezvous`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from hf_lightning.compat import uses_script_launcher
from hf_lightning.core.errors import ConfigError

# what Lightning's script launcher and a distributed strategy's set-up write into the process's environment
RENDEZVOUS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")


def rendezvous_variables() -> dict[str, str | None]:
    """The :data:`RENDEZVOUS` variables as they are now (``None`` for an absent one)."""
    return {key: os.environ.get(key) for key in RENDEZVOUS}


def restore_rendezvous(saved: dict[str, str | None], world_size: int) -> None:
    """Put the :data:`RENDEZVOUS` variables back as ``saved`` after a one-process run (``world_size`` 1):
    left behind, a later HF ``Trainer`` in the process (accelerate reads ``LOCAL_RANK``) or another
    Lightning run would take them for a world that does not exist. Nothing for several processes, whose
    rank 0 needs them to not relaunch its ranks at a later ``trainer.validate``/``test``."""
    if world_size != 1:
        return
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def relaunches_command_line(trainer: Any) -> bool:
    """Whether ``trainer.fit`` will re-execute ``sys.argv`` to start the other ranks."""
    strategy = trainer.strategy
    if not uses_script_launcher(strategy):
        return False
    return not strategy.cluster_environment.creates_processes_externally


def refuse_multirun_relaunch(trainer: Any, multirun: bool) -> None:
    """Raise :class:`ConfigError` in a Hydra multirun whose job would relaunch the command line.

    Raises:
        ConfigError: the message names the launcher to use instead.
    """
    if not (multirun and relaunches_command_line(trainer)):
        return
    raise ConfigError(
        f"multirun (-m) with a {trainer.world_size}-process strategy ({type(trainer.strategy).__name__}): "
        "Lightning starts the other ranks by re-running the command line, -m and the sweep included. "
        "Sweep multi-process jobs with hydra/launcher=slurm (submitit: one SLURM task per device, so "
        "Lightning launches nothing), or run each setting as a single run "
        "(python -m hf_lightning.train ... without -m); single-process jobs (trainer.devices=1) sweep fine"
    )


def other_rank_overrides(args: list[str], environ: Mapping[str, str] | None = None) -> list[str]:
    """Hydra overrides for rank > 0 of a job whose ranks a cluster launcher started (torchrun, SLURM's
    ``srun``, or ``NODE_RANK`` set by hand on each machine), so they share rank 0's run folder as Lightning's
    own DDP children do (``_hydra_subprocess_cmd``): the log goes to ``train_rank_N.log``
    (``train_node_N.log`` when only ``NODE_RANK`` is known), and ``.hydra/`` is left to rank 0. Nothing for
    rank 0, a single process, or a command line that already names ``hydra.job.name`` (Lightning's children).

    Returns:
        ``["hydra.job.name=train_rank_1", "hydra.output_subdir=null"]`` or ``[]``.
    """
    env = os.environ if environ is None else environ
    if any(a.startswith(("hydra.job.name=", "hydra.output_subdir=")) for a in args):
        return []
    for key, prefix in (
        ("RANK", "train_rank_"),
        ("SLURM_PROCID", "train_rank_"),
        ("NODE_RANK", "train_node_"),
    ):
        value = env.get(key, "")
        if value.isdigit():
            if int(value) == 0:
                return []
            return [f"hydra.job.name={prefix}{value}", "hydra.output_subdir=null"]
    return []
