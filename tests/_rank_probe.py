"""A rank for tests/test_starter.py: records what it sees of its start (pids, session, environment, what the
starter imported before forking it), then exits with ``--code`` or waits until it is stopped (``--wait``)."""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path

PRELOAD = ("_rank_probe_preload",)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--code", type=int, default=0)
    parser.add_argument("--wait", action="store_true")
    parser.add_argument("--out-dir", required=True)
    args = parser.parse_args()
    import _rank_probe_preload

    rank = int(os.environ["RANK"])
    with socket.socket() as s:          # the launcher holds the rendezvous port for the launch
        try:
            s.bind(("127.0.0.1", int(os.environ["MASTER_PORT"])))
            port_held = False
        except OSError:
            port_held = True
    Path(args.out_dir, f"rank{rank}.json").write_text(json.dumps({
        "pid": os.getpid(), "ppid": os.getppid(), "sid": os.getsid(0), "pgid": os.getpgid(0),
        "rank": rank, "world": int(os.environ["WORLD_SIZE"]), "name": __name__, "argv": sys.argv[1:],
        "preloaded_by": _rank_probe_preload.IMPORTED_BY,
        "parent_env": os.environ.get("ADVISOR_EXECUTOR_PARENT_PID"), "secret": os.environ.get("PROBE_SECRET"),
        "agent_store": os.environ.get("TORCHELASTIC_USE_AGENT_STORE"), "port_held": port_held}))
    print(f"rank {rank} says hello")
    while args.wait:
        time.sleep(0.05)
    return args.code if rank == 1 else 0


if __name__ == "__main__":
    sys.exit(main())
