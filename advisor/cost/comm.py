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

from dataclasses import dataclass

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


def collective_time_s(hw: HardwareProfile, op: str, message_bytes, n, stride):
    """Seconds for one collective over groups of n ranks at `stride` (aligned); message_bytes is the
    full buffer."""
    if op == "p2p":
        return p2p_time_s(hw, message_bytes, stride)
    g0, g1, g2 = tier_fanouts(hw, n, stride)
    return fanout_time_s(hw, op, message_bytes, g0, g1, g2)


def group_time_s(hw: HardwareProfile, op: str, message_bytes, group) -> np.ndarray:
    """Seconds for one collective over a placed group (advisor.cost.placement.GroupPlacement). What the time
    owes to the group and the links alone is kept with the group (a step prices several collectives on each)."""
    return _placed(hw, op, group).time_s(message_bytes)


def _placed(hw: HardwareProfile, op: str, group) -> "Fanout":
    """The group's Fanout for ``op`` on ``hw``, made once and kept with the group."""
    key = (op, id(hw))
    held = group.priced.get(key)
    if held is None or held[0] is not hw:
        held = group.priced[key] = (hw, Fanout.of(hw, op, group.g0, group.g1, group.g2))
    return held[1]


def fanout_time_s(hw: HardwareProfile, op: str, message_bytes, g0, g1, g2):
    """Seconds for one collective whose group has g0 members per fast group, g1 fast groups per node
    and g2 nodes (may be fractional where groups straddle blocks unevenly).

    Groups of one member cost nothing. Under contention-free assumptions every member uses its own
    links (rail-optimised fat tree: one NIC per device), so parallel groups do not slow each other.
    """
    return Fanout.of(hw, op, g0, g1, g2).time_s(message_bytes)


@dataclass(frozen=True)
class Fanout:
    """One collective over groups of g0 x g1 x g2 members (fanout_time_s), all but its message: per tier the
    ring's bandwidth factor and the link's bandwidth, and the latency terms; the same for the flat ring over
    the slowest tier spanned (all-to-all: each tier's share of the buffer, and the latency per peer)."""

    op: str
    g0: np.ndarray
    g01: np.ndarray                 # g0 * g1
    tiers: tuple                    # per tier (bandwidth factor or share, bytes per second, latency term)
    flat: tuple                     # (bandwidth factor, bytes per second, latency term); all-to-all: ()
    latency_s: np.ndarray | float   # all-to-all: (members - 1) x the latency of the slowest tier spanned
    several: np.ndarray             # groups of more than one member

    @staticmethod
    def of(hw: HardwareProfile, op: str, g0, g1, g2) -> "Fanout":
        g0, g1, g2 = (np.asarray(g, dtype=float) for g in (g0, g1, g2))
        n = g0 * g1 * g2
        links = tuple(link.for_op(op) for link in _tier_links(hw))
        bandwidth = [link.effective_bandwidth_bytes_per_s for link in links]
        if op == "all_to_all":
            # Each member sends (n-1)/n of its buffer; the part bound for other nodes crosses the NIC,
            # the part for other fast groups the cross link; tiers run concurrently (max), latency per peer.
            nf = np.maximum(n, 1.0)
            shares = ((g0 - 1.0) / nf, g0 * (g1 - 1.0) / nf, (nf - g0 * g1) / nf)
            lat = np.where(g2 > 1, links[2].latency_s, np.where(g1 > 1, links[1].latency_s, links[0].latency_s))
            return Fanout(op, g0, g0 * g1, tuple(zip(shares, bandwidth, (0.0,) * 3)), (), (nf - 1.0) * lat,
                          n > MORE_THAN_ONE)
        # Hierarchical: the message shrinks by each lower tier's fan-out before the next tier.
        # (All-reduce: reduce-scatter up, all-reduce at the top, all-gather down; in the ring formulas a
        # reduce-scatter plus an all-gather at one tier cost exactly that tier's all-reduce.)
        tiers = []
        for g, link, bw in zip((g0, g1, g2), links, bandwidth):
            factor, steps = _ring_factor(op, g)
            tiers.append((factor, bw, steps * link.latency_s))
        # Flat ring over every member at the slowest tier spanned (that tier's bandwidth and latency chosen per
        # candidate, then one ring formula: the same arithmetic as pricing each tier and selecting).
        across, inside = g2 > 1, g1 > 1
        flat_bw = np.where(across, bandwidth[2], np.where(inside, bandwidth[1], bandwidth[0]))
        latency = np.where(across, links[2].latency_s, np.where(inside, links[1].latency_s, links[0].latency_s))
        factor, steps = _ring_factor(op, n)
        return Fanout(op, g0, g0 * g1, tuple(tiers), (factor, flat_bw, steps * latency), 0.0, n > MORE_THAN_ONE)

    def busy_s(self, message_bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Seconds each tier's link of a member is busy with data: the bandwidth terms, no latency
        (all-to-all: each tier's share of the buffer; otherwise the message shrunk by the lower tiers' fan-out)."""
        message_bytes = np.asarray(message_bytes, dtype=float)
        if self.op == "all_to_all":
            return tuple(share * message_bytes / bw for share, bw, _ in self.tiers)
        sizes = (message_bytes, message_bytes / self.g0, message_bytes / self.g01)
        return tuple(factor * size / bw for (factor, bw, _), size in zip(self.tiers, sizes))

    def time_s(self, message_bytes) -> np.ndarray:
        message_bytes = np.asarray(message_bytes, dtype=float)
        busy = self.busy_s(message_bytes)
        if self.op == "all_to_all":      # the tiers run concurrently
            return np.where(self.several, np.maximum.reduce(busy) + self.latency_s, 0.0)
        (_, _, l0), (_, _, l1), (_, _, l2) = self.tiers
        t = (busy[0] + l0) + (busy[1] + l1) + (busy[2] + l2)
        factor, bw, lat = self.flat
        flat = factor * message_bytes / bw + lat
        return np.where(self.several, np.minimum(t, flat), 0.0)


def tier_busy_s(hw: HardwareProfile, op: str, message_bytes, group) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Seconds one collective keeps each tier's link of a member busy with data (fast group, node,
    between nodes): the bandwidth terms of the hierarchical schedule above, without start-up latency
    (what another transfer on the same link has to share; advisor.cost.contention)."""
    return _placed(hw, op, group).busy_s(message_bytes)


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
