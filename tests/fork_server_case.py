"""A script for ``tests/unit/test_fork_server.py``: ``python -m tests.fork_server_case ACTION`` prints what a
``-m`` run sees of itself, then ends as ``ACTION`` says (``ok``, ``exit3``, ``raise``, ``interrupt``,
``kill``, ``term``, ``sleep``)."""

import json
import os
import signal
import sys
import time

import __main__

seen = {"argv": sys.argv, "cwd": os.getcwd(), "path0": sys.path[0], "spec": __main__.__spec__.name}
print(json.dumps(seen))
print("to stderr", file=sys.stderr)
action = sys.argv[1]
if action == "exit3":
    sys.exit(3)
if action == "raise":
    raise ValueError("raised")
if action == "interrupt":
    raise KeyboardInterrupt
if action in ("kill", "term"):
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL if action == "kill" else signal.SIGTERM)
if action == "sleep":
    time.sleep(60)
