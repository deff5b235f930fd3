"""Collective costs follow the link tiers a group spans (advisor.cost.comm)."""

from __future__ import annotations

import numpy as np
import pytest

from advisor.cost.comm import collective_time_s, p2p_time_s, slowest_tier, tier_fanouts
from advisor.specs.hardware import load_hardware

MB = 1e6


@pytest.fixture(scope="module")
def ascend():
    return load_hardware("ascend-910")


@pytest.fixture(scope="module")
def a100():
    return load_hardware("dgx-a100-80g")


def test_ascend_tp_group_across_hccs_groups_costs_more(ascend):
    inside = collective_time_s(ascend, "all_reduce", 64 * MB, 4, 1)      # ranks 0-3: one HCCS group
    across = collective_time_s(ascend, "all_reduce", 64 * MB, 4, 2)      # ranks 0,2,4,6: both groups
    eight = collective_time_s(ascend, "all_reduce", 64 * MB, 8, 1)       # the whole server
    assert across > inside
    assert eight > inside
    assert int(slowest_tier(ascend, 4, 1)) == 0 and int(slowest_tier(ascend, 4, 2)) == 1


def test_group_spanning_nodes_pays_inter_node(a100):
    intra = collective_time_s(a100, "all_reduce", 64 * MB, 8, 1)
    inter = collective_time_s(a100, "all_reduce", 64 * MB, 8, 8)         # one rank per node
    assert inter > 5 * intra
    assert int(slowest_tier(a100, 8, 8)) == 2


def test_ring_all_reduce_matches_alpha_beta(a100):
    # One switch tier: 2(n-1)/n * S / B + 2(n-1) * alpha (Thakur et al. 2005).
    n, size = 8, 256 * MB
    link = a100.node.intra
    expected = 2 * (n - 1) / n * size / link.effective_bandwidth_bytes_per_s + 2 * (n - 1) * link.latency_s
    assert collective_time_s(a100, "all_reduce", size, n, 1) == pytest.approx(expected)


def test_hierarchical_beats_flat_ring_across_nodes(a100):
    # 32 ranks, 8 per node: the top tier moves 1/8 of the buffer per device.
    n, size = 32, 512 * MB
    g0, g1, g2 = (int(x) for x in tier_fanouts(a100, n, 1))
    assert (g0, g1, g2) == (8, 1, 4)
    flat = 2 * (n - 1) / n * size / a100.inter.effective_bandwidth_bytes_per_s
    assert collective_time_s(a100, "all_reduce", size, n, 1) < flat


def test_reduce_scatter_plus_all_gather_equals_all_reduce_volume(a100):
    size = 128 * MB
    rs = collective_time_s(a100, "reduce_scatter", size, 8, 1)
    ag = collective_time_s(a100, "all_gather", size, 8, 1)
    ar = collective_time_s(a100, "all_reduce", size, 8, 1)
    assert rs + ag == pytest.approx(ar)


def test_single_member_group_is_free(a100):
    assert collective_time_s(a100, "all_reduce", 1e9, 1, 1) == 0.0


def test_p2p_tiers(ascend):
    assert p2p_time_s(ascend, 1e8, 1) < p2p_time_s(ascend, 1e8, 4) < p2p_time_s(ascend, 1e8, 8)


def test_vectorized(a100):
    n = np.array([2, 4, 8, 16])
    t = collective_time_s(a100, "all_gather", np.full(4, 1e8), n, np.ones(4, dtype=int))
    assert t.shape == (4,) and np.all(np.diff(t) > 0)


def test_a_links_per_operation_fit_replaces_its_own_for_that_operation(a100):
    from dataclasses import replace

    intra = a100.node.intra
    measured = replace(intra, per_op=(("all_reduce", 500.0, 10.0), ("p2p", 2.0, 400.0)))
    hw = replace(a100, node=replace(a100.node, intra=measured))
    g, nbytes = 8, 64e6
    expected = 2 * (g - 1) / g * nbytes / (10e9 * intra.efficiency) + 2 * (g - 1) * 500e-6
    assert float(collective_time_s(hw, "all_reduce", nbytes, g, 1)) == pytest.approx(expected)
    # operations without their own fit keep the link's
    assert float(collective_time_s(hw, "all_gather", nbytes, g, 1)) == float(collective_time_s(a100, "all_gather", nbytes, g, 1))
    assert float(p2p_time_s(hw, nbytes, 1)) == pytest.approx(2e-6 + nbytes / (400e9 * intra.efficiency))
