"""Run the executor's validation matrix and print its figures (not a pass/fail test).

    python benchmarks/executor_matrix.py [--hardware PROFILE.yaml] [--only NAME ...] [--json OUT]

For each plan shape: world size, the largest relative loss difference against the single-process
run (5 fp32 steps), the same for the gradient norm, the largest relative memory error per part on
the predicted worst stage's ranks, the step-time ratio measured / predicted (with --hardware, a
profile of this machine from `advisor calibrate`), and the wall time of the whole matrix.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from advisor.execute import COMPARED_PARTS, ExecuteOptions, prepare_plan, run_prepared  # noqa: E402
from advisor.executor.matrix import MATRIX, matrix_plans  # noqa: E402


def part_errors(report: dict) -> dict[str, float]:
    rows = [r for r in report["memory"]["ranks"] if r["rel_error"] is not None]
    return {p: max(r["rel_error"][p] for r in rows) for p in COMPARED_PARTS} if rows else {}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hardware", default=None, help="profile of this machine for the time prediction")
    ap.add_argument("--only", nargs="*", default=None, choices=list(MATRIX))
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    opts = ExecuteOptions(steps=args.steps, time_hardware=args.hardware, timeout_s=900)
    plans = matrix_plans(args.only)
    start = time.time()
    prepared = [prepare_plan(p, name, opts) for name, p in plans.items()]
    reports = run_prepared(prepared, opts)
    wall = time.time() - start
    head = f"{'shape':24s} {'world':>5s} {'loss diff':>9s} {'gnorm diff':>10s} {'mem err':>8s} " + \
        " ".join(f"{p[:12]:>12s}" for p in COMPARED_PARTS) + f" {'time ratio':>10s} {'step ms':>8s}"
    print(head)
    out = []
    for name, rep in zip(plans, reports):
        errs = part_errors(rep)
        ratio = rep["time_ratio"]
        print(f"{name:24s} {rep['executed']['world_size']:5d} {rep['loss_max_rel_diff']:9.1e} "
              f"{rep['grad_norm_max_rel_diff']:10.1e} {rep['memory_max_rel_error'] or 0:8.1%} "
              + " ".join(f"{errs.get(p, float('nan')):12.1%}" for p in COMPARED_PARTS)
              + f" {ratio if ratio is not None else float('nan'):10.2f} {rep['time']['measured_step_s'] * 1e3:8.1f}")
        out.append({"shape": name, "report": rep})
    print(f"wall time {wall:.1f} s for {len(reports)} runs")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
