"""Balanced pipeline stages (advisor.search.stages): exact, never worse than uniform, within memory."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest

from advisor.cost.estimate import estimate
from advisor.search.stages import (
    balanced_stage_layers, balanced_stage_layers_batch, stage_cost_model, stage_imbalance, stage_plan,
)
from advisor.space.strategy import Strategy, StrategyBatch
from advisor.specs.hardware import load_hardware
from advisor.specs.job import Cluster, TrainingJob
from advisor.specs.model import load_model, model_from_dict

A100 = load_hardware("dgx-a100-80g")
BLOOM = load_model("bloom-176b")
BLOOM_JOB = TrainingJob(global_batch_size=2048, seq_length=2048)
BLOOM_PLAN = Strategy(dp=8, tp=4, pp=12, micro_batch_size=2, num_micro_batches=128, zero_stage=1,
                      sequence_parallel=True, recompute="selective")


def small_model(layers: int, vocab: int = 32000, moe_frequency: int | None = None):
    raw = {"name": "small", "source": "test", "num_layers": layers, "hidden_size": 1024, "num_attention_heads": 16,
           "vocab_size": vocab, "seq_length": 1024}
    if moe_frequency:
        raw["moe"] = {"num_experts": 8, "top_k": 2, "expert_ffn_hidden_size": 4096, "layer_frequency": moe_frequency}
    return model_from_dict(raw, "small")


def test_bloom_head_stage_gets_fewer_layers():
    plan = stage_plan(BLOOM, A100, BLOOM_JOB, BLOOM_PLAN)
    assert sum(plan.stage_layers) == 70 and len(plan.stage_layers) == 12 and min(plan.stage_layers) >= 1
    assert plan.stage_layers[-1] < max(plan.stage_layers)          # the 250,880-word LM head is on the last stage
    assert plan.balanced_slowest_s < plan.uniform_slowest_s
    assert plan.balanced_imbalance < plan.uniform_imbalance
    assert plan.fits
    # the cost model agrees: the balanced split trains faster
    cluster = Cluster.of(A100, devices=BLOOM_PLAN.devices)
    uniform = estimate(BLOOM, A100, cluster, BLOOM_JOB, replace(BLOOM_PLAN, stage_layers=plan.uniform_layers))
    balanced = estimate(BLOOM, A100, cluster, BLOOM_JOB, replace(BLOOM_PLAN, stage_layers=plan.stage_layers))
    assert balanced.step_time_s < uniform.step_time_s
    assert stage_imbalance(BLOOM, A100, BLOOM_JOB, BLOOM_PLAN, plan.stage_layers) == pytest.approx(plan.balanced_imbalance)


@pytest.mark.parametrize("layers, pp, vocab", [(10, 3, 32000), (12, 4, 250000), (9, 2, 500000), (16, 5, 64000)])
def test_partition_is_the_exact_min_max(layers, pp, vocab):
    model = small_model(layers, vocab)
    job = TrainingJob(global_batch_size=64, seq_length=1024)
    s = Strategy(dp=1, tp=1, pp=pp, num_micro_batches=64)
    sm = stage_cost_model(model, A100, job, s)
    best = min(
        sm.stage_times_s(model, split).max()
        for split in _compositions(layers, pp)
        if np.all(sm.stage_memory_bytes(model, split) <= sm.capacity_bytes)
    )
    got = balanced_stage_layers(model, A100, job, s)
    assert sm.stage_times_s(model, got).max() == pytest.approx(best, rel=1e-12)


def test_moe_and_dense_layers_are_weighed_apart():
    model = small_model(12, moe_frequency=3)                  # layers 2, 5, 8, 11 are MoE
    job = TrainingJob(global_batch_size=64, seq_length=1024)
    s = Strategy(dp=8, tp=1, pp=3, ep=8, num_micro_batches=64)
    sm = stage_cost_model(model, A100, job, s)
    assert sm.time_moe_s > sm.time_dense_s > 0
    got = balanced_stage_layers(model, A100, job, s)
    best = min(sm.stage_times_s(model, split).max() for split in _compositions(12, 3))
    assert sm.stage_times_s(model, got).max() == pytest.approx(best, rel=1e-12)


def test_memory_limits_the_first_stages():
    # 1F1B keeps p - i micro-batches in flight on stage i: on a device with room for only six layers
    # on stage 0, the first stage takes fewer layers than time alone would give it
    model = small_model(32)
    job = TrainingJob(global_batch_size=256, seq_length=1024)
    s = Strategy(dp=1, tp=1, pp=4, micro_batch_size=4, num_micro_batches=64)
    roomy = stage_cost_model(model, A100, job, s)
    assert balanced_stage_layers(model, A100, job, s)[0] >= 8
    room = roomy.stage_memory_bytes(model, (6, 9, 9, 8))[0] * 1.001
    hw = A100.with_overrides(memory_gib=room / 2 ** 30)
    sm = stage_cost_model(model, hw, job, s)
    plan = stage_plan(model, hw, job, s)
    assert plan.fits and plan.stage_layers[0] <= 6
    assert np.all(sm.stage_memory_bytes(model, plan.stage_layers) <= sm.capacity_bytes)
    best = min(sm.stage_times_s(model, split).max() for split in _compositions(32, 4)
               if np.all(sm.stage_memory_bytes(model, split) <= sm.capacity_bytes))
    assert sm.stage_times_s(model, plan.stage_layers).max() == pytest.approx(best, rel=1e-12)


def test_virtual_stages_keep_multiples():
    s = replace(BLOOM_PLAN, pp=7, virtual_pipeline_stages=2, pipeline_schedule="interleaved-1f1b", num_micro_batches=126,
                micro_batch_size=2, dp=8)
    job = TrainingJob(global_batch_size=2016, seq_length=2048)
    layers = balanced_stage_layers(BLOOM, A100, job, s)
    assert sum(layers) == 70 and all(n % 2 == 0 and n >= 2 for n in layers)


def test_single_stage_and_cache(monkeypatch):
    import advisor.search.stages as stages

    assert balanced_stage_layers(BLOOM, A100, BLOOM_JOB, replace(BLOOM_PLAN, pp=1, dp=96)) == (70,)
    first = stage_plan(BLOOM, A100, BLOOM_JOB, BLOOM_PLAN)

    def solved_again(*args, **kwargs):
        raise AssertionError("the stage plan was solved again: the cache missed")
    monkeypatch.setattr(stages, "_plans", solved_again)   # counted, not timed: no machine-speed dependence
    for _ in range(1000):                                 # cached: the stage layers given are ignored
        layers = balanced_stage_layers(BLOOM, A100, BLOOM_JOB, replace(BLOOM_PLAN, stage_layers=(1,) * 12))
        assert layers == first.stage_layers


def test_batch_version_matches():
    strategies = [BLOOM_PLAN, replace(BLOOM_PLAN, pp=10, dp=8, tp=4, num_micro_batches=128), replace(BLOOM_PLAN, pp=5)]
    batch = StrategyBatch.from_strategies(strategies, BLOOM.num_layers)
    table = balanced_stage_layers_batch(BLOOM, A100, BLOOM_JOB, batch)
    for i, s in enumerate(strategies):
        assert tuple(table[i, : s.pp]) == balanced_stage_layers(BLOOM, A100, BLOOM_JOB, s)


def _compositions(total: int, parts: int):
    for cuts in itertools.combinations(range(1, total), parts - 1):
        bounds = (0,) + cuts + (total,)
        yield tuple(b - a for a, b in zip(bounds, bounds[1:]))


def test_recommend_uses_balanced_stages_for_a_large_vocabulary():
    # BLOOM's 250,880-token LM head makes the last stage heavy: recommend gives it fewer layers and
    # the plan is faster than the even split.
    from dataclasses import replace as _replace

    from advisor.cost.estimate import estimate
    from advisor.commands.inputs import resolve_inputs
    from advisor.commands.recommend import recommend
    from advisor.search import Pins

    i = resolve_inputs("bloom-176b", "dgx-a100-80g", nodes=48, global_batch_size=2048)
    best = recommend(i.model, i.hardware, i.cluster, i.job, top_k=1, pins=Pins(pp=12, tp=4)).best
    layers = best.strategy.stage_layers
    assert sum(layers) == i.model.num_layers and layers[-1] < max(layers)
    even = estimate(i.model, i.hardware, i.cluster, i.job, _replace(best.strategy, stage_layers=None))
    assert best.prediction["step_time_s"] < even.step_time_s
