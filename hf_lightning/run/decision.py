"""The facts every rank of a run must share, decided once by rank 0 and handed to the ranks it launches.

Lightning's DDP/FSDP launcher (``_SubprocessScriptLauncher``) starts ranks 1..N-1 from inside rank 0's
``trainer.fit`` by re-running the command line into rank 0's run folder. By then rank 0 has decided what the
run is (resume or not, from which checkpoint, whether anything is left to train) and changed the folder:
Hydra has rewritten ``.hydra/config.yaml`` with this command's run length, a resume's previous settings are
copied to ``.hydra/previous-N/``. A launched rank that decided again from those files could decide otherwise
(a finished run continued with a larger ``trainer.max_steps`` looks finished once the saved config holds the
new length), leave, and rank 0 would wait for it in the process group's set-up for ever.

So nothing is re-derived: rank 0 puts its decision (:class:`RunDecision`) into its environment before ``fit``
(:func:`hand_on`); the launcher copies that environment into each rank it starts, and a launched rank takes
the decision as it is (:func:`agreed_decision`) instead of checking the folder again. The environment is the
channel because the launcher hands it over unchanged before any process group exists (a collective needs
every rank inside ``fit`` already; a file in the folder could be rewritten, or be a previous command's).
Ranks that a cluster launcher starts (torchrun, SLURM) start together with rank 0, get no decision, and check
the folder themselves.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass

from hf_lightning.run.lock import launched_as_other_rank

ENV = "HF_LIGHTNING_RUN_DECISION"


@dataclass(frozen=True)
class RunDecision:
    """What rank 0 decided for a run that trains.

    Attributes:
        run_dir: the run folder (absolute).
        ckpt_path: ``ckpt_path`` as given (``last``, ``best``, a file, or ``None``).
        resolved: the checkpoint the run resumes (or loads the weights of) from; ``None`` starts at step 0.
        weights_only: ``resume_weights_only``.
    """

    run_dir: str
    ckpt_path: str | None
    resolved: str | None
    weights_only: bool


@contextlib.contextmanager
def hand_on(decision: RunDecision) -> Iterator[None]:
    """Put ``decision`` into this process's environment (:data:`ENV`) for the ranks ``fit`` launches; the
    previous value is put back on exit."""
    before = os.environ.get(ENV)
    os.environ[ENV] = json.dumps(asdict(decision))
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = before


def agreed_decision(run_dir: str, ckpt_path: str | None, weights_only: bool) -> RunDecision | None:
    """Rank 0's decision for this run, on a rank that rank 0 launched; ``None`` on rank 0, in a single
    process, on a rank a cluster launcher started, or when the decision handed on is of another run folder or
    command (then this rank checks the folder itself)."""
    raw = os.environ.get(ENV)
    if not raw or not launched_as_other_rank():
        return None
    try:
        decision = RunDecision(**json.loads(raw))
    except (TypeError, ValueError):
        return None
    same = (
        decision.run_dir == os.path.abspath(run_dir)
        and decision.ckpt_path == (None if ckpt_path is None else str(ckpt_path))
        and decision.weights_only == bool(weights_only)
    )
    return decision if same else None
