"""The operator-level (intra-op) sharding of one outer configuration, and its price.

An outer configuration is a candidate of the enumerator's space (data, pipeline, context and tensor
degrees, micro-batch, schedule, ZeRO stage, recomputation, mesh order). Inside it, each pipeline
stage runs its operators on tensor-parallel groups of ``tp`` devices; that group is the mesh on
which D-Rec (advisor.search.drec) or the ILP (advisor.search.ilp) choose, operator by operator, the
label each mesh axis cuts (advisor.search.sharding), for one micro-batch of ``micro_batch_size``
sequences of ``seq_length / cp`` tokens, the layers of the stage, ``num_micro_batches`` micro-batches
per step and the micro-batches the schedule keeps in flight (advisor.cost.memory.in_flight).

The reference is Megatron-LM's uniform layout for the same tp and sequence-parallel choice: the
vocabulary-parallel embedding, LM head and cross entropy, QKV/attention/output projection cut by
heads, FC1/FC2 cut by the FFN hidden size (Shoeybi et al. 2019, section 3), and with sequence
parallelism the norms, residuals and MoE routing cut by sequence (Korthikanti et al. 2022, section
4.2.2), everything else replicated in the group. advisor.cost prices exactly that layout.

A searched layout is priced as the cost model's estimate of the outer configuration plus the
difference, in the sharding model, between the searched and the reference layout (both priced by
the same ShardingProblem, so its own biases cancel):

* time: the difference per layer times each stage's layers, spread over its m micro-batches, changes
  every stage's micro-batch time; the pipeline is re-timed (advisor.cost.bubble) so that the slowest
  stage after the change sets the step, and the bubble changes with the others. The change is split
  into its parts: the operators' collectives and the redistribution between operators go to tp_comm,
  the rest to compute;
* memory: the difference per layer times the layers of the stage with the most layers when it
  grows, of the fewest when it shrinks (the worst stage's memory is never understated).

With the reference layout both differences are zero and the estimate is the enumerator's, to the
last bit. A searched layout is kept only when it is cheaper than the reference and fits in the
memory the outer configuration leaves free; otherwise the reference stands.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from advisor.cost.estimate import EstimateBatch
from advisor.cost.bubble import pipeline_time_s
from advisor.cost.memory import GIB, in_flight, stage_masks
from advisor.graph.transformer import transformer_graph
from advisor.search.drec import drec_search
from advisor.search.semi_auto import check_strategies, fix_strategies, strategies_record
from advisor.search.sharding import (
    MEMORY_TOLERANCE, REPLICATE, DeviceMesh, OperatorSolution, ShardingOptions, ShardingProblem, solution,
)
from advisor.search.sharding_mesh import tensor_parallel_shapes
from advisor.space.strategy import Strategy, StrategyBatch
from advisor.specs.hardware import HardwareProfile
from advisor.specs.job import TrainingJob
from advisor.specs.model import ModelSpec
from advisor.specs.operator_strategies import MEGATRON_CUTS, SEQUENCE, OperatorStrategies



@dataclass(frozen=True)
class LayoutKey:
    """What the operator problem of an outer configuration depends on."""

    tp: int
    micro_batch_size: int
    seq_length: int             # tokens per sequence on one device of the cp group
    graph_layers: int           # layers in the graph (the whole model when pp = 1)
    whole_model: bool           # pp = 1: embedding and LM head in the graph
    num_micro_batches: int
    in_flight: float
    zero_stage: int
    sequence_parallel: bool


@dataclass
class Layout:
    """The chosen layout of one key under one memory allowance: the problem, the reference, the
    searched solution (None when the reference stands) and why."""

    problem: ShardingProblem | None
    reference: OperatorSolution | None
    chosen: OperatorSolution | None
    searched: bool
    note: str
    ilp: dict | None = None


def layout_key(model: ModelSpec, job: TrainingJob, batch: StrategyBatch, i: int) -> LayoutKey:
    pp = int(batch.pp[i])
    stages = batch.stage_layers[i, :pp]
    flight = float(in_flight(batch.take([i]))[0, :pp].max())
    return LayoutKey(tp=int(batch.tp[i]), micro_batch_size=int(batch.micro_batch_size[i]),
                     seq_length=job.seq_length // int(batch.cp[i]),
                     graph_layers=model.num_layers if pp == 1 else int(stages.max()), whole_model=pp == 1,
                     num_micro_batches=int(batch.num_micro_batches[i]), in_flight=flight,
                     zero_stage=int(batch.zero_stage[i]), sequence_parallel=bool(batch.sequence_parallel[i]))


def build_problem(model: ModelSpec, hw: HardwareProfile, job: TrainingJob, key: LayoutKey,
                  fixed: OperatorStrategies | None = None) -> ShardingProblem:
    """The layout problem of a key on the group's default mesh; with user-fixed strategies
    (advisor.search.semi_auto) on the group's finest mesh, checked against the key's graph and
    narrowed to them (AdvisorError naming the operator and dimension when one cannot hold)."""
    return build_problems(model, hw, job, key, fixed, two_d=False)[0]


def build_problems(model: ModelSpec, hw: HardwareProfile, job: TrainingJob, key: LayoutKey,
                   fixed: OperatorStrategies | None = None, two_d: bool = True) -> list[ShardingProblem]:
    """The key's layout problems, one per mesh its group is searched on (the default one first;
    advisor.search.sharding_mesh.tensor_parallel_shapes adds the 2-D splits of a single axis unless
    ``two_d`` is off); with fixed strategies the one problem on the finest mesh."""
    local = replace(job, seq_length=key.seq_length)
    graph = transformer_graph(model, local, batch=key.micro_batch_size, layers=(0, key.graph_layers),
                              first_stage=key.whole_model, last_stage=key.whole_model)
    options = ShardingOptions(num_micro_batches=key.num_micro_batches, activations_in_flight=key.in_flight,
                              zero_stage=key.zero_stage)
    if fixed is None:
        return [ShardingProblem(graph, DeviceMesh.for_devices(hw, key.tp, shape=shape), hw, local, options)
                for shape in tensor_parallel_shapes(hw, key.tp)[: None if two_d else 1]]
    check_strategies(graph, fixed, key.tp, f"tp {key.tp}, micro-batch {key.micro_batch_size}, "
                                           f"{key.seq_length} tokens per sequence")
    problem = ShardingProblem(graph, DeviceMesh.for_devices(hw, key.tp, fine=True), hw, local, options)
    fix_strategies(problem, fixed)
    return [problem]


def choose_among(problems: list[ShardingProblem], key: LayoutKey, headroom_bytes: float, searcher: str,
                 ilp_seconds: float = 0.0, found: dict | None = None) -> Layout:
    """choose_layout on each mesh of the key; the layout with the cheapest result wins, the default
    mesh on ties (Megatron's layout costs the same on all). The ILP's time is shared evenly between
    the meshes: each answer is still at least its mesh's D-Rec answer (its warm start), so the ILP
    never loses to D-Rec, but an ILP that runs out of time may stop short on a mesh where it would
    have improved with all of it."""
    layouts = [choose_layout(p, key, headroom_bytes, searcher, ilp_seconds / len(problems), found) for p in problems]

    def cost(layout: Layout) -> float:
        final = layout.chosen or layout.reference
        return final.cost_s if final is not None else float("inf")

    return min(layouts, key=cost)


def megatron_assignment(problem: ShardingProblem, sequence_parallel: bool, fill=None) -> list[tuple] | None:
    """Megatron's layout on the problem's mesh (every axis cuts the same label), or None when an
    operator cannot take its Megatron cut (the cost model then prices something the sharding model
    cannot express, and no difference is taken). With ``fill`` (a strategy per operator), such an
    operator takes fill's strategy instead, so that the difference leaves it out."""
    axes = len(problem.mesh.shape)
    out = []
    for v, info in enumerate(problem.info):
        base = info.op.name.rsplit(".", 1)[-1]
        label = MEGATRON_CUTS.get(base, SEQUENCE if sequence_parallel else REPLICATE)
        strat = (label,) * axes
        if label != REPLICATE and (label not in problem.choices(v) or not problem.shard(v, strat).valid):
            if base in MEGATRON_CUTS:
                if fill is None:
                    return None
                strat = fill[v]
            else:
                strat = (REPLICATE,) * axes
        out.append(strat)
    return out


def group_shape(key: LayoutKey) -> LayoutKey:
    """What a layout's price depends on: the key without the micro-batches in flight, which move only its memory
    (ShardingProblem prices activations x activations_in_flight; every time term is the same)."""
    return replace(key, in_flight=0.0)


def choose_layout(problem: ShardingProblem, key: LayoutKey, headroom_bytes: float, searcher: str,
                  ilp_seconds: float = 0.0, found: dict | None = None) -> Layout:
    """The reference layout and, when the group has more than one device, the searched one within
    the memory the outer configuration leaves free (``headroom_bytes`` per device). ``found``: D-Rec's answers
    by group shape and mesh, shared between the configurations of one search: the cheapest answer D-Rec gave for
    the same shape under another memory allowance is taken where it fits this one (its price is the same), so
    D-Rec runs once per group shape, as MindSpore's does, and again only where no earlier answer fits."""
    forced = bool(problem.fixed)     # user-given strategies stand, whatever they cost
    ref_assignment = megatron_assignment(problem, key.sequence_parallel)
    if ref_assignment is None and forced:
        return _forced_without_reference(problem, key, headroom_bytes, searcher, ilp_seconds)
    if ref_assignment is None:
        return Layout(problem, None, None, False, "an operator cannot take Megatron's cut: reference layout kept")
    reference = solution(problem, "megatron", ref_assignment, 0.0)
    if key.tp == 1:
        return Layout(problem, reference, None, False, "one device per tensor-parallel group")
    # room for the reference plus the free memory, less the tolerance with which searchers compare
    problem.memory_limit_bytes = (reference.memory_bytes + max(headroom_bytes, 0.0)) / (1.0 + MEMORY_TOLERANCE)
    shape = (group_shape(key), problem.mesh.shape)
    earlier = found.setdefault(shape, []) if found is not None and not forced else []
    fitting = [a for a in earlier if problem.evaluate(list(a.assignment)).fits]    # D-Rec's answers, cheapest first
    if fitting:
        drec = solution(problem, "drec", fitting[0].assignment, 0.0, **fitting[0].details, shared=True)
    else:
        drec = drec_search(problem)
        earlier.append(drec)
        earlier.sort(key=lambda a: a.cost_s)
    best = drec if forced or (drec.fits and drec.cost_s < reference.cost_s) else reference
    info = None
    if searcher == "ilp" and ilp_seconds > 0:
        from advisor.search.ilp import ilp_search     # the ILP's module only where it solves (9 ms)

        result = ilp_search(problem, time_limit_s=ilp_seconds, warm_start=best)
        info = {"status": result.status, "gap": result.gap, "seconds": result.seconds, "bound_s": result.bound_s}
        if result.solution is not None and result.solution.fits and (result.solution.cost_s < best.cost_s
                                                                     or (forced and not best.fits)):
            best = result.solution
    if forced:
        return Layout(problem, reference, best, True, "the user's operator strategies kept, the others propagated "
                      "(searched)", info)
    if best is reference:
        return Layout(problem, reference, None, True, "the search found nothing cheaper than Megatron's layout", info)
    return Layout(problem, reference, best, True, "searched layout", info)


def _forced_without_reference(problem: ShardingProblem, key: LayoutKey, headroom_bytes: float, searcher: str,
                              ilp_seconds: float) -> Layout:
    """Fixed strategies where some operator cannot take Megatron's cut (a vocabulary the group does
    not divide: the cost model prices Megatron's padded cut, the graph has the exact size): the search
    runs with those operators replicated in the reference's memory allowance, and the reference then
    gives them the chosen layout's strategies, so the price difference leaves them out."""
    replicated = [(REPLICATE,) * len(problem.mesh.shape)] * problem.num_ops
    allowance = solution(problem, "megatron", megatron_assignment(problem, key.sequence_parallel, replicated), 0.0)
    problem.memory_limit_bytes = (allowance.memory_bytes + max(headroom_bytes, 0.0)) / (1.0 + MEMORY_TOLERANCE)
    best = drec_search(problem) if key.tp > 1 else solution(problem, "megatron", allowance.assignment, 0.0)
    info = None
    if searcher == "ilp" and ilp_seconds > 0 and key.tp > 1:
        from advisor.search.ilp import ilp_search     # the ILP's module only where it solves (9 ms)

        result = ilp_search(problem, time_limit_s=ilp_seconds, warm_start=best)
        info = {"status": result.status, "gap": result.gap, "seconds": result.seconds, "bound_s": result.bound_s}
        if result.solution is not None and result.solution.fits and (result.solution.cost_s < best.cost_s or not best.fits):
            best = result.solution
    reference = solution(problem, "megatron", megatron_assignment(problem, key.sequence_parallel, best.assignment), 0.0)
    return Layout(problem, reference, best, True, "the user's operator strategies kept, the others propagated "
                  "(searched); operators Megatron's cut does not divide are priced as the cost model prices them", info)


def record(layout: Layout, key: LayoutKey, strategy: Strategy, searcher: str) -> dict[str, Any]:
    """The plan's operator_strategies: per operator the cut of each tensor dimension (MindSpore's
    shard() form) and which label each mesh axis cuts, plus what the layout adds to the estimate."""
    problem = layout.problem
    final = layout.chosen or layout.reference
    rec: dict[str, Any] = {"searcher": searcher, "layout": "searched" if layout.chosen else "megatron",
                           "note": layout.note}
    if final is not None:
        rec.update(final.to_json(problem))
        rec["searcher"] = searcher
        for v, op in enumerate(rec["operators"].values()):
            op["mesh_axes"] = _axes(op["mesh_axes"])
            info = problem.info[v]
            op["labels"] = ["".join(labs) for labs in info.op.labels[: info.n_in]]
            op["out_labels"] = ["".join(labs) for labs in info.op.labels[info.n_in: info.n_in + info.n_out]]
            op["shapes"] = [list(problem.graph.tensors[t].shape) for t in info.op.inputs]
            op["parameters"] = [t for t in info.op.inputs if problem.graph.tensors[t].param]
        # the --operator-strategies form (MindSpore's shard(): cuts per input), and which were given
        rec["strategies"] = strategies_record(problem, final.assignment)
        rec["fixed"] = sorted(problem.info[v].op.name for v in problem.fixed)
    rec.update({"pipeline_stages": strategy.pp, "stage_devices": strategy.devices // strategy.pp,
                "tensor_parallel_devices": key.tp, "micro_batch_size": key.micro_batch_size,
                "graph_layers": key.graph_layers,
                "graph": "one tensor-parallel group of one stage" + (" (the whole model)" if key.whole_model
                                                                      else " (its layers)")})
    delta_s = delta_b = delta_comm = 0.0
    changed = []
    if layout.chosen is not None:
        delta_s = layout.chosen.cost_s - layout.reference.cost_s
        delta_b = layout.chosen.memory_bytes - layout.reference.memory_bytes
        chosen = problem.evaluate(list(layout.chosen.assignment))
        reference = problem.evaluate(list(layout.reference.assignment))
        delta_comm = chosen.communication_s - reference.communication_s
        changed = _changed_operators(problem, layout, chosen, reference)
    rec["pricing"] = {"graph_layers": key.graph_layers, "delta_step_s": delta_s, "delta_memory_bytes": delta_b,
                      # the split of delta_step_s: collectives and redistribution (priced as tp_comm), the rest compute
                      "delta_communication_s": delta_comm, "delta_compute_s": delta_s - delta_comm,
                      "reference_cost_s": layout.reference.cost_s if layout.reference else None,
                      "chosen_cost_s": final.cost_s if final else None}
    rec["changed"] = changed
    if layout.ilp is not None:
        rec["ilp"] = layout.ilp
    return rec


def _axes(strat) -> list:
    """What each mesh axis cuts, None where it replicates (the plan's form)."""
    return [None if lab == REPLICATE else lab for lab in strat]


def _changed_operators(problem: ShardingProblem, layout: Layout, chosen, reference) -> list[dict[str, Any]]:
    """The operators whose layout the search changed from Megatron's: the mesh axes' cuts before and after,
    and what the operator itself then costs per step and keeps per device (graph_layers layers; the
    redistribution between operators is in the pricing's communication part)."""
    out = []
    for v, (a, b) in enumerate(zip(layout.reference.assignment, layout.chosen.assignment)):
        if a == b:
            continue
        out.append({"operator": problem.info[v].op.name, "megatron": _axes(a), "searched": _axes(b),
                    "delta_s": chosen.per_operator_s[v] - reference.per_operator_s[v],
                    "delta_bytes": chosen.per_operator_bytes[v] - reference.per_operator_bytes[v]})
    return out


def price_layouts(e: EstimateBatch, batch: StrategyBatch, records, capacity_bytes: float) -> EstimateBatch:
    """The cost model's estimates with each candidate's searched operator layout priced in (see the
    module docstring); candidates without a searched layout are unchanged. ``capacity_bytes``: the device
    memory a plan may use (TrainingJob.usable_memory_gib)."""
    if records is None:
        return e
    n = len(batch)
    per_layer_s, layer_bytes, comm_share = np.zeros(n), np.zeros(n), np.zeros(n)
    for i, rec in enumerate(records):
        pricing = rec.get("pricing") if isinstance(rec, dict) else None
        if not pricing or (pricing["delta_step_s"] == 0.0 and pricing["delta_memory_bytes"] == 0.0):
            continue
        per_layer_s[i] = pricing["delta_step_s"] / pricing["graph_layers"]
        layer_bytes[i] = pricing["delta_memory_bytes"] / pricing["graph_layers"]
        if pricing["delta_step_s"]:
            comm_share[i] = pricing.get("delta_communication_s", 0.0) / pricing["delta_step_s"]
    active, _, _ = stage_masks(batch)
    layers = np.where(active, batch.stage_layers, 0).astype(float)
    m = batch.num_micro_batches.astype(float)
    # every stage's micro-batch time changes by its layers' share, and the pipeline is re-timed as the cost
    # model times it (advisor.cost.bubble): the slowest stage after the change sets the steady state
    stage_s = e.stage_micro_batch_s + per_layer_s[:, None] * layers / m[:, None]
    old_s, old_fill, _ = pipeline_time_s(e.stage_micro_batch_s, active, batch.num_micro_batches,
                                         batch.virtual_pipeline_stages)
    new_s, new_fill, slowest = pipeline_time_s(stage_s, active, batch.num_micro_batches,
                                               batch.virtual_pipeline_stages)
    steady = (new_s - new_fill) - (old_s - old_fill)
    d_parts = {"compute": steady * (1.0 - comm_share), "tp_comm": steady * comm_share, "bubble": new_fill - old_fill}
    # memory: the largest stage's layers when the layout grows, the smallest's when it shrinks
    big = np.max(layers, axis=1)
    small = np.min(np.where(active, layers, np.inf), axis=1)
    d_mem = layer_bytes * np.where(layer_bytes > 0, big, small)
    d_step = sum(d_parts.values())
    if not d_step.any() and not d_mem.any():
        return e
    step = e.step_time_s + d_step
    ratio = e.step_time_s / step
    time_s = dict(e.time_s)
    # a saving in communication larger than the exposed tp_comm the cost model has comes out of compute
    comm = time_s["tp_comm"] + d_parts["tp_comm"]
    time_s["tp_comm"] = np.maximum(comm, 0.0)
    time_s["compute"] = np.maximum(time_s["compute"] + d_parts["compute"] + np.minimum(comm, 0.0), 0.0)
    time_s["bubble"] = np.maximum(time_s["bubble"] + d_parts["bubble"], 0.0)
    total = e.memory.total + d_mem
    memory = replace(e.memory, total=total, activations=np.maximum(e.memory.activations + d_mem, 0.0))
    # stage_parts_s stays the operators' split as the cost model priced it (stage_micro_batch_s is current)
    return replace(e, fits=total <= capacity_bytes, memory=memory, time_s=time_s, step_time_s=step,
                   tokens_per_s=e.tokens_per_s * ratio, tflops_per_device=e.tflops_per_device * ratio,
                   hfu_tflops_per_device=e.hfu_tflops_per_device * ratio, mfu=e.mfu * ratio, hfu=e.hfu * ratio,
                   stage_micro_batch_s=stage_s, slowest_stage=slowest)


def usable_bytes(job: TrainingJob, hw: HardwareProfile) -> float:
    """The device memory a plan may use, in bytes (TrainingJob.usable_memory_gib)."""
    return job.usable_memory_gib(hw.device.memory_gib) * GIB


def headroom_bytes(e: EstimateBatch, i: int, capacity_bytes: float) -> float:
    """Device memory the outer configuration leaves free on its worst stage (of ``capacity_bytes``, what a plan
    may use)."""
    return capacity_bytes - float(e.memory.total[i])
