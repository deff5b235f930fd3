"""How measured runs are read (torchtitan, MindFormers), how a fit is written into a profile, and how
estimates say they extrapolate; the new Megatron settings through the CLI, the plan and the export."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import yaml
from typer.testing import CliRunner

from advisor.cli import app
from advisor.cost.confidence import confidence, summarize
from advisor.cost.estimate import estimate
from advisor.errors import AdvisorError
from advisor.space.strategy import Strategy
from advisor.specs.hardware import PROFILES_DIR, hardware_from_dict, load_hardware
from advisor.specs.job import Cluster, TrainingJob
from advisor.specs.model import load_model, model_from_dict
from advisor.validation.fit import Constant, profile_raw
from advisor.validation.runs import load_runs
from advisor.validation.targets import TARGETS, carried_constant, fit_per_machine, fitted_runs
from advisor.validation.torchtitan import load_torchtitan_runs
from advisor.validation.write import fitted_text, with_calibration

runner = CliRunner()


# ---- reading measured runs ---------------------------------------------------------------------------
def test_torchtitan_rows_as_torchtitan_ran_them():
    runs = {r.id: r for r in load_torchtitan_runs()}
    assert len(runs) == 26
    t5 = runs["torchtitan-h100-405b-t5-1f1b"].strategy
    # local batch 32 split into as many micro-batches as stages (pipeline_parallel_microbatches default)
    assert (t5.pp, t5.num_micro_batches, t5.micro_batch_size) == (8, 8, 4)
    assert runs["torchtitan-h100-405b-t5-1f1b"].job.fp8_param_gather
    # FSDP over dp_shard x cp: FSDP 1 with CP 8 is still sharded over 8 ranks
    cp8 = runs["torchtitan-h100-8b-t2-cp8"].strategy
    assert (cp8.dp, cp8.cp, cp8.zero_stage) == (1, 8, 3)
    assert runs["torchtitan-h100-8b-t2-cp8"].measured_peak_memory_gib == 84.5


def test_mindspore_optimizer_parallel_and_megatron_recompute_modules():
    runs = {r.id: r for r in load_runs()}
    # no gradient accumulation: weights gathered for the step, gradients reduce-scattered (ZeRO-2)
    assert runs["mindformers-llama2-13b-atlas-800t-a2"].strategy.zero_stage == 2
    # gradient accumulation keeps the accumulated gradients whole (ZeRO-1)
    assert runs["mindformers-llama2-7b-atlas-800t-a2"].strategy.zero_stage == 1
    oss = runs["mbridge-26.02-h100-gpt-oss-120b-bf16"]
    assert oss.job.recompute_modules == ("layernorm", "moe_act")
    assert runs["mbridge-25.09-h100-deepseekv3-fp8-cs-dropless"].job.recompute_modules == ("mla_up_proj", "mlp")
    assert runs["mbridge-26.02-gb200-llama3-70b-fp8"].excluded.startswith("CPU activation offload of 40 layers")


# ---- fits written into profiles ------------------------------------------------------------------------
def test_fit_round_trips_through_the_profile_text():
    target = TARGETS["H100"]
    path = PROFILES_DIR / "dgx-h100.yaml"
    values = {"gemm_scale.bf16": 0.7, "gemm_scale.fp8": 0.6, "memory_efficiency": 0.66, "launch_overhead_us": 21.0,
              "inter_efficiency": 0.7}
    raw = profile_raw(target, "dgx-h100", load_hardware("dgx-h100").raw, values)
    text = with_calibration(fitted_text(path.read_text(), raw, "test note"), summarize(fitted_runs(target)))
    again = hardware_from_dict(yaml.safe_load(text), "round trip")
    assert again.device.memory_efficiency == 0.66
    assert again.device.launch_overhead_us == 21.0
    assert again.inter.efficiency == 0.7
    top_bf16 = max(y for _, y in again.device.gemm_curve("bf16"))
    top_fp8 = max(y for _, y in again.device.gemm_curve("fp8"))
    assert abs(top_bf16 / top_fp8 - 0.7 / 0.6) < 0.01
    assert again.raw["calibration"]["runs"] == len(fitted_runs(target))
    # the comments outside the rewritten keys survive
    assert text.count("# ") >= path.read_text().count("# ") - 2
    assert "test note" in text


def test_blackwell_systems_share_the_gpus_constants_and_keep_their_hosts():
    """DGX B200 and GB200 NVL72 are fitted together: one value of the GPU's constants, each system's
    own launch overhead ("key@profile"), and a size factor relative to each system's peak ratio to H100."""
    target = TARGETS["Blackwell"]
    assert target.profiles == ("dgx-b200", "gb200-nvl72")
    values = {"gemm_size_factor": 1.5, "gemm_scale.fp8": 0.6, "attention_scale.te": 0.9, "memory_efficiency": 0.7,
              "launch_overhead_us@dgx-b200": 50.0, "launch_overhead_us@gb200-nvl72": 20.0}
    b200, gb200 = (profile_raw(target, p, load_hardware(p).raw, values)["device"] for p in target.profiles)
    assert (b200["launch_overhead_us"], gb200["launch_overhead_us"]) == (50.0, 20.0)
    assert b200["memory_efficiency"] == gb200["memory_efficiency"] == 0.7
    assert b200["attention_efficiency"] == gb200["attention_efficiency"]
    h100 = load_hardware("dgx-h100").device.peak_flops("bf16")
    for dev, profile in ((b200, "dgx-b200"), (gb200, "gb200-nvl72")):
        ratio = load_hardware(profile).device.peak_flops("bf16") / h100       # 2.27 and 2.53
        assert abs(dev["matmul_efficiency"]["bf16"][0][0] / 0.01 - 1.5 * ratio) < 1e-6   # the shape starts at 0.01 GFLOP
    # a constant of a profile the target does not fit is refused
    with pytest.raises(ValueError, match="dgx-b300"):
        replace(target, constants=target.constants + (Constant("launch_overhead_us@dgx-b300", 30.0, 2.0, 120.0),))


def test_blackwell_ultra_starts_where_the_blackwell_fit_left_off():
    """B300 systems are fitted on their own runs from the B200 fit's constants: at the starting
    constants GB300 NVL72 is GB200 NVL72's profile (the same peaks and Grace host), DGX B300 keeps DGX
    B200's host launch overhead, and both hold BF16 at H100's scale."""
    target = TARGETS["Blackwell-Ultra"]
    assert target.profiles == ("dgx-b300", "gb300-nvl72")
    start = {p: profile_raw(target, p, load_hardware(p).raw, {})["device"] for p in target.profiles}
    gb200, b200 = load_hardware("gb200-nvl72").raw["device"], load_hardware("dgx-b200").raw["device"]
    for key in ("matmul_efficiency", "attention_efficiency"):
        for kind, curve in gb200[key].items():
            flat = [v for point in curve for v in point]
            assert [v for point in start["gb300-nvl72"][key][kind] for v in point] == pytest.approx(flat, rel=2e-3), kind
    assert start["gb300-nvl72"]["launch_overhead_us"] == gb200["launch_overhead_us"]
    assert start["dgx-b300"]["launch_overhead_us"] == b200["launch_overhead_us"]
    assert start["dgx-b300"]["memory_efficiency"] == b200["memory_efficiency"]
    assert "gemm_scale.bf16" not in {c.name for c in target.constants}


def test_bundled_blackwell_ultra_profiles_are_the_blackwell_fit_with_their_fp8_scale():
    """dgx-b300 and gb300-nvl72 carry the bundled Blackwell fit's constants but for their own FP8 GEMM
    scale: a Blackwell refit written without the Ultra one leaves them stale, and this says so."""
    target = TARGETS["Blackwell-Ultra"]
    assert [c.name for c in target.constants] == ["gemm_scale.fp8"]
    for p in target.profiles:
        own = {"gemm_scale.fp8": carried_constant(target, p, "gemm_scale.fp8")}
        want = profile_raw(target, p, load_hardware(p).raw, own)["device"]
        have = load_hardware(p).raw["device"]
        for key in ("matmul_efficiency", "attention_efficiency"):
            for kind, curve in want[key].items():
                flat = [v for point in curve for v in point]
                assert [v for point in have[key][kind] for v in point] == pytest.approx(flat, rel=2e-3), (p, kind)
        assert (have["memory_efficiency"], have["launch_overhead_us"]) == pytest.approx(
            (want["memory_efficiency"], want["launch_overhead_us"]), rel=1e-3)
    with pytest.raises(ValueError, match="inter_efficiency"):
        carried_constant(target, "dgx-b300", "inter_efficiency")


def test_a_device_fitted_per_machine_keeps_each_machines_runs_apart():
    per_machine = fit_per_machine(TARGETS["910B"], evaluations=3)
    assert {m: len(errors) for m, (_, errors) in per_machine.items()} == {"atlas-800t-a2": 12, "atlas-900-a2-podc": 5}
    assert all(set(values) == {c.name for c in TARGETS["910B"].constants} for values, _ in per_machine.values())


# ---- confidence ------------------------------------------------------------------------------------------
def test_estimates_say_where_they_extrapolate():
    hw = load_hardware("dgx-h100")
    model = load_model("llama3-70b")
    s = Strategy(dp=2, tp=4, pp=8, virtual_pipeline_stages=5, sequence_parallel=True, micro_batch_size=1,
                 num_micro_batches=64, zero_stage=1, pipeline_schedule="interleaved-1f1b")
    job = TrainingJob(global_batch_size=128, seq_length=8192, dtype="fp8", fp8_recipe="tensorwise")
    inside = confidence(model, hw, Cluster.of(hw, devices=64), job, s)
    assert inside.calibrated and inside.extrapolated == ()
    outside = confidence(model, hw, Cluster.of(hw, devices=64), TrainingJob(global_batch_size=128, seq_length=8192,
                         dtype="fp8", fp8_recipe="mxfp8"), s)
    assert not outside.calibrated
    assert any("fp8:mxfp8" in part for part in outside.extrapolated)
    e = estimate(model, hw, Cluster.of(hw, devices=64), job, s)
    assert e.confidence == inside
    # no H100 calibration run used CUDA graphs (Megatron-Bridge's recipes graph on Blackwell only)
    graphed = confidence(model, hw, Cluster.of(hw, devices=64), replace(job, cuda_graphs=("attn",)), s)
    assert graphed.extrapolated == ("cuda-graphs on dgx-h100: no calibration run uses it",)
    b200 = load_hardware("dgx-b200")
    assert "cuda-graphs" in b200.raw["calibration"]["parallelism"]


def test_attention_beyond_its_measurements_is_flagged():
    hw = load_hardware("dgx-h100")
    job = TrainingJob(global_batch_size=16, seq_length=4096)
    narrow = model_from_dict({"name": "t", "source": "test", "num_layers": 2, "hidden_size": 4096,
                              "num_attention_heads": 128, "vocab_size": 32000, "seq_length": 4096}, "t")  # head width 32
    s = Strategy(dp=16, tp=1, pp=1, micro_batch_size=1, num_micro_batches=1)
    notes = confidence(narrow, hw, Cluster.of(hw, devices=16), job, s).extrapolated
    assert "head width 32 outside the 64-256 measured for te" in notes
    # a ring of 16 over 4,096 tokens runs 256-token kernels, below the curve's first point (512)
    ring = Strategy(dp=1, tp=1, pp=1, cp=16, micro_batch_size=1, num_micro_batches=16)
    notes = confidence(load_model("llama3-8b"), hw, Cluster.of(hw, devices=16), job, ring).extrapolated
    assert any("ring attention steps of 256 tokens" in n for n in notes)
    ulysses = confidence(load_model("llama3-8b"), hw, Cluster.of(hw, devices=16), job,
                         replace(ring, cp_comm="a2a", cp=8, dp=2)).extrapolated
    assert not any("ring attention" in n for n in ulysses)


def test_recommend_json_and_table_carry_the_calibration():
    result = runner.invoke(app, ["recommend", "--model", "llama3-8b", "--hardware", "dgx-h100", "--devices", "8",
                                 "--top", "2", "--json"])
    assert result.exit_code == 0, result.output
    plans = json.loads(result.output)["plans"]
    for plan in plans:
        assert set(plan["prediction"]["confidence"]) == {"calibrated", "extrapolated"}
    table = runner.invoke(app, ["recommend", "--model", "llama3-8b", "--hardware", "ascend-910", "--devices", "8", "--top", "1"])
    assert table.exit_code == 0, table.output
    flat = " ".join(table.output.split())
    assert "plan 1 extrapolates: ascend-910: no measured runs behind this profile's constants" in flat


# ---- Megatron's recompute modules end to end ---------------------------------------------------------------
def test_recompute_modules_flag_plan_and_export(tmp_path):
    plan = tmp_path / "plan.json"
    result = runner.invoke(app, ["recommend", "--model", "mixtral-8x7b", "--hardware", "dgx-h100", "--devices", "64",
                                 "--recompute", "selective", "--recompute-modules", "layernorm,moe_act",
                                 "--top", "1", "--out", str(plan)])
    assert result.exit_code == 0, result.output
    data = json.loads(plan.read_text())
    assert data["training"]["recompute_modules"] == ["layernorm", "moe_act"]
    exported = runner.invoke(app, ["export", str(plan), "--to", "megatron", "--json"])
    assert exported.exit_code == 0, exported.output
    script = json.dumps(json.loads(exported.output)["files"])
    assert "--recompute-modules" in script and "layernorm" in script and "moe_act" in script
    estimate_out = runner.invoke(app, ["estimate", "--plan", str(plan), "--json"])
    assert estimate_out.exit_code in (0, 1), estimate_out.output
    bad = runner.invoke(app, ["estimate", "--model", "llama3-8b", "--hardware", "dgx-h100", "--devices", "8",
                              "--framework", "torchtitan", "--recompute-modules", "layernorm"])
    assert isinstance(bad.exception, AdvisorError) and bad.exception.exit_code == 2
    assert "Megatron" in str(bad.exception)
