"""The exhaustive searcher: every legal strategy, generated and scored as numpy arrays.

Generation (vectorized; each step crosses the rows so far with one knob's options):

1. parallel degrees dp x tp x pp x cp = devices (products of divisor lists) and ep (MoE);
2. pipeline schedule and virtual stages; 3. micro-batch size (a divisor of global batch / dp;
   the micro-batch count follows); 4. sequence parallelism; 5. recomputation.

The legality rules of advisor.space.rules run on the rows after steps 1 and 5; every removed row is
counted under the first rule that rejects it. On nodes whose fast links join only part of the node
(Ascend's HCCS groups) a searched TP group must stay inside one group (unless --tp is pinned).
Combinations provably equivalent to a kept one are not generated and are counted separately
(``deduplicated``): a schedule when pp = 1, sequence parallelism when tp = 1, a ZeRO stage without
data parallelism, and mesh orders that give every stride that matters the same value. The rows
("skeletons") are then crossed with the ZeRO stage / optimizer offload pairs and the mesh orders,
which change memory and communication only.

Scoring is best-first branch and bound over exact cost-model calls (estimate_batch), with bounds
that are themselves estimate_batch calls on modified hardware profiles:

* family: skeletons differing only in sequence parallelism and recomputation, bounded by their
  fastest member on free_hardware (communication, host and kernel launches free);
* skeleton: each skeleton on free_hardware with the ZeRO/offload pair needing the least memory;
  proves that no variant fits when even that one does not;
* pair: each ZeRO/offload pair on fastest_link_hardware (every placement as fast as the fastest
  link): exact memory, and a bound on every mesh order;
* exact: every mesh order of the surviving pairs on the real hardware.

Items are expanded in order of their bound until it cannot reach ``1 - TIE_BAND`` of the K-th best
distinct throughput found, so the ranking's tie-break within 1% still sees every contender. The
bounds rest on properties of the cost model that tests/test_enumerate.py checks on random candidates:
time never falls as links, host or launches get slower, memory does not depend on links or mesh
order, and each bound is below the real step time.

Each estimate_batch call holds candidates of one pipeline depth, since the cost model's stage arrays
are as wide as the largest pp of a batch.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from dataclasses import replace

import numpy as np

from advisor.cost.comm import slowest_tier
from advisor.cost.estimate import estimate_batch
from advisor.cost.memory import GIB, memory
from advisor.rank import TIE_BAND
from advisor.search import Pins, Progress, SearchOutcome, SearchStats
from advisor.space.rules import illegal_masks
from advisor.space.strategy import (
    DEFAULT_MESH_ORDER, INTERLEAVED, MESH_DIMS, ONE_F_ONE_B, RECOMPUTE, SCHEDULES, StrategyBatch, even_stage_layers,
)
from advisor.specs.hardware import HardwareProfile
from advisor.specs.job import Cluster, TrainingJob
from advisor.specs.model import ModelSpec

ZERO_STAGES = (0, 1, 2, 3)
HCCS_REASON = "TP group would span HCCS groups"
DEVICE_MEMORY_REASON = "does not fit in device memory"
HOST_MEMORY_REASON = "offloaded optimizer does not fit in host memory"
TIME_BOUND_REASON = "cannot reach the top K (bound)"
# Stage-axis cells (candidates x pipeline stages) per cost-model call: bounds the arrays' memory.
PRICE_CELLS = 400_000
# Work per best-first batch, in the next stage's cells: small until a threshold exists, then larger
# (fewer, bigger cost-model calls against a threshold that rises a little less often). Tuned on
# benchmarks/search_speed.py's cases and the published runs' searches.
FIRST_BATCH_CELLS = 20_000
FAMILY_BATCH_CELLS = 400_000
SKELETON_BATCH_CELLS = 800_000
PAIR_BATCH_CELLS = 800_000

Rows = dict[str, np.ndarray]


# ---- mesh orders --------------------------------------------------------------------------------
def _inversions(order: tuple[str, ...]) -> int:
    pos = [DEFAULT_MESH_ORDER.index(d) for d in order]
    return sum(1 for i in range(len(pos)) for j in range(i + 1, len(pos)) if pos[i] > pos[j])


# All orders, the default first, then by distance from it: the first order giving a stride pattern
# is the one reported for it.
MESH_ORDERS: tuple[tuple[str, ...], ...] = tuple(sorted(itertools.permutations(MESH_DIMS), key=_inversions))
DEFAULT_ORDER_INDEX = MESH_ORDERS.index(DEFAULT_MESH_ORDER)


def _representative_orders(active: tuple[bool, ...]) -> np.ndarray:
    """Indices of the orders that differ in the relative order of the active dimensions (see
    _active_code). A dimension of degree 1 changes no other stride, and distinct relative orders of
    the active ones give them distinct strides, so this is exactly de-duplication by the strides
    that can matter."""
    seen: dict[tuple[str, ...], int] = {}
    for i, order in enumerate(MESH_ORDERS):
        key = tuple(d for d in order if active[MESH_DIMS.index(d)])
        seen.setdefault(key, i)
    return np.array(sorted(seen.values()), dtype=np.int64)


def _representative_table() -> np.ndarray:
    """(16, orders) bool: whether order j represents its stride pattern, by active-dimension code."""
    table = np.zeros((16, len(MESH_ORDERS)), dtype=bool)
    for code in range(16):
        table[code, _representative_orders(tuple(bool(code >> i & 1) for i in range(4)))] = True
    return table


_IS_REPRESENTATIVE = _representative_table()
# Position of each of MESH_DIMS in each order (0 = outermost).
_ORDER_POSITIONS = np.array([[order.index(d) for d in MESH_DIMS] for order in MESH_ORDERS], dtype=np.int64)


def _active_code(rows: Rows) -> np.ndarray:
    """Bit i set when MESH_DIMS[i]'s stride can matter: its degree is above 1, or, for dp, cp or ep
    is (the data-parallel group spans dp x cp ranks and hosts the experts, so its stride is read)."""
    active = {d: rows[d] > 1 for d in MESH_DIMS}
    active["dp"] = active["dp"] | active["cp"] | (rows["ep"] > 1)
    return sum(active[d].astype(np.int64) << i for i, d in enumerate(MESH_DIMS))


def mesh_strides(rows: Rows, order_index: np.ndarray) -> dict[str, np.ndarray]:
    """Stride of each mesh dimension for each row under MESH_ORDERS[order_index]."""
    pos = _ORDER_POSITIONS[order_index]                        # (N, 4): position of each dim
    deg = np.stack([rows[d] for d in MESH_DIMS], axis=1)       # (N, 4)
    out = {}
    for k, dim in enumerate(MESH_DIMS):
        inner = pos > pos[:, [k]]
        out[f"{dim}_stride"] = np.prod(np.where(inner, deg, 1), axis=1)
    return out


# ---- pipeline stages ----------------------------------------------------------------------------
def stage_layers_for(model: ModelSpec, pp: np.ndarray, vpp: np.ndarray) -> np.ndarray:
    """Layers per pipeline stage, (N, max pp) zero-padded. The one place the enumerator chooses a
    partition (an even split for now; a balanced partitioner can replace this function)."""
    width = int(pp.max()) if len(pp) else 1
    table = np.zeros((width + 1, width), dtype=np.int64)
    for p in np.flatnonzero(np.bincount(pp, minlength=1)):
        if p <= model.num_layers:
            table[p, :p] = even_stage_layers(model.num_layers, int(p))
    return table[pp]


# ---- row tables ---------------------------------------------------------------------------------
def divisors(n: int) -> np.ndarray:
    small = np.arange(1, int(np.sqrt(n)) + 1)
    small = small[n % small == 0]
    return np.unique(np.concatenate([small, n // small]))


def _options(pinned, default: np.ndarray) -> np.ndarray:
    return np.asarray([pinned] if pinned is not None else default, dtype=np.int64)


def _take(rows: Rows, index) -> Rows:
    return {k: v[index] for k, v in rows.items()}


def _cross(rows: Rows, options: Rows) -> Rows:
    """Every row with every option (options: parallel arrays of equal length)."""
    n = len(next(iter(rows.values())))
    k = len(next(iter(options.values())))
    out = {name: np.repeat(col, k) for name, col in rows.items()}
    out.update({name: np.tile(np.asarray(vals, dtype=np.int64), n) for name, vals in options.items()})
    return out


def _count(rows: Rows) -> int:
    return len(next(iter(rows.values())))


def _concat(parts: list[Rows], like: Rows) -> Rows:
    if not parts:
        return {k: v[:0] for k, v in like.items()}
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


_DEFAULTS = {"ep": 1, "mbs": 1, "vpp": 1, "schedule": ONE_F_ONE_B, "sp": 0, "recompute": 0,
             "zero": 0, "offload": 0, "mesh": DEFAULT_ORDER_INDEX, "cp_comm": 0}


def to_batch(model: ModelSpec, job: TrainingJob, rows: Rows) -> StrategyBatch:
    """The cost model's input for these rows (mesh_order left empty: strides carry it)."""
    n = _count(rows)
    col = {k: rows[k] if k in rows else np.full(n, v, dtype=np.int64) for k, v in _DEFAULTS.items()}
    m = rows["m"] if "m" in rows else np.maximum(job.global_batch_size // np.maximum(rows["dp"], 1), 1)
    return StrategyBatch(
        dp=rows["dp"], tp=rows["tp"], pp=rows["pp"], cp=rows["cp"], ep=col["ep"],
        sequence_parallel=col["sp"].astype(bool), virtual_pipeline_stages=col["vpp"],
        micro_batch_size=col["mbs"], num_micro_batches=m, zero_stage=col["zero"],
        recompute=col["recompute"], recompute_layers=np.full((n, int(rows["pp"].max()) if n else 1), -1, dtype=np.int64),
        pipeline_schedule=col["schedule"], offload_optimizer=col["offload"].astype(bool),
        stage_layers=stage_layers_for(model, rows["pp"], col["vpp"]),
        cp_comm=col["cp_comm"],
        **mesh_strides(rows, col["mesh"]),
    )


def finalist_batch(model: ModelSpec, job: TrainingJob, rows: Rows) -> StrategyBatch:
    """Like to_batch, with each candidate's mesh order filled in (for Strategy objects)."""
    batch = to_batch(model, job, rows)
    return replace(batch, mesh_order=tuple(MESH_ORDERS[int(i)] for i in rows["mesh"]))


def _apply_rules(model: ModelSpec, cluster: Cluster, job: TrainingJob, rows: Rows, pruned: Counter) -> Rows:
    """Keep the legal rows; count each illegal one under the first rule that rejects it. Rows are
    checked one pipeline depth at a time so the stage arrays stay narrow."""
    alive = np.zeros(_count(rows), dtype=bool)
    for idx in chunks_by_pp(rows):
        ok = np.ones(len(idx), dtype=bool)
        for name, mask in illegal_masks(model, cluster, job, to_batch(model, job, _take(rows, idx))).items():
            hit = mask & ok
            if hit.any():
                pruned[name] += int(hit.sum())
            ok &= ~mask
        alive[idx] = ok
    return _take(rows, alive)


# ---- the space ----------------------------------------------------------------------------------
def tp_inside_fast_group(hw: HardwareProfile, tp: np.ndarray, tp_stride: np.ndarray) -> np.ndarray:
    """True where every TP group stays inside one fast group (an HCCS group on mesh-groups nodes):
    the slowest tier it spans is the first, and its aligned blocks tile the fast group."""
    span = tp * tp_stride
    return (tp == 1) | ((slowest_tier(hw, tp, tp_stride) == 0) & (hw.node.group_size % span == 0))


def _keeps_tp_in_group(hw: HardwareProfile, pins: Pins) -> bool:
    """Ascend-style nodes: a searched TP group never spans two HCCS groups (slow PCIe between them)."""
    return hw.node.group_size < hw.node.devices_per_node and pins.tp is None


def degree_rows(model: ModelSpec, hw: HardwareProfile, cluster: Cluster, job: TrainingJob, pins: Pins,
                pruned: Counter) -> Rows:
    """Legal (dp, tp, pp, cp, ep) combinations."""
    n = cluster.devices
    divs = divisors(n)
    tp, pp, cp = (a.ravel() for a in np.meshgrid(_options(pins.tp, divs), _options(pins.pp, divs),
                                                  _options(pins.cp, divs), indexing="ij"))
    fits = n % (tp * pp * cp) == 0
    tp, pp, cp = tp[fits], pp[fits], cp[fits]
    rows = {"dp": n // (tp * pp * cp), "tp": tp, "pp": pp, "cp": cp}
    if pins.dp is not None:
        rows = _take(rows, rows["dp"] == pins.dp)
    experts = divisors(model.moe.num_experts) if model.moe is not None else np.array([1])
    rows = _cross(rows, {"ep": _options(pins.ep, experts)})
    # Deeper pipelines than layers break the "stage layers" rule; counted here without building
    # their (rows x pp) stage arrays.
    deep = rows["pp"] > model.num_layers
    if deep.any():
        pruned["stage layers"] += int(deep.sum())
        rows = _take(rows, ~deep)
    if _keeps_tp_in_group(hw, pins):
        split = ~tp_inside_fast_group(hw, rows["tp"], np.ones_like(rows["tp"]))
        if split.any():
            pruned[HCCS_REASON] += int(split.sum())
            rows = _take(rows, ~split)
    return _apply_rules(model, cluster, job, rows, pruned)


def _expand_micro_batches(rows: Rows, job: TrainingJob, pins: Pins) -> Rows:
    """Micro-batch sizes dividing each replica's share of the global batch (a pinned size is kept
    as given; the "global batch" rule judges it)."""
    out = _cross(rows, {"mbs": _options(pins.micro_batch_size, divisors(job.global_batch_size))})
    if pins.micro_batch_size is None:
        out = _take(out, (job.global_batch_size // out["dp"]) % out["mbs"] == 0)
    out["m"] = np.maximum(job.global_batch_size // (out["dp"] * out["mbs"]), 1)
    return out


def _expand_pipeline(rows: Rows, model: ModelSpec, pins: Pins, dedup: Counter) -> Rows:
    """(schedule, virtual stages): with pp = 1 only 1F1B (every schedule is the same there);
    interleaving with each virtual-stage count dividing the layers per stage."""
    single = rows["pp"] == 1
    wanted_schedules = [pins.pipeline_schedule] if pins.pipeline_schedule else list(SCHEDULES)
    flat = _take(rows, single)
    if _count(flat):
        if pins.pipeline_schedule is None:
            dedup["pipeline schedule with pp = 1"] += _count(flat)   # GPipe, identical to 1F1B here
        sched = SCHEDULES.index(pins.pipeline_schedule) if pins.pipeline_schedule else ONE_F_ONE_B
        flat = _cross(flat, {"schedule": [sched], "vpp": [_pin_or(pins.virtual_pipeline_stages, 1)]})
    deep = _take(rows, ~single)
    parts = [flat]
    if _count(deep):
        plain = [SCHEDULES.index(s) for s in wanted_schedules if s != "interleaved-1f1b"]
        if plain and pins.virtual_pipeline_stages in (None, 1):
            parts.append(_cross(deep, {"schedule": plain, "vpp": [1] * len(plain)}))
        if "interleaved-1f1b" in wanted_schedules:
            vs = _options(pins.virtual_pipeline_stages, divisors(model.num_layers)[1:])
            inter = _cross(deep, {"vpp": vs})
            per_stage = np.maximum(model.num_layers // inter["pp"], 1)
            inter = _take(inter, (per_stage % inter["vpp"] == 0) | (pins.virtual_pipeline_stages is not None))
            inter["schedule"] = np.full(_count(inter), INTERLEAVED, dtype=np.int64)
            parts.append(inter)
    return _concat([p for p in parts if _count(p)], {**rows, "schedule": rows["pp"], "vpp": rows["pp"]})


def _pin_or(value, default):
    return default if value is None else value


def _expand_sequence_parallel(rows: Rows, pins: Pins, dedup: Counter) -> Rows:
    options = [0, 1] if pins.sequence_parallel is None else [int(pins.sequence_parallel)]
    out = _cross(rows, {"sp": options})
    redundant = (out["tp"] == 1) & (out["sp"] == 1) & (pins.sequence_parallel is None)
    if redundant.any():
        dedup["sequence parallelism with tp = 1"] += int(redundant.sum())
    return _take(out, ~redundant)


def skeleton_rows(model: ModelSpec, hw: HardwareProfile, cluster: Cluster, job: TrainingJob, pins: Pins,
                  pruned: Counter, dedup: Counter) -> Rows:
    """Legal candidates without their ZeRO/offload choice and mesh order. Column "family" numbers
    the skeletons that differ only in sequence parallelism and recomputation (see family_bounds)."""
    rows = degree_rows(model, hw, cluster, job, pins, pruned)
    rows = _expand_pipeline(rows, model, pins, dedup)
    rows = _expand_micro_batches(rows, job, pins)
    rows["family"] = np.arange(_count(rows))
    rows = _expand_sequence_parallel(rows, pins, dedup)
    recompute = [RECOMPUTE.index(pins.recompute)] if pins.recompute else list(range(len(RECOMPUTE)))
    rows = _cross(rows, {"recompute": recompute})
    return _apply_rules(model, cluster, job, rows, pruned)


def zero_offload_options(pins: Pins) -> list[tuple[int, int]]:
    """(ZeRO stage, offload) pairs allowed by the pins; offload needs ZeRO >= 1 (rule "offload needs zero")."""
    zeros = [pins.zero_stage] if pins.zero_stage is not None else list(ZERO_STAGES)
    offloads = [int(pins.offload_optimizer)] if pins.offload_optimizer is not None else [0, 1]
    return [(z, o) for z in zeros for o in offloads if not (o and z == 0)]


def _lone_options(options: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Without data parallelism (dp x cp = 1) a ZeRO stage shards nothing: the lowest allowed stage
    stands for all of them (with and without offload)."""
    lowest: dict[int, int] = {}
    for z, o in options:
        lowest[o] = min(z, lowest.get(o, z))
    return [(z, o) for o, z in sorted(lowest.items())]


def zero_variants(rows: Rows, options: list[tuple[int, int]]) -> Rows:
    """Each row with each ZeRO/offload pair it can use."""
    out = _cross(rows, {"zero": [z for z, _ in options], "offload": [o for _, o in options]})
    lone = _lone_options(options)
    keep = (out["dp"] * out["cp"] > 1) | np.isin(out["zero"] * 2 + out["offload"], [z * 2 + o for z, o in lone])
    return _take(out, keep)


def cp_comm_options(model: ModelSpec, rows: Rows, pins: Pins) -> np.ndarray:
    """(rows, 2) bool: whether each row can use ring (p2p) and Ulysses (a2a) context parallelism.
    Without context parallelism only p2p is generated (the choice changes nothing)."""
    split = rows["tp"] * rows["cp"]
    a2a = (rows["cp"] > 1) & (model.num_attention_heads % split == 0) & (model.num_kv_heads % split == 0)
    p2p = np.ones_like(a2a)
    if pins.cp_comm is not None:
        a2a &= pins.cp_comm == "a2a"
        p2p &= (pins.cp_comm == "p2p") | (rows["cp"] == 1)
    return np.stack([p2p, a2a], axis=1)


def order_variants(rows: Rows, hw: HardwareProfile, pins: Pins) -> Rows:
    """Each row with each mesh order that gives distinct strides and, on HCCS nodes, keeps TP in one
    group (unless TP is pinned)."""
    out = _cross(rows, {"mesh": np.arange(len(MESH_ORDERS))})
    keep = _IS_REPRESENTATIVE[_active_code(out), out["mesh"]]
    if _keeps_tp_in_group(hw, pins):
        keep &= tp_inside_fast_group(hw, out["tp"], mesh_strides(out, out["mesh"])["tp_stride"])
    return _take(out, keep)


def mesh_variants(rows: Rows, hw: HardwareProfile, pins: Pins, model: ModelSpec) -> Rows:
    """order_variants, each with each context-parallel communication it can use."""
    out = _cross(order_variants(rows, hw, pins), {"cp_comm": [0, 1]})
    allowed = cp_comm_options(model, out, pins)
    return _take(out, allowed[np.arange(_count(out)), out["cp_comm"]])


def mesh_counts(skel: Rows, hw: HardwareProfile, pins: Pins, options, pruned: Counter, dedup: Counter,
                model: ModelSpec) -> np.ndarray:
    """How many (mesh order, context-parallel communication) variants each skeleton keeps (they depend
    on the degrees only, so the orders are worked out once per (tp, pp, cp, ep)); counts, in complete
    candidates, the de-duplications and HCCS prunes of crossing the skeletons with their ZeRO/offload
    pairs and mesh orders."""
    n = _count(skel)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    base = int(max(skel["tp"].max(), skel["pp"].max(), skel["cp"].max(), skel["ep"].max())) + 1
    key = ((skel["tp"] * base + skel["pp"]) * base + skel["cp"]) * base + skel["ep"]
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    tagged = {d: skel[d][first] for d in (*MESH_DIMS, "ep")}
    tagged["row"] = np.arange(len(first))
    kept = order_variants(tagged, hw, pins)
    orders = np.bincount(kept["row"], minlength=len(first))[inverse]
    kinds = cp_comm_options(model, skel, pins).sum(axis=1)
    reps = _IS_REPRESENTATIVE.sum(axis=1)[_active_code(skel)]
    zeros = np.where(skel["dp"] * skel["cp"] == 1, len(_lone_options(options)), len(options))
    _add(dedup, "ZeRO stage without data parallelism", int(((len(options) - zeros) * orders * kinds).sum()))
    _add(dedup, "mesh orders with identical strides", int((zeros * (len(MESH_ORDERS) - reps)).sum()))
    _add(pruned, HCCS_REASON, int((zeros * (reps - orders)).sum()))
    return orders * kinds


def _add(counter: Counter, key: str, value: int) -> None:
    if value:
        counter[key] += value


# ---- bounds -------------------------------------------------------------------------------------
UNBOUNDED_GBPS = 1e12


def _free_host(hw: HardwareProfile) -> dict:
    host = replace(hw.host, pcie_bandwidth_gbps=UNBOUNDED_GBPS, memory_bandwidth_gbps=UNBOUNDED_GBPS)
    return {"host": host, "device": replace(hw.device, launch_overhead_us=0.0)}


def free_hardware(hw: HardwareProfile) -> HardwareProfile:
    """The profile with free communication (unbounded bandwidth, zero latency), host transfers and
    kernel launches; memory sizes unchanged. Every ZeRO stage, offload choice and mesh order of a
    candidate runs at least this long on `hw`."""
    def free(link):
        return None if link is None else replace(link, bandwidth_gbps=UNBOUNDED_GBPS, latency_us=0.0, efficiency=1.0)

    node = replace(hw.node, intra=free(hw.node.intra), cross=free(hw.node.cross))
    return replace(hw, node=node, inter=free(hw.inter), **_free_host(hw))


def fastest_link_hardware(hw: HardwareProfile, devices: int, moe: bool) -> HardwareProfile:
    """A profile on which no candidate runs slower than on `hw` under any mesh order (its ZeRO stage
    and offload choice kept).

    Every tier becomes one link at the fastest tier's effective bandwidth with zero latency, and one
    "node" holds the whole cluster, so a collective's bandwidth term telescopes to the flat ring's
    (1 - 1/n) S / B for every placement (the hierarchical and flat forms in advisor.cost.comm both
    cost at least that on the real tiers). An all-to-all's tiers run concurrently in the cost model,
    so its time is at least the largest of its per-tier shares, which sum to (n - 1)/n: MoE models
    get the tier count times the bandwidth to keep the bound. Host transfers and kernel launches are
    free; memory sizes are unchanged (host-memory fit must be judged with the real node size)."""
    tiers = [hw.node.intra, hw.inter] + ([hw.node.cross] if hw.node.cross is not None else [])
    fastest = max(t.effective_bandwidth_bytes_per_s for t in tiers) / 1e9
    link = replace(hw.node.intra, bandwidth_gbps=fastest * (len(tiers) if moe else 1), latency_us=0.0, efficiency=1.0)
    node = replace(hw.node, devices_per_node=devices, group_size=devices, intra=link, cross=link)
    return replace(hw, node=node, inter=link, **_free_host(hw))


def leanest_options(options: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The ZeRO/offload pairs that can need the least device memory: memory does not grow with the
    stage up to 2 and offload only removes optimizer states; stage 3 trades sharded weights for a
    gather buffer, so stages 2 and 3 are both kept. The first also has the least optimizer time."""
    best_off = {z: max(o for zz, o in options if zz == z) for z, _ in options}
    stages = sorted(best_off, reverse=True)
    chosen = [z for z in stages if z >= 2] or stages[:1]
    return [(z, best_off[z]) for z in chosen]


def _with_lean_memory(rows: Rows, options: list[tuple[int, int]], pair: tuple[int, int]) -> Rows:
    """The rows with a ZeRO/offload pair (rows without data parallelism get their own lone pair)."""
    lone = _lone_options(options)[-1]
    solo = rows["dp"] * rows["cp"] == 1
    return {**rows, "zero": np.where(solo, lone[0], pair[0]), "offload": np.where(solo, lone[1], pair[1])}


def bound_skeletons(model: ModelSpec, hw: HardwareProfile, cluster: Cluster, job: TrainingJob, rows: Rows,
                    options: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    """(lower bound on step time, may fit) per skeleton, over all its ZeRO/offload/mesh variants:
    priced on free_hardware with the leanest ZeRO/offload pair; "may fit" is false only when no
    pair can fit in device memory."""
    free = free_hardware(hw)
    n = _count(rows)
    lower = np.full(n, np.inf)
    may_fit = np.zeros(n, dtype=bool)
    capacity = hw.device.memory_gib * GIB
    lean = leanest_options(options)
    for idx in chunks_by_pp(rows):
        part = _take(rows, idx)
        e = estimate_batch(model, free, cluster, job, to_batch(model, job, _with_lean_memory(part, options, lean[0])))
        fits = e.fits.copy()
        for pair in lean[1:]:
            todo = ~fits & (part["dp"] * part["cp"] > 1)
            if todo.any():
                other = _take(_with_lean_memory(part, options, pair), todo)
                fits[todo] = memory(model, job, to_batch(model, job, other)).total <= capacity
        lower[idx] = e.step_time_s
        may_fit[idx] = fits
    return lower, may_fit


def family_bounds(model: ModelSpec, hw: HardwareProfile, cluster: Cluster, job: TrainingJob, rows: Rows,
                  options: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    """(first row, lower bound on step time) per family of skeletons (rows that differ only in
    sequence parallelism and recomputation), over all its members and their variants. On
    free_hardware a family's fastest member is the one with sequence parallelism (it only shrinks
    the memory-bound kernels' traffic once communication is free) and the least recomputation
    (recomputation only adds work): that member is priced with the leanest ZeRO/offload pair."""
    family = rows["family"]
    n = _count(rows)
    starts = np.flatnonzero(np.r_[True, family[1:] != family[:-1]]) if n else np.zeros(0, dtype=np.int64)
    # Within a family, the fastest member first: least recomputation, then sequence parallelism on.
    order = np.lexsort((-rows["sp"], rows["recompute"], family))
    fastest = order[np.flatnonzero(np.r_[True, family[order][1:] != family[order][:-1]])] if n else starts
    lower = np.zeros(len(starts))
    reps = _with_lean_memory(_take(rows, fastest), options, leanest_options(options)[0])
    free = free_hardware(hw)
    for idx in chunks_by_pp(reps):
        lower[idx] = estimate_batch(model, free, cluster, job, to_batch(model, job, _take(reps, idx))).step_time_s
    return starts, lower


def chunks_by_pp(rows: Rows, cells: int = PRICE_CELLS):
    """Index arrays of rows of one pp value, at most `cells` candidates x stages each."""
    pp = rows["pp"]
    for p in np.flatnonzero(np.bincount(pp)) if len(pp) else ():
        idx = np.flatnonzero(pp == p)
        step = max(cells // int(p), 1)
        for start in range(0, len(idx), step):
            yield idx[start:start + step]


# ---- the search ---------------------------------------------------------------------------------
def _space(model, hw, cluster, job, pins: Pins, pruned: Counter, dedup: Counter):
    """(skeletons with their mesh-order counts, complete candidates per skeleton, ZeRO/offload pairs)."""
    options = zero_offload_options(pins)
    skel = skeleton_rows(model, hw, cluster, job, pins, pruned, dedup)
    skel["meshes"] = mesh_counts(skel, hw, pins, options, pruned, dedup, model)
    variants = np.where(skel["dp"] * skel["cp"] == 1, len(_lone_options(options)), len(options)) * skel["meshes"]
    return skel, variants, options


def search(model: ModelSpec, hw: HardwareProfile, cluster: Cluster, job: TrainingJob, pins: Pins = Pins(),
           top_k: int = 5, progress: Progress = None) -> SearchOutcome:
    """Every legal candidate, scored or bounded; returns the feasible ones that could place in the top K.

    Bounds nest: a family of skeletons (family_bounds), then each skeleton (bound_skeletons), then
    each ZeRO/offload pair (_Scoring), then every mesh order exactly. Families are taken in order of
    their bound until it cannot reach the K-th best throughput found."""
    start = time.perf_counter()
    pruned: Counter = Counter()
    dedup: Counter = Counter()
    skel, variants, options = _space(model, hw, cluster, job, pins, pruned, dedup)
    starts, lower = family_bounds(model, hw, cluster, job, skel, options)
    ends = np.r_[starts[1:], _count(skel)].astype(np.int64)
    family_variants = np.add.reduceat(variants, starts) if len(starts) else np.zeros(0, dtype=np.int64)
    family_cells = np.add.reduceat(skel["pp"], starts) if len(starts) else np.zeros(0, dtype=np.int64)
    scoring = _Scoring(model, hw, cluster, job, pins, options, top_k, pruned)
    scoring.bounded += len(starts)
    done = [0]

    def expand(families: np.ndarray) -> None:
        members = _ranges(starts[families], ends[families])
        scoring.bounded += len(members)
        scoring.score_skeletons(_take(skel, members), variants[members])
        done[0] += len(families)
        if progress:
            progress(done[0], len(starts))

    scoring.best_first(job.tokens_per_step / lower, family_cells, family_variants, expand, FAMILY_BATCH_CELLS)
    if progress:
        progress(len(starts), len(starts))
    stats = SearchStats(
        searcher="enumerate", candidates=int(variants.sum()), scored=scoring.scored, feasible=scoring.scored,
        seconds=time.perf_counter() - start, pruned=dict(pruned), deduplicated=dict(dedup),
        bound_evaluations=scoring.bounded,
    )
    return SearchOutcome(finalist_batch(model, job, scoring.finalists()), stats)


def space_size(model: ModelSpec, hw: HardwareProfile, cluster: Cluster, job: TrainingJob, pins: Pins = Pins()) -> SearchStats:
    """The legal space's size and the pruning/de-duplication counts, without scoring anything."""
    start = time.perf_counter()
    pruned: Counter = Counter()
    dedup: Counter = Counter()
    _, variants, _ = _space(model, hw, cluster, job, pins, pruned, dedup)
    return SearchStats(searcher="enumerate", candidates=int(variants.sum()), scored=0, feasible=0,
                       seconds=time.perf_counter() - start, pruned=dict(pruned), deduplicated=dict(dedup))


def top_distinct(values: np.ndarray, k: int) -> np.ndarray:
    """The k largest values, counting values within a relative 1e-9 of each other once."""
    ordered = np.sort(values)[::-1]
    if len(ordered) == 0:
        return ordered
    fresh = np.ones(len(ordered), dtype=bool)
    fresh[1:] = ordered[1:] < ordered[:-1] * (1.0 - 1e-9)
    return ordered[fresh][:k]


def _ranges(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Concatenated np.arange(start, end) for each pair."""
    lengths = ends - starts
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    shift = np.repeat(starts - np.cumsum(np.r_[0, lengths[:-1]]), lengths)
    return shift + np.arange(total)


def _chunk_end(order: np.ndarray, pos: int, cells_per_row: np.ndarray, budget: int) -> int:
    cells = np.cumsum(cells_per_row[order[pos:]])
    return pos + max(int(np.searchsorted(cells, budget, side="right")), 1)


class _Scoring:
    """Scores chunks of skeletons: each ZeRO/offload pair is first priced on fastest_link_hardware
    (exact memory, a mesh-independent lower bound on time); the pairs that fit and can still reach
    the top K are priced exactly on the real hardware under each of their mesh orders. Keeps the K
    best throughputs (the bound's threshold) and every candidate that may still rank."""

    def __init__(self, model, hw, cluster, job, pins, options, top_k, pruned: Counter):
        self.args = (model, hw, cluster, job)
        self.fast = fastest_link_hardware(hw, cluster.devices, model.moe is not None)
        self.pins, self.options, self.k, self.pruned = pins, options, max(top_k, 1), pruned
        self.best = np.zeros(0)
        self.kept: list[tuple[Rows, np.ndarray]] = []
        self.scored = self.bounded = 0

    @property
    def limit(self) -> float:
        """Throughput a candidate needs to matter: within the tie band of the K-th best distinct
        throughput so far (the ranking drops candidates that duplicate a pick)."""
        return float(self.best[-1]) * (1.0 - TIE_BAND) if len(self.best) >= self.k else 0.0

    def best_first(self, upper: np.ndarray, cells: np.ndarray, variants: np.ndarray, process, budget: int) -> None:
        """Call process(indices) on batches of items in order of their throughput bound `upper`,
        while the bound can still reach the limit (which rises as candidates are scored); the
        first batch is small so that a limit exists early. `cells` sizes each item's work;
        `variants` counts the candidates an item stands for (for the pruning counts)."""
        order = np.argsort(-upper, kind="stable")
        pos, size = 0, FIRST_BATCH_CELLS
        while pos < len(order) and upper[order[pos]] >= self.limit:
            end = _chunk_end(order, pos, cells, size)
            reach = upper[order[pos:end]] >= self.limit
            _add(self.pruned, TIME_BOUND_REASON, int(variants[order[pos:end][~reach]].sum()))
            process(order[pos:end][reach])
            pos, size = end, (budget if self.limit > 0 else FIRST_BATCH_CELLS)
        _add(self.pruned, TIME_BOUND_REASON, int(variants[order[pos:]].sum()))

    def score_skeletons(self, skeletons: Rows, variants: np.ndarray) -> None:
        """Bound each skeleton, then its ZeRO/offload pairs, then price the survivors exactly."""
        if _count(skeletons) == 0:
            return
        model, hw, cluster, job = self.args
        lower, may_fit = bound_skeletons(model, hw, cluster, job, skeletons, self.options)
        _add(self.pruned, DEVICE_MEMORY_REASON, int(variants[~may_fit].sum()))
        fits = _take(skeletons, may_fit)
        pairs_each = np.where(fits["dp"] * fits["cp"] == 1, len(_lone_options(self.options)), len(self.options))
        self.best_first(job.tokens_per_step / lower[may_fit], fits["pp"] * pairs_each, variants[may_fit],
                        lambda idx: self.score(_take(fits, idx)), SKELETON_BATCH_CELLS)

    def score(self, skeletons: Rows) -> None:
        """Bound the ZeRO/offload pairs, then price their mesh orders exactly, best bound first."""
        if _count(skeletons) == 0:
            return
        pairs, upper = self._bound_pairs(zero_variants(skeletons, self.options))
        self.best_first(upper, pairs["meshes"] * pairs["pp"], pairs["meshes"],
                        lambda idx: self._exact(_take(pairs, idx)), PAIR_BATCH_CELLS)

    def _exact(self, pairs: Rows) -> None:
        model, hw, cluster, job = self.args
        rows = mesh_variants(pairs, hw, self.pins, model)
        for idx in chunks_by_pp(rows):
            part = _take(rows, idx)
            e = estimate_batch(model, hw, cluster, job, to_batch(model, job, part))
            self.scored += len(idx)
            ok = e.feasible   # all of them while memory does not depend on links or placement
            _add(self.pruned, DEVICE_MEMORY_REASON, int((~ok).sum()))
            tps = e.tokens_per_s[ok]
            self.best = top_distinct(np.concatenate([self.best, tps]), self.k)
            self.kept.append((_take(part, ok), tps))

    def _bound_pairs(self, pairs: Rows) -> tuple[Rows, np.ndarray]:
        """The ZeRO/offload pairs that fit (device and host) and whose bound reaches the limit, with
        the bound as an upper limit on throughput."""
        model, hw, cluster, job = self.args
        upper = np.zeros(_count(pairs))
        keep = np.zeros(_count(pairs), dtype=bool)
        limit = self.limit
        for idx in chunks_by_pp(pairs):
            part = _take(pairs, idx)
            e = estimate_batch(model, self.fast, cluster, job, to_batch(model, job, part))
            self.bounded += len(idx)
            step = e.step_time_s
            a2a = cp_comm_options(model, part, self.pins)[:, 1]
            if a2a.any():   # the bound covers both context-parallel kinds: the faster of the two
                rows = _take(part, a2a)
                rows = {**rows, "cp_comm": np.ones(_count(rows), dtype=np.int64)}
                ulysses = estimate_batch(model, self.fast, cluster, job, to_batch(model, job, rows))
                step = step.copy()
                step[a2a] = np.minimum(step[a2a], ulysses.step_time_s)
            host = e.memory.host_optimizer * hw.node.devices_per_node <= hw.host.memory_gib * GIB
            upper[idx] = job.tokens_per_step / step
            reach = upper[idx] >= limit
            meshes = part["meshes"]
            _add(self.pruned, DEVICE_MEMORY_REASON, int(meshes[~e.fits].sum()))
            _add(self.pruned, HOST_MEMORY_REASON, int(meshes[e.fits & ~host].sum()))
            _add(self.pruned, TIME_BOUND_REASON, int(meshes[e.fits & host & ~reach].sum()))
            keep[idx] = e.fits & host & reach
        return _take(pairs, keep), upper[keep]

    def finalists(self) -> Rows:
        """Scored candidates within the tie band of the K-th best (all, when fewer than K)."""
        if not self.kept:
            return {k: np.zeros(0, dtype=np.int64) for k in ("dp", "tp", "pp", "cp", "m", *_DEFAULTS)}
        rows = _concat([r for r, _ in self.kept], self.kept[0][0])
        tps = np.concatenate([t for _, t in self.kept])
        return _take(rows, tps >= float(self.best[-1]) * (1.0 - TIE_BAND))
