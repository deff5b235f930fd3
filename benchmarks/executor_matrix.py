"""Run the executor's validation matrix and print its figures (not a pass/fail test).

    python benchmarks/executor_matrix.py [--hardware PROFILE.yaml] [--only NAME ...] [--steps K]
                                         [--scale S] [--repeat R] [--json OUT]

For each plan shape: world size, the largest relative loss difference against the single-process
run (fp32), the same for the gradient norm, the largest relative memory error per part on the
predicted worst stage's ranks, and, with --hardware (a profile of this machine from `advisor
calibrate`), the step time measured and predicted and their ratio.

--scale S widens the tiny models (head size, FFN width and sequence length times S, as
`advisor execute --tiny --tiny-scale S` does): at scale 1 a CPU step is mostly per-operator
overhead, at scale 4 mostly arithmetic. --repeat R runs the whole matrix R times, one after the
other. Each run's step time is the median of its steps (the first left out); per shape the table
gives the median run's ratio, with the range over the runs: a virtual machine's speed drifts by up
to 2x over seconds, and `advisor calibrate` keeps the median of its rounds (3 to 8, until they agree) for the same reason
(``host x``: the executor's host probe during the run over its time at calibration).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from advisor.commands.execute import COMPARED_PARTS, ExecuteOptions, prepare_plan, run_prepared  # noqa: E402
from advisor.executor.matrix import MATRIX, matrix_plans  # noqa: E402


def part_errors(report: dict) -> dict[str, float]:
    rows = [r for r in report["memory"]["ranks"] if r["rel_error"] is not None]
    return {p: max(r["rel_error"][p] for r in rows) for p in COMPARED_PARTS} if rows else {}


def summarize(name: str, reps: list[dict]) -> dict:
    """One shape over its repeats: correctness and memory from the worst repeat, time as medians."""
    first = reps[0]
    steps = [r["time"]["measured_step_s"] for r in reps]
    predicted = first["time"]["predicted_step_s"]
    ratios = [s / predicted for s in steps] if predicted else []
    slow = [r["time"]["host_speed"]["slowdown"] for r in reps
            if r["time"].get("host_speed") and r["time"]["host_speed"]["slowdown"]]
    return {
        "shape": name, "world": first["executed"]["world_size"],
        "loss_diff": max(r["loss_max_rel_diff"] for r in reps),
        "gnorm_diff": max(r["grad_norm_max_rel_diff"] for r in reps),
        "mem_err": max((r["memory_max_rel_error"] or 0.0) for r in reps),
        "parts": part_errors(first),
        "measured_step_s": statistics.median(steps), "predicted_step_s": predicted,
        "ratio": statistics.median(ratios) if ratios else None,
        "ratio_range": [min(ratios), max(ratios)] if ratios else None,
        "host_slowdown": statistics.median(slow) if slow else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hardware", default=None, help="profile of this machine for the time prediction")
    ap.add_argument("--only", nargs="*", default=None, choices=list(MATRIX))
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--scale", type=int, default=1, help="tiny-model width and length multiplier")
    ap.add_argument("--repeat", type=int, default=1, help="run the matrix this many times; medians")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    opts = ExecuteOptions(steps=args.steps, time_hardware=args.hardware, timeout_s=900)
    plans = matrix_plans(args.only, scale=args.scale)
    start = time.time()
    prepared = [prepare_plan(p, name, opts) for name, p in plans.items()]
    runs = [run_prepared(prepared, opts) for _ in range(args.repeat)]
    wall = time.time() - start
    rows = [summarize(name, [run[i] for run in runs]) for i, name in enumerate(plans)]
    print(f"{'shape':20s} {'world':>5s} {'loss diff':>9s} {'gnorm diff':>10s} {'mem err':>8s} "
          + " ".join(f"{p[:12]:>12s}" for p in COMPARED_PARTS)
          + f" {'step ms':>8s} {'pred ms':>8s} {'ratio':>6s} {'range':>11s} {'host x':>6s}")
    for r in rows:
        ratio = f"{r['ratio']:6.2f}" if r["ratio"] is not None else f"{'-':>6s}"
        span = f"{r['ratio_range'][0]:.2f}-{r['ratio_range'][1]:.2f}" if r["ratio_range"] else "-"
        pred = f"{r['predicted_step_s'] * 1e3:8.1f}" if r["predicted_step_s"] else f"{'-':>8s}"
        host = f"{r['host_slowdown']:6.2f}" if r["host_slowdown"] else f"{'-':>6s}"
        print(f"{r['shape']:20s} {r['world']:5d} {r['loss_diff']:9.1e} {r['gnorm_diff']:10.1e} {r['mem_err']:8.1%} "
              + " ".join(f"{r['parts'].get(p, float('nan')):12.1%}" for p in COMPARED_PARTS)
              + f" {r['measured_step_s'] * 1e3:8.1f} {pred} {ratio} {span:>11s} {host}")
    timed = [r["ratio"] for r in rows if r["ratio"] is not None]
    if timed:
        inside = sum(abs(x - 1.0) <= 0.25 for x in timed)
        print(f"time ratio (median run) within 25%: {inside} of {len(timed)} shapes")
    print(f"wall time {wall:.1f} s for {len(plans) * args.repeat} runs (scale {args.scale}, {args.steps} steps)")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "runs": [dict(zip(plans, run)) for run in runs]}, indent=1))


if __name__ == "__main__":
    main()
