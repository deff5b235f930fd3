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
    python benchmarks/search_speed.py --scale            # how the search grows with the cluster: 1k to 100k
                                                         # devices, and the same model on mixed clusters
    python benchmarks/search_speed.py --recommend        # the issue's commands end to end: `advisor recommend` as a
                                                         # fresh process (imports, search, refinement, rendering)
    python benchmarks/search_speed.py --profile          # where each case's search spends its time: cost-model
                                                         # calls, rows and seconds per level of the bounds

Where the time goes (--profile, this machine, 1T on 4,096 A100): the search is cost-model calls
(advisor.cost.step.estimate_batch) and little else; each call has a fixed cost of about 3 ms (some
thousands of small numpy operations: collectives per tier, placements, the memory parts) and 0.1-0.3 us
per candidate and pipeline stage beyond it (measured: 10 candidates of 1T's search 2.97 ms a call; 14,368
candidates of 4 stages 9.0 ms; 730 of 64 stages 14.8 ms). Rows of nearby pipeline depths share a call (chunks_by_pp's
padding allowance), the Ulysses copies a bound needs ride in the same call, and the bounds decide most
candidates: families, then skeletons (memory alone first, then time on the fastest links without the
ZeRO/offload parts), then ZeRO/offload pairs, before any mesh order is priced exactly. The search's memory
is priced on the stages that can hold each candidate's peak only (advisor.cost.memory.peak_stages: the ends
of each run of like stages, 4 columns of a 64-stage even pipeline instead of 64): 533,360 stage cells of
the 1T search's exact calls become 75,704; and each placed group keeps the message-free part of its
collectives' times (advisor.cost.comm.Fanout). With both (the figures bit for bit the same), this machine,
one run after the other, best of 5: 1T 1.04 -> 0.84 s, Mixtral 2.27 -> 2.05 s, GPT-3 0.43 -> 0.40 s,
530B 0.49 -> 0.47 s; the issue's 1T command as a process 2.6-2.7 -> 2.0-2.2 s.

--scale runs each size in a process of its own (so that its peak memory is its own): `advisor recommend` of
SCALE_MODEL on dgx-h100 at 1,024 to 98,304 devices (the command line's default batch, whose data-parallel
width the largest sizes cannot use, so they fill tensor, pipeline and context parallelism), then half of each
size's nodes as A100 and half as H100 (a mixed cluster, advisor.search.mixed). Per size: legal candidates,
exact evaluations, the search's seconds and the whole process's, and the process's peak resident memory.
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
    parser.add_argument("--scale", action="store_true", help="the search at 1k-100k devices and on mixed clusters")
    parser.add_argument("--timeout", type=float, default=600.0, help="--scale: seconds allowed per case")
    parser.add_argument("--recommend", action="store_true", help="whole `advisor recommend` processes, median of --repeat")
    parser.add_argument("--profile", action="store_true", help="cost-model calls, rows and seconds per level of the search")
    args = parser.parse_args()
    if args.scale:
        return scale_table(args.timeout)
    if args.recommend:
        return recommend_table(args.repeat)
    if args.profile:
        return profile_table()
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


# the search's levels, by the function that asks the cost model (advisor.search.enumerate, enumerate_bounds)
LEVELS = {"family_bounds": "family bounds", "bound_skeletons": "skeleton bounds", "_bound_some": "pair bounds",
          "priced": "exact (mesh orders)"}


def profile_table() -> None:
    """Per case: the search's seconds, then per level the cost-model calls, the rows they priced (Ulysses
    copies of the bounds included) and their seconds (time.process_time around each call)."""
    import inspect

    import advisor.search.enumerate as enumerate_module
    import advisor.search.enumerate_bounds as bounds_module

    calls: list[tuple[str, int, float]] = []
    originals = {m: m.estimate_batch for m in (enumerate_module, bounds_module)}

    def counted(original):
        def estimate_batch(model, hw, cluster, job, batch):
            start = time.process_time()
            out = original(model, hw, cluster, job, batch)
            names = [f.function for f in inspect.stack(0)[1:4]]
            level = next((LEVELS[n] for n in names if n in LEVELS), "other")
            calls.append((level, len(batch), time.process_time() - start))
            return out
        return estimate_batch

    print(f"{'case / level':<38} {'calls':>6} {'rows':>9} {'cpu s':>7}")
    for label, model, hardware, devices in CASES:
        i = resolve_inputs(model, hardware, devices=devices)
        search(i.model, i.hardware, i.cluster, i.job, Pins(), top_k=5)       # caches warm
        calls.clear()
        for m in originals:
            m.estimate_batch = counted(originals[m])
        try:
            start = time.process_time()
            search(i.model, i.hardware, i.cluster, i.job, Pins(), top_k=5)
            total = time.process_time() - start
        finally:
            for m, original in originals.items():
                m.estimate_batch = original
        print(f"{label:<38} {len(calls):>6} {sum(c[1] for c in calls):>9,} {total:>7.2f}")
        for level in [*LEVELS.values(), "other"]:
            mine = [c for c in calls if c[0] == level]
            if mine:
                print(f"{'  ' + level:<38} {len(mine):>6} {sum(c[1] for c in mine):>9,} {sum(c[2] for c in mine):>7.2f}")
        print(f"{'  rest (memory checks, bands, rows)':<38} {'':>6} {'':>9} {total - sum(c[2] for c in calls):>7.2f}")


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


SCALE_MODEL = "llama3-405b"
# 98,304 = 12,288 nodes of 8 stands for 100k: llama3-405b's 126 layers, 128 heads and the default 512 x 8192 batch
# leave no legal split of exactly 100,000 devices (100,000 = 2^5 x 5^5; no degree can hold the factor 5^5)
SCALE_DEVICES = (1024, 4096, 16384, 65536, 98304)
# one case in its own interpreter: the search's figures and the process's peak memory, as JSON on stdout
_ONE_CASE = """
import json, resource, sys, time
start = time.perf_counter()
from advisor.commands.inputs import resolve_inputs
from advisor.commands.recommend import recommend
from advisor.search import Pins
model, hardware, nodes = sys.argv[1], sys.argv[2].split(","), [int(n) for n in sys.argv[3].split(",")]
if len(hardware) == 1:
    i = resolve_inputs(model, hardware[0], nodes=nodes[0])
    searched = time.perf_counter()
    r = recommend(i.model, i.hardware, i.cluster, i.job, pins=Pins(), top_k=5)
    stats = r.search
    figures = {"space": stats.candidates, "scored": stats.scored, "best": r.plans[0].prediction["tokens_per_s"]}
else:
    from advisor.commands.mixed import mixed_inputs, recommend_mixed
    mixed, i = mixed_inputs(model, ",".join(f"{h}:{n}" for h, n in zip(hardware, nodes)), None, None)
    searched = time.perf_counter()
    r = recommend_mixed(i, mixed, top_k=5)
    figures = {"space": r.stats.candidates, "scored": None, "best": r.plans[0].prediction["tokens_per_s"]}
done = time.perf_counter()
figures.update(search_s=done - searched, process_s=done - start,
               peak_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
print(json.dumps(figures))
"""


def scale_table(timeout_s: float) -> None:
    """The search as the cluster grows (each case a fresh process: its import time and peak memory its own)."""
    import json
    import subprocess

    print(f"{'case':<44} {'legal':>11} {'exact':>8} {'search s':>9} {'process s':>10} {'peak MiB':>9}")
    rows = [(f"{SCALE_MODEL} on {n:,} H100", "dgx-h100", str(n // 8)) for n in SCALE_DEVICES]
    rows += [(f"{SCALE_MODEL} on {n // 2:,} A100 + {n // 2:,} H100", "dgx-a100-80g,dgx-h100", f"{n // 16},{n // 16}")
             for n in SCALE_DEVICES]
    for label, hardware, nodes in rows:
        try:
            done = subprocess.run([sys.executable, "-c", _ONE_CASE, SCALE_MODEL, hardware, nodes], capture_output=True,
                                  text=True, timeout=timeout_s, cwd=Path(__file__).resolve().parents[1])
        except subprocess.TimeoutExpired:
            print(f"{label:<44} {'over ' + format(timeout_s, '.0f') + ' s':>41}")
            continue
        if done.returncode != 0:
            print(f"{label:<44} failed: {(done.stderr.strip().splitlines() or ['?'])[-1][:80]}")
            continue
        r = json.loads(done.stdout.strip().splitlines()[-1])
        space = f"{r['space']:,}" if r.get("space") is not None else "-"
        scored = f"{r['scored']:,}" if r.get("scored") is not None else "-"
        print(f"{label:<44} {space:>11} {scored:>8} {r['search_s']:>9.2f} {r['process_s']:>10.2f} "
              f"{r['peak_mib']:>9.0f}")


RECOMMEND_CASES = [
    ("1T dense on 4,096 A100", ["--model", "megatron-1t", "--hardware", "dgx-a100-80g", "--nodes", "512"]),
    ("GPT-3 175B on 64 A100, --searcher drec",
     ["--model", "gpt3-175b", "--hardware", "dgx-a100-80g", "--nodes", "8", "--searcher", "drec"]),
    ("GPT-3 175B on 64 A100, --searcher ilp",
     ["--model", "gpt3-175b", "--hardware", "dgx-a100-80g", "--nodes", "8", "--searcher", "ilp"]),
    ("Llama 3 70B on 4 A100 + 4 H100 nodes (mixed)",
     ["--model", "llama3-70b", "--hardware", "dgx-a100-80g:4,dgx-h100:4"]),
]


def recommend_table(repeat: int) -> None:
    """`advisor recommend` end to end, each run a fresh process: wall and CPU seconds (this process's children).
    The package's bytecode is compiled first, as pip leaves an installed package: a process that compiles
    advisor's modules from source (an editable install under PYTHONDONTWRITEBYTECODE, as on the development
    machine) spends about 0.15 s more on it."""
    import compileall
    import os
    import subprocess

    compileall.compile_dir(Path(__file__).resolve().parents[1] / "advisor", quiet=1)
    print(f"{'command':<44} {'wall s':>13} {'cpu s':>13}")
    print(f"{'':<44} {'best/median':>13} {'best/median':>13}")
    for label, argv in RECOMMEND_CASES:
        walls, cpus = [], []
        for _ in range(repeat):
            before, wall = os.times(), time.perf_counter()
            subprocess.run([sys.executable, "-m", "advisor.cli", "recommend", *argv], check=True,
                           stdout=subprocess.DEVNULL, cwd=Path(__file__).resolve().parents[1])
            after = os.times()
            walls.append(time.perf_counter() - wall)
            cpus.append(after.children_user + after.children_system - before.children_user - before.children_system)
        print(f"{label:<44} {min(walls):>6.2f}/{statistics.median(walls):<6.2f} "
              f"{min(cpus):>6.2f}/{statistics.median(cpus):<6.2f}")


def _warm_up():
    i = resolve_inputs("llama3-8b", "dgx-a100-80g", nodes=1)
    return i.model, i.hardware, i.cluster, i.job


if __name__ == "__main__":
    main()
