"""Operator-level search at scale, and balanced pipeline stages. Prints figures; not a pass/fail test.

0. The searchers compared (issue 13): for each bundled transformer model at 8, 64 and 512 devices,
   the best predicted tokens/s and the search time of ``--searcher enumerate``, ``drec`` and ``ilp``
   (each a full, independent search as ``advisor recommend`` runs it: the composed searchers' time
   includes their outer enumeration), global batch 1,536 x 2,048 tokens; "gain" is the operator-level
   searchers' best over the enumerator's; "searched" counts the finalists whose operator layout
   differs from Megatron's. Then the composed searchers' time at 4,096 devices.
0b. 2-D tensor parallelism: each model at 64 and 512 devices with ``--searcher ilp``, tensor-parallel
   groups on their default mesh only and also split in two axes inside a node: the best predicted
   tokens/s of each, the gain, and the operators of the best plan that cut two dimensions.
1. GPT-3 175B (96 layers: one layer template, so the problem size does not depend on depth) sharded
   operator by operator over 64, 512 and 4,096 A100s with no pipeline: D-Rec's time (goal <= 1 s at
   4,096 devices), the ILP's time (goal <= 30 s, everything included) with its status and gap, and
   D-Rec's cost over the ILP's (goal within 10%). Global batch 1,536 x 2,048 tokens; the graph holds
   one micro-batch of N/8 sequences (gradient accumulation makes up the rest); ZeRO stage 1 where
   the leanest sharding fits in 80 GB, else the lowest stage that fits. Mesh: the default
   (nodes split in two axes, one axis inside a node). D-Rec is also timed on the prime-factor mesh
   (recursive halving, 12 levels at 4,096 devices).
2. BLOOM-176B (250,880-word vocabulary) with pp = 12 as trained (tp 4, dp 8, micro-batch 2, global
   batch 2,048): slowest/mean stage time for the uniform and the balanced split, and the step time
   the cost model gives each.

Usage: python benchmarks/operator_search.py [--sections compare twod operator stages] [--devices 64 512 4096]
       [--compare-devices 8 64 512] [--models gpt3-1.3b ...] [--time-limit 30] [--hardware dgx-a100-80g]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

from advisor.cost.estimate import estimate
from advisor.graph.transformer import transformer_graph
from advisor.search.drec import drec_search
from advisor.search import Pins
from advisor.search import enumerate as enumerator
from advisor.search.ilp import ilp_search
from advisor.search.operator_plan import best_priced, operator_plan
from advisor.search.sharding import DeviceMesh, ShardingOptions, ShardingProblem
from advisor.search.stages import stage_plan
from advisor.space.strategy import Strategy
from advisor.specs.hardware import load_hardware
from advisor.specs.job import Cluster, TrainingJob
from advisor.specs.model import bundled_models, load_model


def gpt3_problem(hw, devices: int, fine: bool = False, zero_stages=(1, 2, 3)) -> ShardingProblem:
    model = load_model("gpt3-175b")
    job = TrainingJob(global_batch_size=1536, seq_length=2048)
    batch = min(job.global_batch_size, max(1, devices // 8))
    graph = transformer_graph(model, job, batch=batch)
    mesh = DeviceMesh.for_devices(hw, devices, fine=fine)
    for zero in zero_stages:
        options = ShardingOptions(num_micro_batches=job.global_batch_size // batch, zero_stage=zero)
        problem = ShardingProblem(graph, mesh, hw, job, options)
        if problem.fits(problem.min_memory_bytes()):
            return problem
    return problem


def _timed_search(model, hw, cluster, job, searcher: str, time_limit: float):
    start = time.perf_counter()
    if searcher == "enumerate":
        outcome = enumerator.search(model, hw, cluster, job, Pins(), 5, distinct_layouts=False)
    else:
        outcome = operator_plan(model, hw, cluster, job, searcher, Pins(), 5, time_limit_s=time_limit)
    seconds = time.perf_counter() - start
    best, _ = best_priced(model, hw, cluster, job, outcome)
    searched = sum(r["layout"] == "searched" for r in outcome.operator_strategies or ())
    return best, seconds, searched, len(outcome.finalists)


def compare_table(hw, models, devices_list, time_limit: float) -> None:
    job = TrainingJob(global_batch_size=1536, seq_length=2048)
    print(f"Best predicted tokens/s and search time per searcher, {hw.name}, global batch "
          f"{job.global_batch_size} x {job.seq_length}")
    head = (f"{'model':<17} {'devices':>7} | {'enumerate':>11} {'s':>5} | {'drec':>11} {'s':>5} {'gain':>7} "
            f"{'searched':>8} | {'ilp':>11} {'s':>5} {'gain':>7} {'searched':>8} | {'ilp/drec':>8}")
    print(head)
    print("-" * len(head))
    worst = {"drec": float("inf"), "ilp": float("inf"), "ilp/drec": float("inf")}
    for name in models:
        model = load_model(name)
        for devices in devices_list:
            cluster = Cluster.of(hw, devices=devices)
            row = {s: _timed_search(model, hw, cluster, job, s, time_limit) for s in ("enumerate", "drec", "ilp")}
            base = row["enumerate"][0]

            def gain(value):
                return f"{value / base - 1:+7.2%}" if base > 0 else f"{'-':>7}"

            cells = [f"{name:<17} {devices:>7} | {base:11,.0f} {row['enumerate'][1]:5.2f}"]
            for s in ("drec", "ilp"):
                best, secs, searched, finalists = row[s]
                cells.append(f"{best:11,.0f} {secs:5.2f} {gain(best)} {f'{searched}/{finalists}':>8}")
                if base > 0:
                    worst[s] = min(worst[s], best / base)
            ratio = row["ilp"][0] / row["drec"][0] if row["drec"][0] > 0 else float("nan")
            if row["drec"][0] > 0:
                worst["ilp/drec"] = min(worst["ilp/drec"], ratio)
            print(" | ".join(cells) + f" | {ratio:8.4f}")
    print(f"smallest ratio over the table: drec/enumerate {worst['drec']:.6f}, ilp/enumerate {worst['ilp']:.6f}, "
          f"ilp/drec {worst['ilp/drec']:.6f} (1 or more: never slower)")
    model = load_model("gpt3-175b")
    cluster = Cluster.of(hw, devices=4096)
    for s in ("enumerate", "drec", "ilp"):
        best, secs, searched, finalists = _timed_search(model, hw, cluster, job, s, time_limit)
        print(f"gpt3-175b on 4,096 devices, --searcher {s}: {best:,.0f} tokens/s, {secs:.2f} s "
              f"({searched} of {finalists} finalists with a searched layout)")
    print()


def operator_table(hw, devices_list, time_limit: float) -> None:
    print("GPT-3 175B, operator-level search over all devices (no pipeline), "
          f"{hw.name}; costs in seconds per optimizer step")
    head = (f"{'devices':>7} {'mesh':>11} {'batch x m':>9} {'zero':>4} | {'D-Rec s':>7} {'D-Rec cost':>10} | "
            f"{'ILP status':>10} {'ILP s':>6} {'gap':>7} {'ILP cost':>9} | {'D-Rec/ILP':>9} | "
            f"{'strategies':>10} {'pairs':>6} {'space':>8}")
    print(head)
    print("-" * len(head))
    zero_used = {}
    for devices in devices_list:
        problem = gpt3_problem(hw, devices)
        zero_used[devices] = problem.options.zero_stage
        start = time.perf_counter()
        drec = drec_search(problem)
        drec_s = time.perf_counter() - start
        result = ilp_search(problem, time_limit_s=time_limit - drec_s, warm_start=drec)
        ilp_s = result.seconds + drec_s          # the warm start is part of the ILP's time
        batch = problem.graph.tensors["tokens"].shape[0]
        ratio = drec.cost_s / result.solution.cost_s if result.solution else float("nan")
        gap = f"{result.gap:.2%}" if result.gap is not None else "-"
        cost = f"{result.solution.cost_s:9.3f}" if result.solution else f"{'-':>9}"
        print(f"{devices:>7} {problem.mesh.describe():>11} {batch:>4} x {problem.options.num_micro_batches:<4}"
              f"{problem.options.zero_stage:>4} | {drec_s:7.2f} {drec.cost_s:10.3f} | {result.status:>10} {ilp_s:6.1f} "
              f"{gap:>7} {cost} | {ratio:9.3f} | {result.stats.get('strategies', 0):>10} "
              f"{result.stats.get('pair_variables', 0):>6} {problem.space_size():8.1e}")
        if not drec.fits or result.message:
            print(f"        note: {result.message or 'D-Rec answer does not fit'}")
    print()
    fine_devices = max(devices_list)
    problem = gpt3_problem(hw, fine_devices, fine=True, zero_stages=(zero_used[fine_devices],))
    start = time.perf_counter()
    drec = drec_search(problem)
    print(f"D-Rec on the prime-factor mesh ({problem.mesh.describe()}: recursive halving, {len(problem.mesh.shape)} "
          f"levels), {fine_devices} devices: {time.perf_counter() - start:.2f} s, cost {drec.cost_s:.3f} s/step")
    print()


def stage_table(hw) -> None:
    model = load_model("bloom-176b")
    job = TrainingJob(global_batch_size=2048, seq_length=2048)
    strategy = Strategy(dp=8, tp=4, pp=12, micro_batch_size=2, num_micro_batches=128, zero_stage=1,
                        sequence_parallel=True, recompute="selective")
    start = time.perf_counter()
    plan = stage_plan(model, hw, job, strategy)
    seconds = time.perf_counter() - start
    cluster = Cluster.of(hw, devices=strategy.devices)
    steps = {name: estimate(model, hw, cluster, job, replace(strategy, stage_layers=layers)).step_time_s
             for name, layers in (("uniform", plan.uniform_layers), ("balanced", plan.stage_layers))}
    print(f"BLOOM-176B (vocabulary {model.vocab_size:,}), pp = 12, tp 4, dp 8, micro-batch 2 x 128, {hw.name}")
    print(f"{'split':>8}  {'layers per stage':<44} {'slowest/mean':>12} {'slowest stage s':>15} {'step s':>7}")
    print(f"{'uniform':>8}  {str(list(plan.uniform_layers)):<44} {plan.uniform_imbalance:12.3f} "
          f"{plan.uniform_slowest_s:15.4f} {steps['uniform']:7.2f}")
    print(f"{'balanced':>8}  {str(list(plan.stage_layers)):<44} {plan.balanced_imbalance:12.3f} "
          f"{plan.balanced_slowest_s:15.4f} {steps['balanced']:7.2f}")
    print(f"balanced partition computed in {seconds * 1e3:.1f} ms (cached afterwards); fits in memory: {plan.fits}")


def two_d_operators(rec) -> list[str]:
    """The operators of a layout record that cut two or more of their labels (2-D tensor parallelism)."""
    if not isinstance(rec, dict) or rec.get("layout") != "searched":
        return []
    return [name.rsplit(".", 1)[-1] + "(" + ",".join(lab or "-" for lab in op["mesh_axes"]) + ")"
            for name, op in rec.get("operators", {}).items()
            if len({lab for lab in op["mesh_axes"] if lab is not None}) >= 2]


def two_d_table(hw, models, devices_list, time_limit: float) -> None:
    """--searcher ilp with tensor-parallel groups on their default mesh only (1-D) and also split in
    two axes (2-D): the best predicted tokens/s of each, and the 2-D cuts of the best plan."""
    job = TrainingJob(global_batch_size=1536, seq_length=2048)
    print(f"2-D tensor parallelism (--searcher ilp), {hw.name}, global batch {job.global_batch_size} x {job.seq_length}")
    head = f"{'model':<17} {'devices':>7} | {'1-D only':>11} | {'with 2-D':>11} {'gain':>7} | best plan: mesh, 2-D cuts"
    print(head)
    print("-" * len(head))
    for name in models:
        model = load_model(name)
        for devices in devices_list:
            cluster = Cluster.of(hw, devices=devices)
            best = {}
            for two_d in (False, True):
                outcome = operator_plan(model, hw, cluster, job, "ilp", Pins(), 5, time_limit_s=time_limit,
                                        two_d=two_d)
                best[two_d] = (best_priced(model, hw, cluster, job, outcome), outcome)
            (one, _), _ = best[False]
            (two, i), outcome = best[True]
            rec = outcome.operator_strategies[i] if i >= 0 and outcome.operator_strategies else None
            cuts = two_d_operators(rec)
            where = (f"mesh {rec.get('mesh')} tp {rec.get('tensor_parallel_devices')}: {' '.join(cuts)}" if cuts
                     else "none (1-D layout)")
            gain = f"{two / one - 1:+7.2%}" if one > 0 else f"{'-':>7}"
            print(f"{name:<17} {devices:>7} | {one:11,.0f} | {two:11,.0f} {gain} | {where}")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, nargs="+", default=[64, 512, 4096])
    parser.add_argument("--time-limit", type=float, default=30.0, help="ILP time limit, seconds (everything included)")
    parser.add_argument("--hardware", default="dgx-a100-80g")
    parser.add_argument("--sections", nargs="+", default=["compare", "twod", "operator", "stages"],
                        choices=["compare", "twod", "operator", "stages"])
    parser.add_argument("--compare-devices", type=int, nargs="+", default=[8, 64, 512])
    parser.add_argument("--twod-devices", type=int, nargs="+", default=[64, 512])
    parser.add_argument("--models", nargs="+", default=None, help="default: every bundled transformer model")
    args = parser.parse_args()
    hw = load_hardware(args.hardware)
    if "compare" in args.sections:
        compare_table(hw, args.models or bundled_models("transformer"), args.compare_devices, args.time_limit)
    if "twod" in args.sections:
        two_d_table(hw, args.models or bundled_models("transformer"), args.twod_devices, args.time_limit)
    if "operator" in args.sections:
        operator_table(hw, args.devices, args.time_limit)
    if "stages" in args.sections:
        stage_table(hw)


if __name__ == "__main__":
    main()
