"""The scheduler: start the servers and workers of a parameter-server run on this machine, watch
them, isolate a worker that dies, stop everything when a server dies; never hang, never orphan.

The scheduler holds the rendezvous, a TCPStore every role connects to (ps-lite's scheduler,
MindSpore's MS_SCHED). Each role runs in its own process session with the hard deadline and the
launcher-gone watchdog of advisor.runtime.rank. While they run:

* a worker ended by a signal (SIGKILL: a lost node, the out-of-memory killer) is isolated: the
  scheduler writes ps/left/<worker> and the servers drop it from the barrier at the step they miss
  it in; hybrid workers regroup without it. A worker that raises is a bug, not a lost node: the run
  fails with its error.
* a server that ends for any reason stops the run: its shards are gone. Every process is stopped
  (SIGTERM, then SIGKILL) at once and the error names the server and the step it was in. With
  ``replicas`` 1 (synchronous) a server ended by a signal whose backup (the next server) still runs is
  taken over instead: the scheduler writes ps/server_left/<server>, the backup serves the shard from its
  copy and the workers replay to it (advisor.executor.ps.server, worker). A second server lost, or the
  backup of a lost one, still stops the run.
* when every role still in the run has written its result, the scheduler sets ps/exit and they leave.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from advisor.executor.ps.config import PsConfig
from advisor.executor.ps.node import EXIT_KEY, STORE_PORT
from advisor.executor.ps.server import left_key, server_left_key, step_key
from advisor.runtime.files import temporary_folder, write_json
from advisor.runtime.launch import ExecutionFailed, process_state, start_ranks, starter_failed, stop

POLL_S = 0.05


@dataclass(frozen=True)
class PsLaunchOptions:
    timeout_s: float = 600.0         # hard limit for the whole run
    pg_timeout_s: float = 30.0       # gloo and store timeout of every role
    grace_s: float = 3.0             # after a failure or ps/exit, how long the roles may take to leave
    workdir: str | None = None       # keep the role files here (default: a temporary folder, removed)


def _env(rank: int, world: int, port: int, opts: PsLaunchOptions, deadline: float) -> dict[str, str]:
    """One thread per role (2 cores run 4 roles), the timeouts, the watchdog's parent and deadline."""
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[3])
    env.update(RANK=str(rank), WORLD_SIZE=str(world), OMP_NUM_THREADS="1", ADVISOR_EXECUTOR_THREADS="1",
               ADVISOR_EXECUTOR_PG_TIMEOUT_S=str(opts.pg_timeout_s), ADVISOR_EXECUTOR_PARENT_PID=str(os.getpid()),
               ADVISOR_EXECUTOR_DEADLINE=str(deadline), PYTHONPATH=src + os.pathsep + env.get("PYTHONPATH", ""))
    env[STORE_PORT] = str(port)
    return env


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def launch_ps(spec: dict, cfg: PsConfig, opts: PsLaunchOptions) -> dict:
    """Run the roles; returns {"ranks": [result per rank still in the run], "left": [isolated workers]}."""
    import torch.distributed as dist

    world = cfg.servers + cfg.workers
    with temporary_folder("advisor-ps-", keep=opts.workdir) as out:
        write_json(out / "spec.json", spec, what="the run's spec")
        for rank in range(world):   # a kept --workdir may hold an earlier run's results: never read those
            for name in (f"rank{rank}.json", f"rank{rank}.error.json", f"rank{rank}.ready"):
                (out / name).unlink(missing_ok=True)
        store = dist.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=opts.pg_timeout_s),
                              wait_for_workers=False)
        deadline = time.time() + opts.timeout_s
        procs: list = []
        try:
            argv = ["--spec", str(out / "spec.json"), "--out-dir", str(out)]
            procs = start_ranks("advisor.executor.ps.node",
                                [(argv, _env(rank, world, store.port, opts, deadline + 5)) for rank in range(world)],
                                out, deadline + 5, temporary=opts.workdir is None)
            try:
                left, servers_left = _watch(procs[:-1], store, cfg, out, opts, deadline)
            except ExecutionFailed as exc:
                raise starter_failed(procs, out) or exc
        finally:
            stop(procs)
            del store
        gone = {x["rank"] for x in left + servers_left}
        ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(world) if r not in gone]
    return {"ranks": ranks, "left": left, "servers_left": servers_left}


def _taken_over(cfg: PsConfig, rank: int, code: int, exits: dict[int, int], servers_left: list[dict]) -> bool:
    """Whether a server's end is taken over by its backup: replicated and synchronous, ended by a signal
    (a lost host, not a bug), its backup still running, and no server lost before it."""
    backup = (rank + 1) % cfg.servers
    return cfg.replicas > 0 and cfg.synchronous and code < 0 and not servers_left and backup not in exits


def _watch(procs, store, cfg: PsConfig, out: Path, opts: PsLaunchOptions, deadline: float):
    exits: dict[int, int] = {}
    left: list[dict] = []
    servers_left: list[dict] = []
    exit_sent = failed_at = None
    while True:
        now = time.monotonic()
        for rank, p in enumerate(procs):
            code = p.poll()
            if code is None or rank in exits:
                continue
            exits[rank] = code
            if rank < cfg.servers and exit_sent is None and _taken_over(cfg, rank, code, exits, servers_left):
                key = step_key(rank)
                step = int(store.get(key).decode()) if store.check([key]) else 0
                servers_left.append({"server": rank, "rank": rank, "signal": _signal_name(code), "step": step,
                                     "backup": (rank + 1) % cfg.servers})
                store.set(server_left_key(rank), str(time.time()))
                continue
            if rank < cfg.servers and (code != 0 or exit_sent is None):
                raise ExecutionFailed(_server_message(store, rank, code, out), rank=rank)
            if rank >= cfg.servers and code < 0 and exit_sent is None:
                w = rank - cfg.servers
                store.set(left_key(w), str(time.time()))
                left.append({"worker": w, "rank": rank, "signal": _signal_name(code)})
            elif code != 0 and failed_at is None:
                failed_at = now       # a worker's error: give a server's death the chance to explain it
        if failed_at is not None and now > failed_at + min(1.0, opts.grace_s):
            rank = min(r for r, c in exits.items() if c != 0 and r not in {x["rank"] for x in left + servers_left})
            raise ExecutionFailed(f"worker {rank - cfg.servers} (rank {rank}) failed: {_error(out, rank)}", rank=rank)
        gone = {x["rank"] for x in left + servers_left}
        live = [r for r in range(len(procs)) if r not in gone]
        if len(left) == cfg.workers:
            raise ExecutionFailed("every worker is gone: " + ", ".join(f"worker {x['worker']} ({x['signal']})" for x in left))
        if exit_sent is None and all((out / f"rank{r}.json").exists() for r in live):
            store.set(EXIT_KEY, "1")
            exit_sent = now
        if all(r in exits for r in live) or (exit_sent is not None and now > exit_sent + opts.grace_s):
            return left, servers_left
        if time.time() > deadline:
            raise ExecutionFailed(f"the parameter-server run did not finish within {opts.timeout_s:g} s; "
                                  "every process was stopped" + _hung(procs, store, cfg, exits), timed_out=True)
        time.sleep(POLL_S)


def _hung(procs, store, cfg: PsConfig, exits: dict[int, int]) -> str:
    """': server 1 is stopped (process state T ...) after step 3; ...' for the processes still running at the
    deadline: the stopped ones by role and, for servers, the last step they served (the store's ps/step keys)."""
    def role(rank: int) -> str:
        return f"server {rank}" if rank < cfg.servers else f"worker {rank - cfg.servers}"

    parts = []
    for rank, p in enumerate(procs):
        if rank in exits or p.poll() is not None:
            continue
        key = step_key(rank)
        step = f" after step {store.get(key).decode()}" if rank < cfg.servers and store.check([key]) else ""
        state = process_state(p.pid) if p.pid is not None else None
        if state in ("T", "t"):
            parts.append(f"{role(rank)} (rank {rank}) is stopped{step} (process state {state}: SIGSTOP or a debugger)")
        elif rank < cfg.servers:
            parts.append(f"{role(rank)} (rank {rank}) is still running{step or ' before its first step'}")
    return ": " + "; ".join(parts) if parts else ""


def _server_message(store, rank: int, code: int, out: Path) -> str:
    key = step_key(rank)
    step = f" during step {store.get(key).decode()}" if store.check([key]) else " before its first step"
    if code < 0:
        how = f"was killed by {_signal_name(code)} (signal {-code})"
    elif code == 0:
        how = "left before the run finished"
    else:
        how = f"failed: {_error(out, rank)}"
    return f"server {rank} (rank {rank}) {how}{step}; its shards are lost, every process of the run was stopped"


def _error(out: Path, rank: int) -> str:
    try:
        info = json.loads((out / f"rank{rank}.error.json").read_text())
        return info["error"]
    except (OSError, ValueError, KeyError):
        try:
            return "exited with an error; log tail:\n" + (out / f"rank{rank}.log").read_text(errors="replace")[-2000:]
        except OSError:
            return "exited with an error"
