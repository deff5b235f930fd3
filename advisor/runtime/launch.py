"""Start one process per rank on this machine, wait, collect; never hang, never orphan.

Each rank runs in its own process session (so it and anything it starts can be signalled as a
group, and a Ctrl-C at the terminal reaches only the launcher, which then stops them), with a short
process-group timeout and a hard deadline. When a rank ends with an error the others are usually
blocked in a collective: after a short grace period they are terminated (SIGTERM, then SIGKILL).
The ranks also exit on their own when the launcher disappears or the deadline passes
(advisor.runtime.rank).

Which rank to blame: a rank killed by a signal (SIGKILL from the out-of-memory killer) leaves no
error file, and its peers then fail with a lost connection; so a real error of a rank comes first,
then a rank that a signal ended before the launcher stopped anything, then a rank that only lost a
peer, then the deadline.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from advisor.errors import AdvisorError
from advisor.runtime import starter as starter_files
from advisor.runtime.files import write_atomic


class ExecutionFailed(AdvisorError):
    """A rank failed or the run timed out (exit code 1)."""

    exit_code = 1

    def __init__(self, message: str, rank: int | None = None, timed_out: bool = False,
                 exit_codes: dict[int, int] | None = None):
        super().__init__(message)
        self.rank = rank                          # the rank blamed, when one is
        self.timed_out = timed_out                # the launcher's deadline passed (and no rank is to blame)
        self.exit_codes = dict(exit_codes or {})  # ranks that ended on their own: code (negative: signal)


@dataclass(frozen=True)
class LaunchOptions:
    nproc: int
    timeout_s: float = 600.0          # hard limit for the whole launch
    pg_timeout_s: float = 60.0        # torch.distributed process-group timeout
    grace_s: float = 3.0              # after a rank fails, how long the others may take to exit
    backend: str = "auto"
    threads_per_rank: int | None = None
    workdir: str | None = None        # where rank files go (default: a temporary directory)


# Called while the ranks run: (out folder, exit code per rank or None while running).
Progress = Callable[[Path, list], None]


def agent_store(timeout_s: float):
    """The launch's rendezvous store: a TCPStore server on a port the operating system picks, held by this
    process for the whole launch. Every rank connects to it as a client (TORCHELASTIC_USE_AGENT_STORE, as
    torchrun's agent hosts it; torch.distributed.rendezvous), so no other process can take the port between
    its choice and the ranks' start: a port found free and released for rank 0 to listen on was taken in that
    gap under parallel tests (EADDRINUSE)."""
    import datetime

    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=timeout_s), wait_for_workers=False)


def _rank_env(rank: int, opts: LaunchOptions, port: int, deadline: float) -> dict[str, str]:
    env = dict(os.environ)
    threads = opts.threads_per_rank or max(1, (os.cpu_count() or 1) // opts.nproc)
    src = str(Path(__file__).resolve().parents[2])
    env.update(RANK=str(rank), WORLD_SIZE=str(opts.nproc), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(opts.nproc),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TORCHELASTIC_USE_AGENT_STORE="True",
               OMP_NUM_THREADS=str(threads),
               ADVISOR_EXECUTOR_THREADS=str(threads), ADVISOR_EXECUTOR_PG_TIMEOUT_S=str(opts.pg_timeout_s),
               ADVISOR_EXECUTOR_PARENT_PID=str(os.getpid()), ADVISOR_EXECUTOR_DEADLINE=str(deadline),
               PYTHONPATH=src + os.pathsep + env.get("PYTHONPATH", ""))
    return env


def launch_module(module: str, args: list[str], out: Path, opts: LaunchOptions,
                  progress: Progress | None = None, temporary: bool = False) -> None:
    """Run ``python -m module *args --out-dir out`` once per rank, forked from one rank starter
    (advisor.runtime.starter), and wait (see module doc). Each rank writes out/rank<R>.json, or
    out/rank<R>.error.json when it fails. ``temporary``: ``out`` is the launch's temporary folder (the
    starter removes it if this process dies without doing so)."""
    store = agent_store(opts.pg_timeout_s)      # held until the ranks are stopped (this function's end)
    deadline = time.time() + opts.timeout_s
    procs: list = []
    for rank in range(opts.nproc):      # a kept --workdir may hold an earlier run's files: never read those
        for name in (f"rank{rank}.json", f"rank{rank}.error.json", f"rank{rank}.ready", f"rank{rank}.step"):
            (out / name).unlink(missing_ok=True)
    (out / "progress.json").unlink(missing_ok=True)
    try:
        argv = [*args, "--out-dir", str(out)]
        envs = [_rank_env(rank, opts, store.port, deadline + 5) for rank in range(opts.nproc)]
        procs = start_ranks(module, [(argv, env) for env in envs], out, deadline + 5, temporary)
        exits, timed_out = _wait(procs[:-1], opts, deadline, out, progress)
        states = {rank: process_state(p.pid) for rank, p in enumerate(procs[:-1])
                  if p.poll() is None and p.pid is not None} if timed_out else {}
        # judged before stop(): a starter this launcher stops at the deadline, still starting the ranks, did not fail
        failed = starter_failed(procs, out)
    finally:
        stop(procs)
        del store
    if failed is not None:
        raise failed
    if timed_out or any(code != 0 for code in exits.values()):
        rank, message = diagnose(out, exits, timed_out, opts.timeout_s, states)
        raise ExecutionFailed(message, rank=rank, timed_out=timed_out and rank is None, exit_codes=exits)


class ForkedRank:
    """A rank forked by the rank starter, as the launcher watches it: ``subprocess.Popen``'s ``pid``,
    ``poll``, ``wait`` and ``returncode``, read from the pid and exit files the starter writes. ``pid`` is
    None until the starter has forked the rank."""

    def __init__(self, rank: int, status: Path, starter: subprocess.Popen):
        self.rank, self.status, self.starter = rank, status, starter
        self._pid: int | None = None
        self.returncode: int | None = None

    @property
    def pid(self) -> int | None:
        if self._pid is None:
            try:
                self._pid = int(starter_files.pid_file(self.status, self.rank).read_text())
            except (OSError, ValueError):
                return None
        return self._pid

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        try:
            self.returncode = int(starter_files.exit_file(self.status, self.rank).read_text())
            return self.returncode
        except (OSError, ValueError):
            pass
        code = self.starter.poll()
        if code is not None and not self._alive():
            # the starter ended without recording this rank's end: it was killed, or never forked the rank
            self.returncode = code if code != 0 else 1
        return self.returncode

    def _alive(self) -> bool:
        pid = self.pid
        if pid is None:
            return False
        state = process_state(pid)
        return state is not None and state not in ("Z", "X")

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() > end:
                raise subprocess.TimeoutExpired(f"rank {self.rank}", timeout)
            time.sleep(0.02)
        return self.returncode


def start_ranks(module: str, ranks: list[tuple[list[str], dict[str, str]]], out: Path, deadline: float,
                temporary: bool = False) -> list:
    """Start one rank per (arguments, environment) with the rank starter; the ranks' handles
    (ForkedRank), then the starter's own ``Popen`` last. The starter runs with rank 0's environment
    (the same OpenMP threads, path and timeouts as every rank), its own deadline and this process as
    its launcher; its output goes to out/starter.log and each rank's to out/rank<R>.log. ``temporary``:
    ``out`` is a temporary folder, which the starter removes if this process dies."""
    for rank in range(len(ranks)):
        for path in (starter_files.pid_file(out, rank), starter_files.exit_file(out, rank)):
            path.unlink(missing_ok=True)
    env = {k: v for k, v in ranks[0][1].items() if k not in ("RANK", "LOCAL_RANK")}
    env.update(ADVISOR_EXECUTOR_PARENT_PID=str(os.getpid()), ADVISOR_EXECUTOR_DEADLINE=str(deadline))
    # the file holds each rank's differences from the starter's environment, never the environment itself
    # (it may hold a user's credentials; the file lies in a shared temporary folder)
    job = out / "starter.json"
    write_atomic(job, json.dumps({"module": module, "status": str(out), "remove_if_orphaned": temporary, "ranks": [
        {"argv": argv, "log": str(out / f"rank{rank}.log"),
         "env_set": {k: v for k, v in rank_env.items() if env.get(k) != v},
         "env_unset": sorted(set(env) - set(rank_env))} for rank, (argv, rank_env) in enumerate(ranks)]}),
        what="the ranks for the starter")
    with open(out / "starter.log", "w") as log:
        starter = subprocess.Popen([sys.executable, "-m", "advisor.runtime.starter", str(job)], env=env,
                                   stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return [ForkedRank(rank, out, starter) for rank in range(len(ranks))] + [starter]


def starter_failed(procs: list, out: Path) -> ExecutionFailed | None:
    """The error to report when the rank starter (the last of ``procs``, from ``start_ranks``) ended badly before
    it had started every rank (it could not import the rank's module, or it was killed); None otherwise."""
    starter = procs[-1] if procs else None
    if starter is None or not starter.poll() or all(p.pid is not None for p in procs[:-1]):
        return None
    return ExecutionFailed(f"the process starting the ranks exited with code {starter.returncode} before it started "
                           f"them all:\n{_tail(out / 'starter.log')}")


def stop(procs: list[subprocess.Popen], wait_s: float = 2.0) -> None:
    """SIGTERM every rank's process group still running, then SIGKILL what is left."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = [p for p in procs if p.poll() is None]
        for p in alive:
            if p.pid is None:       # a rank its starter has not forked (the starter is stopped with the rest)
                continue
            try:
                os.killpg(p.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        end = time.monotonic() + wait_s
        while any(p.poll() is None for p in alive) and time.monotonic() < end:
            time.sleep(0.05)
    for p in procs:
        if p.poll() is None:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:   # stuck in the kernel after SIGKILL: leave it, keep the real error
                pass


def _wait(procs: list[subprocess.Popen], opts: LaunchOptions, deadline: float, out: Path,
          progress: Progress | None) -> tuple[dict[int, int], bool]:
    """Poll until all ranks exit, one fails (then give the rest ``grace_s``), or the deadline.
    Returns the exit code of every rank that ended on its own, in the order they were seen
    (negative: ended by that signal), and whether the deadline passed."""
    exits: dict[int, int] = {}
    first_failure = None
    while True:
        for rank, p in enumerate(procs):
            code = p.poll()
            if code is not None and rank not in exits:
                exits[rank] = code
                if code != 0 and first_failure is None:
                    first_failure = time.monotonic()
        if progress is not None:
            progress(out, [exits.get(r) for r in range(len(procs))])
        if len(exits) == len(procs):
            return exits, False
        if first_failure is not None and time.monotonic() > first_failure + opts.grace_s:
            return exits, False
        if time.time() > deadline:
            return exits, True
        time.sleep(0.05)


# ---- which rank to blame ----------------------------------------------------------------------------
# Errors a rank raises only because a peer went away: the root cause is elsewhere.
_PEER_ERRORS = ("Connection reset", "Connection closed", "Broken pipe", "gloo", "NCCL", "timed out", "Timeout")
# the same, looked for in the cause chain: an error raised around a lost connection (e.g. the pipeline
# schedule's "Failed to run stage backward", caused by gloo's "Connection closed by peer") is secondary too
_PEER_CAUSES = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")


def _secondary(info: dict) -> bool:
    return any(m in info["error"] for m in _PEER_ERRORS) or any(m in info.get("traceback", "") for m in _PEER_CAUSES)


def _errors(out: Path) -> list[tuple[int, int, dict]]:
    """(mtime, rank, info) of every rank's error file."""
    found = []
    for path in out.glob("rank*.error.json"):
        try:
            info = json.loads(path.read_text())
            found.append((path.stat().st_mtime_ns, int(path.name[4:-len(".error.json")]), info))
        except (OSError, ValueError):
            continue
    return sorted(found, key=lambda x: x[:2])


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def process_state(pid: int) -> str | None:
    """The kernel's state letter of a process (Linux /proc/PID/stat: R running, S sleeping, T stopped, t traced...);
    None where it cannot be read."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[-1].split()[0] if ")" in text else None


def _marks(out: Path, ranks) -> dict[int, tuple[dict, float]]:
    """rank -> (its last step mark, the mark's age in seconds)."""
    marks, now = {}, time.time()
    for rank in ranks:
        path = out / f"rank{rank}.step"
        try:
            marks[rank] = (json.loads(path.read_text()), max(now - path.stat().st_mtime, 0.0))
        except (OSError, ValueError):
            continue
    return marks


SHOWN_RANKS = 4     # ranks a timeout message names one by one (the stalest first); the rest are counted


def hung_ranks(out: Path, ranks, states: dict[int, str | None], name=lambda rank: f"rank {rank}") -> list[str]:
    """What each rank still running at the deadline was doing, stalest first, as sentences: stopped processes
    (state T: a SIGSTOP or a debugger), ranks that never joined the process group, and each rank's last step mark
    with its age (a rank that stopped answering is the one whose mark is oldest); ``name`` names a rank."""
    ranks = list(ranks)
    marks = _marks(out, ranks)

    def staleness(rank: int) -> float:
        return marks[rank][1] if rank in marks else float("inf")

    def stopped(rank: int) -> bool:
        return states.get(rank) in ("T", "t")

    lines = []
    for rank in sorted(ranks, key=lambda r: (not stopped(r), -staleness(r))):
        if rank in marks:
            mark, age = marks[rank]
            where = f"in {mark['label']} (its last mark {age:.1f} s old)"
        elif (out / f"rank{rank}.ready").exists():
            where = "joined, before its first step"
        else:
            where = "never joined the process group"
        state = f", stopped (process state {states[rank]}: SIGSTOP or a debugger)" if stopped(rank) else ""
        lines.append(f"{name(rank)}: {where}{state}")
    if len(lines) > SHOWN_RANKS:
        lines = lines[:SHOWN_RANKS] + [f"{len(lines) - SHOWN_RANKS} more rank(s) with fresher marks"]
    return lines


def diagnose(out: Path, exits: dict[int, int], timed_out: bool, timeout_s: float,
             states: dict[int, str | None] | None = None) -> tuple[int | None, str]:
    """(rank blamed or None, one message) for a launch that did not succeed (see module doc); ``states``: the
    process state of every rank still running at the deadline."""
    errors = _errors(out)
    primary = [(rank, info) for _, rank, info in errors if not _secondary(info)]
    if primary:
        rank, info = primary[0]
        return rank, f"rank {rank} failed: {info['error']}\n{info['traceback']}"
    killed = [(rank, -code) for rank, code in exits.items() if code < 0]
    if killed:
        rank, signum = killed[0]
        name = _signal_name(signum)
        why = (" (the kernel's out-of-memory killer sends SIGKILL when memory runs out; see `dmesg`)"
               if signum == signal.SIGKILL else "")
        lost = sorted({r for _, r, _ in errors} - {rank})
        after = f"; rank{'s' if len(lost) > 1 else ''} {', '.join(map(str, lost))} then lost the connection to it" \
            if lost else ""
        return rank, f"rank {rank} was killed by {name} (signal {signum}){why}{after}"
    silent = [rank for rank, code in exits.items() if code > 0 and rank not in {r for _, r, _ in errors}]
    if silent:      # a rank that left with an exit code and no error of its own (e.g. its watchdog)
        rank = silent[0]
        return rank, (f"rank {rank} exited with code {exits[rank]} and no error of its own; the others then lost "
                      f"the connection to it:\n{_tail(out / f'rank{rank}.log')}")
    if errors:
        _, rank, info = errors[0]
        return rank, f"rank {rank} failed: {info['error']}\n{info['traceback']}"
    if timed_out:
        hung = hung_ranks(out, sorted(states or {}), states or {})
        return None, (f"the run did not finish within {timeout_s:g} s; all ranks were stopped"
                      + (": " + "; ".join(hung) if hung else ""))
    failed = [rank for rank, code in exits.items() if code != 0]
    rank = failed[0] if failed else 0
    return rank, f"rank {rank} exited with code {exits.get(rank)}:\n{_tail(out / f'rank{rank}.log')}"


def _tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""
