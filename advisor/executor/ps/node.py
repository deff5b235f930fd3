"""One process of a parameter-server run, a server or a worker by its rank (servers first):

    python -m advisor.executor.ps.node --spec spec.json --out-dir DIR      (started by ps.launch)

It joins the scheduler's store (127.0.0.1:ADVISOR_PS_STORE_PORT) and a gloo group with each other role,
runs its role, writes DIR/rank<R>.json, and waits for the scheduler's "ps/exit" before leaving,
so that nobody leaves while a peer still reads from it. A rank that raises writes
DIR/rank<R>.error.json and exits 1 (advisor.runtime.rank). Knobs: ADVISOR_EXECUTOR_PG_TIMEOUT_S,
ADVISOR_EXECUTOR_THREADS, and for tests ADVISOR_PS_TEST_KILL_WORKER / ADVISOR_PS_TEST_KILL_SERVER
= ``index:step`` (that worker or server dies by SIGKILL when it starts that step).
"""

from __future__ import annotations

import datetime
import os
import sys
import time
from pathlib import Path
from typing import NoReturn

from advisor.runtime.rank import TORCH_PRELOAD, mark_ready, run_spec_rank, write_result

# what a role imports, for the rank starter to import once before it forks the roles (advisor.runtime.starter)
PRELOAD = (*TORCH_PRELOAD, "advisor.executor.ps.config", "advisor.executor.ps.server",
           "advisor.executor.ps.worker")
STORE_PORT = "ADVISOR_PS_STORE_PORT"
EXIT_KEY = "ps/exit"


def main(argv: list[str] | None = None) -> NoReturn:
    run_spec_rank("python -m advisor.executor.ps.node", _main, argv)


def _main(spec: dict, out: Path, rank: int) -> None:
    import torch
    import torch.distributed as dist

    from advisor.executor.ps.config import ps_config_from_plan
    from advisor.executor.ps.wire import PairGroups
    from advisor.executor.ps.server import Server
    from advisor.executor.ps.worker import Worker

    torch.set_num_threads(int(os.environ.get("ADVISOR_EXECUTOR_THREADS", "1")))
    cfg = ps_config_from_plan(spec["plan"], steps=spec["steps"], tiny=spec["tiny"], dtype=spec["dtype"])
    timeout_s = float(os.environ.get("ADVISOR_EXECUTOR_PG_TIMEOUT_S", "60"))
    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.TCPStore("127.0.0.1", int(os.environ[STORE_PORT]), None, False, timeout)
    world = cfg.servers + cfg.workers
    # one group per pair that talks (a dead peer closes only its own): a server with every role, a worker with the
    # servers (the workers' all-reduce has groups of its own, advisor.executor.ps.worker)
    peers = range(world) if rank < cfg.servers else range(cfg.servers)
    pg = PairGroups(store, rank, list(peers), timeout)
    mark_ready(out, rank)
    role = Server(cfg, rank, pg, store, timeout_s) if rank < cfg.servers else Worker(cfg, rank - cfg.servers, pg, store, timeout_s)
    result = role.run()
    result["rank"] = rank
    write_result(out / f"rank{rank}.json", result)
    while True:        # the watchdog ends this wait if the scheduler is gone or the deadline passes
        try:
            store.wait([EXIT_KEY], timeout)
            return
        except RuntimeError:
            time.sleep(0.1)


if __name__ == "__main__":
    sys.exit(main())
