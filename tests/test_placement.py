"""advisor.cost.placement against an explicit rank-by-rank reference written here independently."""

from __future__ import annotations

import copy
import itertools
from collections import defaultdict
from dataclasses import replace
from functools import lru_cache

import numpy as np
import pytest

from advisor.cost import placement as pl
from advisor.space.strategy import MESH_DIMS, Strategy, StrategyBatch
from advisor.specs.hardware import hardware_from_dict, load_hardware

ORDERS = list(itertools.permutations(MESH_DIMS))
HARDWARE = [(8, 8), (4, 4), (8, 4), (4, 2)]   # (devices_per_node, group_size)
DEVICES = (8, 12, 16, 24, 32)
NUM_LAYERS = 64
GROUP_KINDS = ("tp", "cp", "dp", "pp", "dp_cp", "ep", "edp")


@lru_cache(maxsize=None)
def hw_for(per_node: int, group: int):
    if per_node == group:
        raw = copy.deepcopy(load_hardware("dgx-a100-40g").raw)
        raw["node"]["devices_per_node"] = per_node
    else:
        raw = copy.deepcopy(load_hardware("ascend-910").raw)
        raw["node"]["devices_per_node"] = per_node
        raw["node"]["intra_node"]["group_size"] = group
    hw = hardware_from_dict(raw, f"test {per_node}/{group}")
    assert (hw.node.devices_per_node, hw.node.group_size) == (per_node, group)
    return hw


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def degree_combos(devices: int):
    for dp, tp, pp in itertools.product(divisors(devices), repeat=3):
        if devices % (dp * tp * pp) == 0:
            yield dp, tp, pp, devices // (dp * tp * pp)


# ---- the reference: every rank, every group, listed explicitly -------------------------------------
DENSE_KINDS = ("tp", "cp", "dp", "pp", "dp_cp")


def canonical(s: Strategy, kinds):
    """Degree-1 dims change no rank, so equal layouts share one reference computation."""
    deg = tuple(s.degree(d) for d in MESH_DIMS)
    order = tuple(d for d in s.mesh_order if s.degree(d) > 1)
    return deg, order, s.ep if {"ep", "edp"} & set(kinds) else 1, tuple(kinds)


@lru_cache(maxsize=None)
def reference_groups(deg_t, order, ep, kinds):
    """{kind: list of rank lists} and {dim: (step pairs, wrap pairs)} of neighbour ranks."""
    deg = dict(zip(MESH_DIMS, deg_t))
    # itertools.product varies the last dim fastest, which is exactly the rank order
    coords = [dict(zip(order, c), **{d: 0 for d in MESH_DIMS if d not in order})
              for c in itertools.product(*(range(deg[d]) for d in order))]
    rank_of = {tuple(c[d] for d in MESH_DIMS): r for r, c in enumerate(coords)}
    inner = "cp" if "dp" not in order or ("cp" in order and order.index("cp") > order.index("dp")) else "dp"
    outer = "dp" if inner == "cp" else "cp"

    def q(c):
        return c[inner] + deg[inner] * c[outer]

    keys = {
        "tp": lambda c: (c["pp"], c["dp"], c["cp"]),
        "cp": lambda c: (c["pp"], c["dp"], c["tp"]),
        "dp": lambda c: (c["pp"], c["cp"], c["tp"]),
        "pp": lambda c: (c["dp"], c["cp"], c["tp"]),
        "dp_cp": lambda c: (c["pp"], c["tp"]),
        "ep": lambda c: (c["pp"], c["tp"], q(c) // ep),
        "edp": lambda c: (c["pp"], c["tp"], q(c) % ep),
    }
    groups = {}
    for kind in kinds:
        by = defaultdict(list)
        for r, c in enumerate(coords):
            by[keys[kind](c)].append(r)
        groups[kind] = list(by.values())
    pairs = {}
    for dim in ("pp", "cp"):
        step, wrap = [], []
        for r, c in enumerate(coords):
            nxt = dict(c)
            nxt[dim] = (c[dim] + 1) % deg[dim]
            if deg[dim] > 1:
                (step if c[dim] + 1 < deg[dim] else wrap).append((r, rank_of[tuple(nxt[d] for d in MESH_DIMS)]))
        pairs[dim] = (step, wrap)
    return groups, pairs


@lru_cache(maxsize=None)
def _reference(key, per_node: int, group: int):
    groups, pairs = reference_groups(*key)
    out = {}
    for kind, gs in groups.items():
        n = max(len(g) for g in gs)
        worst = max((len({r // per_node for r in g}), len({r // group for r in g})) for g in gs)
        out[kind] = (n, *worst)

    def tier(ps):
        return max((2 if a // per_node != b // per_node else 1 if a // group != b // group else 0 for a, b in ps), default=0)

    for dim in ("pp", "cp"):
        step, wrap = pairs[dim]
        out[f"{dim}_step"] = tier(step)
        out[f"{dim}_wrap"] = max(tier(step), tier(wrap))
    return out


def reference(s: Strategy, per_node: int, group: int, kinds=GROUP_KINDS):
    """Worst group (n, nodes, fast groups) per kind, and the worst neighbour tiers."""
    return _reference(canonical(s, kinds), per_node, group)


def assert_matches(strategies, per_node, group, kinds=GROUP_KINDS):
    hw = hw_for(per_node, group)
    b = StrategyBatch.from_strategies(strategies, NUM_LAYERS)
    got = {kind: pl.group_placement(hw, b, kind) for kind in kinds}
    pipe = {w: pl.pipeline_neighbour_tier(hw, b, np.full(len(b), w)) for w in (False, True)}
    ring = pl.cp_ring_tier(hw, b)
    for i, s in enumerate(strategies):
        want = reference(s, per_node, group, kinds)
        for kind in kinds:
            p = got[kind]
            assert (p.n[i], p.nodes[i], p.fast_groups[i]) == want[kind], (kind, s, per_node, group)
        assert pipe[False][i] == want["pp_step"], (s, per_node, group)
        assert pipe[True][i] == want["pp_wrap"], (s, per_node, group)
        assert ring[i] == want["cp_wrap"], (s, per_node, group)


def dense_sweep():
    return [Strategy(dp=dp, tp=tp, pp=pp, cp=cp, mesh_order=order)
            for d in DEVICES for dp, tp, pp, cp in degree_combos(d) for order in ORDERS]


@pytest.mark.parametrize("per_node,group", HARDWARE)
def test_every_order_and_degree_matches_reference(per_node, group):
    assert_matches(dense_sweep(), per_node, group, kinds=DENSE_KINDS)


@pytest.mark.parametrize("per_node,group", HARDWARE)
def test_expert_groups_match_reference(per_node, group):
    strategies = [Strategy(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, mesh_order=order)
                  for d in DEVICES for dp, tp, pp, cp in degree_combos(d) for order in ORDERS
                  for ep in divisors(dp * cp)[1:]]
    # splits that are no exact mixed radix (cp = 2 inner, dp = 3, ep = 3) take the brute-force path
    assert any(s.ep == 3 and s.cp == 2 and s.dp == 3 for s in strategies)
    assert_matches(strategies, per_node, group, kinds=("ep", "edp"))


def group_shapes(s: Strategy, per_node: int, group: int, kind: str):
    """Multiset of group shapes: per node spanned, members per fast group (sorted)."""
    groups, _ = reference_groups(*canonical(s, (kind,)))
    shapes = []
    for g in groups[kind]:
        per = defaultdict(lambda: defaultdict(int))
        for r in g:
            per[r // per_node][r // group] += 1
        shapes.append(tuple(sorted(tuple(sorted(fg.values())) for fg in per.values())))
    return tuple(sorted(shapes))


@pytest.mark.parametrize("per_node,group", [(8, 8), (8, 4)])
def test_orders_with_same_membership_cost_the_same(per_node, group):
    hw = hw_for(per_node, group)
    strategies = [s for s in dense_sweep() if s.devices in (16, 24)]
    b = StrategyBatch.from_strategies(strategies, NUM_LAYERS)
    placed = pl.placements(hw, b)
    distinct_strides = 0
    for kind in DENSE_KINDS:
        classes = defaultdict(list)
        for i, s in enumerate(strategies):
            classes[(s.dp, s.tp, s.pp, s.cp, group_shapes(s, per_node, group, kind))].append(i)
        p = placed[kind]
        for members in classes.values():
            out = {(p.n[i], p.nodes[i], p.fast_groups[i]) for i in members}
            assert len(out) == 1, (kind, [strategies[i] for i in members], out)
            distinct_strides += len({(b.dp_stride[i], b.cp_stride[i], b.tp_stride[i], b.pp_stride[i]) for i in members}) > 1
    assert distinct_strides > 0


@pytest.mark.parametrize("order", [("pp", "dp", "tp", "cp"), ("pp", "dp", "cp", "tp")])
def test_dp_cp_group_two_per_node_either_order(order):
    s = Strategy(dp=96, tp=4, pp=4, cp=2, mesh_order=order)
    assert s.devices == 3072
    hw = hw_for(8, 8)
    p = pl.placements(hw, StrategyBatch.from_strategies([s], NUM_LAYERS))["dp_cp"]
    assert (p.n[0], p.nodes[0], p.fast_groups[0]) == (192, 96, 96)
    assert p.per_node[0] == 2.0 and p.per_fast_group[0] == 2.0
    assert reference(s, 8, 8)["dp_cp"] == (192, 96, 96)


def test_tp3_straddles_nodes():
    # tp=3 innermost on 8-device nodes: {0,1,2} fits a node, {6,7,8} does not; the worst is priced
    s = Strategy(dp=8, tp=3, pp=1)
    for per_node, group in ((8, 8), (8, 4)):
        b = StrategyBatch.from_strategies([s], NUM_LAYERS)
        got = pl.placements(hw_for(per_node, group), b)
        tp, dp = got["tp"], got["dp"]
        assert (tp.n[0], tp.nodes[0], tp.fast_groups[0]) == (3, 2, 2)
        assert tp.per_node[0] == 1.5 and tp.slowest_tier[0] == 2
        assert (dp.n[0], dp.nodes[0]) == (8, 3)   # ranks 1, 4, ..., 22: 3 + 2 + 3 over three nodes
        assert reference(s, per_node, group)["tp"] == (3, 2, 2)


def test_pipeline_stride_four_crosses_nodes():
    # pp=4 at stride 4 on 8-device nodes: stages 0->1 share a node, 1->2 do not
    s = Strategy(dp=1, tp=4, pp=4, mesh_order=("dp", "cp", "pp", "tp"))
    assert s.stride("pp") == 4
    b = StrategyBatch.from_strategies([s], NUM_LAYERS)
    hw = hw_for(8, 8)
    assert pl.pipeline_neighbour_tier(hw, b, np.array([False]))[0] == 2
    p = pl.group_placement(hw, b, "pp")
    assert (p.n[0], p.nodes[0], p.per_node[0]) == (4, 2, 2.0)
    single = StrategyBatch.from_strategies([Strategy(dp=4, tp=2, pp=1)], NUM_LAYERS)
    assert pl.pipeline_neighbour_tier(hw, single, True)[0] == 0


def test_fanouts_and_tiers():
    hw = hw_for(8, 4)
    b = StrategyBatch.from_strategies([Strategy(dp=4, tp=2, pp=2), Strategy(dp=8, tp=3, pp=1)], NUM_LAYERS)
    for p in pl.placements(hw, b).values():
        g0, g1, g2 = p.fanouts
        np.testing.assert_allclose(g0 * g1 * g2, p.n)
        assert (p.c0 == p.per_fast_group).all() and (p.c1 == p.per_node).all()
    dp = pl.group_placement(hw, b, "dp")
    # dp=4 at stride 2 on 4-device HCCS groups: 2 per group, 2 groups, one node
    assert (dp.g0[0], dp.g1[0], dp.g2[0], dp.slowest_tier[0]) == (2.0, 2.0, 1.0, 1)
    ep = pl.placements(hw, b)["ep"]
    assert (ep.n == 1).all() and (ep.slowest_tier == 0).all()


def test_expert_factors_split_dims():
    # ep = 4 over cp = 2 (inner, stride 1) and dp = 8 (stride 2): ep [(2, 1), (2, 2)], edp [(4, 4)]
    b = StrategyBatch.from_strategies([Strategy(dp=8, tp=1, pp=1, cp=2, ep=4, mesh_order=("pp", "tp", "dp", "cp"))],
                                      NUM_LAYERS)
    n, s, exact = pl.group_factors(b, "ep")
    assert exact[0] and sorted((a, c) for a, c in zip(n[0], s[0]) if a > 1) == [(2, 1), (2, 2)]
    n, s, exact = pl.group_factors(b, "edp")
    assert [(a, c) for a, c in zip(n[0], s[0]) if a > 1] == [(4, 4)]
    with pytest.raises(ValueError):
        pl.group_factors(b, "nope")


def test_folded_expert_groups_take_the_tensor_parallel_ranks_first():
    # MoE parallel folding (experts' own tp 1, Megatron "tp-ep-dp-pp"): ep = 8 over tp = 4 (stride 1) and dp = 4
    # (stride 4): the ep group is tp x 2 of dp, [(4, 1), (2, 4)]; the experts' data parallelism the other 2 of dp
    s = Strategy(dp=4, tp=4, pp=1, cp=1, ep=8, fold_experts=True, sequence_parallel=True)
    b = StrategyBatch.from_strategies([s, replace(s, ep=2, fold_experts=False)], NUM_LAYERS)
    n, st, exact = pl.group_factors(b, "ep")
    assert exact[0] and sorted((a, c) for a, c in zip(n[0], st[0]) if a > 1) == [(2, 4), (4, 1)]
    assert sorted((a, c) for a, c in zip(n[1], st[1]) if a > 1) == [(2, 4)]       # unfolded: dp only
    n, st, _ = pl.group_factors(b, "edp")
    assert [(a, c) for a, c in zip(n[0], st[0]) if a > 1] == [(2, 8)]
    assert [(a, c) for a, c in zip(n[1], st[1]) if a > 1] == [(2, 8)]
    hw = load_hardware("dgx-h100")                        # 8 devices a node: the folded ep group fills one
    ep = pl.placements(hw, b)["ep"]
    assert (int(ep.n[0]), int(ep.nodes[0])) == (8, 1) and (int(ep.n[1]), int(ep.nodes[1])) == (2, 1)
    # every layout counted rank by rank agrees with the closed form
    for i in range(2):
        deg, stride, _ = pl._layout(b.take([i]))
        layout = tuple(int(x) for x in np.concatenate([deg[0], stride[0]]))
        for kind in ("ep", "edp"):
            p = pl.group_placement(hw, b.take([i]), kind)
            assert pl._exact_group(kind, layout, int(b.ep[i]), 8, 8, bool(b.fold_experts[i])) == \
                (int(p.n[0]), int(p.nodes[0]), int(p.fast_groups[0]))


def test_worst_group_is_the_one_on_most_nodes():
    # 30 devices on (8, 4) nodes; dp_cp groups are 3 consecutive ranks at 15 apart, e.g.
    # {6,7,8, 21,22,23} spans nodes {0,1,2} in 3 fast groups, {3,4,5, 18,19,20} 2 nodes in 4 fast groups
    s = Strategy(dp=2, tp=1, pp=5, cp=3, mesh_order=("dp", "pp", "cp", "tp"))
    p = pl.group_placement(hw_for(8, 4), StrategyBatch.from_strategies([s], NUM_LAYERS), "dp_cp")
    assert (p.n[0], p.nodes[0], p.fast_groups[0]) == (6, 3, 3) == reference(s, 8, 4)["dp_cp"]
