"""Run the executor's validation matrix and print its figures (not a pass/fail test).

    python benchmarks/executor_matrix.py [--hardware PROFILE.yaml] [--only NAME ...] [--steps K]
                                         [--scale S] [--repeat R] [--dtype fp32|bf16] [--json OUT]
    python benchmarks/executor_matrix.py --layouts [--steps K]
    python benchmarks/executor_matrix.py --settings
    python benchmarks/executor_matrix.py --headline [--steps K]

--settings prints, for every plan setting (advisor.space.strategy.Strategy and advisor.specs.job.
TrainingJob, each set away from its default on a tiny bf16 plan), whether the executor runs it, runs it
with a note, or refuses it by name before any process starts. --layouts runs the plans with operator
layouts (advisor.executor.matrix.LAYOUTS: D-Rec/ILP-style cuts of batch, sequence, hidden, heads, FFN and
vocabulary on one- and two-axis meshes, alone and with pp, dp and ZeRO-1) through DTensor placements. --headline runs the README's headline
recommendation (llama3-70b on 64 H100s) at --tiny: 64 processes.

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
from advisor.executor.matrix import LAYOUTS, MATRIX, matrix_plans  # noqa: E402


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


# A setting's sample value away from its default, and what it needs beside it to be a legal plan
COMPANIONS = {
    "pp": dict(num_micro_batches=4), "virtual_pipeline_stages": dict(pp=2, num_micro_batches=4,
                                                                     pipeline_schedule="interleaved-1f1b"),
    "pipeline_schedule": dict(pp=2, num_micro_batches=4), "sequence_parallel": dict(tp=2),
    "recompute_layers": dict(recompute="full"), "offload_optimizer": dict(zero_stage=1),
    "offload_fraction": dict(zero_stage=1, offload_optimizer=True),
    "offload_params": dict(zero_stage=3, offload_optimizer=True),
    "grad_bucket_mb": dict(zero_stage=0), "stage_layers": dict(pp=2, num_micro_batches=4),
    "swap_layers": dict(pp=2, num_micro_batches=4), "host_embedding": dict(zero_stage=0),
}
SAMPLES = {"mesh_order": ["dp", "pp", "cp", "tp"], "stage_layers": [3, 1], "swap_layers": [1, 0],
           "recompute_layers": 1, "pipeline_schedule": "gpipe", "recompute_modules": ["core_attn", "mlp"],
           "cuda_graphs": ["attn"], "dtype": "fp16", "optimizer": "sgd", "framework": "torchtitan"}


def _sample(name: str, st, default):
    if name in SAMPLES:
        return SAMPLES[name]
    if st.kind == "boolean":
        return not default if default is not None else True
    if st.kind == "choice":
        return next(c for c in st.choices if c != default)
    if st.kind in ("positive_int", "non_negative_int"):
        return 2
    if st.kind in ("positive_float", "non_negative_float"):
        return 4.0
    if st.kind == "fraction":
        return 0.5
    return None


def settings_table() -> list[tuple[str, str, str]]:
    """(setting, sample value, what the executor does with it) for every plan setting, each set away from
    its default on a tiny bf16 plan (dp 2, ZeRO-1, flash attention): runs, runs with a note, or refused."""
    from advisor.errors import AdvisorError
    from advisor.executor.config import run_config_from_plan
    from advisor.executor.matrix import tiny_plan
    from advisor.space.strategy import Strategy
    from advisor.specs.job import TrainingJob
    from advisor.specs.setting import field_default, settings_of

    rows = []
    for section, cls in (("parallel", Strategy), ("training", TrainingJob)):
        for fl, st in settings_of(cls):
            if fl.name in ("dp", "global_batch_size", "seq_length"):
                continue
            value = _sample(fl.name, st, field_default(fl))
            if value is None:
                continue
            par = dict(dp=2, zero_stage=1)
            train = dict(dtype="bf16")
            if section == "parallel":
                par.update(COMPANIONS.get(fl.name, {}))
                par[fl.name] = value
            else:
                train[fl.name] = value
            plan = tiny_plan(par, "llama", "flash", training=train)
            if section == "parallel" and fl.name == "tp":
                plan["model"]["num_kv_heads"] = 4
            try:
                cfg = run_config_from_plan(plan)
                what = "runs" + (f" ({'; '.join(cfg.notes)})" if cfg.notes else "")
            except AdvisorError as e:
                what = "refused: " + str(e).replace("the executor cannot run this plan: ", "")
            rows.append((f"{section}.{fl.name}", repr(value), what))
    return rows


HEADLINE = ("--model", "llama3-70b", "--hardware", "dgx-h100", "--nodes", "8", "--top", "3")


def run_headline(steps: int) -> None:
    """The README's `advisor recommend` example, its #1 executed at --tiny: every rank a process here."""
    import subprocess
    import tempfile

    from advisor.commands.execute import execute
    from advisor.validation.execute_report import summary_rows

    with tempfile.TemporaryDirectory() as tmp:
        plan = Path(tmp) / "plan.json"
        subprocess.run([sys.executable, "-m", "advisor", "recommend", *HEADLINE, "--out", str(plan)], check=True,
                       stdout=subprocess.DEVNULL)
        start = time.time()
        report = execute(plan, ExecuteOptions(tiny=True, oversubscribe=True, steps=steps, timeout_s=3600))
        wall = time.time() - start
    ex = report["executed"]
    par = ex["parallel"]
    print(f"headline plan: dp {par['dp']} tp {par['tp']} pp {par['pp']} cp {par['cp']} sp {par['sequence_parallel']} "
          f"zero {par['zero_stage']} {par['pipeline_schedule']} mbs {par['micro_batch_size']} x "
          f"{par['num_micro_batches']}, {ex['dtype']}, {ex['world_size']} ranks, {steps} steps: {wall:.0f} s")
    for what, measured, predicted, verdict in summary_rows(report):
        print(f"  {what:36s} {measured:>14s} {predicted:>22s}  {verdict}")
    print("verdict:", "ok" if report["verdict"]["ok"] else "; ".join(report["verdict"]["failures"]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hardware", default=None, help="profile of this machine for the time prediction")
    ap.add_argument("--only", nargs="*", default=None, choices=list(MATRIX))
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--scale", type=int, default=1, help="tiny-model width and length multiplier")
    ap.add_argument("--repeat", type=int, default=1, help="run the matrix this many times; medians")
    ap.add_argument("--json", default=None)
    ap.add_argument("--dtype", default=None, choices=["fp32", "bf16"], help="run the matrix in this dtype")
    ap.add_argument("--layouts", action="store_true",
                    help="run the operator-layout plans (D-Rec/ILP-style cuts through DTensor placements) instead")
    ap.add_argument("--settings", action="store_true", help="only print what the executor does with each setting")
    ap.add_argument("--headline", action="store_true",
                    help="only run the README's headline recommendation (64 ranks) at --tiny")
    args = ap.parse_args()
    if args.settings:
        for name, value, what in settings_table():
            print(f"{name:34s} {value:28s} {what}")
        return
    if args.headline:
        run_headline(args.steps)
        return
    opts = ExecuteOptions(steps=args.steps, time_hardware=args.hardware, timeout_s=900, dtype=args.dtype)
    plans = matrix_plans(args.only, scale=args.scale)
    if args.layouts:
        plans = dict(LAYOUTS)
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
