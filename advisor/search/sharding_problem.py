"""The sharding problem (advisor.search.sharding explains the model): a graph on a mesh.

ShardingOptions (what is searched, how a step is composed) and ShardingProblem: each operator's legal
strategies, its cost and memory under each, the cost of each edge's redistribution, and the
evaluation of a whole assignment (Evaluation); everything cached.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace

import numpy as np

from advisor.cost.compute import linear_gemm_time_s, memory_time_s, optimizer_step_s
from advisor.cost.memory import ALLOCATOR_OVERHEAD, GIB, state_bytes_per_param
from advisor.errors import AdvisorError
from advisor.graph.graph import Edge, OperatorGraph
from advisor.search.sharding_layouts import (
    PARTIAL, REPL, REPLICATE, Shard, Strat, _backward_target, _Collectives, _mask, _OpInfo, conversion,
)
from advisor.search.sharding_mesh import DeviceMesh
from advisor.specs.hardware import HardwareProfile
from advisor.specs.job import TrainingJob

MEMORY_TOLERANCE = 1e-4     # relative: limits are compared up to this (integer rounding in the ILP)
ENUMERATION_LIMIT = 50_000  # label choices per operator beyond which strategies are not listed


# ---- options ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ShardingOptions:
    """What is searched and how a step is composed.

    num_micro_batches: gradient-accumulation steps per optimizer step (operator and edge costs
    repeat, gradient reduction does not); activations_in_flight: micro-batches whose activations
    are held at the peak (1 without pipelining, the stage's warm-up depth with 1F1B);
    memory_limit_gib: per device (default: the device memory, less the allocator allowance of
    advisor.cost.memory); forbid_cut: labels no operator may cut (``{"b", "s"}`` keeps only
    tensor-parallel-style cuts)."""

    num_micro_batches: int = 1
    activations_in_flight: float = 1.0
    zero_stage: int = 1
    memory_limit_gib: float | None = None
    forbid_cut: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if self.zero_stage not in (0, 1, 2, 3):
            raise AdvisorError(f"zero stage must be 0, 1, 2 or 3, got {self.zero_stage!r}")
        if self.num_micro_batches < 1:
            raise AdvisorError(f"micro-batch count must be positive, got {self.num_micro_batches!r}")



# ---- the problem --------------------------------------------------------------------------------
class ShardingProblem:
    """A graph on a mesh: strategies, operator costs, edge costs, memory; everything cached."""

    def __init__(self, graph: OperatorGraph, mesh: DeviceMesh, hw: HardwareProfile, job: TrainingJob,
                 options: ShardingOptions = ShardingOptions()):
        self.graph, self.mesh, self.hw, self.job, self.options = graph, mesh, hw, job, options
        self.info = [_OpInfo(graph, i, options.forbid_cut) for i in range(len(graph.operators))]
        self.edges: tuple[Edge, ...] = graph.edges
        self.owner = graph.param_owner()
        limit = options.memory_limit_gib if options.memory_limit_gib is not None else hw.device.memory_gib
        self.memory_limit_bytes = limit * GIB / (1.0 + ALLOCATOR_OVERHEAD)
        self.bytes_per_param = state_bytes_per_param(job)
        self.incident: list[list[int]] = [[] for _ in graph.operators]
        for e, edge in enumerate(self.edges):
            self.incident[edge.src].append(e)
            if edge.dst != edge.src:
                self.incident[edge.dst].append(e)
        self._shards: dict[tuple[int, Strat], Shard] = {}
        self._op_cost: dict[tuple[int, Strat], tuple[float, float]] = {}
        self._op_comm: dict[tuple[int, Strat], float] = {}   # the collectives' share of _op_cost's seconds
        self._edge_cost: dict[tuple[int, tuple, tuple], float] = {}
        # the arrays op_costs and edge_costs return, by their arguments (read-only: the searchers ask for the
        # same candidate lists again and again), and evaluate's figures by assignment
        self._op_arrays: dict[tuple[int, tuple], tuple[np.ndarray, np.ndarray]] = {}
        self._edge_arrays: dict[tuple[int, tuple, tuple], np.ndarray] = {}
        self._evaluations: dict[tuple, Evaluation] = {}
        self._collective_s: dict[tuple[str, int, float], float] = {}
        self._strategies: dict[int, list[Strat]] = {}
        self._templates: dict[tuple, tuple] = {}
        # outputs an operator keeps for backward itself (Operator.kept_outputs): priced on the first edge to a
        # consumer (edge_memory), or with the operator where no edge carries them
        self._kept_edges: dict[int, bool] = {}      # edge -> whether its consumer saves the tensor it gets
        self._kept_unlinked: dict[int, list[int]] = {}   # operator -> its kept outputs' tensor indices
        for v, info in enumerate(self.info):
            for t in info.op.kept_outputs:
                first = next((e for e, edge in enumerate(self.edges) if edge.src == v and edge.src_tensor == t
                              and edge.dst != v), None)
                if first is None:
                    self._kept_unlinked.setdefault(v, []).append(info.op.tensors.index(t))
                else:
                    dst = self.info[self.edges[first].dst].op
                    self._kept_edges[first] = self.edges[first].dst_tensor in dst.saves
        # operators whose strategy a user fixed (advisor.search.semi_auto): v -> the mesh strategies
        # that give the user's cuts, and every prefix of them (D-Rec decides one axis at a time)
        self.fixed: dict[int, list[Strat]] = {}
        self._fixed_prefixes: dict[int, set[Strat]] = {}

    @property
    def num_ops(self) -> int:
        return len(self.info)

    # ---- strategies ------------------------------------------------------------------------------
    def choices(self, v: int) -> tuple[str, ...]:
        return self.info[v].choices

    def enumerable(self, v: int) -> bool:
        """Whether operator v's strategies can be listed (the ILP and brute force need them)."""
        return v in self.fixed or len(self.info[v].choices) ** len(self.mesh.shape) <= ENUMERATION_LIMIT

    def fix(self, v: int, strategies: list[Strat]) -> None:
        """Keep operator v to these strategies (a user's shard(); advisor.search.semi_auto)."""
        if not strategies:
            raise AdvisorError(f"operator '{self.info[v].op.name}': a fixed operator needs at least one strategy")
        self.fixed[v] = list(strategies)
        self._fixed_prefixes[v] = {s[:k] for s in strategies for k in range(len(s) + 1)}
        self._strategies.pop(v, None)

    def allows(self, v: int, strat: Strat, level: int) -> bool:
        """Whether axes 0..level of a partial strategy can still end in one of v's fixed strategies."""
        return v not in self.fixed or tuple(strat[: level + 1]) in self._fixed_prefixes[v]

    def strategies(self, v: int) -> list[Strat]:
        """Every legal full strategy of operator v."""
        if not self.enumerable(v):
            raise AdvisorError(
                f"operator '{self.info[v].op.name}' has {len(self.info[v].choices)}^{len(self.mesh.shape)} strategies "
                f"on the {self.mesh.describe()} mesh, too many to list; use a mesh with fewer axes "
                f"(DeviceMesh.for_devices without fine=True)")
        if v in self.fixed:
            return self.fixed[v]
        if v not in self._strategies:
            pool = itertools.product(self.info[v].choices, repeat=len(self.mesh.shape))
            self._strategies[v] = [s for s in pool if self.shard(v, s).valid]
        return self._strategies[v]

    def space_size(self) -> float:
        """Combinations of legal strategies (of every label choice when they are too many to list)."""
        return math.prod(float(len(self.strategies(v))) if self.enumerable(v)
                         else float(len(self.info[v].choices)) ** len(self.mesh.shape) for v in range(self.num_ops))

    def shard(self, v: int, strat: Strat) -> Shard:
        key = (v, strat)
        hit = self._shards.get(key)
        if hit is None:
            hit = self._shards[key] = self._make_shard(v, strat)
        return hit

    def _make_shard(self, v: int, strat: Strat) -> Shard:
        info, sizes = self.info[v], self.mesh.shape
        op = info.op
        labs = [REPLICATE if lab is None else lab for lab in strat]
        in_labs = [op.input_label(lab) for lab in labs]
        out_layouts, in_layouts, in_grads, local = [], [], [], []
        for i, (t, tlabs) in enumerate(zip(info.tensors, op.labels)):
            is_input = i < info.n_in
            seen = in_labs if is_input else labs
            cuts = [1] * len(tlabs)
            for k, lab in enumerate(seen):
                if lab in tlabs:
                    cuts[tlabs.index(lab)] *= sizes[k]
            if any(size % c for size, c in zip(t.shape, cuts)):
                return Shard(valid=False)
            local.append(t.nbytes / math.prod(cuts))
            if is_input:
                in_layouts.append(tuple(tlabs.index(lab) if lab in tlabs else REPL for lab in seen))
                in_grads.append(tuple(tlabs.index(lab) if lab in tlabs else (REPL if lab == REPLICATE else PARTIAL)
                                      for lab in seen))
            elif i < info.n_in + info.n_out:
                out_layouts.append(tuple(
                    tlabs.index(lab) if lab in tlabs else (PARTIAL if lab in op.sum_labels else REPL) for lab in seen))
        total_cut = math.prod(s for s, lab in zip(sizes, labs) if lab != REPLICATE)
        return Shard(True, tuple(out_layouts), tuple(in_layouts), tuple(in_grads), tuple(local), op.flops / total_cut)

    # ---- operator costs --------------------------------------------------------------------------
    def op_costs(self, v: int, strats: list[Strat]) -> tuple[np.ndarray, np.ndarray]:
        """(seconds per step, bytes per device) of operator v under each strategy."""
        key = (v, tuple(strats))
        hit = self._op_arrays.get(key)
        if hit is not None:
            return hit
        todo = [s for s in dict.fromkeys(strats) if (v, s) not in self._op_cost]
        if todo:
            cost, mem, comm = self._price_ops(v, todo)
            for s, c, mb, cm in zip(todo, cost, mem, comm):
                self._op_cost[(v, s)] = (float(c), float(mb))
                self._op_comm[(v, s)] = float(cm)
        pairs = [self._op_cost[(v, s)] for s in strats]
        hit = self._op_arrays[key] = (_frozen(np.array([p[0] for p in pairs])), _frozen(np.array([p[1] for p in pairs])))
        return hit

    def op_communication_s(self, v: int, s: Strat) -> float:
        """The seconds per step of operator v's own collectives under strategy s (part of op_costs')."""
        self.op_costs(v, [s])
        return self._op_comm[(v, s)]

    def _price_ops(self, v: int, strats: list[Strat]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        info, hw, job, opts = self.info[v], self.hw, self.job, self.options
        op = info.op
        m = opts.num_micro_batches
        z = opts.zero_stage
        wb, gb, ob = self.bytes_per_param
        n = len(strats)
        flops = np.zeros(n)
        traffic = np.zeros(n)
        mem = np.zeros(n)
        updated = np.zeros(n)             # parameters this device updates (ZeRO shards the update)
        per_mb = _Collectives(n)
        per_step = _Collectives(n)
        out_slice = slice(info.n_in, info.n_in + info.n_out)
        for row, s in enumerate(strats):
            sh = self.shard(v, s)
            labs = [REPLICATE if lab is None else lab for lab in s]
            flops[row] = sh.local_flops
            outs = sum(sh.local_bytes[out_slice])
            internals = sum(sh.local_bytes[info.n_in + info.n_out:])
            if op.is_gemm:
                traffic[row] = op.epilogue_passes * (outs + internals)
            else:
                traffic[row] = sum(b for i, b in enumerate(sh.local_bytes[: info.n_in]) if not info.tensors[i].param) + outs
            stat = _mask(labs, lambda lab: lab in op.stat_labels)
            if stat:
                elems = sh.local_bytes[info.n_in] / info.tensors[info.n_in].dtype_bytes
                per_mb.add("all_reduce", row, stat, op.stat_bytes * elems)
            mapped = _mask(labs, lambda lab: op.input_label(lab) != lab)
            per_mb.add("all_to_all", row, mapped, outs, 2.0)
            saved = sum(sh.local_bytes[op.tensors.index(t)] for t in op.saves)
            saved += sum(sh.local_bytes[i] for i in self._kept_unlinked.get(v, ()))
            mem[row] = saved * opts.activations_in_flight
            for i in info.params:
                t = info.tensors[i]
                tlabs = op.labels[i]
                replicas = _mask(labs, lambda lab: lab != REPLICATE and op.input_label(lab) not in tlabs)
                r = math.prod(self.mesh.shape[k] for k in range(len(labs)) if replicas >> k & 1)
                numel = sh.local_bytes[i] / t.dtype_bytes
                if self.owner.get(t.name) == v and t.tied_to is None:
                    mem[row] += numel * (wb / (r if z >= 3 else 1) + gb / (r if z >= 2 else 1) + ob / (r if z >= 1 else 1))
                    updated[row] += numel / (r if z >= 1 else 1)
                if z == 0:
                    per_step.add("all_reduce", row, replicas, numel * gb)
                elif z <= 2:
                    per_step.add("reduce_scatter", row, replicas, numel * gb)
                    per_step.add("all_gather", row, replicas, numel * wb)
                else:  # FSDP: gather weights for forward and backward, reduce-scatter gradients, per micro-batch
                    per_mb.add("all_gather", row, replicas, numel * wb, 2.0)
                    per_mb.add("reduce_scatter", row, replicas, numel * gb)
        compute = 3.0 * (np.asarray(linear_gemm_time_s(hw, job, job.gemm_dtype, flops)) + np.asarray(memory_time_s(hw, traffic)))
        collectives = per_step.total(hw, self.mesh)
        step = collectives + np.asarray(optimizer_step_s(hw, updated))
        cost = op.count * (m * (compute + per_mb.total(hw, self.mesh)) + step)
        comm = op.count * (m * per_mb.total(hw, self.mesh) + collectives)
        return cost, mem * op.count, comm

    # ---- edge costs ------------------------------------------------------------------------------
    def producer_key(self, e: int, s: Strat) -> tuple[int, ...]:
        edge = self.edges[e]
        op = self.info[edge.src].op
        return self.shard(edge.src, s).out_layouts[op.outputs.index(edge.src_tensor)]

    def consumer_key(self, e: int, s: Strat) -> tuple[tuple[int, ...], tuple[int, ...]]:
        edge = self.edges[e]
        sh = self.shard(edge.dst, s)
        return sh.in_layouts[edge.dst_slot], sh.in_grads[edge.dst_slot]

    def edge_key_costs(self, e: int, pkeys: list, ckeys: list) -> np.ndarray:
        """Seconds per step of edge e for each (producer layout, consumer layout) pair: a matrix.
        Conversions are shape-free templates (collective, axes, fraction of the tensor), each
        distinct collective priced once."""
        edge = self.edges[e]
        nbytes = float(self.graph.tensors[edge.src_tensor].nbytes)
        cache = self._edge_cost
        todo = [(a, b) for a in dict.fromkeys(pkeys) for b in dict.fromkeys(ckeys) if (e, a, b) not in cache]
        if todo:
            plans = [self._template(a, b_in) + self._template(b_grad, _backward_target(a)) for a, (b_in, b_grad) in todo]
            price = self._collective_s    # (collective, axes, bytes) -> seconds, shared by every edge of the problem
            distinct = list({(op_name, mask, fraction * nbytes) for plan in plans for op_name, mask, fraction in plan}
                            - price.keys())
            if distinct:
                batch = _Collectives(len(distinct))
                for row, (op_name, mask, size) in enumerate(distinct):
                    batch.add(op_name, row, mask, size)
                price.update(zip(distinct, batch.total(self.hw, self.mesh)))
            scale = edge.count * self.options.num_micro_batches
            for (a, b), plan in zip(todo, plans):
                cache[(e, a, b)] = scale * float(sum(price[(op_name, mask, fraction * nbytes)]
                                                     for op_name, mask, fraction in plan))
        return np.array([[cache[(e, a, b)] for b in ckeys] for a in pkeys])

    def _template(self, x: tuple[int, ...], y: tuple[int, ...]) -> tuple:
        key = (x, y)
        hit = self._templates.get(key)
        if hit is None:
            hit = self._templates[key] = tuple(conversion(x, y, self.mesh.shape, 1.0))
        return hit

    def edge_costs(self, e: int, src_strats: list[Strat], dst_strats: list[Strat]) -> np.ndarray:
        key = (e, tuple(src_strats), tuple(dst_strats))
        hit = self._edge_arrays.get(key)
        if hit is None:
            pk = [self.producer_key(e, s) for s in src_strats]
            ck = [self.consumer_key(e, s) for s in dst_strats]
            hit = self._edge_arrays[key] = _frozen(self.edge_key_costs(e, pk, ck))
        return hit

    # ---- memory on edges ---------------------------------------------------------------------------
    @property
    def memory_edges(self) -> tuple[int, ...]:
        """The edges that carry memory (edge_memory): those of a kept output to its consumer."""
        return tuple(self._kept_edges)

    def edge_key_memory(self, e: int, pkeys: list, ckeys: list) -> np.ndarray:
        """Bytes per device of edge e for each (producer layout, consumer layout) pair: the producer's kept copy of
        the tensor (Operator.kept_outputs), unless the consumer saves it in the same layout (then it is the one
        tensor the consumer's own memory counts). Zero on edges without a kept output."""
        out = np.zeros((len(pkeys), len(ckeys)))
        if e not in self._kept_edges:
            return out
        edge = self.edges[e]
        op = self.info[edge.src].op
        nbytes = float(self.graph.tensors[edge.src_tensor].nbytes)
        scale = op.count * self.options.activations_in_flight
        for i, a in enumerate(pkeys):
            local = scale * nbytes / math.prod(n for n, d in zip(self.mesh.shape, a) if d >= 0)
            for j, (b_in, _) in enumerate(ckeys):
                out[i, j] = 0.0 if self._kept_edges[e] and a == b_in else local
        return out

    def edge_memory(self, e: int, src_strats: list[Strat], dst_strats: list[Strat]) -> np.ndarray:
        pk = [self.producer_key(e, s) for s in src_strats]
        ck = [self.consumer_key(e, s) for s in dst_strats]
        return self.edge_key_memory(e, pk, ck)

    def assignment_edge_memory(self, assignment: list[Strat]) -> float:
        """The bytes per device the memory edges of an assignment add to its operators' (edge_memory)."""
        return sum(float(self.edge_memory(e, [assignment[self.edges[e].src]], [assignment[self.edges[e].dst]])[0, 0])
                   for e in self._kept_edges)

    # ---- whole assignments -----------------------------------------------------------------------
    def evaluate(self, assignment: list[Strat]) -> "Evaluation":
        key = tuple(assignment)
        hit = self._evaluations.get(key)
        if hit is None:
            hit = self._evaluations[key] = self._evaluate(assignment)
        return replace(hit, fits=self.fits(hit.memory_bytes))     # the memory limit may have changed since

    def _evaluate(self, assignment: list[Strat]) -> "Evaluation":
        op_s, mem, comm = 0.0, 0.0, 0.0
        per_op, per_op_mem = [], []
        for v, s in enumerate(assignment):
            if not self.shard(v, s).valid:
                raise AdvisorError(f"strategy {list(s)} of operator '{self.info[v].op.name}' does not divide its tensors")
            c, mb = self.op_costs(v, [s])
            op_s += float(c[0])
            mem += float(mb[0])
            comm += self.op_communication_s(v, s)
            per_op.append(float(c[0]))
            per_op_mem.append(float(mb[0]))
        edge_s = 0.0
        for e, edge in enumerate(self.edges):
            edge_s += float(self.edge_costs(e, [assignment[edge.src]], [assignment[edge.dst]])[0, 0])
        mem += self.assignment_edge_memory(assignment)
        return Evaluation(op_s + edge_s, op_s, edge_s, mem, self.fits(mem), tuple(per_op), comm + edge_s,
                          tuple(per_op_mem))

    def fits(self, memory_bytes) -> bool | np.ndarray:
        """Within the memory limit, up to MEMORY_TOLERANCE (the ILP's integer rounding)."""
        return memory_bytes <= self.memory_limit_bytes * (1.0 + MEMORY_TOLERANCE)

    def min_memory_bytes(self) -> float:
        """The leanest sharding's memory: exact where strategies can be listed, else the memory of
        the leanest label chosen axis by axis (a sharding that exists, so an upper bound)."""
        return sum(self._min_memory(v) for v in range(self.num_ops))

    def _min_memory(self, v: int) -> float:
        if self.enumerable(v):
            return float(self.op_costs(v, self.strategies(v))[1].min())
        current: Strat = (None,) * len(self.mesh.shape)
        for level in range(len(current)):
            cands = [current[:level] + (lab,) + current[level + 1:] for lab in self.choices(v)]
            cands = [c for c in cands if self.shard(v, c).valid]
            current = cands[int(np.argmin(self.op_costs(v, cands)[1]))]
        return float(self.op_costs(v, [current])[1][0])


@dataclass(frozen=True)
class Evaluation:
    cost_s: float          # seconds per optimizer step: operators + redistribution
    operator_s: float
    redistribution_s: float
    memory_bytes: float
    fits: bool
    per_operator_s: tuple[float, ...]
    communication_s: float = 0.0    # the operators' collectives plus the redistribution; the rest is compute
    per_operator_bytes: tuple[float, ...] = ()


def _frozen(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a
