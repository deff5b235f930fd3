"""Overlapped data-parallel traffic sharing links with the critical path (advisor.cost.contention)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from advisor.cost import comm
from advisor.cost.contention import _window
from advisor.cost.estimate import estimate
from advisor.cost.placement import placements
from advisor.space.strategy import Strategy, StrategyBatch
from advisor.specs.hardware import load_hardware
from advisor.specs.job import Cluster, TrainingJob
from advisor.specs.model import load_model


def _parts(model, hw, cluster, job, s):
    e = estimate(model, hw, cluster, job, s)
    assert e.feasible, e.reasons
    return e


def test_window_fair_sharing_and_priority_by_hand():
    critical = (np.array([0.0]), np.array([0.1]), np.array([0.2]))
    dp_busy = (np.array([0.0]), np.array([0.05]), np.array([0.4]))
    # fair: each tier's critical data slowed by the share of the window the dp data occupies
    fair = _window(critical, dp_busy, np.array([0.5]), np.array([0.2]), priority=False)
    assert fair[0] == pytest.approx(0.1 * 0.25 + 0.2 * 1.0)
    # priority: the dp collective yields 0.225 s; exposed 0.5 + 0.225 - 0.2 instead of 0.3
    assert _window(critical, dp_busy, np.array([0.5]), np.array([0.2]), priority=True)[0] == pytest.approx(0.225)
    # a short dp collective absorbs most of what it yields inside the window
    assert _window(critical, dp_busy, np.array([0.0]), np.array([0.2]), priority=True)[0] == pytest.approx(0.025)


def test_tier_busy_is_the_bandwidth_part_of_the_collective():
    hw = load_hardware("dgx-h100")
    b = StrategyBatch.from_strategies([Strategy(dp=16, tp=1, pp=1)], 32)
    dp = placements(hw, b, ("dp",))["dp"]
    busy = comm.tier_busy_s(hw, "all_reduce", 1e9, dp)
    # 8 per node over 2 nodes: 2 x 7/8 of 1 GB over NVLink, then 2 x 1/2 of 1/8 GB over the NIC
    assert busy[0][0] == pytest.approx(2 * 7 / 8 * 1e9 / hw.node.intra.effective_bandwidth_bytes_per_s)
    assert busy[2][0] == pytest.approx(1e9 / 8 / hw.inter.effective_bandwidth_bytes_per_s)
    latency = comm.group_time_s(hw, "all_reduce", 0.0, dp)[0]
    assert sum(x[0] for x in busy) + latency == pytest.approx(comm.group_time_s(hw, "all_reduce", 1e9, dp)[0], rel=1e-9)


def test_megatron_layout_keeps_data_parallel_traffic_off_the_tensor_parallel_links():
    """tp 8 inside each node, dp across nodes: the dp ring uses only the NICs, tp only NVLink."""
    model, hw = load_model("gpt3-13b"), load_hardware("dgx-a100-80g")
    cluster = Cluster.of(hw, nodes=4)
    job = TrainingJob(global_batch_size=64, seq_length=2048)
    e = _parts(model, hw, cluster, job, Strategy(dp=4, tp=8, pp=1, micro_batch_size=1, num_micro_batches=16,
                                                 zero_stage=1, recompute="selective"))
    assert e.time_s["contention"] == 0.0


def test_shared_node_links_cost_time_and_priority_moves_it_to_the_data_parallel_collective():
    model, hw = load_model("llama3-8b"), load_hardware("dgx-h100")
    cluster = Cluster.of(hw, nodes=2)
    job = TrainingJob(global_batch_size=64, seq_length=8192)
    s = Strategy(dp=8, tp=2, pp=1, micro_batch_size=1, num_micro_batches=8, zero_stage=1)
    fair = _parts(model, hw, cluster, job, s)
    first = _parts(model, hw, cluster, replace(job, comm_priority=True), s)
    assert fair.time_s["contention"] > 0.0
    assert 0.0 <= first.time_s["contention"] <= fair.time_s["contention"]
    # the part is in the step: everything else is unchanged
    others = {k: v for k, v in fair.time_s.items() if k != "contention"}
    assert others == {k: v for k, v in first.time_s.items() if k != "contention"}
    assert fair.step_time_s - first.step_time_s == pytest.approx(fair.time_s["contention"] - first.time_s["contention"])


def test_nothing_contends_without_overlap():
    model, hw = load_model("llama3-8b"), load_hardware("dgx-h100")
    cluster = Cluster.of(hw, nodes=2)
    job = TrainingJob(global_batch_size=64, seq_length=8192, overlap_grad_reduce=False)
    s = Strategy(dp=8, tp=2, pp=1, micro_batch_size=1, num_micro_batches=8, zero_stage=0, recompute="full")
    assert _parts(model, hw, cluster, job, s).time_s["contention"] == 0.0
    cpu = replace(hw, device=replace(hw.device, overlaps_communication=False))
    assert _parts(model, cpu, cluster, replace(job, overlap_grad_reduce=True), s).time_s["contention"] == 0.0


def test_pipeline_transfers_that_cross_the_nic_with_fsdp_traffic_pay_for_it():
    """pp neighbours in different nodes and FSDP gathers across nodes share the NIC: the mesh order that
    keeps pipeline neighbours inside a node pays less."""
    model, hw = load_model("llama3-70b"), load_hardware("dgx-h100")
    cluster = Cluster.of(hw, nodes=4)
    job = TrainingJob(global_batch_size=32, seq_length=4096)
    base = Strategy(dp=16, tp=1, pp=2, micro_batch_size=1, num_micro_batches=2, zero_stage=3, recompute="full")
    across = _parts(model, hw, cluster, job, replace(base, mesh_order=("pp", "dp", "cp", "tp")))
    inside = _parts(model, hw, cluster, job, replace(base, mesh_order=("dp", "cp", "tp", "pp")))
    assert across.time_s["contention"] > inside.time_s["contention"] >= 0.0


def test_priority_survives_the_plan_and_every_export_says_it_cannot_be_set(tmp_path):
    from advisor.export import export_plan
    from advisor.plan import plan_from_dict, plan_to_dict
    from tests._export_plans import make_plan

    plain = make_plan("llama3-8b", "dgx-h100", 2, {"dp": 8, "tp": 2, "pp": 1, "micro_batch_size": 1,
                                                   "num_micro_batches": 8, "zero_stage": 1},
                      global_batch_size=64, seq_length=8192)
    assert "comm_priority" not in plan_to_dict(plain)["training"]    # written only when set
    data = plan_to_dict(plain)
    data["training"]["comm_priority"] = True
    plan = plan_from_dict(data, "priority plan")
    assert plan.training.comm_priority and plan_to_dict(plan)["training"]["comm_priority"] is True
    for target in ("megatron", "deepspeed", "torchtitan", "mindspore"):
        notes = export_plan(plan, target).unsupported
        assert any(n.startswith("training.comm_priority = true") for n in notes), target
        assert not any(n.startswith("training.comm_priority") for n in export_plan(plain, target).unsupported)
