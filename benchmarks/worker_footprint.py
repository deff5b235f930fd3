"""Memory of one executor rank before it allocates any tensor: the figure behind
advisor.runtime.capacity.RANK_FOOTPRINT_BYTES.

A fresh process imports torch and advisor's executor (what ``python -m advisor.executor.worker``
imports), joins a one-rank gloo process group, and prints its resident and private memory from
/proc/self/smaps_rollup; then it trains the --tiny model for three steps and prints them again.
Private dirty memory is what each extra rank costs (library text is shared between the ranks).
A figure, not a pass/fail test (Linux only).

    python benchmarks/worker_footprint.py
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import datetime, os
import torch, torch.distributed as dist
import advisor.executor.train, advisor.executor.worker

def rollup():
    out = {}
    for line in open("/proc/self/smaps_rollup"):
        parts = line.split()
        if parts[0].endswith(":") and len(parts) > 1 and parts[1].isdigit():
            out[parts[0][:-1]] = int(parts[1]) / 1024
    return out

def show(when):
    r = rollup()
    print(f"{when:<28} resident {r['Rss']:6.0f} MiB   private dirty {r['Private_Dirty']:6.0f} MiB   "
          f"private clean {r['Private_Clean']:6.0f} MiB")

torch.set_num_threads(1)
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
show("bare worker (gloo joined)")
from advisor.executor.config import run_config_from_plan
from advisor.executor.matrix import tiny_plan
from advisor.executor.train import run_distributed
run_distributed(run_config_from_plan(tiny_plan(dict()), steps=3), torch.device("cpu"))
show("after a 3-step --tiny run")
dist.destroy_process_group()
print(f"python {'.'.join(map(str, __import__('sys').version_info[:3]))}, torch {torch.__version__}")
"""


def main() -> int:
    from advisor.runtime.launch import free_port

    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1",
               OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-c", CHILD], env=env).returncode


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
