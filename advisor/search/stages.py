"""Balanced pipeline stages: layers per stage that minimize the slowest stage, within memory.

The pipeline's step time is m x (slowest stage) plus the fill and drain (advisor.cost.bubble), so
an even split of layers is not the best one when stages differ: the first stage also embeds, the
last runs the final norm, the LM head and the loss (with a 250k vocabulary the head costs more than
a layer), MoE layers cost more than dense ones, and 1F1B keeps more micro-batches in flight on the
early stages (memory). This is the load-imbalance problem vPipe (Zhao et al., TPDS 2022) and
MindSpore's pipeline partitioner address.

Method.

1. Stage costs come from the cost model itself, not a copy of its formulas: for each stage index i,
   ``estimate_batch`` and ``memory`` price probe candidates whose stage i holds K, 2K (and K + 1)
   layers and whose other stages hold none, with K so large that stage i is the slowest and the
   fullest. The stage's time per micro-batch (compute, recomputation, TP/CP/EP communication) and
   its memory are affine in its dense and MoE layer counts, so the probes give, per stage, an
   intercept (embedding, head, fixed buffers; in-flight activations depend on i) and a slope per
   layer kind.
2. Exact partition (a linear-partition problem with stage-dependent costs): dynamic programming
   over (stage, last layer) minimizes the slowest stage's time subject to every stage's memory
   fitting, in units of ``vpp`` layers (interleaving needs stage counts divisible by vpp); a second
   pass, with every stage at most that bottleneck, minimizes the sum of squared stage times (the
   most even split among the optimal ones). The even split is kept when it is as good.
3. The answer is checked with ``memory`` on the real partition; results are cached per (model,
   hardware, job, strategy without its stage layers), so the enumerator can call this for every
   candidate.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from advisor.cost.estimate import estimate_batch
from advisor.cost.memory import memory
from advisor.space.rules import legal_mask
from advisor.space.strategy import Strategy, StrategyBatch, even_stage_layers
from advisor.specs.hardware import HardwareProfile
from advisor.specs.job import Cluster, TrainingJob
from advisor.specs.model import ModelSpec

STAGE_TIME_PARTS = ("compute", "recompute", "tp_comm", "cp_comm", "ep_comm")
PROBE_LAYERS = 1 << 14
CACHE_LIMIT = 50_000
_CACHE: dict[tuple, "StagePlan"] = {}
_SM_CACHE: dict[tuple, "StageModel"] = {}


@dataclass(frozen=True)
class StageModel:
    """Per stage i: seconds per micro-batch = time_fixed_s[i] + layer time (dense or MoE); bytes =
    memory_fixed_bytes[i] + memory per layer of stage i (dense or MoE)."""

    time_fixed_s: np.ndarray
    time_dense_s: float
    time_moe_s: float
    memory_fixed_bytes: np.ndarray
    memory_dense_bytes: np.ndarray
    memory_moe_bytes: np.ndarray
    capacity_bytes: float

    def stage_times_s(self, model: ModelSpec, stage_layers) -> np.ndarray:
        dense, moe = _kinds_per_stage(model, stage_layers)
        return self.time_fixed_s + dense * self.time_dense_s + moe * self.time_moe_s

    def stage_memory_bytes(self, model: ModelSpec, stage_layers) -> np.ndarray:
        dense, moe = _kinds_per_stage(model, stage_layers)
        return self.memory_fixed_bytes + dense * self.memory_dense_bytes + moe * self.memory_moe_bytes


@dataclass(frozen=True)
class StagePlan:
    stage_layers: tuple[int, ...]
    uniform_layers: tuple[int, ...]
    balanced_imbalance: float           # slowest stage time / mean stage time
    uniform_imbalance: float
    balanced_slowest_s: float           # per micro-batch
    uniform_slowest_s: float
    fits: bool                          # every stage within device memory (checked with the cost model)


def balanced_stage_layers(model: ModelSpec, hw: HardwareProfile, job: TrainingJob, strategy: Strategy,
                          pp: int | None = None, vpp: int | None = None) -> tuple[int, ...]:
    """Layers per stage for ``strategy`` (its pp and virtual stages unless given), balanced."""
    return stage_plan(model, hw, job, strategy, pp, vpp).stage_layers


def balanced_stage_layers_batch(model: ModelSpec, hw: HardwareProfile, job: TrainingJob, batch: StrategyBatch) -> np.ndarray:
    """(N, max pp) layers per stage for every candidate of a batch, zero-padded (cached per candidate)."""
    width = int(batch.pp.max()) if len(batch) else 1
    out = np.zeros((len(batch), width), dtype=np.int64)
    strategies = [replace(batch.strategy(i), stage_layers=None) for i in range(len(batch))]
    plans = _cached_plans(model, hw, job, strategies)
    for i, plan in enumerate(plans):
        out[i, : len(plan.stage_layers)] = plan.stage_layers
    return out


def stage_plan(model: ModelSpec, hw: HardwareProfile, job: TrainingJob, strategy: Strategy,
               pp: int | None = None, vpp: int | None = None) -> StagePlan:
    """The balanced partition with the uniform one for comparison (cached)."""
    s = replace(strategy, stage_layers=None,
                pp=pp if pp is not None else strategy.pp,
                virtual_pipeline_stages=vpp if vpp is not None else strategy.virtual_pipeline_stages)
    return _cached_plans(model, hw, job, [s])[0]


def _cached_plans(model: ModelSpec, hw: HardwareProfile, job: TrainingJob,
                  strategies: list[Strategy]) -> list[StagePlan]:
    """stage_plan of each strategy (stage_layers None), those not cached planned together (_plans)."""
    keys = [(model, _hw_key(hw), job, s) for s in strategies]
    missing = list(dict.fromkeys(k for k in keys if k not in _CACHE))
    if missing:
        if len(_CACHE) + len(missing) > CACHE_LIMIT:
            _CACHE.clear()
        _CACHE.update(zip(missing, _plans(model, hw, job, [k[3] for k in missing])))
    return [_CACHE[k] for k in keys]


def stage_imbalance(model: ModelSpec, hw: HardwareProfile, job: TrainingJob, strategy: Strategy,
                    stage_layers) -> float:
    """Slowest stage time over the mean stage time of a partition."""
    times = stage_cost_model(model, hw, job, strategy).stage_times_s(model, stage_layers)
    return float(times.max() / times.mean())


def stage_cost_model(model: ModelSpec, hw: HardwareProfile, job: TrainingJob, strategy: Strategy) -> StageModel:
    """Step 1: per-stage intercepts and per-layer slopes, from probes priced by the cost model."""
    return stage_cost_models(model, hw, job, [strategy])[0]


def stage_cost_models(model: ModelSpec, hw: HardwareProfile, job: TrainingJob,
                      strategies: list[Strategy]) -> list[StageModel]:
    """stage_cost_model of each strategy, their probes priced together (one ``estimate_batch`` and one
    ``memory`` call per device count instead of one per strategy: most of the cost of pricing a few
    dozen probes is the call), cached per (model, hardware, job, strategy)."""
    hw_key = _hw_key(hw)
    out: list[StageModel | None] = [_SM_CACHE.get((model, hw_key, job, s)) for s in strategies]
    todo: dict[int, list[int]] = {}                  # devices -> positions still to price
    for n, (s, hit) in enumerate(zip(strategies, out)):
        if hit is None:
            todo.setdefault(s.devices, []).append(n)
    freq = model.moe.layer_frequency if model.moe is not None else 1
    k = PROBE_LAYERS * freq                       # K layers hold K / freq MoE layers
    counts = [k, 2 * k] + ([k + 1] if model.moe is not None and freq > 1 else [])
    for devices, positions in todo.items():
        probes = []
        for n in positions:
            p = strategies[n].pp
            for i in range(p):
                for c in counts:
                    layers = [0] * p
                    layers[i] = c
                    probes.append(replace(strategies[n], stage_layers=tuple(layers)))
        batch = StrategyBatch.from_strategies(probes, model.num_layers)
        est = estimate_batch(model, hw, Cluster(nodes=1, devices=devices), job, batch)
        mem = memory(model, job, batch)
        t_all = sum(est.time_s[part] for part in STAGE_TIME_PARTS)
        row = 0
        for n in positions:
            s = strategies[n]
            rows = slice(row, row + s.pp * len(counts))
            row = rows.stop
            if len(_SM_CACHE) >= CACHE_LIMIT:
                _SM_CACHE.clear()
            out[n] = _SM_CACHE[(model, hw_key, job, s)] = _stage_model(
                model, hw, job, s, k, freq, len(counts), t_all[rows] / float(s.num_micro_batches), mem.total[rows],
                est.slowest_stage[rows], mem.worst_stage[rows])
    return out


def _stage_model(model, hw, job, strategy, k, freq, n, t, b, slowest, fullest) -> StageModel:
    """The intercepts and slopes of one strategy from its probes' per-micro-batch times ``t`` and bytes ``b``."""
    p = strategy.pp
    t, b = t.reshape(p, n), b.reshape(p, n)
    assert np.all(slowest.reshape(p, n) == np.arange(p)[:, None]), "probe stage is not the slowest"
    assert np.all(fullest.reshape(p, n) == np.arange(p)[:, None]), "probe stage is not the fullest"
    # per block of `freq` layers (freq - 1 dense + 1 MoE, or freq = 1 layer of the model's one kind)
    t_block = (t[:, 1] - t[:, 0]) / (k / freq)
    b_block = (b[:, 1] - b[:, 0]) / (k / freq)
    if model.moe is None:
        t_dense, t_moe, b_dense, b_moe = t_block, np.zeros(p), b_block, np.zeros(p)
    elif freq == 1:
        t_dense, t_moe, b_dense, b_moe = np.zeros(p), t_block, np.zeros(p), b_block
    else:
        t_dense, b_dense = t[:, 2] - t[:, 0], b[:, 2] - b[:, 0]
        t_moe, b_moe = t_block - (freq - 1) * t_dense, b_block - (freq - 1) * b_dense
    blocks = k / freq
    t_fixed = t[:, 0] - blocks * ((freq - 1) * t_dense + t_moe) if model.moe is not None and freq > 1 else t[:, 0] - k * (t_dense + t_moe)
    b_fixed = b[:, 0] - blocks * ((freq - 1) * b_dense + b_moe) if model.moe is not None and freq > 1 else b[:, 0] - k * (b_dense + b_moe)
    return StageModel(
        time_fixed_s=np.maximum(t_fixed, 0.0), time_dense_s=float(np.median(t_dense)), time_moe_s=float(np.median(t_moe)),
        memory_fixed_bytes=b_fixed, memory_dense_bytes=b_dense, memory_moe_bytes=b_moe,
        capacity_bytes=job.usable_memory_gib(hw.device.memory_gib) * 2.0 ** 30,
    )


def _kinds_per_stage(model: ModelSpec, stage_layers) -> tuple[np.ndarray, np.ndarray]:
    layers = np.asarray(stage_layers, dtype=np.int64)
    if model.moe is None:
        return layers, np.zeros_like(layers)
    end = np.cumsum(layers)
    start = end - layers
    freq = model.moe.layer_frequency
    moe = end // freq - start // freq
    return layers - moe, moe


def _plans(model: ModelSpec, hw: HardwareProfile, job: TrainingJob, strategies: list[Strategy]) -> list[StagePlan]:
    """Each strategy's balanced and uniform partitions: their stage models priced together
    (stage_cost_models), then every partition's memory checked in one cost-model call."""
    stage_cost_models(model, hw, job, [s for s in strategies if _partitioned(model, s)])
    drafts = []
    for s in strategies:
        p, v, n_layers = s.pp, s.virtual_pipeline_stages, model.num_layers
        uniform = even_stage_layers(n_layers, p) if p <= n_layers else tuple([1] * p)
        if not _partitioned(model, s):
            drafts.append((s, uniform, None, None, None))
            continue
        sm = stage_cost_model(model, hw, job, s)
        balanced = _partition(model, sm, p, v)
        drafts.append((s, uniform, uniform if balanced is None else balanced, sm.stage_times_s(model, uniform), sm))
    checked = [(s, layers) for s, uniform, balanced, _, sm in drafts if sm is not None for layers in (uniform, balanced)]
    fits = iter(_fits_all(model, job, checked, job.usable_memory_gib(hw.device.memory_gib) * 2.0 ** 30))
    plans = []
    for s, uniform, balanced, u_times, sm in drafts:
        if sm is None:
            plans.append(StagePlan(uniform, uniform, 1.0, 1.0, 0.0, 0.0, True))
            continue
        uniform_fits, balanced_fits = next(fits), next(fits)
        b_times = sm.stage_times_s(model, balanced)
        if u_times.max() <= b_times.max() * (1 + 1e-9) and uniform_fits:
            balanced, b_times, balanced_fits = uniform, u_times, uniform_fits
        plans.append(StagePlan(
            stage_layers=tuple(int(x) for x in balanced), uniform_layers=uniform,
            balanced_imbalance=float(b_times.max() / b_times.mean()), uniform_imbalance=float(u_times.max() / u_times.mean()),
            balanced_slowest_s=float(b_times.max()), uniform_slowest_s=float(u_times.max()), fits=balanced_fits,
        ))
    return plans


def _partitioned(model: ModelSpec, s: Strategy) -> bool:
    """Whether the strategy's stages can be sized other than evenly (pp > 1, whole virtual chunks per stage)."""
    v = s.virtual_pipeline_stages
    return s.pp > 1 and model.num_layers % v == 0 and model.num_layers // v >= s.pp


def _fits_all(model: ModelSpec, job: TrainingJob, partitions: list[tuple[Strategy, tuple]],
              capacity_bytes: float) -> list[bool]:
    """The cost model's own memory check of each (strategy, stage layers) in one call (the allocator
    allowance is inside memory())."""
    if not partitions:
        return []
    batch = StrategyBatch.from_strategies([replace(s, stage_layers=tuple(int(x) for x in layers)) for s, layers in partitions],
                                          model.num_layers)
    return [bool(x) for x in memory(model, job, batch, every_stage=False).total <= capacity_bytes]


def _partition(model: ModelSpec, sm: StageModel, p: int, v: int) -> tuple[int, ...] | None:
    """Step 2: the exact min-max partition in units of v layers, then the most even among the optimal."""
    units = model.num_layers // v
    kinds = np.array([model.is_moe_layer(j) for j in range(model.num_layers)], dtype=bool)
    moe_prefix = np.concatenate([[0], np.cumsum(kinds)])[:: v].astype(float)        # MoE layers before unit u
    dense_prefix = np.arange(0, model.num_layers + 1, v, dtype=float) - moe_prefix
    s_idx, e_idx = np.meshgrid(np.arange(units + 1), np.arange(units + 1), indexing="ij")
    span = e_idx > s_idx
    d = dense_prefix[e_idx] - dense_prefix[s_idx]
    mo = moe_prefix[e_idx] - moe_prefix[s_idx]
    times, fits = [], []
    for i in range(p):
        times.append(np.where(span, sm.time_fixed_s[i] + d * sm.time_dense_s + mo * sm.time_moe_s, np.inf))
        mem = sm.memory_fixed_bytes[i] + d * sm.memory_dense_bytes[i] + mo * sm.memory_moe_bytes[i]
        fits.append(span & (mem <= sm.capacity_bytes))
    if not _any_partition(fits, p, units):
        fits = [span] * p                        # nothing fits: balance time anyway; the estimate will say so
    bottleneck = _min_max(times, fits, p, units)
    if not np.isfinite(bottleneck):
        return None
    allowed = [f & (t <= bottleneck * (1 + 1e-9)) for t, f in zip(times, fits)]
    squares = [np.where(a, t * t, np.inf) for t, a in zip(times, allowed)]
    cuts = _min_sum(squares, p, units)
    return tuple(int((b - a) * v) for a, b in zip(cuts, cuts[1:]))


def _any_partition(fits, p: int, units: int) -> bool:
    reach = np.zeros(units + 1, dtype=bool)
    reach[0] = True
    for i in range(p):
        reach = np.any(reach[:, None] & fits[i], axis=0)
    return bool(reach[units])


def _min_max(times, fits, p: int, units: int) -> float:
    best = np.full(units + 1, np.inf)
    best[0] = 0.0
    for i in range(p):
        cand = np.where(fits[i], np.maximum(best[:, None], times[i]), np.inf)
        best = cand.min(axis=0)
    return float(best[units])


def _min_sum(costs, p: int, units: int) -> list[int]:
    best = np.full(units + 1, np.inf)
    best[0] = 0.0
    choice = []
    for i in range(p):
        cand = best[:, None] + costs[i]
        choice.append(np.argmin(cand, axis=0))
        best = cand.min(axis=0)
    cuts = [units]
    for i in range(p - 1, -1, -1):
        cuts.append(int(choice[i][cuts[-1]]))
    return cuts[::-1]


def _hw_key(hw: HardwareProfile) -> tuple:
    d = hw.device
    return (hw.name, d.name, d.memory_gib, d.memory_bandwidth_gbps, tuple(sorted(d.peak_tflops.items())),
            d.matmul_efficiency, d.matmul_efficiency_by_dtype, d.attention_efficiency, d.memory_efficiency, hw.node, hw.inter, hw.inter_topology, hw.host,
            getattr(d, "launch_overhead_us", None))


def rebalance(model: ModelSpec, hw: HardwareProfile, cluster: Cluster, job: TrainingJob,
              batch: StrategyBatch) -> StrategyBatch:
    """The batch with each pipelined candidate's stage_layers replaced by the balanced partition
    where the cost model prices it faster (or it fits where the even split does not)."""
    multi = np.flatnonzero(batch.pp > 1)
    if len(multi) == 0:
        return batch
    balanced = batch.stage_layers.copy()
    rows = balanced_stage_layers_batch(model, hw, job, batch.take(multi))
    balanced[multi] = 0
    balanced[multi, : rows.shape[1]] = rows
    even_e = estimate_batch(model, hw, cluster, job, batch)
    alt = replace(batch, stage_layers=balanced)
    bal_e = estimate_batch(model, hw, cluster, job, alt)
    better = bal_e.feasible & (~even_e.feasible | (bal_e.step_time_s < even_e.step_time_s * (1 - 1e-9)))
    better &= legal_mask(model, cluster, job, alt)       # a split the framework runs (Framework.uneven_stages)
    return replace(batch, stage_layers=np.where(better[:, None], balanced, batch.stage_layers))
