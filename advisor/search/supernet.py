"""Supernet plans (advisor.specs.supernet): the pipeline depth, the data-parallel replicas of it and
the layers per stage, priced with NASPipe's schedule (advisor.cost.supernet).

Every pp dividing the devices (dp = devices / pp replicas, each subnet's batch split between them) is
tried; stages are balanced on the mean candidate's time per layer with the head on the last stage
(it is every subnet's, and with a large vocabulary worth several layers). Ranked by subnets per
second among the plans that fit.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from advisor.cost.supernet import SupernetEstimate, SupernetRun, candidate_times_s, estimate_supernet
from advisor.cost.compute import head_compute_s
from advisor.errors import AdvisorError, InfeasibleError
from advisor.space.strategy import Strategy, StrategyBatch
from advisor.specs.hardware import HardwareProfile
from advisor.specs.job import Cluster, TrainingJob
from advisor.specs.supernet import SupernetSpec


@dataclass(frozen=True)
class SupernetPlan:
    strategy: Strategy
    estimate: SupernetEstimate


def balanced_stage_layers(layer_s: float, head_s: float, num_layers: int, pp: int) -> tuple[int, ...]:
    """Layers per stage (each at least one) minimizing the slowest stage, the last one carrying the
    head: exact over the last stage's count, the others as even as possible."""
    best, best_t = None, np.inf
    for last in range(1, num_layers - pp + 2):
        rest, others = num_layers - last, pp - 1
        if others == 0:
            if last != num_layers:
                continue
            split: list[int] = []
        else:
            if rest < others:
                continue
            base, extra = divmod(rest, others)
            split = [base + 1] * extra + [base] * (others - extra)
        t = max([n * layer_s for n in split] + [last * layer_s + head_s])
        if t < best_t - 1e-15:
            best, best_t = tuple(split) + (last,), t
    return best


def _layer_and_head_s(net: SupernetSpec, hw: HardwareProfile, job: TrainingJob, s: Strategy) -> tuple[float, float]:
    times = candidate_times_s(net, hw, job, s)
    head = float(head_compute_s(net.base, hw, job, StrategyBatch.from_strategies([s], net.num_layers))[0][0])
    return float(times.sum(axis=1).mean()), 3.0 * head


def supernet_strategy(net: SupernetSpec, hw: HardwareProfile, job: TrainingJob, pp: int, dp: int) -> Strategy:
    s = Strategy(dp=dp, tp=1, pp=pp, micro_batch_size=job.global_batch_size // dp, num_micro_batches=1)
    if pp == 1:
        return s
    if not 1 < pp <= net.num_layers:
        raise AdvisorError(f"a {pp}-stage pipeline needs at least {pp} layers; {net.name} has {net.num_layers}")
    layer_s, head_s = _layer_and_head_s(net, hw, job, s)
    return Strategy(dp=dp, tp=1, pp=pp, micro_batch_size=s.micro_batch_size, num_micro_batches=1,
                    stage_layers=balanced_stage_layers(layer_s, head_s, net.num_layers, pp))


# What NASPipe's runtime does to fit, where the run does not fit as it is: checkpointing
# (activations), context switching (weights), both
MEMORY_OPTIONS = ((True, False), (False, True), (True, True))


def fitting_estimate(net: SupernetSpec, hw: HardwareProfile, job: TrainingJob, s: Strategy,
                     run: SupernetRun) -> SupernetEstimate:
    """The run's estimate, or, where it does not fit, the fastest of MEMORY_OPTIONS that does (the
    leanest when none does, so that the refusal names the least memory this pipeline can need)."""
    e = estimate_supernet(net, hw, job, s, run)
    if e.feasible or run.checkpoint or run.context_switch:
        return e
    others = [estimate_supernet(net, hw, job, s, replace(run, checkpoint=c, context_switch=w)) for c, w in MEMORY_OPTIONS]
    fitting = [o for o in others if o.feasible]
    if fitting:
        return max(fitting, key=lambda o: o.subnets_per_s)
    return min([e] + others, key=lambda o: o.memory_gib)


def search_supernet(net: SupernetSpec, hw: HardwareProfile, cluster: Cluster, job: TrainingJob,
                    run: SupernetRun = SupernetRun(), pp: int | None = None, top_k: int = 5) -> list[SupernetPlan]:
    """The best plans, fastest first; InfeasibleError when none fits."""
    plans, why = [], []
    for depth in range(1, min(cluster.devices, net.num_layers) + 1):
        if cluster.devices % depth or (pp is not None and depth != pp):
            continue
        dp = cluster.devices // depth
        if job.global_batch_size % dp:
            why.append(f"pp {depth}: the batch {job.global_batch_size} does not split over {dp} replicas")
            continue
        s = supernet_strategy(net, hw, job, depth, dp)
        e = fitting_estimate(net, hw, job, s, run)
        if e.feasible:
            plans.append(SupernetPlan(s, e))
        else:
            host = (f" and {e.host_gib:.1f} GiB of host memory (of {e.host_capacity_gib:.0f})"
                    if e.host_gib > e.host_capacity_gib else "")
            why.append(f"pp {depth}: needs {e.memory_gib:.1f} GiB per device{host}")
    if not plans:
        raise InfeasibleError(f"no supernet plan fits on {cluster.devices} x {hw.device.name}: " + "; ".join(why[:3]))
    plans.sort(key=lambda p: -p.estimate.subnets_per_s)
    return plans[:top_k]
