"""Can this machine hold N local ranks? Checked before any process starts.

Cores: the CPUs this process may run on (its affinity mask, and a cgroup v2 ``cpu.max`` quota
where one is set). CPU ranks time-share cores well while they wait in collectives, so up to
RANKS_PER_CORE ranks per core are allowed; beyond that ``--oversubscribe`` is needed, as with Open
MPI, whose mpirun refuses more processes than slots unless told ``--oversubscribe``
(https://docs.open-mpi.org/en/v5.0.x/launching-apps/scheduling.html).

Memory: every rank is a Python process with torch loaded (RANK_FOOTPRINT_BYTES, measured) plus
what its share of the model needs; the sum must stay under MEMORY_SHARE of what the machine (or
its cgroup) has available.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

GIB = 2.0 ** 30
MIB = 2.0 ** 20

# The executor's validation matrix (tests/test_executor_matrix.py) runs 8 gloo ranks on a 2-core
# machine; 4 ranks per core is that, and no more.
RANKS_PER_CORE = 4

# Measured on this machine (x86-64, Python 3.11.7, PyTorch 2.13.0+cpu): a bare worker -- a
# process that has imported torch and advisor.executor.train and joined a one-rank gloo process
# group -- has 223 MiB resident, of which 146 MiB is private dirty memory (/proc/self/smaps_rollup);
# the rest is shared library text that all ranks share. 146 MiB is what each extra rank costs
# before any tensor is allocated (benchmarks/worker_footprint.py measures it again).
RANK_FOOTPRINT_BYTES = 146 * MIB

# Headroom for the kernel, the launcher itself and everything else on the machine (the executor's
# memory refusal has used 80% of the available memory since it was written).
MEMORY_SHARE = 0.8


@dataclass(frozen=True)
class Machine:
    cores: int
    available_bytes: float | None      # None: unknown (no /proc/meminfo)


def usable_cores() -> int:
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cores)


def available_memory_bytes() -> float | None:
    avail = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = float(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            used = float(Path("/sys/fs/cgroup/memory.current").read_text())
            left = float(limit) - used
            avail = left if avail is None else min(avail, left)
    except (OSError, ValueError):
        pass
    return avail


def this_machine() -> Machine:
    return Machine(usable_cores(), available_memory_bytes())


def capacity_problems(ranks: int, model_bytes_per_rank: float = 0.0, oversubscribe: bool = False,
                      processes: bool = True, hint: str = "", machine: Machine | None = None) -> list[str]:
    """Sentences, with the numbers, for what this machine cannot hold (empty: it can). ``processes``:
    the ranks are started here (their cores and their Python and torch count); otherwise only the
    model's memory is checked (``hint`` ends that sentence)."""
    m = machine or this_machine()
    problems = []
    if processes and ranks > RANKS_PER_CORE * m.cores and not oversubscribe:
        problems.append(f"{ranks} ranks on {m.cores} core{'s' if m.cores != 1 else ''} is more than "
                        f"{RANKS_PER_CORE} per core (give --oversubscribe to run it anyway, slowly)")
    if m.available_bytes is not None:
        footprint = RANK_FOOTPRINT_BYTES if processes else 0.0
        model = max(model_bytes_per_rank, 0.0)
        need = ranks * (footprint + model)
        if need > MEMORY_SHARE * m.available_bytes:
            parts = " + ".join(x for x in (f"{footprint / MIB:.0f} MiB of Python and torch" if footprint else "",
                                           f"{model / GIB:.2f} GiB of model" if model else "") if x)
            problems.append(f"the run needs about {need / GIB:.1f} GiB on this machine ({ranks} ranks x ({parts})) "
                            f"but {m.available_bytes / GIB:.1f} GiB is available (at most {MEMORY_SHARE:.0%} of it "
                            f"may be used){hint}")
    return problems
