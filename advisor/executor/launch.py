"""Start one worker process per device on this machine, wait, collect; never hang, never orphan.

Each rank runs in its own process session (so it and anything it starts can be signalled as a
group), with a short process-group timeout and a hard deadline. When a rank exits with an error the
others are usually blocked in a collective: after a short grace period they are terminated
(SIGTERM, then SIGKILL), and the failing rank's error is raised. The workers also exit on their own
when this launcher disappears or the deadline passes.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from advisor.errors import AdvisorError


class ExecutionFailed(AdvisorError):
    """A rank failed or the run timed out (exit code 1)."""

    exit_code = 1


@dataclass(frozen=True)
class LaunchOptions:
    nproc: int
    timeout_s: float = 600.0          # hard limit for the whole launch
    pg_timeout_s: float = 60.0        # torch.distributed process-group timeout
    grace_s: float = 3.0              # after a rank fails, how long the others may take to exit
    backend: str = "auto"
    threads_per_rank: int | None = None
    workdir: str | None = None        # where rank files go (default: a temporary directory)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_env(rank: int, opts: LaunchOptions, port: int, deadline: float) -> dict[str, str]:
    env = dict(os.environ)
    threads = opts.threads_per_rank or max(1, (os.cpu_count() or 1) // opts.nproc)
    src = str(Path(__file__).resolve().parents[2])
    env.update(RANK=str(rank), WORLD_SIZE=str(opts.nproc), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(opts.nproc),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS=str(threads),
               ADVISOR_EXECUTOR_THREADS=str(threads), ADVISOR_EXECUTOR_PG_TIMEOUT_S=str(opts.pg_timeout_s),
               ADVISOR_EXECUTOR_PARENT_PID=str(os.getpid()), ADVISOR_EXECUTOR_DEADLINE=str(deadline),
               PYTHONPATH=src + os.pathsep + env.get("PYTHONPATH", ""))
    return env


def _stop(procs: list[subprocess.Popen], wait_s: float = 2.0) -> None:
    """SIGTERM every rank's process group still running, then SIGKILL what is left."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = [p for p in procs if p.poll() is None]
        for p in alive:
            try:
                os.killpg(p.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        end = time.time() + wait_s
        while any(p.poll() is None for p in alive) and time.time() < end:
            time.sleep(0.05)
    for p in procs:
        if p.poll() is None:
            p.wait(timeout=5)


def _tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


# Errors a rank raises only because a peer went away: the root cause is elsewhere.
_PEER_ERRORS = ("Connection reset", "Connection closed", "Broken pipe", "gloo", "NCCL", "timed out", "Timeout")


def _root_cause(out: Path, ranks: list[int]) -> tuple[int, dict] | None:
    """The failing rank whose error is not a consequence of another's: errors that do not look
    like a lost peer first, then the earliest written."""
    found = []
    for rank in ranks:
        err = out / f"rank{rank}.error.json"
        if err.exists():
            info = json.loads(err.read_text())
            secondary = any(marker in info["error"] for marker in _PEER_ERRORS)
            found.append((secondary, err.stat().st_mtime_ns, rank, info))
    if not found:
        return None
    _, _, rank, info = min(found, key=lambda x: x[:3])
    return rank, info


def _failure_message(out: Path, failed: list[int], timed_out: bool, timeout_s: float) -> str:
    cause = _root_cause(out, sorted(set(failed) | {int(p.name[4:-11]) for p in out.glob("rank*.error.json")}))
    if cause is not None:
        rank, info = cause
        return f"rank {rank} failed: {info['error']}\n{info['traceback']}"
    if timed_out:
        return f"the run did not finish within {timeout_s:g} s; all ranks were stopped"
    rank = failed[0] if failed else 0
    return f"rank {rank} exited with an error:\n{_tail(out / f'rank{rank}.log')}"


def launch(runs: list[dict], opts: LaunchOptions) -> list[list[dict]]:
    """Run the RunConfig dicts on ``opts.nproc`` local processes; per rank, its list of run results."""
    out = Path(opts.workdir or tempfile.mkdtemp(prefix="advisor-exec-"))
    out.mkdir(parents=True, exist_ok=True)
    spec = out / "spec.json"
    spec.write_text(json.dumps({"runs": runs}))
    launch_module("advisor.executor.worker", ["--spec", str(spec), "--backend", opts.backend], out, opts)
    return [json.loads((out / f"rank{r}.json").read_text())["runs"] for r in range(opts.nproc)]


def launch_module(module: str, args: list[str], out: Path, opts: LaunchOptions) -> None:
    """Start ``python -m module *args --out-dir out`` once per rank and wait (see module doc). Each
    rank writes out/rank<R>.json, or out/rank<R>.error.json when it fails."""
    port = free_port()
    deadline = time.time() + opts.timeout_s
    procs: list[subprocess.Popen] = []
    logs = []
    try:
        for rank in range(opts.nproc):
            log = open(out / f"rank{rank}.log", "w")
            logs.append(log)
            cmd = [sys.executable, "-m", module, *args, "--out-dir", str(out)]
            procs.append(subprocess.Popen(cmd, env=_rank_env(rank, opts, port, deadline + 5), stdout=log,
                                          stderr=subprocess.STDOUT, start_new_session=True))
        failed, timed_out = _wait(procs, opts, deadline)
    finally:
        _stop(procs)
        for log in logs:
            log.close()
    if failed or timed_out:
        raise ExecutionFailed(_failure_message(out, failed, timed_out, opts.timeout_s))


def _wait(procs: list[subprocess.Popen], opts: LaunchOptions, deadline: float) -> tuple[list[int], bool]:
    """Poll until all ranks exit, one fails (then give the rest ``grace_s``), or the deadline."""
    failed: list[int] = []
    first_failure = None
    while True:
        codes = [p.poll() for p in procs]
        for rank, code in enumerate(codes):
            if code not in (None, 0) and rank not in failed:
                failed.append(rank)
                first_failure = first_failure or time.time()
        if all(c is not None for c in codes):
            return failed, False
        if first_failure is not None and time.time() > first_failure + opts.grace_s:
            return failed, False
        if time.time() > deadline:
            return failed, True
        time.sleep(0.05)
