"""The error bands' table from leave-one-source-out residuals (prints it; --write stores it).

    python benchmarks/error_bands.py [--write] [--evaluations N]

For every device of benchmarks/fit_profiles.py (advisor/validation/targets.py) and every source of its
measured runs, the device's constants are refitted without that source and the source's runs are
predicted; each residual (predicted / measured - 1 of tokens/s) is counted with the parts of its plan
outside what the other sources cover (advisor.cost.confidence against their summary and coverage).
advisor/cost/band.py explains the figures drawn from them; --write puts them in
advisor/cost/error_bands.json, which estimate and recommend read.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from advisor.cost.band import MIN_RUNS, TABLE  # noqa: E402
from advisor.cost.confidence import confidence, summarize  # noqa: E402
from advisor.cost.estimate import estimate  # noqa: E402
from advisor.specs.hardware import load_hardware  # noqa: E402
from advisor.specs.job import Cluster  # noqa: E402
from advisor.validation.accuracy import predict, run_hardware, usable_runs  # noqa: E402
from advisor.validation.torchtitan import load_torchtitan_runs  # noqa: E402
from advisor.validation.published import load_published_runs, paper_source  # noqa: E402
from advisor.validation.published import predict as predict_published  # noqa: E402
from advisor.validation.targets import TARGETS, leave_one_source_out  # noqa: E402
from advisor.validation.write import write_atomic  # noqa: E402

QUANTILES = (0.10, 0.90)


@dataclass(frozen=True)
class Run:
    """One measured run as the fit sees it, with the share of data-parallel traffic its estimate prices."""

    id: str
    model: object
    job: object
    strategy: object
    devices: int
    group: str
    hw: object
    dp_share: float


def _run(rid, model, job, strategy, devices, group, hw) -> Run:
    e = estimate(model, hw, Cluster.of(hw, devices=devices), job, strategy)
    return Run(rid, model, job, strategy, devices, group, hw, e.dp_traffic_share or 0.0)


def target_runs(target) -> list[Run]:
    """The target's runs in the order of its observations (advisor.validation.targets.observations)."""
    out = [_run(r.id, r.model, r.job, r.strategy, r.devices, r.group, run_hardware(r))
           for r in usable_runs() if r.profile in target.profiles]
    if target.device == "A100":
        for run in load_published_runs():
            hw = load_hardware(run.hardware)
            out.append(_run(run.id, run.model, run.job, predict_published(run, hw).strategy, run.devices,
                            paper_source(run), hw))
    return out


def coverage(runs: list[Run]) -> dict:
    """The plan-dependent ranges ``runs`` span (advisor.cost.band's coverage)."""
    zero3 = [r.strategy.dp * r.strategy.cp for r in runs if r.strategy.zero_stage == 3]
    moe = [r.strategy.micro_batch_size * r.job.seq_length for r in runs if r.model.moe is not None]
    return {"zero3_ranks": [min(zero3), max(zero3)] if zero3 else None,
            "dp_traffic_share": round(max(r.dp_share for r in runs), 4) if runs else None,
            "moe_micro_batch_tokens": [min(moe), max(moe)] if moe else None}


def residuals(target, evaluations: int) -> list[tuple[Run, float, int]]:
    """(run, leave-one-source-out error, parts outside the other sources' region) for the target's runs."""
    runs = target_runs(target)
    errors = leave_one_source_out(target, evaluations)
    out = []
    for source, errs in errors.items():
        members = [r for r in runs if r.group == source]
        rest = [r for r in runs if r.group != source]
        if len(members) != len(errs):
            raise SystemExit(f"{target.device} {source}: {len(members)} runs but {len(errs)} residuals")
        cal = summarize(rest) if rest else None
        cov = coverage(rest)
        for r, e in zip(members, errs):
            if cal is None:
                parts = 1
            else:
                conf = confidence(r.model, r.hw, Cluster.of(r.hw, devices=r.devices), r.job, r.strategy,
                                  dp_share=r.dp_share, cal=cal, cov=cov)
                parts = len(conf.extrapolated)
            out.append((r, e, parts))
    return out


def features(r: Run) -> list[str]:
    """The issue's features of a run: where the model must generalise (a run can have several)."""
    out = []
    if r.job.seq_length >= 65536:
        out.append("long context (>= 64k)")
    if r.job.seq_length >= 16384:
        out.append("long context (>= 16k)")
    if r.devices > 1000:
        out.append("> 1,000 devices")
    if r.model.moe is not None:
        out.append("MoE")
    if r.strategy.zero_stage == 3:
        out.append("FSDP/ZeRO-3")
    if r.job.dtype == "fp8":
        out.append("FP8")
    if r.strategy.cp > 1:
        out.append("context parallel")
    return out


def _q(values, q):
    return float(np.quantile(np.asarray(values, dtype=float), q))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"write {TABLE.name}")
    parser.add_argument("--evaluations", type=int, default=60, help="least-squares function evaluations per refit")
    args = parser.parse_args()
    per_target = {name: residuals(t, args.evaluations) for name, t in TARGETS.items()}
    everything = [x for rows in per_target.values() for x in rows]
    inside = [e for _, e, k in everything if k == 0]
    outside = [(e, k) for _, e, k in everything if k > 0]
    pooled = [_q(inside, q) for q in QUANTILES]
    inner80 = _q([abs(e) for e in inside], 0.8)
    one = [abs(e) for e, k in outside if k == 1]
    more = [(abs(e), k) for e, k in outside if k > 1]
    # the first part outside: how much wider the 80% interval of |e| is for runs with exactly one part outside
    first = max(_q(one, 0.8) - inner80, 0.0) if one else 0.0
    # each further part: the runs with more, over their mean count beyond the first (0 where they are no worse)
    more_k = statistics.mean(k - 1 for _, k in more) if more else 1.0
    further = max(_q([e for e, _ in more], 0.8) - inner80 - first, 0.0) / more_k if more else 0.0
    pairs = []
    for rows in per_target.values():
        groups: dict[tuple, list[float]] = {}
        for r, e, _ in rows:
            groups.setdefault((r.group, r.model.name, r.devices), []).append(e)
        for errs in groups.values():
            pairs += [abs(a - b) for a, b in itertools.combinations(errs, 2)]
    print("leave-one-source-out error per source (each source predicted by its device refitted without it):")
    for name, rows in per_target.items():
        for source in sorted({r.group for r, _, _ in rows}):
            errs = [abs(e) for r, e, _ in rows if r.group == source]
            print(f"   {name:16s} {source:26s} n={len(errs):3d} MAPE {statistics.mean(errs):6.1%} "
                  f"median {statistics.median(errs):6.1%}")
    print("leave-one-source-out error per feature (every device's residuals; a run counts under each of its features):")
    by_feature: dict[str, list[float]] = {}
    for r, e, _ in everything:
        for feature in features(r):
            by_feature.setdefault(feature, []).append(abs(e))
    for feature, errs in sorted(by_feature.items()):
        print(f"   {feature:26s} n={len(errs):3d} MAPE {statistics.mean(errs):6.1%} median {statistics.median(errs):6.1%}")
    absent = [f for f in ("long context (>= 64k)", "> 1,000 devices", "MoE", "FSDP/ZeRO-3", "FP8") if f not in by_feature]
    if absent:
        print(f"   no measured run has: {', '.join(absent)}")
    profiles = {}
    print(f"{'device':16s} {'runs':>5s} {'inside':>6s} {'p10':>7s} {'p90':>7s}  own?  coverage")
    for name, rows in per_target.items():
        own = [e for _, e, k in rows if k == 0]
        mine = len(own) >= MIN_RUNS
        low, high = ([_q(own, q) for q in QUANTILES] if mine else pooled)
        cov = coverage([r for r, _, _ in rows])
        print(f"{name:16s} {len(rows):5d} {len(own):6d} {low:+7.1%} {high:+7.1%}  {'yes' if mine else 'no '}   {cov}")
        for profile in TARGETS[name].profiles:
            profiles[profile] = {"target": name, "runs": len(rows), "in_region_runs": len(own),
                                 "in_region": [round(low, 4), round(high, 4)], "coverage": cov}
    uncalibrated = [_q([e for e, _ in outside], q) for q in QUANTILES] if outside else pooled
    print(f"\nall: {len(everything)} residuals, {len(inside)} inside their region: p10 {pooled[0]:+.1%} p90 {pooled[1]:+.1%}"
          f" |e| p80 {inner80:.1%}; {len(outside)} outside")
    print(f"outside the region: the first part {first:+.1%} wider, each further part {further:+.1%}; pairs of plans for one job: {len(pairs)}, median |e_a - e_b| "
          f"{statistics.median(pairs):.1%}; uncalibrated profiles: {uncalibrated[0]:+.1%} to {uncalibrated[1]:+.1%}")
    by_k: dict[int, list[float]] = {}
    for _, e, k in everything:
        by_k.setdefault(min(k, 3), []).append(abs(e))
    for k, errs in sorted(by_k.items()):
        print(f"   {k}{'+' if k == 3 else ' '} parts outside: n={len(errs):3d} |e| median {statistics.median(errs):5.1%} "
              f"p80 {_q(errs, 0.8):5.1%}")
    memory = [p.memory_error for p in map(predict, load_torchtitan_runs()) if p.memory_error is not None]
    mem_band = [_q(memory, q) for q in QUANTILES]
    print(f"peak memory (torchtitan, {len(memory)} runs): predicted / measured - 1 from {mem_band[0]:+.1%} to "
          f"{mem_band[1]:+.1%}")
    table = {"written_by": "python benchmarks/error_bands.py --write", "quantiles": list(QUANTILES),
             "residuals": len(everything), "first_part": round(first, 4), "further_part": round(further, 4), "pair": round(statistics.median(pairs), 4),
             "uncalibrated": [round(x, 4) for x in uncalibrated],
             "memory": [round(x, 4) for x in mem_band], "profiles": profiles}
    if args.write:
        write_atomic(TABLE, json.dumps(table, indent=1, sort_keys=True) + "\n")
        print(f"wrote {TABLE}")


if __name__ == "__main__":
    main()
