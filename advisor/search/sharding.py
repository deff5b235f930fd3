"""Operator-level sharding: the device mesh, each operator's strategies, and what they cost.

D-Rec (advisor.search.drec), the ILP (advisor.search.ilp) and the exhaustive oracle below all search
the same space with the same costs, so their answers can be compared exactly.

Mesh. The devices form a logical mesh of axes, outermost first; the last axis has consecutive ranks
(the fastest links). ``DeviceMesh.for_devices`` follows the hardware tiers: one axis inside a node
(two for Ascend-style HCCS groups), and the nodes split in two axes (``[nodes / p, p]``, p the
smallest prime factor) so that a label can take a few nodes or most of them. ``fine=True`` gives one
axis per prime factor (the recursive halving of MindSpore's D-Rec).

Strategy. One label of the operator (or ``REPLICATE``) per mesh axis: that axis cuts every tensor
dimension carrying the label (advisor.graph.graph explains what cuts of outputs, contracted labels
and missing labels imply). A strategy is legal when each tensor dimension's total cut divides it.

Layouts. Per axis, a tensor is cut along one of its dimensions (the dimension's index), holds
partial sums (``PARTIAL``) or is replicated (``REPL``). A consumer whose layout differs from its
producer's pays a redistribution in the forward pass, and the transposed one for the gradient in
the backward pass (``conversion``): partial sums are reduce-scattered onto a dimension the consumer
cuts, else all-reduced; a dimension cut by the producer and not by the consumer is all-gathered;
a cut that moves to another dimension is an all-to-all; a cut the consumer adds is a local slice.
These are the primitives of MindSpore's tensor redistribution and of Alpa's resharding costs.

Costs (seconds per optimizer step; ``m`` micro-batches):
  operator: count x [m x (compute + in-operator collectives) + per-step gradient collectives
            + the optimizer step of the parameters it owns (Adam, memory-bound; ZeRO shards it)];
            compute is forward + backward = 3 x the forward (backward = 2 x forward, SC'21), the
            forward being the GEMM time of the local FLOPs at the profile's size-dependent efficiency
            plus memory-bound traffic (advisor.cost.compute);
  edge:     count x m x (forward + backward redistribution).
Every collective is priced by advisor.cost.comm.collective_time_s on the link tiers its group
spans; a group made of several mesh axes is passed as the evenly strided group with the same number
of members per node (exact on switch topologies; on HCCS mesh-groups the fast-group count is kept).
Memory per device: each parameter once (its first consumer's layout), weights and gradients cut
like the parameter, optimizer states also divided over the parameter's replicas from ZeRO stage 1
(MindSpore's optimizer parallelism; gradients from stage 2, weights from stage 3, which then
gathers weights every micro-batch as FSDP does), plus the activations each operator saves for the
backward pass, times the micro-batches in flight. An output the producer keeps itself (a fused
attention keeps its output, Operator.kept_outputs) is one tensor with a consumer that saves it in
the same layout and a second copy where the consumer's layout differs: that copy is priced on the
edge (ShardingProblem.edge_memory; D-Rec's moves and the ILP's memory constraint count it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from advisor.cost.memory import GIB
from advisor.errors import AdvisorError
from advisor.search.sharding_layouts import PARTIAL, REPL, REPLICATE, Shard, Strat, conversion
from advisor.search.sharding_mesh import DeviceMesh, prime_factors
from advisor.search.sharding_problem import (
    ENUMERATION_LIMIT, MEMORY_TOLERANCE, Evaluation, ShardingOptions, ShardingProblem,
)

# The mesh, the layouts and the problem live in advisor.search.sharding_mesh, _layouts and _problem;
# their names stay importable from here.
__all__ = [
    "ENUMERATION_LIMIT", "MEMORY_TOLERANCE", "PARTIAL", "REPL", "REPLICATE", "DeviceMesh", "Evaluation",
    "OperatorSolution", "Shard", "ShardingOptions", "ShardingProblem", "Strat", "brute_force", "conversion",
    "memory_fix_message", "prime_factors", "solution",
]


# ---- solutions ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class OperatorSolution:
    """A strategy per operator, its cost and how it was found."""

    searcher: str
    assignment: tuple[Strat, ...]
    cost_s: float
    memory_bytes: float
    fits: bool
    seconds: float
    details: dict = field(default_factory=dict, compare=False)

    def to_json(self, problem: ShardingProblem) -> dict:
        """MindSpore-style strategy records: per operator, the cut of every dimension of each tensor,
        and which label each mesh axis cuts."""
        ops = {}
        for v, s in enumerate(self.assignment):
            info = problem.info[v]
            op = info.op
            labs = [REPLICATE if lab is None else lab for lab in s]
            rec = {"kind": op.kind, "count": op.count, "mesh_axes": list(labs), "inputs": {}, "outputs": {}}
            for i, t in enumerate(op.inputs + op.outputs):
                seen = [op.input_label(lab) for lab in labs] if i < info.n_in else labs
                cuts = [math.prod(size for size, lab in zip(problem.mesh.shape, seen) if lab == dim)
                        for dim in op.labels[i]]
                rec["inputs" if i < info.n_in else "outputs"][t] = cuts
            ops[op.name] = rec
        return {
            "searcher": self.searcher, "graph": problem.graph.name, "mesh": list(problem.mesh.shape),
            "cost_s": self.cost_s, "memory_gib": self.memory_bytes / GIB, "operators": ops,
        }


def solution(problem: ShardingProblem, searcher: str, assignment, seconds: float, **details) -> OperatorSolution:
    ev = problem.evaluate(list(assignment))
    return OperatorSolution(searcher, tuple(assignment), ev.cost_s, ev.memory_bytes, ev.fits, seconds, dict(details))


def memory_fix_message(problem: ShardingProblem) -> str:
    """Why nothing fits and what would: the leanest sharding's memory against the limit."""
    need = problem.min_memory_bytes()
    have = problem.memory_limit_bytes
    devices = problem.mesh.devices
    more = 1 << max(0, math.ceil(math.log2(need / have))) if need > have else 1
    return (f"no sharding of {problem.graph.name} fits: the leanest needs {need / GIB:.1f} GiB per device, "
            f"{have / GIB:.1f} GiB is usable on {problem.hw.device.name}; use about {devices * more} devices "
            f"(memory shrinks with the device count), a device with more memory, more pipeline stages, "
            f"a higher ZeRO stage or fewer micro-batches in flight")


def brute_force(problem: ShardingProblem, limit: int = 2_000_000) -> OperatorSolution | None:
    """The exact optimum by trying every combination (the tests' oracle); None when nothing fits."""
    import time

    start = time.perf_counter()
    strats = [problem.strategies(v) for v in range(problem.num_ops)]
    shape = tuple(len(s) for s in strats)
    if math.prod(shape) > limit:
        raise AdvisorError(f"brute force over {math.prod(shape):.3g} combinations exceeds the limit {limit}")
    total = np.zeros(shape)
    mem = np.zeros(shape)
    for v, ss in enumerate(strats):
        c, mb = problem.op_costs(v, ss)
        view = [1] * len(shape)
        view[v] = len(ss)
        total = total + c.reshape(view)
        mem = mem + mb.reshape(view)
    for e, edge in enumerate(problem.edges):
        mat = problem.edge_costs(e, strats[edge.src], strats[edge.dst])
        view = [1] * len(shape)
        if edge.src == edge.dst:
            view[edge.src] = len(strats[edge.src])
            total = total + np.diag(mat).reshape(view)
            continue
        view[edge.src] = len(strats[edge.src])
        view2 = [1] * len(shape)
        view2[edge.dst] = len(strats[edge.dst])
        a = np.arange(len(strats[edge.src])).reshape(view)
        b = np.arange(len(strats[edge.dst])).reshape(view2)
        total = total + mat[a, b]
    total = np.where(problem.fits(mem), total, np.inf)
    best = np.unravel_index(int(np.argmin(total)), shape)
    if not np.isfinite(total[best]):
        return None
    assignment = [strats[v][i] for v, i in enumerate(best)]
    return solution(problem, "brute-force", assignment, time.perf_counter() - start)
