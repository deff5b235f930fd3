"""The rank starter: one process imports a rank's module once and forks every rank of a launch from it.

A rank's Python start-up is mostly imports: PyTorch with its distributed and DTensor packages costs about
2.4 s of CPU per process on this project's 2-core machine, more than most of the executor's test runs
train. The starter pays it once per launch and forks the ranks, which then share those pages until they
write them (copy-on-write): the preloading fork server of Python's multiprocessing, for processes that each
need a session, an environment and a log of their own, as advisor.runtime.launch starts them.

Nothing runs in the starter before the forks but imports: no thread pool, device, process group or random
draw (each rank creates those itself, as a fresh process would). Importing PyTorch initialises neither CUDA
nor OpenMP's threads, so forking after it is what PyTorch's own DataLoader workers do. The OpenMP thread count
is read when the library loads, so the starter runs with the ranks' OMP_NUM_THREADS.

``python -m advisor.runtime.starter FILE``, FILE a JSON object written by the launcher:

* ``module``: the module each rank runs as ``__main__`` (``python -m module``); the starter imports it and
  then every module it names in its ``PRELOAD`` tuple, before forking;
* ``ranks``: per rank, ``argv`` (the module's arguments), ``env_set`` and ``env_unset`` (how its environment
  differs from the starter's: RANK, LOCAL_RANK) and ``log`` (the file its stdout and stderr go to);
* ``status``: a folder where the starter writes ``rank<R>.pid`` when rank R starts and ``rank<R>.exit``
  (its exit code, negative for the signal that ended it, as subprocess reports it) when it ends;
* ``remove_if_orphaned``: whether that folder is the launch's temporary folder, which the starter removes
  when the launcher has died without removing it (SIGKILL, the out-of-memory killer).

Each rank starts a session of its own (so it and what it starts can be signalled as one group) and is told
the starter's pid as the parent its watchdog watches (advisor.runtime.rank). The starter exits when every
rank has ended. When its own launcher has gone (ADVISOR_EXECUTOR_PARENT_PID in its environment) it stops
the ranks (SIGKILL to their groups), waits for them, removes the temporary folder and exits; past its
deadline it stops them and exits (the launcher, still there, reports it).
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import shutil
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import NoReturn

from advisor.runtime.files import write_atomic

POLL_S = 0.05
# how long past the launcher's deadline the starter stays for ranks that have not ended (their own watchdogs
# leave 5 s after it)
LINGER_S = 10.0


def pid_file(status: Path, rank: int) -> Path:
    return status / f"rank{rank}.pid"


def exit_file(status: Path, rank: int) -> Path:
    return status / f"rank{rank}.exit"


def preload(module: str) -> None:
    """Import the rank module and what it names in PRELOAD (what its main imports when it runs)."""
    mod = importlib.import_module(module)
    for name in getattr(mod, "PRELOAD", ()):
        importlib.import_module(name)


def _run_rank(module: str, rank: dict) -> NoReturn:
    """In the forked child: a session of its own, its environment and log, then the module as ``__main__``."""
    try:
        os.setsid()
        log = os.open(rank["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        for key in rank["env_unset"]:
            os.environ.pop(key, None)
        os.environ.update(rank["env_set"])
        os.environ["ADVISOR_EXECUTOR_PARENT_PID"] = str(os.getppid())
    except BaseException:
        traceback.print_exc()
        os._exit(1)
    run_as_main(module, rank["argv"])


def run_as_main(module: str, argv: list[str]) -> NoReturn:
    """In a forked child: the module as ``__main__`` with ``argv``, as ``python -m module`` runs it once its
    imports are made, and the end a fresh interpreter has: the exit code, a message exit's text on stderr (code
    1), an uncaught exception's traceback (code 1)."""
    code = 1
    try:
        sys.argv = [module, *argv]
        sys.modules.pop(module, None)       # run afresh as __main__, as ``python -m`` would (its imports stay)
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            sys.stderr.write(f"{exc.code}\n")
    except BaseException:       # what an uncaught exception does to a fresh interpreter: the traceback, code 1
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _stop(pids: list[int]) -> None:
    """SIGKILL each rank's group and reap the ranks."""
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for pid in pids:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        sys.stderr.write("usage: python -m advisor.runtime.starter FILE (written by advisor.runtime.launch)\n")
        return 2
    job = json.loads(Path(argv[0]).read_text())
    module, status = job["module"], Path(job["status"])
    launcher = os.environ.get("ADVISOR_EXECUTOR_PARENT_PID")
    deadline = os.environ.get("ADVISOR_EXECUTOR_DEADLINE")
    preload(module)
    pids: dict[int, int] = {}            # pid -> rank
    for r, rank in enumerate(job["ranks"]):
        sys.stdout.flush()      # nothing of the starter's own output is written twice
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _run_rank(module, rank)
        pids[pid] = r
        write_atomic(pid_file(status, r), str(pid), what="a rank's pid")
    while pids:
        pid, wait_status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            gone = launcher is not None and os.getppid() != int(launcher)
            late = deadline is not None and time.time() > float(deadline) + LINGER_S
            if gone or late:
                _stop(list(pids))
                if gone and job.get("remove_if_orphaned"):
                    shutil.rmtree(status, ignore_errors=True)
                return 3
            time.sleep(POLL_S)
            continue
        r = pids.pop(pid, None)
        if r is not None:
            write_atomic(exit_file(status, r), str(os.waitstatus_to_exitcode(wait_status)), what="a rank's exit code")
    return 0


if __name__ == "__main__":
    sys.exit(main())
