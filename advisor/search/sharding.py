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
backward pass, times the micro-batches in flight.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from advisor.cost import comm
from advisor.cost.compute import gemm_time_s, memory_time_s, optimizer_step_s
from advisor.cost.memory import ALLOCATOR_OVERHEAD, GIB, state_bytes_per_param
from advisor.errors import AdvisorError
from advisor.graph.graph import Edge, OperatorGraph
from advisor.specs.hardware import HardwareProfile
from advisor.specs.job import TrainingJob

REPLICATE = "*"
PARTIAL = -1
REPL = -2
MEMORY_TOLERANCE = 1e-4     # relative: limits are compared up to this (integer rounding in the ILP)
ENUMERATION_LIMIT = 50_000  # label choices per operator beyond which strategies are not listed
Strat = tuple  # one label (or REPLICATE; None while undecided) per mesh axis


# ---- the mesh -----------------------------------------------------------------------------------
def prime_factors(n: int) -> list[int]:
    out, p = [], 2
    while p * p <= n:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    if n > 1:
        out.append(n)
    return out


@dataclass(frozen=True)
class DeviceMesh:
    shape: tuple[int, ...]          # axis sizes, outermost first
    devices_per_node: int
    group_size: int                 # devices joined by the fastest links (= devices_per_node on switches)

    @property
    def devices(self) -> int:
        return math.prod(self.shape)

    @property
    def strides(self) -> tuple[int, ...]:
        out, inner = [], 1
        for size in reversed(self.shape):
            out.append(inner)
            inner *= size
        return tuple(reversed(out))

    @staticmethod
    def for_devices(hw: HardwareProfile, devices: int, shape: tuple[int, ...] | None = None,
                    fine: bool = False) -> "DeviceMesh":
        per_node, group = hw.node.devices_per_node, hw.node.group_size
        if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
            raise AdvisorError(f"device count must be a positive integer, got {devices!r}")
        if shape is None:
            shape = tuple(_default_shape(devices, per_node, group, fine))
        shape = tuple(int(x) for x in shape)
        if any(x < 2 for x in shape) or math.prod(shape) != devices:
            raise AdvisorError(f"mesh shape {list(shape)} must be axes of size >= 2 whose product is {devices} devices")
        return DeviceMesh(shape, per_node, group)

    @cached_property
    def _groups(self) -> dict[int, tuple[int, int]]:
        return {}

    def group(self, mask: int) -> tuple[int, int]:
        """(members, stride) of the evenly strided group that spans the same tiers as the axes in mask."""
        hit = self._groups.get(mask)
        if hit is None:
            hit = self._groups[mask] = self._equivalent_group(mask)
        return hit

    def _equivalent_group(self, mask: int) -> tuple[int, int]:
        axes = [k for k in range(len(self.shape)) if mask >> k & 1]
        n = math.prod(self.shape[k] for k in axes)
        if n <= 1:
            return 1, 1
        ranks = np.zeros(1, dtype=np.int64)
        for k in axes:
            ranks = (ranks[:, None] + np.arange(self.shape[k])[None, :] * self.strides[k]).ravel()
        in_group = int(np.sum(ranks < self.group_size))
        in_node = int(np.sum(ranks < self.devices_per_node))
        if in_group > 1:
            return n, max(self.group_size // in_group, 1)
        if in_node > 1:
            return n, max(self.devices_per_node // in_node, self.group_size)
        return n, self.devices_per_node

    def describe(self) -> str:
        return " x ".join(str(s) for s in self.shape)


def _default_shape(devices: int, per_node: int, group: int, fine: bool) -> list[int]:
    intra = math.gcd(devices, per_node)
    inter = devices // intra
    fast = math.gcd(intra, group)
    tiers = [inter, intra // fast, fast]          # outermost first
    if fine:
        return [p for t in tiers for p in sorted(prime_factors(t), reverse=True)]
    out = []
    if inter > 1:
        primes = prime_factors(inter)
        out += [inter // primes[0], primes[0]] if len(primes) > 1 else [inter]
    return out + [t for t in tiers[1:] if t > 1]


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


# ---- per-operator facts -------------------------------------------------------------------------
@dataclass(frozen=True)
class Shard:
    """One operator under one strategy."""

    valid: bool
    out_layouts: tuple[tuple[int, ...], ...] = ()    # per output
    in_layouts: tuple[tuple[int, ...], ...] = ()     # per input: what the operator needs
    in_grads: tuple[tuple[int, ...], ...] = ()       # per input: the layout its gradient comes out in
    local_bytes: tuple[float, ...] = ()              # per tensor of the operator (inputs, outputs, internals)
    local_flops: float = 0.0


@dataclass
class _Collectives:
    """Collectives gathered from many strategies, priced in one vectorized call per kind."""

    rows: int
    items: dict[str, list[tuple[int, int, float, float]]] = field(default_factory=dict)

    def add(self, op: str, row: int, mask: int, nbytes: float, weight: float = 1.0) -> None:
        if mask and nbytes > 0 and weight:
            self.items.setdefault(op, []).append((row, mask, nbytes, weight))

    def total(self, hw: HardwareProfile, mesh: DeviceMesh) -> np.ndarray:
        out = np.zeros(self.rows)
        for op, items in self.items.items():
            rows, masks, nbytes, weights = (np.array(x) for x in zip(*items))
            groups = np.array([mesh.group(int(m)) for m in masks], dtype=np.int64)
            t = comm.collective_time_s(hw, op, nbytes, groups[:, 0], groups[:, 1])
            np.add.at(out, rows.astype(np.int64), np.asarray(t, dtype=float) * weights)
        return out


def conversion(x: tuple[int, ...], y: tuple[int, ...], sizes: tuple[int, ...], full_bytes: float):
    """Collectives turning layout x into layout y of a tensor of full_bytes: [(op, axis mask, bytes)]."""
    out = []
    local = full_bytes / math.prod(s for s, c in zip(sizes, x) if c >= 0)
    ar = rs = a2a = ag = 0
    after = list(x)
    for k, (a, b) in enumerate(zip(x, y)):
        if a == PARTIAL:
            if b >= 0:
                rs |= 1 << k
                after[k] = b
            else:
                ar |= 1 << k
                after[k] = REPL
    if ar:
        out.append(("all_reduce", ar, local))
    if rs:
        out.append(("reduce_scatter", rs, local))
        local /= math.prod(sizes[k] for k in range(len(sizes)) if rs >> k & 1)
    gathered = 1
    for k, (a, b) in enumerate(zip(after, y)):
        if a >= 0 and b != a:
            if b >= 0:
                a2a |= 1 << k
            else:
                ag |= 1 << k
                gathered *= sizes[k]
    if a2a:
        out.append(("all_to_all", a2a, local))
    if ag:
        out.append(("all_gather", ag, local * gathered))
    return out


def _backward_target(x: tuple[int, ...]) -> tuple[int, ...]:
    """The layout a producer needs its output's gradient in: its partial-sum axes replicated."""
    return tuple(REPL if c == PARTIAL else c for c in x)


class _OpInfo:
    def __init__(self, graph: OperatorGraph, index: int, forbid: frozenset[str]):
        op = graph.operators[index]
        self.op = op
        self.index = index
        self.tensors = [graph.tensors[t] for t in op.tensors]
        self.n_in, self.n_out = len(op.inputs), len(op.outputs)
        extents: dict[str, int] = {}
        for t, labs in zip(self.tensors, op.labels):
            for lab, size in zip(labs, t.shape):
                extents[lab] = max(extents.get(lab, 1), size)
        self.choices = tuple(lab for lab in op.all_labels
                             if lab not in op.no_cut and lab not in forbid and extents.get(lab, 1) > 1) + (REPLICATE,)
        self.params = [i for i, t in enumerate(self.tensors[: self.n_in]) if t.param]


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
        self._edge_cost: dict[tuple[int, tuple, tuple], float] = {}
        self._strategies: dict[int, list[Strat]] = {}
        self._templates: dict[tuple, tuple] = {}
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
        todo = [s for s in dict.fromkeys(strats) if (v, s) not in self._op_cost]
        if todo:
            cost, mem = self._price_ops(v, todo)
            for s, c, mb in zip(todo, cost, mem):
                self._op_cost[(v, s)] = (float(c), float(mb))
        pairs = [self._op_cost[(v, s)] for s in strats]
        return np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])

    def _price_ops(self, v: int, strats: list[Strat]) -> tuple[np.ndarray, np.ndarray]:
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
        compute = 3.0 * (np.asarray(gemm_time_s(hw, job.gemm_dtype, flops)) + np.asarray(memory_time_s(hw, traffic)))
        step = per_step.total(hw, self.mesh) + np.asarray(optimizer_step_s(hw, updated))
        cost = op.count * (m * (compute + per_mb.total(hw, self.mesh)) + step)
        return cost, mem * op.count

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
            distinct = list({item for plan in plans for item in plan})
            batch = _Collectives(len(distinct))
            for row, (op_name, mask, fraction) in enumerate(distinct):
                batch.add(op_name, row, mask, fraction * nbytes)
            price = dict(zip(distinct, batch.total(self.hw, self.mesh)))
            scale = edge.count * self.options.num_micro_batches
            for (a, b), plan in zip(todo, plans):
                cache[(e, a, b)] = scale * float(sum(price[item] for item in plan))
        return np.array([[cache[(e, a, b)] for b in ckeys] for a in pkeys])

    def _template(self, x: tuple[int, ...], y: tuple[int, ...]) -> tuple:
        key = (x, y)
        hit = self._templates.get(key)
        if hit is None:
            hit = self._templates[key] = tuple(conversion(x, y, self.mesh.shape, 1.0))
        return hit

    def edge_costs(self, e: int, src_strats: list[Strat], dst_strats: list[Strat]) -> np.ndarray:
        pk = [self.producer_key(e, s) for s in src_strats]
        ck = [self.consumer_key(e, s) for s in dst_strats]
        return self.edge_key_costs(e, pk, ck)

    # ---- whole assignments -----------------------------------------------------------------------
    def evaluate(self, assignment: list[Strat]) -> "Evaluation":
        op_s, mem = 0.0, 0.0
        per_op = []
        for v, s in enumerate(assignment):
            if not self.shard(v, s).valid:
                raise AdvisorError(f"strategy {list(s)} of operator '{self.info[v].op.name}' does not divide its tensors")
            c, mb = self.op_costs(v, [s])
            op_s += float(c[0])
            mem += float(mb[0])
            per_op.append(float(c[0]))
        edge_s = 0.0
        for e, edge in enumerate(self.edges):
            edge_s += float(self.edge_costs(e, [assignment[edge.src]], [assignment[edge.dst]])[0, 0])
        return Evaluation(op_s + edge_s, op_s, edge_s, mem, self.fits(mem), tuple(per_op))

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


def _mask(labels: list[str], pred) -> int:
    out = 0
    for k, lab in enumerate(labels):
        if lab != REPLICATE and pred(lab):
            out |= 1 << k
    return out


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
