"""Activation swapping (advisor.cost.swap; vPipe's other half, advisor.search.vpipe.swap_strategy): the
memory it frees, the time it exposes, its rules, plans and exports."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from advisor.cost import swap
from advisor.cost.estimate import estimate
from advisor.cost.memory import in_flight, memory, swapped_layer_bytes
from advisor.errors import AdvisorError
from advisor.plan import Plan, dumps_plan, plan_from_dict
from advisor.search.vpipe import repartition, swap_strategy
from advisor.space.strategy import Strategy, StrategyBatch
from advisor.specs.hardware import hardware_from_dict, load_hardware
from advisor.specs.job import Cluster, TrainingJob
from advisor.specs.model import load_model

MODEL, H100 = load_model("llama3-70b"), load_hardware("dgx-h100")
CLUSTER = Cluster.of(H100, nodes=4)
JOB = TrainingJob(global_batch_size=64, seq_length=8192, framework="mindspore")
BASE = Strategy(dp=2, tp=4, pp=4, micro_batch_size=1, num_micro_batches=32, zero_stage=1, sequence_parallel=True)


def test_swapped_layers_leave_the_device_for_every_micro_batch_in_flight():
    swapped = replace(BASE, swap_layers=(8, 4, 2, 0))
    b0 = StrategyBatch.from_strategies([BASE], MODEL.num_layers)
    b1 = StrategyBatch.from_strategies([swapped], MODEL.num_layers)
    per_layer, f = swapped_layer_bytes(MODEL, JOB, b1)[0], in_flight(b1)[0]
    k = np.array([8, 4, 2, 0])
    expected = per_layer * (k * f - np.minimum(k, swap.STAGING_LAYERS))
    saved = memory(MODEL, JOB, b0).stage_total[0] - memory(MODEL, JOB, b1).stage_total[0]
    # the allocator allowance (5%) scales what is saved
    assert saved == pytest.approx(expected * 1.05, rel=1e-9)
    assert f.tolist() == [4, 3, 2, 1]


def test_copies_hide_under_compute_until_the_link_is_slow():
    swapped = replace(BASE, swap_layers=(8, 4, 2, 0))
    fast = estimate(MODEL, H100, CLUSTER, JOB, swapped)
    plain = estimate(MODEL, H100, CLUSTER, JOB, BASE)
    assert fast.time_s["offload"] == 0.0 and fast.step_time_s == pytest.approx(plain.step_time_s, rel=1e-12)
    raw = dict(H100.raw)
    raw["host"] = {**raw["host"], "pcie_bandwidth_gbps": 1.0}
    slow_hw = hardware_from_dict(raw, "test")
    slow = estimate(MODEL, slow_hw, CLUSTER, JOB, swapped)
    b = StrategyBatch.from_strategies([swapped], MODEL.num_layers)
    copy = 8 * swapped_layer_bytes(MODEL, JOB, b)[0, 0] / swap.bandwidth_bytes_per_s(slow_hw)
    assert slow.time_s["offload"] > 0 and slow.step_time_s > plain.step_time_s + copy   # every micro-batch waits


def test_swap_rules():
    cases = ((replace(BASE, swap_layers=(30, 0, 0, 0)), "swap"), (replace(BASE, recompute="selective", swap_layers=(1, 0, 0, 0)), "swap"))
    for s, words in cases:
        e = estimate(MODEL, H100, CLUSTER, JOB, s)
        assert not e.feasible and any(words in r for r in e.reasons)


def test_vpipe_swaps_where_that_beats_recomputing_and_the_plan_keeps_it(tmp_path):
    assert not estimate(MODEL, H100, CLUSTER, JOB, BASE).feasible
    swapped = swap_strategy(MODEL, H100, JOB, BASE)
    e = estimate(MODEL, H100, CLUSTER, JOB, swapped)
    assert e.feasible and swapped.recompute == "none" and swapped.swap_layers[0] > 0
    assert list(swapped.swap_layers) == sorted(swapped.swap_layers, reverse=True)   # the early stages hold more
    full = estimate(MODEL, H100, CLUSTER, JOB, replace(BASE, recompute="full"))
    assert e.step_time_s < 0.8 * full.step_time_s
    # repartition keeps the faster of recomputing per stage (vPipe's repartitioning) and swapping
    from advisor.search.vpipe import memory_aware_strategy

    batch = StrategyBatch.from_strategies([replace(BASE, recompute="full")], MODEL.num_layers)
    chosen = estimate(MODEL, H100, CLUSTER, JOB, repartition(MODEL, H100, CLUSTER, JOB, batch).strategy(0))
    recomputing = estimate(MODEL, H100, CLUSTER, JOB, memory_aware_strategy(MODEL, H100, JOB, BASE))
    assert chosen.step_time_s == pytest.approx(min(e.step_time_s, recomputing.step_time_s), rel=1e-12)
    # a leader with selective recomputation is offered swapping instead (MindFormers swaps per layer)
    selective = StrategyBatch.from_strategies([replace(BASE, recompute="selective", stage_layers=(20, 20, 21, 19))],
                                              MODEL.num_layers)
    kept = repartition(MODEL, H100, CLUSTER, JOB, selective).strategy(0)
    assert kept.swap_layers is not None and kept.recompute == "none"
    assert swap_strategy(MODEL, H100, replace(JOB, framework="megatron"), BASE) is None
    plan = Plan(model=MODEL, hardware=H100, cluster=CLUSTER, training=JOB, strategy=swapped)
    text = dumps_plan(plan)
    assert json.loads(text)["parallel"]["swap_layers"] == list(swapped.swap_layers)
    assert plan_from_dict(json.loads(text)).strategy == swapped
    bad = json.loads(text)
    bad["parallel"]["swap_layers"] = [-1, 0, 0, 0]
    with pytest.raises(AdvisorError, match="swap_layers"):
        plan_from_dict(bad)


def test_exports_write_mindformers_swap_config_and_say_where_they_cannot():
    import yaml

    from advisor.export import export_plan

    swapped = replace(BASE, swap_layers=(3, 1, 0, 0), stage_layers=(20, 20, 20, 20))
    plan = Plan(model=MODEL, hardware=H100, cluster=CLUSTER, training=JOB, strategy=swapped)
    ms = export_plan(plan, "mindspore")
    config = yaml.safe_load(next(v for k, v in ms.files.items() if k.endswith(".yaml")))
    assert config["swap_config"] == {"swap": True, "default_prefetch": 1,
                                     "layer_swap": [{"backward_prefetch": 1, "layers": [0, 1, 2, 20]}]}
    assert config["recompute_config"]["recompute"] is False
    mg = export_plan(plan, "megatron")
    assert any("swap_layers" in u for u in mg.unsupported)


def test_swapped_activations_count_against_host_memory_and_plans_name_one_count_per_stage():
    swapped = replace(BASE, swap_layers=(8, 4, 2, 0))
    raw = dict(H100.raw)
    raw["host"] = {**raw["host"], "memory_gib": 16}
    small_host = hardware_from_dict(raw, "test")
    e = estimate(MODEL, small_host, CLUSTER, JOB, swapped)
    assert not e.feasible and any("swapped activations" in r for r in e.reasons)
    plan = Plan(model=MODEL, hardware=H100, cluster=CLUSTER, training=JOB, strategy=swapped)
    data = json.loads(dumps_plan(plan))
    data["parallel"]["swap_layers"] = [8]
    with pytest.raises(AdvisorError, match="one per pipeline stage"):
        plan_from_dict(data)
