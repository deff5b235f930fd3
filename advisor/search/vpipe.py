"""Memory-aware repartitioning (vPipe: Zhao et al., "vPipe: A Virtualized Acceleration System for
Achieving Efficient and Scalable Pipeline Parallel DNN Training", TPDS 2022): layers per stage chosen
together with how many layers each stage recomputes, so that a faster partition fits.

Under 1F1B the first stage keeps pp micro-batches of activations in flight and the last one keeps
one (advisor.cost.memory), so one recomputation count for every stage recomputes too much on the
late stages or too little on the early ones. Here each stage recomputes only what its own memory
needs: for stage i holding a span of L layers, the cost model's stage model priced without
recomputation (time T0, memory M0) and with every layer recomputed (T1, M1) (advisor.search.stages'
probes) give the fewest recomputed layers that fit, r = ceil(L (M0 - capacity) / (M0 - M1)) clipped
to [0, L], and its time T0 + r / L (T1 - T0) (a layer's replay and the memory it frees are the same
for every layer of a kind; spans that mix dense and MoE layers recompute them in proportion). The
exact min-max partition over those times (stages' dynamic programme) then picks the stage sizes;
the result is re-checked with the cost model's memory and a stage that misses its capacity
recomputes one more layer until it fits.

vPipe's other half swaps activations to the host instead (advisor.cost.swap): ``swap_strategy`` keeps
the stage sizes and gives each stage the fewest swapped layers that fit, raising the fullest stage's
count one layer at a time (MindFormers' swap_config lists the layers; Megatron-Core refuses its CPU
offloading under pipeline parallelism, TransformerConfig.__post_init__, and the PyTorch stacks have no
per-layer switch, so only framework mindspore swaps). ``repartition`` keeps whichever of recomputing
and swapping the cost model prices faster.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from advisor.cost.estimate import estimate_batch
from advisor.cost.memory import memory
from advisor.search import Pins
from advisor.search.stages import _min_max, _min_sum, _partitioned, stage_cost_models
from advisor.space.rules import legal_mask
from advisor.space.strategy import RECOMPUTE, Strategy, StrategyBatch
from advisor.specs.hardware import HardwareProfile
from advisor.specs.job import Cluster, TrainingJob
from advisor.specs.model import ModelSpec

SELECTIVE = RECOMPUTE.index("selective")


def _span_counts(model: ModelSpec, v: int):
    """(dense, MoE, span) over unit spans [a, b) of v layers: (units + 1, units + 1) arrays."""
    units = model.num_layers // v
    kinds = np.array([model.is_moe_layer(j) for j in range(model.num_layers)], dtype=bool)
    moe_prefix = np.concatenate([[0], np.cumsum(kinds)])[:: v].astype(float)
    dense_prefix = np.arange(0, model.num_layers + 1, v, dtype=float) - moe_prefix
    a, b = np.meshgrid(np.arange(units + 1), np.arange(units + 1), indexing="ij")
    return dense_prefix[b] - dense_prefix[a], moe_prefix[b] - moe_prefix[a], b > a


def memory_aware_strategy(model: ModelSpec, hw: HardwareProfile, job: TrainingJob, strategy: Strategy) -> Strategy | None:
    """The strategy with full recomputation of some layers per stage and the stage sizes that minimize
    the slowest stage within memory; None where no partition fits, pp is 1 or the framework cannot run
    it. Counts per stage as MindFormers' recompute list takes them (framework mindspore); one count for
    every stage, a multiple of the virtual stages, as Megatron's --recompute-method block takes it
    (framework megatron); the PyTorch stacks recompute all layers or none (advisor.search.stages)."""
    p, v = strategy.pp, strategy.virtual_pipeline_stages
    policy = job.framework_record.recompute_layer_counts
    if not _partitionable(model, job, strategy):
        return None
    stages, layers, capacity = _stage_spans(model, hw, job, strategy)
    if policy == "per_stage":
        best = _partition(stages, layers, p, model.num_layers // v, v, None)
    else:   # one count for every stage: the best of each multiple of v (the first, on ties)
        counts = np.arange(0, model.num_layers // p + v, v, dtype=float)
        bottlenecks = _count_bottlenecks(stages, layers, model.num_layers // v, counts)
        finite = np.flatnonzero(np.isfinite(bottlenecks))
        best = None if len(finite) == 0 else \
            _partition(stages, layers, p, model.num_layers // v, v, float(counts[finite[np.argmin(bottlenecks[finite])]]))
    if best is None:
        return None
    _, stage_layers, counts = best
    return _fit(model, job, replace(strategy, recompute="full", stage_layers=stage_layers), counts, capacity,
                per_stage=policy == "per_stage", step=v)


def _stage_spans(model: ModelSpec, hw: HardwareProfile, job: TrainingJob, strategy: Strategy):
    """(per stage: (time keeping every layer, time recomputing all, layers to recompute for memory, fits
    at all), each over unit spans [a, b); layers per span; device capacity) from the strategy's stage
    models without and with full recomputation."""
    keep, replay = stage_cost_models(model, hw, job, _probed(strategy))
    dense, moe, span = _span_counts(model, strategy.virtual_pipeline_stages)
    layers = np.maximum(dense + moe, 1.0)
    capacity = keep.capacity_bytes
    stages = []
    for i in range(strategy.pp):
        t0 = keep.time_fixed_s[i] + dense * keep.time_dense_s + moe * keep.time_moe_s
        t1 = replay.time_fixed_s[i] + dense * replay.time_dense_s + moe * replay.time_moe_s
        m0 = keep.memory_fixed_bytes[i] + dense * keep.memory_dense_bytes[i] + moe * keep.memory_moe_bytes[i]
        m1 = replay.memory_fixed_bytes[i] + dense * replay.memory_dense_bytes[i] + moe * replay.memory_moe_bytes[i]
        need = np.clip(np.ceil(layers * (m0 - capacity) / np.maximum(m0 - m1, 1.0) - 1e-9), 0.0, layers)
        stages.append((t0, t1, need, span & (m1 <= capacity)))
    return stages, layers, capacity


def _partitionable(model: ModelSpec, job: TrainingJob, strategy: Strategy) -> bool:
    """Stages that can be sized (advisor.search.stages), under a framework that takes recomputation counts."""
    return _partitioned(model, strategy) and job.framework_record.recompute_layer_counts is not None


def _probed(strategy: Strategy) -> list[Strategy]:
    """The strategies whose stage models memory_aware_strategy reads: without and with full recomputation."""
    base = replace(strategy, stage_layers=None, recompute_layers=None)
    return [replace(base, recompute="none"), replace(base, recompute="full")]


def _partition(stages, layers, p: int, units: int, v: int, count: float | None):
    """(slowest stage, stage layers, counts) of the min-max partition, each stage recomputing what its
    memory needs (count None) or the given count (capped at its layers), or None if none fits."""
    times, fits, needs = [], [], []
    for t0, t1, need, ok in stages:
        r = need if count is None else np.minimum(count, layers)
        ok = ok & (r >= need)
        times.append(np.where(ok, t0 + r / layers * (t1 - t0), np.inf))
        fits.append(ok)
        needs.append(r)
    bottleneck = _min_max(times, fits, p, units)
    if not np.isfinite(bottleneck):
        return None
    allowed = [f & (t <= bottleneck * (1 + 1e-9)) for t, f in zip(times, fits)]
    cuts = _min_sum([np.where(a, t * t, np.inf) for t, a in zip(times, allowed)], p, units)
    spans = list(zip(cuts, cuts[1:]))
    return (bottleneck, tuple(int((b - a) * v) for a, b in spans), [int(needs[i][a, b]) for i, (a, b) in enumerate(spans)])


def _count_bottlenecks(stages, layers, units: int, counts: np.ndarray) -> np.ndarray:
    """The min-max partition's slowest stage (_partition's first figure; inf where none fits) for each
    recomputation count every stage takes, all counts at once."""
    count = counts[:, None, None]
    best = np.full((len(counts), units + 1), np.inf)
    best[:, 0] = 0.0
    for t0, t1, need, ok in stages:
        r = np.minimum(count, layers)
        fits = ok & (r >= need)
        times = np.where(fits, t0 + r / layers * (t1 - t0), np.inf)
        best = np.where(fits, np.maximum(best[:, :, None], times), np.inf).min(axis=1)
    return best[:, units]


def _fit(model: ModelSpec, job: TrainingJob, s: Strategy, counts: list[int], capacity: float, per_stage: bool,
         step: int) -> Strategy | None:
    """The strategy with the counts raised (the fullest stage's by one layer, or every stage's by
    ``step`` when they share one count) until the cost model's memory says every stage fits (the stage
    model is affine; the real memory may round)."""
    layers = s.stage_layers
    if not per_stage:
        counts = [max(counts)] * len(layers)
    for _ in range(sum(layers) + 1):
        candidate = (replace(s, recompute_layers=tuple(counts) if per_stage else counts[0]) if any(counts)
                     else replace(s, recompute="none", recompute_layers=None))   # nothing to recompute
        mem = memory(model, job, StrategyBatch.from_strategies([candidate], model.num_layers))
        if mem.total[0] <= capacity:
            return candidate
        worst = int(mem.worst_stage[0])
        if counts[worst] >= layers[worst]:
            return None
        if per_stage:
            counts[worst] += 1
        else:
            counts = [c + step for c in counts]
    return None


def swap_strategy(model: ModelSpec, hw: HardwareProfile, job: TrainingJob, strategy: Strategy) -> Strategy | None:
    """The strategy, without recomputation, with the fewest swapped layers per stage that fit; None
    where it fits without swapping, nothing fits, or the framework cannot swap per layer."""
    if strategy.pp == 1 or strategy.virtual_pipeline_stages != 1 or not job.framework_record.activation_swap:
        return None
    s = replace(strategy, recompute="none", recompute_layers=None, swap_layers=None)
    layers = list(s.resolved_stage_layers(model.num_layers))
    counts = [0] * s.pp
    capacity = job.usable_memory_gib(hw.device.memory_gib) * 2.0 ** 30
    for _ in range(sum(layers) + 1):
        candidate = replace(s, stage_layers=tuple(layers), swap_layers=tuple(counts) if any(counts) else None)
        mem = memory(model, job, StrategyBatch.from_strategies([candidate], model.num_layers))
        if mem.total[0] <= capacity:
            return candidate if any(counts) else None
        worst = int(mem.worst_stage[0])
        if counts[worst] >= layers[worst]:
            return None
        counts[worst] += 1
    return None


def repartition(model: ModelSpec, hw: HardwareProfile, cluster: Cluster, job: TrainingJob,
                batch: StrategyBatch, pins: Pins = Pins()) -> StrategyBatch:
    """The batch with each pipelined candidate replaced by its memory-aware repartitioning (no or full
    recomputation) or its activation swapping (any) where the cost model prices that faster,
    or where only it fits. A
    candidate that keeps its optimizer states on the host also tries them back on the device, the
    recomputation paying for the memory (vPipe's trade of swapping against recomputing). An alternative that
    drops a pinned choice (--offload, --recompute, ...) is not taken."""
    rows = np.flatnonzero(batch.pp > 1)
    if len(rows) == 0:
        return batch
    current = estimate_batch(model, hw, cluster, job, batch)
    strategies = [batch.strategy(i) for i in range(len(batch))]
    starts = [(int(i), start) for i in rows for start in
              [strategies[i]] + ([replace(strategies[i], offload_optimizer=False, offload_params=False,
                                          offload_fraction=1.0)] if strategies[i].offload_optimizer else [])]
    # every start's stage models priced in one batch (memory_aware_strategy then finds them cached)
    stage_cost_models(model, hw, job, [p for i, start in starts if strategies[i].recompute != "selective"
                                       and _partitionable(model, job, start) for p in _probed(start)])
    tried, owner = [], []
    for i, start in starts:
        s = strategies[i]
        repartitioned = memory_aware_strategy(model, hw, job, start) if s.recompute != "selective" else None
        for alt in (repartitioned, swap_strategy(model, hw, job, start)):
            if alt is not None and alt != s and pins.admits(alt):
                tried.append(alt)
                owner.append(i)
    if not tried:
        return batch
    alternatives = StrategyBatch.from_strategies(tried, model.num_layers)
    e = estimate_batch(model, hw, cluster, job, alternatives)
    legal = legal_mask(model, cluster, job, alternatives)      # what the framework runs (uneven stages, swapping)
    best = {int(i): float(current.step_time_s[i]) if current.feasible[i] else np.inf for i in rows}
    for k, i in enumerate(owner):
        if legal[k] and e.feasible[k] and e.step_time_s[k] < best[i] * (1 - 1e-9):
            strategies[i], best[i] = tried[k], float(e.step_time_s[k])
    return StrategyBatch.from_strategies(strategies, model.num_layers)
