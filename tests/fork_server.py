"""``python -m PACKAGE.MODULE ARGS`` for the tests, started from a process that has already imported
``PACKAGE``.

A CLI run starts by importing torch, Lightning, transformers, datasets and Hydra (``import hf_lightning``),
which costs more CPU than a tiny run's training. :func:`run_module` keeps one server process per
``(package, environment)``: a plain ``python -c`` that loads this file by its path and calls :func:`main`,
started with that environment from an empty folder. It imports ``PACKAGE`` as ``python -m PACKAGE.MODULE``
would before it runs ``MODULE`` (same interpreter, ``sys.path``, environment), records what that import
wrote to stdout and stderr, then forks one child per run. The child moves to the run's working folder and
puts it first on ``sys.path`` (as ``-m`` does); where that folder holds a module the server imported from
elsewhere (a ``python -m`` started there would import that one), the run is a plain subprocess instead. The
child writes the recorded output first, runs ``MODULE`` with :func:`runpy.run_module` as ``__main__``
(``sys.argv[0]`` its file, as ``-m`` sets it) and ends through the interpreter's normal exit (``SystemExit``
codes, a traceback and status 1 for an uncaught exception, death by SIGINT for an uncaught
``KeyboardInterrupt``, atexit handlers, non-daemon threads joined). The test gets a
:class:`subprocess.CompletedProcess` with the child's exit status (``-9`` for SIGKILL), stdout and stderr,
or :class:`subprocess.TimeoutExpired` after the child was killed.

What a fresh process has and a fork does not: fresh seeds of numpy's and torch's default generators (Python's
``random`` is reseeded at fork by Python itself); the runs seed what they use. ``HF_LIGHTNING_TEST_FORK=0``
in the test process's environment runs every call as a plain ``python -m`` subprocess instead.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence

# the server's command: this file loaded by its path (nothing added to sys.path; `-c` puts the working folder
# first, as `-m` does, made absolute as `-m` makes it), then main(PACKAGE)
_START = (
    "import importlib.util, os, sys; sys.path[0] = os.getcwd(); "
    "spec = importlib.util.spec_from_file_location('_fork_server', sys.argv[1]); "
    "server = importlib.util.module_from_spec(spec); spec.loader.exec_module(server); "
    "server.main(sys.argv[2])"
)
_IDLE_SERVERS = 2  # idle servers kept for other environments than the one asked for (each holds the imports)


class _Server:
    """One server process (see :data:`_START`); serves one run at a time."""

    def __init__(self, package: str, env: Mapping[str, str]) -> None:
        self.key = (package, tuple(sorted(env.items())))
        self.home = tempfile.mkdtemp(prefix="fork_server")  # an empty start folder: nothing on it to import
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _START, __file__, package],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            bufsize=0,  # unbuffered: a line read is all that is taken from the pipe, select sees the rest
            stderr=subprocess.DEVNULL,
            cwd=self.home,
            env=dict(env),
        )
        self.busy = False
        self.child: int | None = None  # the run under way

    def run(
        self, module: str, args: Sequence[str], cwd: str, timeout: float | None
    ) -> subprocess.CompletedProcess | None:
        """The run's outcome, or ``None`` where ``cwd`` holds a module or package that a ``python -m``
        started there would import in place of one the server imported."""
        with tempfile.TemporaryDirectory(prefix="fork_server") as folder:
            out, err = os.path.join(folder, "stdout"), os.path.join(folder, "stderr")
            request = {"module": module, "args": list(args), "cwd": cwd, "stdout": out, "stderr": err}
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
            self.timeout = timeout
            deadline = None if timeout is None else time.monotonic() + timeout
            reply = self._reply(deadline)
            if "shadowed" in reply:
                return None
            self.child = reply["pid"]
            status = self._reply(deadline)["status"]
            self.child = None
            with open(out, encoding="utf-8", errors="replace") as fh:
                stdout = fh.read()
            with open(err, encoding="utf-8", errors="replace") as fh:
                stderr = fh.read()
        return subprocess.CompletedProcess([sys.executable, "-m", module, *args], status, stdout, stderr)

    def _reply(self, deadline: float | None) -> dict:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready, _, _ = select.select([self.proc.stdout], [], [], left)
        if not ready:  # the caller kills the run (and this server), as subprocess.run kills its process
            raise subprocess.TimeoutExpired(self.proc.args, self.timeout)
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the fork server for {self.key[0]} ended (status {self.proc.wait()})")
        return json.loads(line)

    def close(self, kill: bool = False) -> None:
        if self.child is not None and kill:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.child, 9)
        if kill:
            self.proc.kill()
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.home, ignore_errors=True)


_servers: list[_Server] = []
_lock = threading.Lock()


def _take(package: str, env: Mapping[str, str]) -> _Server:
    key = (package, tuple(sorted(env.items())))
    with _lock:
        for server in _servers:
            if server.key == key and not server.busy and server.proc.poll() is None:
                server.busy = True
                return server
        idle_elsewhere = [s for s in _servers if s.key != key and not s.busy]
        for server in idle_elsewhere[: max(0, len(idle_elsewhere) - _IDLE_SERVERS + 1)]:
            server.close()
            _servers.remove(server)
        server = _Server(package, env)
        server.busy = True
        _servers.append(server)
        return server


def _release(server: _Server) -> None:
    with _lock:
        server.busy = False
        if server.proc.poll() is not None:
            _servers.remove(server)


@atexit.register
def _close_all() -> None:
    for server in list(_servers):
        server.close()
    _servers.clear()


def run_module(
    module: str, args: Sequence[str], *, env: Mapping[str, str], cwd: str, timeout: float | None = None
) -> subprocess.CompletedProcess:
    """``subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, env=env,
    cwd=cwd, timeout=timeout)``, forked from a server that has imported ``module``'s top package."""
    cwd = os.path.abspath(cwd)
    if os.environ.get("HF_LIGHTNING_TEST_FORK", "1") != "0" and "." in module:
        server = _take(module.split(".", 1)[0], env)
        try:
            done = server.run(module, args, cwd, timeout)
        except BaseException:
            server.close(kill=True)  # its replies may be out of step with the requests now
            raise
        finally:
            _release(server)
        if done is not None:
            return done
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(env),
        cwd=cwd,
    )


# ------------------------------------------------------------------------------------------ the server side
def _import_recorded(package: str) -> tuple[bytes, bytes]:
    """Import ``package`` (and its parents, as ``-m`` does) with fds 1 and 2 sent to files; returns what was
    written."""
    import importlib

    saved = os.dup(1), os.dup(2)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        try:
            importlib.import_module(package)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
        out.seek(0)
        err.seek(0)
        return out.read(), err.read()


def _shadowed(cwd: str) -> list[str]:
    """Imported top-level modules that ``cwd`` (first on ``sys.path`` of a ``python -m`` started there)
    holds elsewhere than where they were imported from."""
    try:
        names = os.listdir(cwd)
    except OSError:
        return []
    found = []
    for name in names:
        top = name.split(".", 1)[0]
        module = sys.modules.get(top)
        if module is None or top == "__main__":
            continue
        where = [getattr(module, "__file__", None) or "", *getattr(module, "__path__", [])]
        if not any(os.path.abspath(w).startswith(os.path.join(cwd, top)) for w in where if w):
            found.append(name)
    return found


def _serve(package: str) -> dict | None:
    """Answer requests on stdin until it closes (returns ``None``); in a forked child, return its request."""
    prelude = _import_recorded(package)
    replies = os.fdopen(os.dup(1), "w")
    requests = os.fdopen(os.dup(0), "r")
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)  # a run reads nothing; its stdin is empty
    os.dup2(null, 1)  # nothing but the replies on the reply pipe
    os.close(null)
    for line in requests:
        request = json.loads(line)
        shadowed = _shadowed(request["cwd"])
        if shadowed:
            replies.write(json.dumps({"shadowed": shadowed}) + "\n")
            replies.flush()
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            requests.close()
            replies.close()
            os.chdir(request["cwd"])
            sys.path[0] = request["cwd"]  # what `python -m` started there puts first
            for fd, name, recorded in ((1, "stdout", prelude[0]), (2, "stderr", prelude[1])):
                target = os.open(request[name], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                os.dup2(target, fd)
                os.close(target)
                os.write(fd, recorded)
            return request
        replies.write(json.dumps({"pid": pid}) + "\n")
        replies.flush()
        _, status = os.waitpid(pid, 0)
        replies.write(json.dumps({"status": os.waitstatus_to_exitcode(status)}) + "\n")
        replies.flush()
    return None


def main(package: str) -> None:
    """The server: serve until stdin closes; in a forked child, run the module as ``python -m`` would (its
    exit is the interpreter's own once this returns)."""
    import runpy

    request = _serve(package)
    if request is not None:
        sys.argv = [sys.argv[0], *request["args"]]
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
