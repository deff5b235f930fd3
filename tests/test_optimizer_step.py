"""The optimizer step's traffic as each framework implements it (advisor.cost.optimizer_step)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from _export_plans import plans
from advisor.cost.estimate import estimate
from advisor.cost.optimizer_step import ADAM_BYTES_PER_PARAM, bytes_per_param
from advisor.errors import AdvisorError
from advisor.export import export_plan
from advisor.plan import plan_from_dict, plan_to_dict
from advisor.space.strategy import Strategy
from advisor.specs.hardware import load_hardware
from advisor.specs.job import Cluster, TrainingJob
from advisor.specs.model import load_model
from advisor.validation.runs import load_runs


def _job(**kw) -> TrainingJob:
    return TrainingJob(global_batch_size=64, seq_length=4096, **kw)


def test_bytes_per_parameter_count_each_kernel():
    gpu, npu = load_hardware("dgx-h100"), load_hardware("ascend-910b")
    assert ADAM_BYTES_PER_PARAM == 28
    assert bytes_per_param(gpu, None) == 28
    assert bytes_per_param(gpu, _job(framework="megatron")) == 28
    # torch.optim's per-operation AdamW: mul_, lerp_, mul_, addcmul_, sqrt, div, add_, addcdiv_
    assert bytes_per_param(gpu, _job(framework="pytorch", optimizer_impl="unfused")) == 80
    assert bytes_per_param(gpu, _job(framework="torchtitan", optimizer_impl="fused")) == 28
    # MindFormers on fp32 weights: the update (one in-place fused kernel: 28; 12 operations and 3
    # Assign: 140) + ClipGradNorm (20) + the loss-scale division (8), in mixed precision as in fp32
    for dtype in ("bf16", "fp32"):
        assert bytes_per_param(npu, _job(framework="mindspore", dtype=dtype)) == 28 + 20 + 8
        assert bytes_per_param(npu, _job(framework="mindspore", dtype=dtype, optimizer_impl="unfused")) == 140 + 20 + 8


def test_a_measured_profile_figure_prices_the_fused_step_only():
    hw = load_hardware("dgx-h100")
    measured = dataclasses.replace(hw, device=dataclasses.replace(hw.device, optimizer_bytes_per_param=50.0))
    assert bytes_per_param(measured, _job(framework="pytorch")) == 50.0
    assert bytes_per_param(measured, _job(framework="pytorch", optimizer_impl="unfused")) == 80


def _optimizer_s(job, **strategy):
    model, hw = load_model("llama2-7b"), load_hardware("ascend-910b")
    s = Strategy(**{"dp": 8, "tp": 1, "pp": 1, "micro_batch_size": 1, "num_micro_batches": 1, "zero_stage": 1, **strategy})
    rate = hw.device.memory_bandwidth_gbps * 1e9 * hw.device.memory_efficiency
    return estimate(model, hw, Cluster.of(hw, devices=8), job, s).time_s["optimizer"], model.num_params / rate


def test_the_step_time_follows_the_traffic():
    fused, per_byte = _optimizer_s(_job(framework="mindspore", optimizer_impl="fused"))
    unfused, _ = _optimizer_s(_job(framework="mindspore", optimizer_impl="unfused"))
    assert unfused / fused == pytest.approx(168 / 56, rel=1e-9)
    # every parameter over 8 optimizer-parallel ranks, 56 bytes each, at the profile's memory-bound rate
    assert fused == pytest.approx(56 * per_byte / 8, rel=0.01)


def test_mindspore_accumulates_each_micro_batch_in_a_pass_of_its_own():
    job = _job(framework="mindspore")
    one, per_byte = _optimizer_s(job)
    # 8 micro-batches: 8 AssignAdds of 12 bytes (fp32) over the whole gradient (ZeRO-1 keeps it whole) ...
    eight, _ = _optimizer_s(job, num_micro_batches=8)
    assert eight - one == pytest.approx(8 * 12 * per_byte, rel=0.01)
    # ... over its shard with ZeRO-2 (gradient_accumulation_shard)
    sharded, _ = _optimizer_s(job, num_micro_batches=8, zero_stage=2)
    one_z2, _ = _optimizer_s(job, zero_stage=2)
    assert sharded - one_z2 == pytest.approx(8 * 12 * per_byte / 8, rel=0.01)
    # Megatron accumulates inside the weight-gradient GEMM: no pass
    assert _optimizer_s(_job(), num_micro_batches=8)[0] == pytest.approx(_optimizer_s(_job())[0], rel=1e-9)


def test_unknown_or_unavailable_implementations_are_refused():
    with pytest.raises(AdvisorError, match="optimizer_impl"):
        _job(framework="pytorch", optimizer_impl="apex")
    with pytest.raises(AdvisorError, match="Megatron-LM's Adam is always a fused kernel"):
        _job(framework="megatron", optimizer_impl="unfused")


def test_the_plan_keeps_the_implementation():
    plan = next(p for p in plans().values() if p.training.optimizer == "adamw")
    plan = dataclasses.replace(plan, training=dataclasses.replace(plan.training, framework="pytorch",
                                                                  optimizer_impl="unfused"))
    data = json.loads(json.dumps(plan_to_dict(plan)))
    assert data["training"]["optimizer_impl"] == "unfused"
    assert plan_from_dict(data).training.optimizer_impl == "unfused"
    data["training"]["optimizer_impl"] = "turbo"
    with pytest.raises(AdvisorError, match="optimizer_impl"):
        plan_from_dict(data)


def test_exports_ask_for_the_priced_implementation():
    plan = next(p for p in plans().values() if p.training.optimizer == "adamw")
    unfused = dataclasses.replace(plan, training=dataclasses.replace(plan.training, framework="pytorch",
                                                                     optimizer_impl="unfused"))
    ds = json.loads(export_plan(unfused, "deepspeed").files["ds_config.json"])
    assert ds["optimizer"]["params"]["torch_adam"] is True
    ds = json.loads(export_plan(plan, "deepspeed").files["ds_config.json"])
    assert "torch_adam" not in ds["optimizer"]["params"]
    titan = export_plan(unfused, "torchtitan")
    assert any('implementation = "foreach"' in n for n in titan.notes)


def test_calibration_rows_run_the_optimizer_their_yaml_names():
    unfused = {r.id for r in load_runs() if r.job.optimizer_impl == "unfused"}
    assert unfused == {f"mindformers-{n}" for n in (
        "llama3.1-8b-atlas-900-a2-podc", "glm4-9b-atlas-900-a2-podc", "qwen2-0.5b-atlas-900-a2-podc",
        "qwen2-1.5b-atlas-900-a2-podc", "deepseek-coder1.5-7b-atlas-900-a2-podc", "yi-6b-atlas-800t-a2",
        "yi-34b-atlas-800t-a2")}
