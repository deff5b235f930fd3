"""Test helper: `python -m advisor ...` as a process of its own, without paying its imports every time.

A test that runs the command line many times as a real process (its exit status, its stdout and stderr, no
traceback) pays about 0.35 s of imports per run here, most of a small command's cost. ``run_advisor`` hands
the command to a zygote: one process per test process and environment that has made the imports
`python -m advisor` makes (advisor.cli) and forks one child per command. The child is a process of its own,
with its own stdin (empty), stdout and stderr (files) and exit status, and runs what `python -m advisor` runs
after its imports (advisor/__main__.py, through advisor.runtime.starter.run_as_main, as the executor's rank
starter runs its ranks). Environment variables read at import (the terminal width rich reads from COLUMNS)
are the zygote's, so each environment gets its own zygote (the test pytest names in PYTEST_CURRENT_TEST aside).
"""

from __future__ import annotations

import atexit
import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_ZYGOTE = r"""
import json, os, sys, traceback
import advisor.cli                      # the imports `python -m advisor` makes before it runs
from advisor.runtime.starter import run_as_main
protocol = os.fdopen(os.dup(1), "w")    # the answers; fd 1 becomes each child's stdout
for line in sys.stdin:
    ask = json.loads(line)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        try:
            os.setpgid(0, 0)
            os.chdir(ask["cwd"])
            for fd, (path, flags) in enumerate(((os.devnull, os.O_RDONLY),
                                                (ask["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                                                (ask["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC))):
                os.dup2(os.open(path, flags, 0o600), fd)
        except BaseException:
            traceback.print_exc()
            os._exit(1)
        run_as_main("advisor.__main__", ask["argv"])      # what `python -m advisor` runs: the package's __main__
    protocol.write(json.dumps({"pid": pid}) + "\n")
    protocol.flush()
    _, status = os.waitpid(pid, 0)
    protocol.write(json.dumps({"code": os.waitstatus_to_exitcode(status)}) + "\n")
    protocol.flush()
"""

_zygotes: dict[tuple, subprocess.Popen] = {}


def _zygote(env: dict[str, str]) -> subprocess.Popen:
    # pytest names the running test in PYTEST_CURRENT_TEST; advisor reads only whether it is set (test hooks)
    key = tuple(sorted((k, "set" if k == "PYTEST_CURRENT_TEST" else v) for k, v in env.items()))
    z = _zygotes.get(key)
    if z is None or z.poll() is not None:
        z = _zygotes[key] = subprocess.Popen([sys.executable, "-c", _ZYGOTE], stdin=subprocess.PIPE,
                                             stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    return z


def _answer(z: subprocess.Popen, timeout_s: float) -> dict:
    with selectors.DefaultSelector() as sel:
        sel.register(z.stdout, selectors.EVENT_READ)
        if not sel.select(timeout_s):
            raise TimeoutError
    line = z.stdout.readline()
    if not line:
        raise RuntimeError(f"the advisor zygote ended (exit status {z.wait()})")
    return json.loads(line)


def run_advisor(args: list[str], env: dict[str, str], cwd: Path = ROOT,
                timeout: float = 120) -> subprocess.CompletedProcess:
    """What ``subprocess.run([python, "-m", "advisor", *args], capture_output=True, text=True)`` gives."""
    z = _zygote(env)
    with tempfile.TemporaryDirectory(prefix="advisor-cli-") as scratch:
        out, err = Path(scratch, "out"), Path(scratch, "err")
        z.stdin.write(json.dumps({"argv": list(args), "cwd": str(cwd), "out": str(out), "err": str(err)}) + "\n")
        z.stdin.flush()
        pid = _answer(z, timeout)["pid"]
        try:
            code = _answer(z, timeout)["code"]
        except TimeoutError:
            os.killpg(pid, signal.SIGKILL)
            _answer(z, timeout)
            raise subprocess.TimeoutExpired([sys.executable, "-m", "advisor", *args], timeout) from None
        return subprocess.CompletedProcess([sys.executable, "-m", "advisor", *args], code,
                                           out.read_text(), err.read_text())


@atexit.register
def _close() -> None:
    for z in _zygotes.values():
        if z.poll() is None:
            z.stdin.close()
            try:
                z.wait(timeout=10)
            except subprocess.TimeoutExpired:
                z.kill()
