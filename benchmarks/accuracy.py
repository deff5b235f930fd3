"""Accuracy of the cost model against measured runs (prints figures; not a pass/fail test).

    python benchmarks/accuracy.py [--leave-one-out] [--recommend] [--runs]

Sections (each source named where its data lie; benchmarks/data/README.md lists them):
  1. Megatron-LM papers on A100: Korthikanti et al. 2022 Table 5 (iteration time), Narayanan et al.
     SC'21 Table 1 (TFLOP/s per GPU on the paper's own count), vTrain (Bang et al., MICRO'24) ranking.
  2. The calibration set (benchmarks/data/calibration_runs.yaml, 338 runs): throughput MAPE per source
     and device, with and without the runs left out as implausible or as preset conflicts, per feature,
     and the runs left out with their reasons.
  3. torchtitan's published tables (held out: no constant is fitted on them): throughput and peak
     memory (max reserved) MAPE.
  4. Ranking: Kendall tau of throughput inside each llm-foundry table (same model and GPU count).
  5. Feasibility: measured runs the cost model judges not to fit in memory (goal: none).
  6. --leave-one-out: each source's error when the device is refitted without it, and at the
     device's starting constants.
  7. --recommend: recommend on the README's examples next to the closest measured run's MFU.

How the profiles were fitted: benchmarks/fit_profiles.py and advisor/validation/fit.py.
MAPE = mean over runs of |predicted / measured - 1| of tokens per second per device.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from advisor.validation.published import published_errors, vtrain_ranking  # noqa: E402
from advisor.validation.accuracy import by_feature, by_group, predict, predictions  # noqa: E402
from advisor.validation.ranking import foundry_rankings  # noqa: E402
from advisor.validation.runs import PRESET_CONFLICT, load_runs  # noqa: E402
from advisor.validation.torchtitan import load_torchtitan_runs  # noqa: E402


def _stats(errors: list[float]) -> str:
    if not errors:
        return "n=  0"
    a = [abs(e) for e in errors]
    return (f"n={len(errors):3d}  MAPE {statistics.mean(a):6.1%}  median {statistics.median(a):6.1%}  "
            f"bias {statistics.mean(errors):+6.1%}  max {max(a):6.1%}  within 10%: {sum(x <= 0.10 for x in a)}/{len(a)}")


def papers() -> None:
    errors = published_errors()
    kort = [abs(e.relative_error) for e in errors if e.run_id.startswith("korthikanti")]
    sc21 = [abs(e.relative_error) for e in errors if e.run_id.startswith("sc21")]
    print("== 1. Megatron-LM papers on A100 (dgx-a100-80g)")
    for e in errors:
        print(f"   {e.run_id:26s} {e.metric:17s} measured {e.measured:9.2f} predicted {e.predicted:9.2f} {e.relative_error:+7.1%}")
    print(f"   Korthikanti 2022 Table 5 ({len(kort)} runs): mean |error| {statistics.mean(kort):.1%}, max {max(kort):.1%} "
          f"(goal <= 3% mean, <= 8% max)")
    print(f"   SC'21 Table 1 ({len(sc21)} runs): mean |error| {statistics.mean(sc21):.1%} (goal <= 8%)")
    scores = vtrain_ranking()
    taus = [s.kendall_tau for s in scores]
    top3 = sum(s.best_in_top3 for s in scores) / len(scores)
    print(f"   vTrain ({sum(s.configurations for s in scores)} runs, {len(scores)} groups): median Kendall tau "
          f"{statistics.median(taus):.3f} (goal >= 0.8), measured-best in predicted top 3: {top3:.0%}")


def calibration(show_runs: bool) -> list:
    preds = predictions()
    runs = load_runs()
    # runs left out whose inputs are all there: shown with their group too
    priced_anyway = {label: [predict(r) for r in runs if r.excluded and r.excluded.startswith(reason)]
                     for reason, label in (("implausible", "with the implausible"),
                                           (PRESET_CONFLICT, "with preset conflicts"))}
    print("\n== 2. Calibration set: throughput error per source and device (goal: MAPE <= 10% each)")
    for group, ps in by_group(preds).items():
        print(f"   {group:26s} {_stats([p.error for p in ps])}")
        for label, left_out in priced_anyway.items():
            extra = [p for p in left_out if p.run.group == group]
            if extra:
                print(f"     {label:24s} {_stats([p.error for p in ps + extra])}")
    print(f"   {'all':26s} {_stats([p.error for p in preds])}")
    print("   per feature (calibration set):")
    for feature, ps in by_feature(preds).items():
        print(f"     {feature:24s} {_stats([p.error for p in ps])}")
    print("   worst runs per source (|error| > 25%):")
    for group, ps in by_group(preds).items():
        worst = sorted((p for p in ps if abs(p.error) > 0.25), key=lambda p: -abs(p.error))
        for p in worst:
            print(f"     {p.run.id:60s} {p.error:+7.1%}")
    reasons: dict[str, list[str]] = {}
    for r in runs:
        if r.excluded:
            reasons.setdefault(r.excluded.split(":")[0], []).append(r.id)
    print(f"   left out ({sum(len(v) for v in reasons.values())} of {len(runs)}):")
    for reason, ids in sorted(reasons.items()):
        print(f"     {reason}: {len(ids)}")
    for r in runs:
        if r.excluded and (show_runs or not r.excluded.startswith(("no bundled profile", "NVFP4"))):
            print(f"       {r.id}: {r.excluded[:160]}")
    if show_runs:
        print("   every run:")
        for p in preds:
            print(f"     {p.run.id:60s} measured {p.run.measured_tokens_per_s_per_device:9.1f} "
                  f"predicted {p.predicted_tokens_per_s_per_device:9.1f} {p.error:+7.1%} memory {p.memory_gib:6.1f} GiB")
    return preds


def torchtitan() -> list:
    preds = [predict(r) for r in load_torchtitan_runs()]
    print("\n== 3. torchtitan's published runs (held out; memory = max reserved as torchtitan logs it)")
    for p in preds:
        mem = p.memory_error
        mem_text = "" if mem is None else f"  memory {p.memory_gib:5.1f} vs {p.run.measured_peak_memory_gib:5.1f} GiB {mem:+6.1%}"
        print(f"   {p.run.id:38s} {p.error:+7.1%}{mem_text}")
    for group, ps in by_group(preds).items():
        print(f"   {group + ' throughput':30s} {_stats([p.error for p in ps])}")
        mems = [p.memory_error for p in ps if p.memory_error is not None]
        if mems:
            print(f"   {group + ' peak memory':30s} {_stats(mems)}")
    print("   per feature (torchtitan):")
    for feature, ps in by_feature(preds).items():
        print(f"     {feature:24s} {_stats([p.error for p in ps])}")
    return preds


def ranking(preds: list) -> None:
    scores = foundry_rankings(preds)
    taus = [s.kendall_tau for s in scores]
    print("\n== 4. Ranking inside each llm-foundry table (same model and GPU count; goal tau >= 0.8)")
    for s in scores:
        print(f"   {s.table:18s} {s.model[:36]:36s} {s.devices:4d} GPUs {s.runs:3d} runs  tau {s.kendall_tau:+.3f}")
    print(f"   {len(scores)} groups: median tau {statistics.median(taus):.3f}, mean {statistics.mean(taus):.3f}, "
          f"min {min(taus):+.3f}, groups >= 0.8: {sum(t >= 0.8 for t in taus)}/{len(taus)}")


def feasibility(preds: list) -> None:
    bad = [p for p in preds if not p.fits]
    print(f"\n== 5. Measured runs judged not to fit in memory: {len(bad)} of {len(preds)} (goal: 0)")
    for p in bad:
        print(f"   {p.run.id}: predicted {p.memory_gib:.1f} GiB")


def leave_one_out() -> None:
    from advisor.validation.targets import TARGETS, leave_one_source_out, starting_errors

    print("\n== 6. Leave one source out: the source's error when its device is refitted without it, and")
    print("   at the device's starting constants (none of its runs fitted; Blackwell-Ultra: the Blackwell fit's)")
    for device, target in TARGETS.items():
        for source, errors in leave_one_source_out(target).items():
            print(f"   {device:15s} without {source:24s} {_stats(errors)}")
        for source, errors in starting_errors(target).items():
            print(f"   {device:15s} starting {source:23s} {_stats(errors)}")


def recommend_examples() -> None:
    from advisor.commands.inputs import resolve_inputs
    from advisor.commands.recommend import recommend
    from advisor.render.report import _knobs
    from advisor.validation.examples import EXAMPLES, closest_runs

    print("\n== 7. recommend on the examples, next to the closest measured run (MFU in advisor's convention)")
    for ex in EXAMPLES:
        inputs = resolve_inputs(ex.model, ex.hardware, devices=ex.devices, dtype=ex.dtype, global_batch_size=ex.global_batch)
        result = recommend(inputs.model, inputs.hardware, inputs.cluster, inputs.job, top_k=1, suggest=False)
        s, e = result.best.strategy, result.estimates[0]
        near = closest_runs(inputs.model.num_active_params, ex.devices, inputs.job.seq_length, ex.hardware, ex.dtype)
        print(f"   {ex.command}")
        print(f"     plan dp{s.dp} tp{s.tp} pp{s.pp} cp{s.cp} ep{s.ep} mbs{s.micro_batch_size} {_knobs(s)}: MFU {e.mfu:.1%}, "
              f"HFU {e.hfu:.1%}, recomputation: {s.recompute}, "
              f"calibrated: {'yes' if e.confidence and e.confidence.calibrated else 'no'}")
        for r in near:
            print(f"     closest measured: {r.id} ({r.params / 1e9:.0f}B active, {r.devices} devices, seq {r.seq_length}): "
                  f"MFU {r.mfu:.1%}, recomputation: {r.recompute}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--leave-one-out", action="store_true", help="refit each device without each source (about 2 min)")
    parser.add_argument("--recommend", action="store_true", help="run recommend on the examples")
    parser.add_argument("--runs", action="store_true", help="print every run")
    args = parser.parse_args()
    start = time.perf_counter()
    papers()
    preds = calibration(args.runs)
    titan = torchtitan()
    ranking(preds)
    feasibility(preds + titan)
    if args.leave_one_out:
        leave_one_out()
    if args.recommend:
        recommend_examples()
    print(f"\n({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
