"""Placement: which nodes and fast groups each collective group occupies, from the mesh layout.

Ranks. The mesh coordinates (i_pp, i_dp, i_cp, i_tp) of a device give its global rank
``r = sum_d i_d * stride_d`` (advisor.space.strategy: the last dim of ``mesh_order`` gets consecutive
ranks). Ranks fill nodes in order: node(r) = r // devices_per_node and fast group(r) = r // group_size
(the whole node on switch topologies, one HCCS group on Ascend ``mesh-groups`` nodes). The last node
may be partial.

Groups. A group kind is a list of mixed-radix *factors* (degree, stride): the coordinate of rank r in
a factor is (r // stride) % degree, and the group holding r is {r - own offset + sum_k j_k * stride_k}.
"tp", "cp", "dp", "pp" are one mesh dim each; "dp_cp" (the ZeRO/FSDP data-parallel group) is dp x cp,
whose members are not evenly strided when tp or pp sits between dp and cp in the order. Expert groups
follow Megatron-Core's parallel_state.RankGenerator order "tp-cp-ep-dp-pp": the dp x cp ranks of one
(tp, pp) position are numbered by q, running over the inner of {dp, cp} (smaller stride) first; the
"ep" group is a block of ep consecutive q, the "edp" (expert data parallel) group the ranks with equal
q mod ep. That splits a dim into a finer radix, e.g. ep = 4 over cp = 2 (inner, stride s_c) and
dp = 8 (stride s_d): ep = [(2, s_c), (2, s_d)], edp = [(4, 2 s_d)]. With MoE parallel folding
(Strategy.fold_experts: the experts' own tp is 1, order "tp-ep-dp-pp") q runs over tp x cp x dp, tp too.

What is priced. All groups of a kind run their collective in lock step and the step waits for the
slowest, so each kind is described by its worst group: the one spanning the most nodes (ties: the
most fast groups). ``GroupPlacement`` holds its members n, nodes and fast groups; per_node = n / nodes
(c1) and per_fast_group = n / fast_groups (c0) are exact integers in aligned layouts, where every
group of a kind is placed alike.

Aligned closed form. A block of U consecutive ranks (U = devices_per_node or group_size) is a box of
the mixed radix (factors sorted by stride) when U >= devices, or when the factor j with
s_j <= U < s_j n_j has U % s_j == 0 and n_j % (U // s_j) == 0 (and U divides the devices). Then a
group has prod_k clip(U // s_k, 1, n_k) members in each block it touches. Other rows (e.g. tp = 3 on
8-device nodes: {6, 7, 8} straddles two nodes while {0, 1, 2} does not) are counted exactly over
all ranks, once per distinct layout (cached). Point-to-point pairs (pipeline stages i -> i+1, with
pp-1 -> 0 for interleaved schedules; the cp ring) get the slowest tier any pair crosses:
0 inside one fast group, 1 inside one node, 2 across nodes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from advisor.cost.per_batch import cached, per_batch
from advisor.space.strategy import MESH_DIMS, StrategyBatch
from advisor.specs.hardware import HardwareProfile

KINDS = ("tp", "cp", "dp", "pp", "dp_cp", "ep", "edp")
TIER_FAST_GROUP, TIER_NODE, TIER_ACROSS_NODES = 0, 1, 2


@dataclass(frozen=True)
class GroupPlacement:
    """The worst group of one kind per candidate (int arrays): members, nodes, fast groups spanned."""

    n: np.ndarray
    nodes: np.ndarray
    fast_groups: np.ndarray
    # what its collectives' times owe to the group and the links alone, kept as they are priced
    # (advisor.cost.comm.group_time_s)
    priced: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def per_node(self) -> np.ndarray:
        """c1: members per node (float; an integer in aligned layouts)."""
        return self.n / self.nodes

    @property
    def per_fast_group(self) -> np.ndarray:
        """c0: members per fast group (float; an integer in aligned layouts)."""
        return self.n / self.fast_groups

    c1 = per_node
    c0 = per_fast_group

    @property
    def g0(self) -> np.ndarray:
        """Fan-out inside a fast group."""
        return self.per_fast_group

    @property
    def g1(self) -> np.ndarray:
        """Fast groups per node."""
        return self.fast_groups / self.nodes

    @property
    def g2(self) -> np.ndarray:
        """Nodes (g0 * g1 * g2 = n)."""
        return self.nodes.astype(float)

    @property
    def fanouts(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.g0, self.g1, self.g2

    @property
    def slowest_tier(self) -> np.ndarray:
        return np.where(self.nodes > 1, TIER_ACROSS_NODES, np.where(self.fast_groups > 1, TIER_NODE, TIER_FAST_GROUP))


# ---- layout ---------------------------------------------------------------------------------------


@cached
def _layout(b: StrategyBatch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(degrees (N, 4), strides (N, 4), devices (N,)), columns in MESH_DIMS order."""
    deg = np.stack([np.asarray(getattr(b, d), dtype=np.int64) for d in MESH_DIMS], axis=1)
    stride = np.stack([np.asarray(getattr(b, f"{d}_stride"), dtype=np.int64) for d in MESH_DIMS], axis=1)
    return deg, np.maximum(stride, 1), deg.prod(axis=1)


def _whole_box(b: StrategyBatch, per_node: int, per_group: int) -> np.ndarray:
    """Whether every node and every fast group is a box of the whole mesh's radix (degrees and strides)."""
    def make():
        deg, stride, devices = _layout(b)
        return _is_box(deg, stride, devices, per_node) & _is_box(deg, stride, devices, per_group)
    return per_batch(b, ("box", per_node, per_group), make)


def _col(dim: str) -> int:
    return MESH_DIMS.index(dim)


EXPERT_DIMS = ("tp", "cp", "dp")     # the dims expert groups number their ranks over (tp only when folded)


def _expert_dims(deg, stride, fold):
    """(degrees (N, 3), strides (N, 3)) of the dims the expert groups run over, innermost (smallest stride) first:
    cp and dp, and tp where the experts are folded (its degree 1 elsewhere)."""
    n = np.stack([np.where(fold, deg[:, _col("tp")], 1), deg[:, _col("cp")], deg[:, _col("dp")]], axis=1)
    s = np.stack([stride[:, _col(d)] for d in EXPERT_DIMS], axis=1)
    order = np.argsort(np.where(n > 1, s, 0), axis=1, kind="stable")
    return np.take_along_axis(n, order, axis=1), np.take_along_axis(s, order, axis=1)


def _expert_factors(deg, stride, ep, fold):
    """ep factors (N, 3) x2, edp factors (N, 3) x2, and whether the split is an exact mixed radix.

    Megatron-Core numbers the ranks of one pipeline stage by q over the expert dims, innermost first
    (parallel_state.RankGenerator: "tp-cp-ep-dp-pp", experts "tp-ep-dp-pp" with their own tp, 1 when folded): the
    ep group is a block of ep consecutive q, taking whole inner dims and e values of the next one."""
    n, s = _expert_dims(deg, stride, fold)
    ep = np.maximum(np.asarray(ep, dtype=np.int64), 1)
    one = np.ones_like(n)
    inner = np.cumprod(np.concatenate([np.ones((n.shape[0], 1), dtype=np.int64), n[:, :-1]], axis=1), axis=1)
    # the dim j the block ends in: the first whose inner product times its degree reaches ep
    j = np.argmax(inner * n >= ep[:, None], axis=1)
    j = np.where((inner * n).max(axis=1) >= ep, j, n.shape[1] - 1)
    cols = np.arange(n.shape[1])[None, :]
    c_j = np.take_along_axis(inner, j[:, None], axis=1)[:, 0]
    n_j = np.take_along_axis(n, j[:, None], axis=1)[:, 0]
    e = np.maximum(ep // np.maximum(c_j, 1), 1)
    exact = (ep % c_j == 0) & (n_j % e == 0)
    before, at = cols < j[:, None], cols == j[:, None]
    ep_n = np.where(before, n, np.where(at, e[:, None], one))
    ep_s = np.where(before | at, s, one)
    edp_n = np.where(at, (n_j // e)[:, None], np.where(before, one, n))
    edp_s = np.where(at, (e[:, None] * s), np.where(before, one, s))
    return (ep_n, ep_s), (edp_n, edp_s), exact


def group_factors(b: StrategyBatch, kind: str):
    """(degrees (N, k), strides (N, k), exact (N,) bool): the kind's mixed-radix factors.

    Where ``exact`` is False (an expert split that does not divide a dim evenly) the factors are
    meaningless and placement counts the groups rank by rank.
    """
    deg, stride, _ = _layout(b)
    return _factors(deg, stride, b.ep, kind, b.fold_experts)[:3]


def _factors(deg, stride, ep, kind, fold):
    """The kind's factors, exactness, and the full radix (kind's factors plus the rest) to test blocks on."""
    exact = np.ones(deg.shape[0], dtype=bool)
    if kind in MESH_DIMS:
        k = [_col(kind)]
    elif kind == "dp_cp":
        k = [_col("dp"), _col("cp")]
    elif kind in ("ep", "edp"):
        (ep_n, ep_s), (edp_n, edp_s), exact = _expert_factors(deg, stride, ep, fold)
        rest_n = np.stack([deg[:, _col("pp")], np.where(fold, 1, deg[:, _col("tp")])], axis=1)   # tp: its own dim
        rest_s = np.stack([stride[:, _col("pp")], stride[:, _col("tp")]], axis=1)                # unless folded
        rn = np.concatenate([ep_n, edp_n, rest_n], axis=1)
        rs = np.concatenate([ep_s, edp_s, rest_s], axis=1)
        fn, fs = (ep_n, ep_s) if kind == "ep" else (edp_n, edp_s)
        keep = exact[:, None]
        return np.where(keep, fn, 1), np.where(keep, fs, 1), exact, np.where(keep, rn, 1), np.where(keep, rs, 1)
    else:
        raise ValueError(f"unknown group kind {kind!r} (known: {', '.join(KINDS)})")
    return deg[:, k], stride[:, k], exact, deg, stride


def _is_box(rn, rs, devices, unit: int) -> np.ndarray:
    """Whether every block of `unit` consecutive ranks is a box of the mixed radix (rn, rs)."""
    cut = (rs <= unit) & (unit < rs * rn)   # the one factor (degree > 1) a block boundary falls in
    fits = cut & (unit % rs == 0) & (rn % np.maximum(unit // rs, 1) == 0)
    return (unit >= devices) | (fits.any(axis=1) & (devices % unit == 0))


def _in_block(fn, fs, unit: int) -> np.ndarray:
    return np.prod(np.clip(unit // fs, 1, fn), axis=1)


def _unique_layouts(deg, stride, extra):
    """Distinct (degrees, strides, extra) rows; a degree-1 dim's stride is irrelevant and set to 1."""
    keys = np.concatenate([deg, np.where(deg > 1, stride, 1), extra[:, None]], axis=1)
    uniq, inv = np.unique(keys, axis=0, return_inverse=True)
    return uniq, inv.reshape(-1)


# ---- exact counts (misaligned rows) ---------------------------------------------------------------
def _coords(layout: tuple[int, ...]):
    deg, stride = dict(zip(MESH_DIMS, layout[:4])), dict(zip(MESH_DIMS, layout[4:8]))
    r = np.arange(int(np.prod(list(deg.values()))), dtype=np.int64)
    return r, deg, stride, {d: (r // stride[d]) % deg[d] for d in MESH_DIMS}


@lru_cache(maxsize=1 << 14)
def _exact_group(kind: str, layout: tuple[int, ...], ep: int, per_node: int, per_group: int,
                 fold: bool = False) -> tuple[int, int, int]:
    """(n, nodes, fast groups) of the worst group of `kind`, by listing every rank."""
    r, deg, stride, c = _coords(layout)
    d = r.size
    if kind in MESH_DIMS:
        label = r - c[kind] * stride[kind]
    elif kind == "dp_cp":
        label = r - c["dp"] * stride["dp"] - c["cp"] * stride["cp"]
    else:
        dims = sorted((x for x in EXPERT_DIMS if (fold or x != "tp") and deg[x] > 1), key=lambda x: stride[x])
        base = r - sum(c[x] * stride[x] for x in dims)
        q, radix = np.zeros_like(r), 1
        for x in dims:                    # q runs over the expert dims, innermost first (_expert_factors)
            q, radix = q + radix * c[x], radix * deg[x]
        label = base * d + (q // ep if kind == "ep" else q % ep)
    _, g = np.unique(label, return_inverse=True)
    g = g.reshape(-1)
    count = int(g.max()) + 1

    def spans(unit: int) -> np.ndarray:
        pairs = np.unique(g * d + r // unit)
        return np.bincount(pairs // d, minlength=count)

    nodes, groups = spans(per_node), spans(per_group)
    worst = np.lexsort((groups, nodes))[-1]
    return int(np.bincount(g).max()), int(nodes[worst]), int(groups[worst])


@lru_cache(maxsize=1 << 14)
def _exact_tier(dim: str, layout: tuple[int, ...], wrap: bool, per_node: int, per_group: int) -> int:
    """Slowest tier crossed by neighbours i -> i+1 of `dim` (and n-1 -> 0 when wrap), rank by rank."""
    r, deg, stride, c = _coords(layout)
    n, s = deg[dim], stride[dim]
    if n <= 1:
        return TIER_FAST_GROUP
    src = r[c[dim] < n - 1]
    dst = src + s
    if wrap:
        last = r[c[dim] == n - 1]
        src, dst = np.concatenate([src, last]), np.concatenate([dst, last - (n - 1) * s])
    tier = np.where(src // per_node != dst // per_node, TIER_ACROSS_NODES,
                    np.where(src // per_group != dst // per_group, TIER_NODE, TIER_FAST_GROUP))
    return int(tier.max())


# ---- public API -----------------------------------------------------------------------------------
def group_placement(hw: HardwareProfile, b: StrategyBatch, kind: str) -> GroupPlacement:
    """The worst group of `kind` ("tp", "cp", "dp", "pp", "dp_cp", "ep", "edp") for each candidate.

    "edp" where ep == 1 is the whole dp x cp group (the experts' data-parallel group).
    """
    per_node, per_group = hw.node.devices_per_node, hw.node.group_size
    deg, stride, devices = _layout(b)
    ep = np.maximum(np.asarray(b.ep, dtype=np.int64), 1)
    fold = np.asarray(b.fold_experts, dtype=bool)
    fn, fs, exact, rn, rs = _factors(deg, stride, ep, kind, fold)
    n = fn.prod(axis=1)
    # the mesh's own kinds test the whole radix (_factors returns the degrees and strides themselves)
    whole = kind not in ("ep", "edp")
    aligned = exact & (_whole_box(b, per_node, per_group) if whole else
                       _is_box(rn, rs, devices, per_node) & _is_box(rn, rs, devices, per_group))
    nodes, groups = n // _in_block(fn, fs, per_node), n // _in_block(fn, fs, per_group)
    bad = np.flatnonzero(~aligned)
    if bad.size:
        n, nodes, groups = n.copy(), nodes.copy(), groups.copy()
        extra = 2 * ep[bad] + fold[bad] if kind in ("ep", "edp") else np.ones_like(bad)
        uniq, inv = _unique_layouts(deg[bad], stride[bad], extra)
        found = np.array([_exact_group(kind, tuple(int(x) for x in u[:8]), int(u[8]) // 2, per_node, per_group,
                                       bool(int(u[8]) % 2)) for u in uniq], dtype=np.int64).reshape(-1, 3)
        n[bad], nodes[bad], groups[bad] = found[inv, 0], found[inv, 1], found[inv, 2]
    return GroupPlacement(n=n, nodes=nodes, fast_groups=groups)


def placements(hw: HardwareProfile, b: StrategyBatch, kinds: tuple[str, ...] = KINDS) -> dict[str, GroupPlacement]:
    """The given kinds at once; "ep" and "edp" are one-member groups where ep == 1 (no expert groups)."""
    moe = np.asarray(b.ep) > 1
    one = GroupPlacement(*(np.ones(len(b), dtype=np.int64),) * 3)
    out = {}
    for kind in kinds:
        if kind in ("ep", "edp") and not moe.any():
            out[kind] = one
            continue
        p = group_placement(hw, b, kind)
        out[kind] = GroupPlacement(*(np.where(moe, x, 1) for x in (p.n, p.nodes, p.fast_groups))) if kind in ("ep", "edp") else p
    return out


def _neighbour_tier(hw: HardwareProfile, b: StrategyBatch, dim: str, wrap) -> np.ndarray:
    per_node, per_group = hw.node.devices_per_node, hw.node.group_size
    deg, stride, devices = _layout(b)
    wrap = np.broadcast_to(np.asarray(wrap, dtype=bool), devices.shape)
    n, span = deg[:, _col(dim)], deg[:, _col(dim)] * stride[:, _col(dim)]
    # In box layouts some pair crosses a block boundary exactly when the dim does not fit in a block.
    tier = np.where(n <= 1, TIER_FAST_GROUP,
                    np.where(per_node < span, TIER_ACROSS_NODES, np.where(per_group < span, TIER_NODE, TIER_FAST_GROUP)))
    aligned = _whole_box(b, per_node, per_group)
    bad = np.flatnonzero(~aligned & (n > 1))
    if bad.size:
        tier = tier.copy()
        uniq, inv = _unique_layouts(deg[bad], stride[bad], wrap[bad].astype(np.int64))
        found = np.array([_exact_tier(dim, tuple(int(x) for x in u[:8]), bool(u[8]), per_node, per_group) for u in uniq],
                         dtype=np.int64)
        tier[bad] = found[inv]
    return tier


def pipeline_neighbour_tier(hw: HardwareProfile, b: StrategyBatch, wrap=False) -> np.ndarray:
    """Slowest tier (0/1/2) crossed by consecutive pipeline stages i -> i+1 at equal dp/cp/tp
    coordinates, and pp-1 -> 0 where `wrap` (bool array or scalar; interleaved schedules); 0 where pp == 1."""
    return _neighbour_tier(hw, b, "pp", wrap)


def cp_ring_tier(hw: HardwareProfile, b: StrategyBatch) -> np.ndarray:
    """Slowest tier (0/1/2) crossed by consecutive members of the context-parallel ring
    (i -> i+1 and cp-1 -> 0); 0 where cp == 1."""
    return _neighbour_tier(hw, b, "cp", True)
