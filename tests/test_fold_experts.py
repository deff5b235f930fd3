"""MoE parallel folding (Strategy.fold_experts; Liu et al. 2025, Megatron-Core --expert-tensor-parallel-size 1,
torchtitan expert_tensor_parallel_degree 1): the experts whole on each rank, ep taking its ranks from tp x dp x cp,
priced, searched, refused where it cannot run, exported and read back."""

from __future__ import annotations

from dataclasses import replace

import pytest

from advisor.commands.estimate_request import estimate_request
from advisor.commands.inputs import resolve_inputs
from advisor.commands.recommend import recommend
from advisor.cost.estimate import estimate
from advisor.cost.placement import placements
from advisor.errors import AdvisorError
from advisor.export import export_plan
from advisor.search import Pins
from advisor.space.strategy import Strategy, StrategyBatch

# Qwen3-235B-A22B on 256 H100 as the Megatron-Bridge 25.11/26.02 recipes run it: tp 2, pp 8, ep 32 > dp 16
RECIPE = {"tp": 2, "pp": 8, "ep": 32, "sequence_parallel": True, "virtual_pipeline_stages": 4, "zero_stage": 1}
JOB = {"global_batch_size": 2048, "seq_length": 4096, "dtype": "fp8"}


def _estimate(strategy, **job):
    return estimate_request("qwen3-235b-a22b", "dgx-h100", None, 256, job={**JOB, **job}, strategy=strategy)


def test_ep_beyond_dp_x_cp_needs_the_experts_folded():
    with pytest.raises(AdvisorError, match="divide dp x cp .*--fold-experts|divide dp x cp.*ep = 32, dp x cp = 16"):
        _estimate(RECIPE)
    folded = _estimate({**RECIPE, "fold_experts": True})
    assert folded.strategy.fold_experts and folded.estimate.tokens_per_s > 0
    with pytest.raises(AdvisorError, match="folded"):            # tp = 1: the same plan, not a second one
        _estimate({**RECIPE, "tp": 1, "ep": 8, "fold_experts": True, "sequence_parallel": False})
    with pytest.raises(AdvisorError, match="--fold-experts needs a framework that runs it \\(megatron, torchtitan\\)"):
        _estimate({"ep": 8, "tp": 2, "fold_experts": True, "zero_stage": 1}, framework="deepspeed", dtype="bf16")


def test_folding_moves_the_experts_off_the_tensor_parallel_group():
    """Same layout with ep <= dp x cp: folded, each rank holds tp x the expert weights and the MoE block has no
    tensor-parallel collective; the experts' data-parallel group shrinks by tp, the FLOPs stay."""
    i = resolve_inputs("qwen3-235b-a22b", "dgx-h100", devices=256, **JOB)
    split = Strategy(dp=16, tp=2, pp=8, ep=16, sequence_parallel=True, micro_batch_size=1, num_micro_batches=128,
                     zero_stage=1)
    folded = replace(split, fold_experts=True)
    a, b = (estimate(i.model, i.hardware, i.cluster, i.job, s) for s in (split, folded))
    assert b.memory_gib.parameters > 1.5 * a.memory_gib.parameters       # experts are most of the weights
    assert b.time_s["tp_comm"] < a.time_s["tp_comm"]
    assert b.mfu * b.step_time_s == pytest.approx(a.mfu * a.step_time_s, rel=1e-9)   # same model FLOPs
    groups = placements(i.hardware, StrategyBatch.from_strategies([split, folded], i.model.num_layers))
    assert list(groups["ep"].n) == [16, 16] and list(groups["edp"].n) == [1, 2]


@pytest.mark.parametrize("framework, name, model, devices, ep, job", [
    ("megatron", "megatron_pretrain_gpt.sh", "qwen3-235b-a22b", 256, 32, JOB),
    ("torchtitan", "torchtitan.toml", "mixtral-8x7b", 64, 8, {}),
])
def test_a_folded_plan_exports_and_reads_back_at_its_price(tmp_path, framework, name, model, devices, ep, job):
    i = resolve_inputs(model, "dgx-h100", devices=devices, framework=framework, **job)
    pins = Pins(tp=2, ep=ep, fold_experts=True)
    plans = recommend(i.model, i.hardware, i.cluster, i.job, pins=pins, top_k=2).plans
    assert plans and all(p.strategy.fold_experts and p.strategy.ep == ep for p in plans)
    for plan in plans:
        result = export_plan(plan, framework)
        assert not result.unsupported, result.unsupported
        text = result.files[name]
        assert ("--expert-tensor-parallel-size 1" in text) if framework == "megatron" else \
            ("expert_tensor_parallel_degree = 1" in text)
        for file, body in result.files.items():
            (tmp_path / file).write_text(body)
        back = estimate_request(model, "dgx-h100", None, None, job={}, strategy={}, launch=str(tmp_path / name))
        assert back.strategy.fold_experts
        assert back.estimate.tokens_per_s == pytest.approx(plan.prediction["tokens_per_s"], rel=1e-12)


def test_torchtitans_default_expert_tensor_parallelism_is_folded(tmp_path):
    """torchtitan 0.2's expert_tensor_parallel_degree defaults to 1 (job_config.py): a TOML that leaves it out
    runs folded experts; ep is a multiple of tp x cp then (parallel_dims.py)."""
    toml = tmp_path / "moe.toml"
    toml.write_text("[parallelism]\ndata_parallel_shard_degree = -1\ntensor_parallel_degree = 2\n"
                    "expert_parallel_degree = 8\n[training]\nlocal_batch_size = 1\nglobal_batch_size = 64\n"
                    "seq_len = 4096\n")
    r = estimate_request("mixtral-8x7b", "dgx-h100", None, 64, job={}, strategy={}, launch=str(toml))
    assert r.strategy.fold_experts and r.strategy.ep == 8
    with pytest.raises(AdvisorError, match="ep a multiple of cp \\(tp x cp with the experts folded\\)"):
        estimate_request("mixtral-8x7b", "dgx-h100", None, 64, job={"framework": "torchtitan"},
                         strategy={"tp": 4, "ep": 2, "fold_experts": True, "zero_stage": 3, "sequence_parallel": True})


def test_the_search_offers_folded_plans_only_where_they_differ():
    i = resolve_inputs("mixtral-8x7b", "dgx-h100", devices=64)
    result = recommend(i.model, i.hardware, i.cluster, i.job, pins=Pins(tp=2, fold_experts=True), top_k=5)
    assert all(p.strategy.fold_experts and p.strategy.tp == 2 and p.strategy.ep > 1 for p in result.plans)
    dense = resolve_inputs("llama3-8b", "dgx-h100", devices=8)
    with pytest.raises(AdvisorError):
        recommend(dense.model, dense.hardware, dense.cluster, dense.job, pins=Pins(fold_experts=True), top_k=1)
