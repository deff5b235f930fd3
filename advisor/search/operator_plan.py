"""Operator-level searchers (``--searcher drec`` and ``--searcher ilp``) composed with data, pipeline
and context parallelism and every other knob of the enumerator, behind the searcher interface of
advisor.search.

Composition:

1. Outer configurations. The enumerator (advisor.search.enumerate.search) walks its whole space
   (degrees, schedule, virtual stages, micro-batch size, sequence parallelism, recomputation, ZeRO
   stage, offload, mesh order, context-parallel kind) with the same pins, best-first with its
   proven bounds, and returns the configurations that can place among the best (at least
   OUTER_TOP_K, more when its tie band holds more), each priced by advisor.cost with Megatron's
   uniform operator layout.
2. Operator layouts. For each of them, D-Rec searches the operator-level sharding of one
   tensor-parallel group of one stage (advisor.search.intra_op: every operator may cut any of its
   labels on each axis of the group's mesh, not only Megatron's); ``ilp`` then re-solves the same
   problem exactly with CP-SAT, warm-started with the better of D-Rec's answer and Megatron's
   layout, the candidates taken best first and sharing ILP_TIME_LIMIT_S. A group whose default mesh
   is one axis (tensor parallelism inside a node) is also searched split into two axes, so that an
   operator can cut two of its dimensions (2-D tensor parallelism; the cheapest mesh wins, the
   default on ties). Identical problems (same
   group size, micro-batch, layers, micro-batches in flight, ZeRO stage, memory left) are solved once, and D-Rec
   runs once per group shape: its answer is reused by every configuration whose memory it fits (the micro-batches
   in flight and the memory left change only whether it fits, not its price).
3. Pricing. Each candidate is the cost model's estimate plus the difference between its chosen
   layout and Megatron's in the sharding model (intra_op.price_layouts; advisor.commands.recommend applies it
   to the finalists it ranks). A layout is only chosen when cheaper than Megatron's and within the
   memory left, so every candidate is at least as fast as the enumerator's, the same configuration
   with Megatron's layout gives the enumerator's numbers exactly, and the ILP, whose warm start is
   D-Rec's choice, is never worse than D-Rec.

The outer search is the enumerator's, exact for uniform layouts; a configuration just outside its
best few could in principle overtake them with a searched layout, and is not revisited.

Semi-automatic (``fixed``, --operator-strategies; advisor.search.semi_auto): the strategies are
checked against the model's graph first; the outer configurations are the enumerator's best among
those whose tensor-parallel degree is a multiple of the group the strategies span (one enumerator run
per such degree when --tp is not pinned), less those whose micro-batch or sequence the cuts do not
divide; in each, the fixed operators keep their strategies, the others are searched around them, and
the layout is priced and kept whatever it costs (a user's choice is priced, not second-guessed).
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from typing import Any

from advisor.cost.estimate import Estimate, estimate, estimate_batch, from_batch
from advisor.errors import AdvisorError
from advisor.graph.transformer import transformer_graph
from advisor.search import Pins, Progress, SearchOutcome
from advisor.search import enumerate as enumerator
from advisor.search.intra_op import (
    Layout, build_problems, choose_among, headroom_bytes, layout_key, price_layouts, record, usable_bytes,
)
from advisor.search.semi_auto import check_strategies, required_group
from advisor.space.rules import violations
from advisor.space.strategy import Strategy, StrategyBatch
from advisor.specs.hardware import HardwareProfile
from advisor.specs.job import Cluster, TrainingJob
from advisor.specs.model import ModelSpec
from advisor.specs.operator_strategies import OperatorStrategies

OUTER_TOP_K = 8              # outer configurations asked of the enumerator, at least
ILP_TIME_LIMIT_S = 30.0      # shared by the ILP's layout problems


def operator_plan(model: ModelSpec, hw: HardwareProfile, cluster: Cluster, job: TrainingJob, searcher: str = "drec",
                  pins: Pins = Pins(), top_k: int = 5, progress: Progress = None,
                  time_limit_s: float = ILP_TIME_LIMIT_S, outer: SearchOutcome | None = None,
                  fixed: OperatorStrategies | None = None, two_d: bool = True) -> SearchOutcome:
    """The enumerator's best outer configurations, each with its operator layout searched by D-Rec
    (``searcher="drec"``) or D-Rec then the ILP (``"ilp"``). ``outer``: the enumerator's outcome
    when already computed (with the same pins and at least ``top_k``). ``fixed``: operator
    strategies the user gives (see the module docstring). ``two_d`` off: tensor-parallel groups
    on their default mesh only (no 2-D tensor parallelism inside a node; for comparisons)."""
    start = time.perf_counter()
    if searcher not in ("drec", "ilp"):
        raise ValueError(f"unknown operator-level searcher {searcher!r}")
    if outer is None:
        outer = (_fixed_outer(model, hw, cluster, job, pins, max(top_k, OUTER_TOP_K), progress, fixed) if fixed
                 else enumerator.search(model, hw, cluster, job, pins, max(top_k, OUTER_TOP_K), progress,
                                        distinct_layouts=False))
    if fixed and len(outer.finalists):
        outer = _holding(model, job, outer, fixed)
    batch = outer.finalists
    if len(batch) == 0:
        stats = replace(outer.stats, searcher=searcher, seconds=time.perf_counter() - start)
        return SearchOutcome(batch, stats, ())
    e = estimate_batch(model, hw, cluster, job, batch)
    keys = [layout_key(model, job, batch, i) for i in range(len(batch))]
    order = np.argsort(-np.where(e.feasible, e.tokens_per_s, 0.0), kind="stable")
    problems: dict = {}
    layouts: dict = {}
    capacity = usable_bytes(job, hw)
    todo = len({(keys[i], headroom_bytes(e, i, capacity)) for i in order if keys[i].tp > 1})
    records: list = [None] * len(batch)
    found: dict = {}        # D-Rec's answers per group shape and mesh (intra_op.choose_layout)
    ilp_spent = 0.0
    for i in order:
        key = keys[i]
        memo = (key, headroom_bytes(e, i, capacity))
        layout = layouts.get(memo)
        if layout is None:
            if key not in problems:
                problems[key] = _problem(model, hw, job, key, fixed, two_d)
            problem = problems[key]
            budget = (time_limit_s - ilp_spent) / max(todo, 1) if key.tp > 1 else 0.0
            t0 = time.perf_counter()
            if isinstance(problem, str):    # no operator graph for this model: Megatron's layout stands
                layout = layouts[memo] = Layout(None, None, None, False, problem)
            else:
                layout = layouts[memo] = choose_among(problem, key, memo[1], searcher, budget, found)
            if key.tp > 1:
                todo -= 1
                ilp_spent += time.perf_counter() - t0
        records[int(i)] = record(layout, key, batch.strategy(int(i)), searcher)
    stats = replace(outer.stats, searcher=searcher, seconds=time.perf_counter() - start)
    return SearchOutcome(batch, stats, tuple(records))


def _problem(model, hw, job, key, fixed=None, two_d=True):
    """The layout problems of a key (one per mesh), or why there are none (a model the operator
    graphs do not cover)."""
    if fixed:
        return build_problems(model, hw, job, key, fixed)     # _holding kept only keys that can hold them
    try:
        return build_problems(model, hw, job, key, two_d=two_d)
    except AdvisorError as err:
        return f"{err}: Megatron's layout kept"


def _fixed_outer(model, hw, cluster, job, pins: Pins, k: int, progress, fixed: OperatorStrategies) -> SearchOutcome:
    """The enumerator's best configurations whose tensor-parallel degree can hold the fixed
    strategies: the strategies checked against the whole model's graph at the largest micro-batch and
    sequence (AdvisorError, exit 2, naming the operator and dimension), then one run per degree."""
    graph = transformer_graph(model, job, batch=job.global_batch_size)
    group = required_group(graph, fixed, pins.tp or cluster.devices)
    if pins.tp is not None:
        if pins.tp % group:
            raise AdvisorError(f"{fixed.source}: the strategies span groups of {group} devices, which --tp {pins.tp} "
                               f"is not a multiple of")
        return enumerator.search(model, hw, cluster, job, pins, k, progress, distinct_layouts=False)
    degrees = [t for t in range(group, cluster.devices + 1, group) if cluster.devices % t == 0]
    outcomes = [enumerator.search(model, hw, cluster, job, replace(pins, tp=t), k, progress, distinct_layouts=False)
                for t in degrees]
    found = [o for o in outcomes if len(o.finalists)]
    stats = replace(outcomes[0].stats, candidates=sum(o.stats.candidates for o in outcomes),
                    scored=sum(o.stats.scored for o in outcomes), feasible=sum(o.stats.feasible for o in outcomes))
    if not found:
        return SearchOutcome(outcomes[0].finalists, stats)
    strategies = [o.finalists.strategy(i) for o in found for i in range(len(o.finalists))]
    return SearchOutcome(StrategyBatch.from_strategies(strategies, model.num_layers), stats)


def _holding(model, job, outer: SearchOutcome, fixed: OperatorStrategies) -> SearchOutcome:
    """The outer configurations whose graph the fixed strategies divide; AdvisorError with the first
    reason when none does."""
    batch = outer.finalists
    keep, reasons = [], []
    for i in range(len(batch)):
        key = layout_key(model, job, batch, i)
        graph = transformer_graph(model, replace(job, seq_length=key.seq_length), batch=key.micro_batch_size,
                                  layers=(0, key.graph_layers), first_stage=key.whole_model, last_stage=key.whole_model)
        try:
            check_strategies(graph, fixed, key.tp, f"tp {key.tp}, micro-batch {key.micro_batch_size}, "
                                                   f"{key.seq_length} tokens per sequence")
            keep.append(i)
        except AdvisorError as err:
            reasons.append(str(err))
    if not keep:
        raise AdvisorError(f"none of the {len(batch)} best configurations can hold the operator strategies: "
                           f"{reasons[0]}; pin --tp, --mbs or --cp to a configuration they divide")
    return SearchOutcome(batch.take(np.array(keep, dtype=np.int64)), outer.stats)


def layout_of(model: ModelSpec, hw: HardwareProfile, cluster: Cluster, job: TrainingJob, strategy: Strategy,
              fixed: OperatorStrategies | None = None, searcher: str = "drec",
              time_limit_s: float = ILP_TIME_LIMIT_S) -> dict[str, Any]:
    """The operator layout of one given configuration (``advisor estimate --operator-strategies``):
    the fixed strategies kept, the rest searched, as the plan's operator_strategies record."""
    batch = StrategyBatch.from_strategies([strategy], model.num_layers)
    e = estimate_batch(model, hw, cluster, job, batch)
    key = layout_key(model, job, batch, 0)
    problems = build_problems(model, hw, job, key, fixed)
    layout = choose_among(problems, key, headroom_bytes(e, 0, usable_bytes(job, hw)), searcher, time_limit_s if key.tp > 1 else 0.0)
    return record(layout, key, strategy, searcher)


def estimate_with_layout(model: ModelSpec, hw: HardwareProfile, cluster: Cluster, job: TrainingJob,
                         strategy: Strategy, operator_record) -> Estimate:
    """The cost model's estimate of a strategy with its operator layout priced in (price_layouts):
    what ``advisor estimate --plan`` gives for a drec/ilp plan, equal to its recommend prediction."""
    reasons = violations(model, cluster, job, strategy)
    if reasons:
        return estimate(model, hw, cluster, job, strategy)
    batch = StrategyBatch.from_strategies([strategy], model.num_layers)
    e = price_layouts(estimate_batch(model, hw, cluster, job, batch), batch, [operator_record], usable_bytes(job, hw))
    return from_batch(e, 0, model, hw, cluster, job, strategy=strategy)


def best_priced(model: ModelSpec, hw: HardwareProfile, cluster: Cluster, job: TrainingJob,
                outcome: SearchOutcome) -> tuple[float, int]:
    """(best predicted tokens/s among the feasible finalists, its index), the searched layouts
    priced in; (0.0, -1) when none is feasible."""
    if len(outcome.finalists) == 0:
        return 0.0, -1
    e = estimate_batch(model, hw, cluster, job, outcome.finalists)
    e = price_layouts(e, outcome.finalists, outcome.operator_strategies, usable_bytes(job, hw))
    tps = np.where(e.feasible, e.tokens_per_s, 0.0)
    i = int(np.argmax(tps))
    return (float(tps[i]), i) if tps[i] > 0 else (0.0, -1)


def drec_searcher(model, hw, cluster, job, pins: Pins, top_k: int, progress: Progress) -> SearchOutcome:
    """``--searcher drec`` (the advisor.commands.recommend interface)."""
    return operator_plan(model, hw, cluster, job, "drec", pins, top_k, progress)


def ilp_searcher(model, hw, cluster, job, pins: Pins, top_k: int, progress: Progress) -> SearchOutcome:
    """``--searcher ilp`` (the advisor.commands.recommend interface)."""
    return operator_plan(model, hw, cluster, job, "ilp", pins, top_k, progress)


__all__ = ["operator_plan", "best_priced", "drec_searcher", "ilp_searcher", "layout_of", "estimate_with_layout",
           "OUTER_TOP_K", "ILP_TIME_LIMIT_S"]
