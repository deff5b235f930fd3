"""Operator-level searchers (``--searcher drec`` and ``--searcher ilp``) composed with pipeline and
data parallelism, behind the searcher interface of advisor.search.

For each pipeline depth pp (a divisor of the device count, at most the layer count; or the pinned
one) and a few micro-batch sizes of the whole stage (B sequences: the global batch is cut into
m = global batch / B micro-batches, m >= pp), the operator graph of one stage (the embedding, the
largest stage's share of the layers, the LM head and the loss: every operator kind the model has) is
sharded over the stage's devices by D-Rec (its "lookahead" variant first; the three best
configurations again with every variant); activations are counted for the micro-batches 1F1B keeps
in flight on the first stage (min(pp, m)). The ILP searcher then re-solves the best D-Rec
configurations exactly (warm-started, sharing the time limit).

Each result becomes a Strategy for the cost model (advisor.recommend ranks those): dp is the cut of
the batch label and cp the cut of the sequence label in the layer's heaviest operator, tp the rest
of the stage's devices; sequence parallelism is on when the norms cut the sequence while the
matmuls cut model dimensions; stage_layers come from the balanced partitioner (advisor.search.stages).
The operator-level result itself (per operator, the cut of every tensor dimension) goes into the
plan's ``operator_strategies``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Any

from advisor.graph.transformer import transformer_graph
from advisor.search import Pins, Progress, SearchOutcome, SearchStats
from advisor.search.drec import drec_search
from advisor.search.ilp import ilp_search
from advisor.search.sharding import REPLICATE, DeviceMesh, OperatorSolution, ShardingOptions, ShardingProblem
from advisor.search.stages import balanced_stage_layers
from advisor.space.rules import violations
from advisor.space.strategy import Strategy, StrategyBatch
from advisor.specs.hardware import HardwareProfile
from advisor.specs.job import Cluster, TrainingJob
from advisor.specs.model import ModelSpec

BATCH_SHARES = (2, 8, 32)    # stage micro-batch sizes tried: about 1/2, 1/8 and 1/32 sequence per device
REFINED = 3                  # configurations D-Rec re-solves with all its neighbour assumptions
ILP_CONFIGS = 2              # configurations the ILP re-solves
ILP_TIME_LIMIT_S = 30.0      # shared by them


@dataclass(frozen=True)
class OperatorCandidate:
    model: ModelSpec
    pp: int
    batch: int                   # sequences per micro-batch of the whole stage
    problem: ShardingProblem
    solution: OperatorSolution
    strategy: Strategy | None    # None when the result maps to no legal Strategy
    ilp: dict | None = None


def operator_plan(model: ModelSpec, hw: HardwareProfile, cluster: Cluster, job: TrainingJob, searcher: str = "drec",
                  pins: Pins = Pins(), top_k: int = 5, progress: Progress = None,
                  time_limit_s: float = ILP_TIME_LIMIT_S) -> SearchOutcome:
    """Operator-level search composed with pipeline and data parallelism: the finalists (legal
    Strategies, best operator-level cost first) and their operator strategies."""
    start = time.perf_counter()
    configs = _configs(model, cluster, job, pins)
    candidates: list[OperatorCandidate] = []
    for done, (pp, batch) in enumerate(configs, start=1):
        cand = _search_config(model, hw, cluster, job, pins, pp, batch)
        if cand is not None:
            candidates.append(cand)
        if progress is not None:
            progress(done, len(configs))
    candidates.sort(key=lambda c: (not c.solution.fits, c.solution.cost_s))
    candidates = [_refine_with_drec(c) for c in candidates[:REFINED]] + candidates[REFINED:]
    candidates.sort(key=lambda c: (not c.solution.fits, c.solution.cost_s))
    if searcher == "ilp":
        candidates = _refine_with_ilp(candidates, time_limit_s)
    kept = [c for c in candidates if c.solution.fits and c.strategy is not None and _matches(c.strategy, pins)]
    seen, finalists = set(), []
    for c in kept:
        if c.strategy not in seen:
            seen.add(c.strategy)
            finalists.append(c)
    finalists = finalists[:top_k]
    batch = StrategyBatch.from_strategies([c.strategy for c in finalists], model.num_layers)
    stats = SearchStats(searcher=searcher, candidates=len(candidates), scored=len(candidates),
                        feasible=sum(c.solution.fits for c in candidates), seconds=time.perf_counter() - start)
    return SearchOutcome(batch, stats, tuple(_record(c) for c in finalists))


def drec_searcher(model, hw, cluster, job, pins: Pins, top_k: int, progress: Progress) -> SearchOutcome:
    """``--searcher drec`` (the advisor.recommend interface)."""
    return operator_plan(model, hw, cluster, job, "drec", pins, top_k, progress)


def ilp_searcher(model, hw, cluster, job, pins: Pins, top_k: int, progress: Progress) -> SearchOutcome:
    """``--searcher ilp`` (the advisor.recommend interface)."""
    return operator_plan(model, hw, cluster, job, "ilp", pins, top_k, progress)


# ---- configurations ---------------------------------------------------------------------------
def _configs(model: ModelSpec, cluster: Cluster, job: TrainingJob, pins: Pins) -> list[tuple[int, int]]:
    n = cluster.devices
    depths = [pins.pp] if pins.pp is not None else [p for p in _divisors(n) if p <= model.num_layers]
    out = []
    for pp in depths:
        if n % pp:
            continue
        stage = n // pp
        sizes = [b for b in _divisors(job.global_batch_size) if job.global_batch_size // b >= pp and b <= stage]
        if pins.micro_batch_size is not None and pins.dp is not None:
            sizes = [b for b in sizes if b == pins.micro_batch_size * pins.dp]
        picked = []
        for share in BATCH_SHARES:            # the largest size up to each share of the stage's devices
            fitting = [b for b in sizes if b <= max(1, stage // share)]
            if fitting and fitting[-1] not in picked:
                picked.append(fitting[-1])
        out += [(pp, b) for b in picked]
    return out


def _search_config(model, hw, cluster, job, pins: Pins, pp: int, batch: int) -> OperatorCandidate | None:
    stage_devices = cluster.devices // pp
    layers = math.ceil(model.num_layers / pp)
    graph = transformer_graph(model, job, batch=batch, layers=(0, layers))
    m = job.global_batch_size // batch
    options = ShardingOptions(num_micro_batches=m, activations_in_flight=float(min(pp, m)),
                              zero_stage=pins.zero_stage if pins.zero_stage is not None else 1)
    mesh = DeviceMesh.for_devices(hw, stage_devices)
    problem = ShardingProblem(graph, mesh, hw, job, options)
    solution = drec_search(problem, assumptions=("lookahead",))
    return OperatorCandidate(model, pp, batch, problem, solution, _strategy(model, hw, job, problem, solution, pp, batch))


def _refine_with_drec(c: OperatorCandidate) -> OperatorCandidate:
    sol = drec_search(c.problem)
    if (sol.fits, -sol.cost_s) <= (c.solution.fits, -c.solution.cost_s):
        return c
    p = c.problem
    return replace(c, solution=sol, strategy=_strategy(c.model, p.hw, p.job, p, sol, c.pp, c.batch))


def _refine_with_ilp(candidates: list[OperatorCandidate], time_limit_s: float) -> list[OperatorCandidate]:
    out = list(candidates)
    chosen = [i for i, c in enumerate(out) if c.solution.fits][:ILP_CONFIGS]
    for i in chosen:
        c = out[i]
        result = ilp_search(c.problem, time_limit_s=time_limit_s / max(len(chosen), 1), warm_start=c.solution)
        if result.solution is None:
            continue
        info = {"status": result.status, "gap": result.gap, "seconds": result.seconds, "bound_s": result.bound_s}
        p = c.problem
        out[i] = replace(c, solution=result.solution, ilp=info,
                         strategy=_strategy(c.model, p.hw, p.job, p, result.solution, c.pp, c.batch))
    out.sort(key=lambda c: (not c.solution.fits, c.solution.cost_s))
    return out


# ---- from operator cuts to a Strategy ----------------------------------------------------------
def _strategy(model: ModelSpec, hw: HardwareProfile, job: TrainingJob, problem: ShardingProblem,
              solution: OperatorSolution, pp: int, batch: int) -> Strategy | None:
    n = problem.mesh.devices
    heaviest = _heaviest_layer_operator(problem, solution)
    labels = solution.assignment[heaviest]
    sizes = problem.mesh.shape
    dp = math.prod(s for s, lab in zip(sizes, labels) if lab == "b")
    cp = math.prod(s for s, lab in zip(sizes, labels) if lab == "s")
    tp = n // (dp * cp)
    norms = [v for v, op in enumerate(problem.graph.operators) if op.kind == "norm" and op.count > 1]
    sp = tp > 1 and any("s" in solution.assignment[v] for v in norms)
    m = job.global_batch_size // batch
    if batch % dp:
        return None
    strategy = Strategy(dp=dp, tp=tp, pp=pp, cp=cp, sequence_parallel=sp, micro_batch_size=batch // dp,
                        num_micro_batches=m, zero_stage=problem.options.zero_stage,
                        recompute="none", pipeline_schedule="1f1b")
    if pp > 1:
        strategy = replace(strategy, stage_layers=balanced_stage_layers(model, hw, job, strategy))
    cluster = Cluster(nodes=1, devices=strategy.devices)
    if violations(model, cluster, job, strategy):
        return None
    return strategy


def _heaviest_layer_operator(problem: ShardingProblem, solution: OperatorSolution) -> int:
    ops = problem.graph.operators
    layer_ops = [v for v, op in enumerate(ops) if op.count > 1 and op.is_gemm] or list(range(len(ops)))
    costs = {v: problem.op_costs(v, [solution.assignment[v]])[0][0] for v in layer_ops}
    return max(costs, key=costs.get)


def _matches(s: Strategy, pins: Pins) -> bool:
    for name, value in pins.pinned().items():
        if name in ("dp", "tp", "pp", "cp", "micro_batch_size", "zero_stage", "sequence_parallel") and getattr(s, name) != value:
            return False
    return True


def _record(c: OperatorCandidate) -> dict[str, Any]:
    rec = c.solution.to_json(c.problem)
    rec.update({"pipeline_stages": c.pp, "stage_batch": c.batch, "stage_devices": c.problem.mesh.devices,
                "graph": "first stage with the LM head (the stage graph every stage's operators are taken from)"})
    if c.ilp is not None:
        rec["ilp"] = c.ilp
    rec["operators"] = {name: {k: v for k, v in op.items()} for name, op in rec["operators"].items()}
    for op in rec["operators"].values():
        op["mesh_axes"] = [None if lab == REPLICATE else lab for lab in op["mesh_axes"]]
    return rec


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]
