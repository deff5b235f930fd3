"""Communication: alpha-beta collective times on the link tiers a group actually spans.

Where a group's members sit comes from advisor.cost.placement: for each kind of group (tp, cp, dp,
dp x cp, ep, expert dp) the worst group's members per fast group (HCCS group, or the whole node on
switch topologies), fast groups per node and nodes, derived exactly from the mesh order. Collectives
run hierarchically, the way NCCL/HCCL do on multi-tier machines (Jeaugey, "Massively Scale Your
Deep Learning Training with NCCL 2.4", 2019; Thakur, Rabenseifner and Gropp, "Optimization of
Collective Communication Operations in MPICH", IJHPCA 2005): reduce-scatter up the tiers, all-reduce
at the top, all-gather back down, each tier at its own bandwidth. A flat ring over the slowest tier
is also priced and the cheaper of the two is used.

Cost per ring stage (Thakur et al.): all-reduce 2(g-1)/g * S/B + 2(g-1) * alpha; all-gather and
reduce-scatter (g-1)/g * S/B + (g-1) * alpha, where S is the full (unsharded) buffer; all-to-all
(g-1)/g * S/B + (g-1) * alpha; point-to-point alpha + S/B. B is the tier's per-device, per-direction
bandwidth times its collective efficiency (bus bandwidth over peak, from NCCL-tests). A link may
carry measured per-operation alpha and B (``collectives:`` in a profile, written by ``advisor
calibrate``); each operation then uses its own.

``collective_time_s(hw, op, bytes, n, stride)`` keeps the older description of a group as n members
at one stride (aligned layouts), for callers without a mesh (the operator-level searchers).
Every function takes numpy arrays (or scalars) and broadcasts, so the search prices many
candidates at once.
"""

from __future__ import annotations

import numpy as np

from advisor.specs.hardware import HardwareProfile, Link

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p")


# Member counts arrive as floats: a group of one (up to rounding) exchanges nothing.
MORE_THAN_ONE = 1.0 + 1e-9


def _tier_links(hw: HardwareProfile) -> tuple[Link, Link, Link]:
    node = hw.node
    return node.intra, (node.cross if node.cross is not None else node.intra), hw.inter


def members_per_unit(n, stride, unit: int):
    """How many of a group's n members (stride apart, aligned) fall in one block of `unit` ranks."""
    n = np.asarray(n, dtype=np.int64)
    stride = np.maximum(np.asarray(stride, dtype=np.int64), 1)
    per_unit = np.where(stride < unit, np.maximum(unit // stride, 1), 1)
    return np.minimum(n, per_unit)


def tier_fanouts(hw: HardwareProfile, n, stride):
    """(g0, g1, g2): members per fast group, fast groups per node, nodes (their product is n)."""
    n = np.asarray(n, dtype=np.int64)
    c0 = members_per_unit(n, stride, hw.node.group_size)
    c1 = np.maximum(members_per_unit(n, stride, hw.node.devices_per_node), c0)
    g0 = c0
    g1 = np.maximum(c1 // np.maximum(c0, 1), 1)
    g2 = np.maximum(-(-n // np.maximum(c1, 1)), 1)
    return g0, g1, g2


def _ring_factor(op: str, g):
    g = np.asarray(g, dtype=float)
    share = (g - 1.0) / np.maximum(g, 1.0)
    if op == "all_reduce":
        return 2.0 * share, 2.0 * (g - 1.0)
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return share, (g - 1.0)
    raise ValueError(op)


def _tier_time(op: str, message_bytes, g, link: Link):
    link = link.for_op(op)
    bw_factor, steps = _ring_factor(op, g)
    return bw_factor * message_bytes / link.effective_bandwidth_bytes_per_s + steps * link.latency_s


def collective_time_s(hw: HardwareProfile, op: str, message_bytes, n, stride):
    """Seconds for one collective over groups of n ranks at `stride` (aligned); message_bytes is the
    full buffer."""
    if op == "p2p":
        return p2p_time_s(hw, message_bytes, stride)
    g0, g1, g2 = tier_fanouts(hw, n, stride)
    return fanout_time_s(hw, op, message_bytes, g0, g1, g2)


def group_time_s(hw: HardwareProfile, op: str, message_bytes, group) -> np.ndarray:
    """Seconds for one collective over a placed group (advisor.cost.placement.GroupPlacement)."""
    return fanout_time_s(hw, op, message_bytes, group.g0, group.g1, group.g2)


def fanout_time_s(hw: HardwareProfile, op: str, message_bytes, g0, g1, g2):
    """Seconds for one collective whose group has g0 members per fast group, g1 fast groups per node
    and g2 nodes (may be fractional where groups straddle blocks unevenly).

    Groups of one member cost nothing. Under contention-free assumptions every member uses its own
    links (rail-optimised fat tree: one NIC per device), so parallel groups do not slow each other.
    """
    message_bytes = np.asarray(message_bytes, dtype=float)
    g0, g1, g2 = (np.asarray(g, dtype=float) for g in (g0, g1, g2))
    n = g0 * g1 * g2
    l0, l1, l2 = _tier_links(hw)
    if op == "all_to_all":
        l0, l1, l2 = l0.for_op(op), l1.for_op(op), l2.for_op(op)
        # Each member sends (n-1)/n of its buffer; the part bound for other nodes crosses the NIC,
        # the part for other fast groups the cross link; tiers run concurrently (max), latency per peer.
        nf = np.maximum(n, 1.0)
        inside0 = (g0 - 1.0) / nf
        inside1 = g0 * (g1 - 1.0) / nf
        outside = (nf - g0 * g1) / nf
        t = np.maximum.reduce([
            inside0 * message_bytes / l0.effective_bandwidth_bytes_per_s,
            inside1 * message_bytes / l1.effective_bandwidth_bytes_per_s,
            outside * message_bytes / l2.effective_bandwidth_bytes_per_s,
        ])
        lat = np.where(g2 > 1, l2.latency_s, np.where(g1 > 1, l1.latency_s, l0.latency_s))
        return np.where(n > MORE_THAN_ONE, t + (nf - 1.0) * lat, 0.0)
    # Hierarchical: the message shrinks by each lower tier's fan-out before the next tier.
    # (All-reduce: reduce-scatter up, all-reduce at the top, all-gather down; in the ring formulas a
    # reduce-scatter plus an all-gather at one tier cost exactly that tier's all-reduce.)
    t = (
        _tier_time(op, message_bytes, g0, l0)
        + _tier_time(op, message_bytes / g0, g1, l1)
        + _tier_time(op, message_bytes / (g0 * g1), g2, l2)
    )
    # Flat ring over every member at the slowest tier spanned (that tier's bandwidth and latency chosen per
    # candidate, then one ring formula: the same arithmetic as pricing each tier and selecting).
    f0, f1, f2 = (link.for_op(op) for link in (l0, l1, l2))
    across, inside = g2 > 1, g1 > 1
    bandwidth = np.where(across, f2.effective_bandwidth_bytes_per_s,
                         np.where(inside, f1.effective_bandwidth_bytes_per_s, f0.effective_bandwidth_bytes_per_s))
    latency = np.where(across, f2.latency_s, np.where(inside, f1.latency_s, f0.latency_s))
    bw_factor, steps = _ring_factor(op, n)
    flat = bw_factor * message_bytes / bandwidth + steps * latency
    return np.where(n > MORE_THAN_ONE, np.minimum(t, flat), 0.0)


def tier_busy_s(hw: HardwareProfile, op: str, message_bytes, group) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Seconds one collective keeps each tier's link of a member busy with data (fast group, node,
    between nodes): the bandwidth terms of the hierarchical schedule above, without start-up latency
    (what another transfer on the same link has to share; advisor.cost.contention)."""
    message_bytes = np.asarray(message_bytes, dtype=float)
    g0, g1, g2 = (np.asarray(g, dtype=float) for g in group.fanouts)
    links = [link.for_op(op) for link in _tier_links(hw)]
    if op == "all_to_all":
        nf = np.maximum(g0 * g1 * g2, 1.0)
        shares = ((g0 - 1.0) / nf, g0 * (g1 - 1.0) / nf, (nf - g0 * g1) / nf)
        return tuple(s * message_bytes / link.effective_bandwidth_bytes_per_s for s, link in zip(shares, links))
    out = []
    for g, size, link in ((g0, message_bytes, links[0]), (g1, message_bytes / g0, links[1]),
                          (g2, message_bytes / (g0 * g1), links[2])):
        bw_factor, _ = _ring_factor(op, g)
        out.append(bw_factor * size / link.effective_bandwidth_bytes_per_s)
    return tuple(out)


def tier_p2p_busy_s(hw: HardwareProfile, message_bytes, tier) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Seconds one point-to-point transfer keeps each tier's link busy with data (only its own tier)."""
    message_bytes = np.asarray(message_bytes, dtype=float)
    tier = np.asarray(tier)
    return tuple(np.where(tier == k, message_bytes / link.for_op("p2p").effective_bandwidth_bytes_per_s, 0.0)
                 for k, link in enumerate(_tier_links(hw)))


def p2p_time_s(hw: HardwareProfile, message_bytes, stride):
    """One point-to-point transfer between ranks `stride` apart (aligned neighbours)."""
    stride = np.asarray(stride, dtype=np.int64)
    tier = np.where(stride < hw.node.group_size, 0, np.where(stride < hw.node.devices_per_node, 1, 2))
    return tier_p2p_time_s(hw, message_bytes, tier)


def tier_p2p_time_s(hw: HardwareProfile, message_bytes, tier):
    """One point-to-point transfer over tier 0 (fast group), 1 (node) or 2 (between nodes)."""
    message_bytes = np.asarray(message_bytes, dtype=float)
    tier = np.asarray(tier)
    l0, l1, l2 = (link.for_op("p2p") for link in _tier_links(hw))
    bw = np.select([tier == 0, tier == 1], [l0.effective_bandwidth_bytes_per_s, l1.effective_bandwidth_bytes_per_s],
                   l2.effective_bandwidth_bytes_per_s)
    lat = np.select([tier == 0, tier == 1], [l0.latency_s, l1.latency_s], l2.latency_s)
    return lat + message_bytes / bw


def slowest_tier(hw: HardwareProfile, n, stride):
    """0 = fast group, 1 = across groups of a node, 2 = across nodes (for reports and rules)."""
    g0, g1, g2 = tier_fanouts(hw, n, stride)
    return np.where(g2 > 1, 2, np.where(g1 > 1, 1, 0))
