"""Memory-aware repartitioning (advisor.search.vpipe): stage sizes chosen with per-stage recomputation."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from advisor.cost.estimate import estimate
from advisor.search import vpipe
from advisor.search.vpipe import memory_aware_strategy
from advisor.space.strategy import Strategy
from advisor.specs.hardware import load_hardware
from advisor.specs.job import Cluster, TrainingJob
from advisor.specs.model import load_model

BASE = Strategy(dp=1, tp=2, pp=4, micro_batch_size=2, num_micro_batches=16, zero_stage=0, recompute="none")


def _setting(framework: str):
    model, hw = load_model("llama3-8b"), load_hardware("dgx-a100-40g")
    return model, hw, Cluster.of(hw, nodes=1), TrainingJob(global_batch_size=32, seq_length=8192, framework=framework)


def test_each_stage_recomputes_what_its_in_flight_micro_batches_need():
    model, hw, cluster, job = _setting("mindspore")
    assert not estimate(model, hw, cluster, job, BASE).feasible          # nothing recomputed: stage 0 overflows
    plan = memory_aware_strategy(model, hw, job, BASE)
    e = estimate(model, hw, cluster, job, plan)
    assert e.feasible and plan.recompute == "full" and sum(plan.stage_layers) == model.num_layers
    counts = plan.recompute_layers
    # 1F1B keeps pp micro-batches in flight on the first stage and one on the last
    assert list(counts) == sorted(counts, reverse=True) and counts[0] > counts[-1]
    # never slower than any even split with one recomputation count that fits (the enumerator's space)
    for k in range(0, 9):
        even = replace(BASE, recompute="full" if k else "none", recompute_layers=k or None)
        other = estimate(model, hw, cluster, job, even)
        if other.feasible:
            assert e.step_time_s <= other.step_time_s * (1 + 1e-9), k
    full = estimate(model, hw, cluster, job, replace(BASE, recompute="full"))
    assert e.step_time_s < 0.85 * full.step_time_s


def test_megatron_gets_one_count_for_every_stage_and_the_pytorch_stacks_none():
    model, hw, cluster, job = _setting("megatron")
    plan = memory_aware_strategy(model, hw, job, BASE)
    assert isinstance(plan.recompute_layers, int) and plan.recompute_layers > 0
    assert estimate(model, hw, cluster, job, plan).feasible
    interleaved = replace(BASE, virtual_pipeline_stages=2, pipeline_schedule="interleaved-1f1b")
    plan2 = memory_aware_strategy(model, hw, job, interleaved)
    assert plan2.recompute_layers % 2 == 0 and all(n % 2 == 0 for n in plan2.stage_layers)
    for framework in ("torchtitan", "pytorch"):
        assert memory_aware_strategy(model, hw, replace(job, framework=framework), BASE) is None


def test_one_count_for_every_stage_is_searched_over_all_counts_at_once():
    """Megatron's single count: the bottleneck of every count computed at once equals the min-max
    partition of each count computed alone (vpipe._partition), infeasible counts included."""
    model, hw, cluster, job = _setting("megatron")
    checked = 0
    for strategy in (BASE, replace(BASE, pp=2, tp=4), replace(BASE, pp=8, tp=1, micro_batch_size=1)):
        stages, layers, _ = vpipe._stage_spans(model, hw, job, strategy)
        counts = np.arange(0, model.num_layers // strategy.pp + 1, dtype=float)
        together = vpipe._count_bottlenecks(stages, layers, model.num_layers, counts)
        alone = [vpipe._partition(stages, layers, strategy.pp, model.num_layers, 1, float(c)) for c in counts]
        assert [np.inf if a is None else a[0] for a in alone] == together.tolist()
        checked += len(counts)
        assert np.isfinite(together).any() and np.isinf(together).any()
    assert checked > 30


def test_recommend_trades_offload_for_partial_recomputation(monkeypatch):
    """llama3-70b on 32 H100s with tp4 pp4, no cp and the optimizer on the device: under Megatron's ZeRO-1 (its
    most under pipelining) nothing fits without recomputation; recomputing some layers per stage (Megatron's
    block count) with the first stage lighter is faster than the even split's recomputation."""
    import advisor.commands.recommend as rec
    from advisor.search import Pins

    model, hw = load_model("llama3-70b"), load_hardware("dgx-h100")
    cluster = Cluster.of(hw, devices=32)
    job = TrainingJob(global_batch_size=64, seq_length=8192)
    pins = Pins(tp=4, pp=4, cp=1, virtual_pipeline_stages=1, offload_optimizer=False)
    best = rec.recommend(model, hw, cluster, job, pins=pins, top_k=1)
    s, e = best.plans[0].strategy, best.estimates[0]
    assert s.recompute == "full" and not s.offload_optimizer and isinstance(s.recompute_layers, int)
    assert s.stage_layers[0] < model.num_layers // 4
    assert e.feasible
    monkeypatch.setattr(rec, "repartition", lambda model, hw, cluster, job, batch, pins: batch)
    before = rec.recommend(model, hw, cluster, job, pins=pins, top_k=1).estimates[0]
    assert e.step_time_s < before.step_time_s
