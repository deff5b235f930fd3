"""Search speed of `advisor recommend --searcher enumerate`, all knobs on (prints figures; not a test).

Cases from the search issue: a 1T dense model on 4,096 A100s, Mixtral 8x7B on 1,024 H100s, GPT-3 175B
on 1,024 Ascend 910s; and, for comparison with Calculon (whose optimal-execution search scores 8,112
configurations of the 530B model on 5,128 A100s in 35.6 s on this machine, 230 per second), the
530B model on 5,120 A100s (5,128 = 8 x 641 leaves no legal split of 105 layers / 128 heads when
every device is used, as advisor requires; Calculon may leave devices idle). Global batch and sequence length are the command line's defaults
(about 4M tokens per step, the model's sequence length).

Figures per case (best and median of --repeat runs):
  space     legal candidates after the rules and de-duplication (each priced or bounded);
  priced    cost-model evaluations: exact ones plus the bound evaluations;
  wall, cpu the whole search (wall clock and this process's CPU time; the machine may be shared);
  cand/s    space / wall: candidates settled per second;
  evals/s   priced / wall: candidates run through the vectorized cost model per second.

    python benchmarks/search_speed.py [--repeat 5]
    python benchmarks/search_speed.py --all-candidates   # every fitting candidate of each case as CSV (recommend
                                                         # --all-candidates): rows, seconds, peak memory
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from advisor.commands.inputs import resolve_inputs  # noqa: E402
from advisor.search import Pins  # noqa: E402
from advisor.search.enumerate import search  # noqa: E402

CASES = [
    ("1T dense on 4,096 A100", "megatron-1t", "dgx-a100-80g", 4096),
    ("Mixtral 8x7B on 1,024 H100", "mixtral-8x7b", "dgx-h100", 1024),
    ("GPT-3 175B on 1,024 Ascend 910", "gpt3-175b", "ascend-910", 1024),
    ("530B on 5,120 A100 (Calculon's model)", "mt-nlg-530b", "dgx-a100-80g", 5120),
]
CALCULON_PER_S = 8112 / 35.6


def measure(model: str, hardware: str, devices: int, repeat: int) -> dict:
    i = resolve_inputs(model, hardware, devices=devices)
    walls, cpus, outcome = [], [], None
    for _ in range(repeat):
        wall, cpu = time.perf_counter(), time.process_time()
        outcome = search(i.model, i.hardware, i.cluster, i.job, Pins(), top_k=5)
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    s = outcome.stats
    return {"job": f"gbs {i.job.global_batch_size} x seq {i.job.seq_length}, {i.job.dtype}",
            "space": s.candidates, "scored": s.scored, "priced": s.scored + s.bound_evaluations,
            "wall_best": min(walls), "wall_median": statistics.median(walls),
            "cpu_best": min(cpus), "cpu_median": statistics.median(cpus)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--all-candidates", action="store_true",
                        help="time writing every fitting candidate as CSV instead (advisor.search.all_candidates)")
    args = parser.parse_args()
    search(*_warm_up())   # imports and first-call costs out of the figures
    if args.all_candidates:
        return all_candidates_table()
    print(f"{'case':<38} {'space':>11} {'priced':>8} {'wall s':>12} {'cpu s':>12} {'cand/s':>11} {'evals/s':>9} {'x Calculon':>10}")
    print(f"{'':<38} {'':>11} {'':>8} {'best/median':>12} {'best/median':>12} {'(best)':>11} {'(best)':>9} {'(evals)':>10}")
    for label, model, hardware, devices in CASES:
        r = measure(model, hardware, devices, args.repeat)
        print(f"{label:<38} {r['space']:>11,} {r['priced']:>8,} {r['wall_best']:>5.3f}/{r['wall_median']:<6.3f} "
              f"{r['cpu_best']:>5.3f}/{r['cpu_median']:<6.3f} {r['space'] / r['wall_best']:>11,.0f} "
              f"{r['priced'] / r['wall_best']:>9,.0f} {r['priced'] / r['wall_best'] / CALCULON_PER_S:>10,.0f}")
        print(f"{'  ' + r['job']:<38}")
    print(f"\nCalculon reference: {CALCULON_PER_S:,.0f} configurations per second (8,112 in 35.6 s).")


def all_candidates_table() -> None:
    """Each case's whole table streamed to a discarding file: rows, legal candidates, wall seconds, and the peak
    memory the writing added (tracemalloc: numpy's arrays and Python's objects, not the interpreter)."""
    import io
    import tracemalloc

    from advisor.search.all_candidates import write_all

    class Discard(io.RawIOBase):
        def writable(self):
            return True

        def write(self, b):
            self.bytes = getattr(self, "bytes", 0) + len(b)
            return len(b)

    print(f"{'case':<38} {'legal':>11} {'rows':>9} {'MB':>7} {'wall s':>7} {'peak MiB':>9}")
    for label, model, hardware, devices in CASES:
        i = resolve_inputs(model, hardware, devices=devices)
        sink = Discard()
        tracemalloc.start()
        wall = time.perf_counter()
        w = write_all(sink, i.model, i.hardware, i.cluster, i.job, Pins())
        wall = time.perf_counter() - wall
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        print(f"{label:<38} {w.candidates:>11,} {w.rows:>9,} {getattr(sink, 'bytes', 0) / 1e6:>7.1f} {wall:>7.2f} "
              f"{peak / 2 ** 20:>9.0f}")


def _warm_up():
    i = resolve_inputs("llama3-8b", "dgx-a100-80g", nodes=1)
    return i.model, i.hardware, i.cluster, i.job


if __name__ == "__main__":
    main()
