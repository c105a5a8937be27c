"""``hf-lightning train|evaluate|inspect|migrate [ARGS]``: the console script, one name for the four entry
points.

Each subcommand runs its module exactly as ``python -m`` runs it (``train`` is ``python -m
hf_lightning.train``, ``inspect`` is ``python -m hf_lightning.inspect_batch``, ...): the module is executed as
``__main__`` with the rest of the command line as its ``sys.argv[1:]``, so Hydra's own options (``--help``,
``--hydra-help``, ``--cfg job``, ``-m``), the one-line errors, the exit statuses and Lightning's re-run of the
command line for the other DDP ranks (``python -m <module> ARGS``, read from ``__main__.__spec__``) are those
of ``python -m``.

Hydra's tab completion: ``eval "$(hf-lightning -sc install=bash)"`` installs Hydra's bash completion for
``hf-lightning``. Hydra's completion function asks the program itself (``hf-lightning -sc query=bash``, the
line in ``COMP_LINE``); here the subcommand is read from that line and the query is answered by the
subcommand's Hydra app with the line it would see under ``python -m``, so ``hf-lightning train
+experiment=s<TAB>`` completes as Hydra completes ``python -m hf_lightning.train``. The subcommand word itself
completes to the four names.
"""

from __future__ import annotations

import os
import runpy
import shlex
import sys

#: subcommand -> the module ``python -m`` runs
COMMANDS = {
    "train": "hf_lightning.train",
    "evaluate": "hf_lightning.evaluate",
    "inspect": "hf_lightning.inspect_batch",
    "migrate": "hf_lightning.migrate",
}
#: the subcommands that are Hydra apps (the others have no Hydra completion)
HYDRA_COMMANDS = ("train", "evaluate", "inspect")
PROG = "hf-lightning"

USAGE = f"""usage: {PROG} COMMAND [ARGS]

commands (each is the python -m command named beside it, with the same arguments):
  train      fine-tune, evaluate, checkpoint, export      python -m hf_lightning.train
  evaluate   evaluate a model or checkpoint on a file     python -m hf_lightning.evaluate
  inspect    print the first batch the model receives     python -m hf_lightning.inspect_batch
  migrate    an HF TrainingArguments -> a command line    python -m hf_lightning.migrate

  {PROG} train +experiment=sft          the default run
  {PROG} train --help                   the config groups and keys (Hydra's help)
  eval "$({PROG} -sc install=bash)"     tab completion in bash (Hydra's)"""


def _completion_query() -> int:
    """Answer Hydra's bash completion query (``-sc query=bash``) for the line in ``COMP_LINE``."""
    line = os.environ.get("COMP_LINE", "")
    try:
        words = shlex.split(line)
    except ValueError:
        words = line.split()
    typing_command = len(words) < 2 or (len(words) == 2 and not line.endswith(" "))
    if typing_command:
        start = words[1] if len(words) == 2 else ""
        print(" ".join(c for c in COMMANDS if c.startswith(start)))
        return 0
    if words[1] not in HYDRA_COMMANDS:
        return 0
    # the line Hydra's app would see: the program name, then what follows the subcommand
    rest = line.split(words[1], 1)[1]
    os.environ["COMP_LINE"] = PROG + rest
    return _run(words[1], ["-sc", "query=bash"], as_main=False)


def _run(name: str, args: list[str], as_main: bool = True) -> int:
    """Run the subcommand's module as ``__main__`` with ``args``; returns its exit status.

    ``as_main``: the module also stands in ``sys.modules["__main__"]`` while it runs (runpy's ``alter_sys``),
    which Lightning reads to start the other ranks as ``python -m <module>``; without it ``sys.argv[0]``
    stays ``hf-lightning``, the name Hydra's completion script registers.
    """
    sys.argv = [PROG, *args]
    try:
        runpy.run_module(COMMANDS[name], run_name="__main__", alter_sys=as_main)
    except SystemExit as stop:
        code = stop.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        print(code, file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    """The console script. Returns the exit status (2 for an unknown subcommand, with one
    ``hf_lightning: error:`` line)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    if argv[0] in ("-sc", "--shell-completion") and len(argv) == 2:
        if argv[1].startswith("query="):
            return _completion_query()
        # install= / uninstall=: Hydra's script, for this program's name
        return _run("train", argv, as_main=False)
    if argv[0] in ("-V", "--version"):
        from hf_lightning import __version__

        print(f"hf_lightning {__version__}")
        return 0
    if argv[0] not in COMMANDS:
        print(
            f"hf_lightning: error: unknown command {argv[0]!r}: the commands are {', '.join(COMMANDS)} "
            f"({PROG} --help lists them)",
            file=sys.stderr,
        )
        return 2
    return _run(argv[0], argv[1:])


if __name__ == "__main__":
    sys.exit(main())
