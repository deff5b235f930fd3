"""What-if sweep speed: a 4 x 6 grid (4 hardware profiles x 6 cluster sizes) for a 70B model.

Goal (issue 6): under 5 seconds on the 2-core development machine. Prints the wall time, the CPU
time of this process and its workers, and the points per second. A figure, not a pass/fail test.

    python benchmarks/whatif_speed.py [--repeat 3] [--workers N]
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from advisor.whatif import whatif  # noqa: E402

MODEL = "llama3-70b"
HARDWARE = ["dgx-a100-80g", "dgx-h100", "dgx-h200", "ascend-910b"]
NODES = [4, 8, 16, 32, 64, 128]
GOAL_S = 5.0


def _cpu_seconds() -> float:
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", type=int, default=None, help="worker processes (default: one per core)")
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"what-if grid: {MODEL}, {len(HARDWARE)} hardware profiles x {len(NODES)} node counts "
          f"= {len(HARDWARE) * len(NODES)} points; {cores} cores; load average {os.getloadavg()[0]:.2f}")
    walls = []
    for i in range(args.repeat):
        cpu0, t0 = _cpu_seconds(), time.perf_counter()
        result = whatif(MODEL, HARDWARE, nodes=NODES, tokens="2T", workers=args.workers)
        wall, cpu = time.perf_counter() - t0, _cpu_seconds() - cpu0
        walls.append(wall)
        fits = sum(p.fits for p in result.points)
        print(f"run {i + 1}: {wall:.2f} s wall, {cpu:.2f} s CPU, {len(result.points) / wall:.1f} points/s, "
              f"{fits}/{len(result.points)} points fit")
    best = min(walls)
    print(f"best of {args.repeat}: {best:.2f} s ({'under' if best < GOAL_S else 'OVER'} the {GOAL_S:.0f} s goal)")


if __name__ == "__main__":
    main()
