"""NVFP4 (advisor.cost.fp8): the linear layers' GEMMs on Blackwell's FP4 tensor cores, priced from Transformer
Engine's measured kernel times, refused where it cannot run, and checked on Megatron-Bridge's measured NVFP4 runs."""

from __future__ import annotations

from dataclasses import replace

import pytest

from advisor.commands.inputs import resolve_inputs
from advisor.cost import fp8
from advisor.cost.estimate import estimate
from advisor.errors import AdvisorError
from advisor.space.strategy import Strategy
from advisor.validation.accuracy import predict
from advisor.validation.runs import load_runs

LAYOUT = Strategy(dp=8, tp=2, pp=4, virtual_pipeline_stages=5, pipeline_schedule="interleaved-1f1b",
                  sequence_parallel=True, micro_batch_size=1, num_micro_batches=32, zero_stage=1)


def test_the_gemm_time_is_the_measured_kernel_ratio_bounded_by_the_peak_ratio():
    job = resolve_inputs("llama3-70b", "gb200-nvl72", devices=64, dtype="fp8", fp8_recipe="nvfp4").job
    # TE's gemm_profiling guide on the B300: 3.764 ms of NVFP4 GEMMs per layer against 6.812 ms per-tensor FP8
    assert fp8.gemm_time_factor(job, 3.0) == pytest.approx(3.764 / 6.812)
    assert fp8.gemm_time_factor(job, 2.0) == pytest.approx(3.764 / 6.812)     # Blackwell's 2x peak does not bind
    assert fp8.gemm_time_factor(job, 1.5) == pytest.approx(1 / 1.5)           # a lower peak ratio would
    with pytest.raises(AdvisorError, match="no FP4 tensor cores"):      # a hand-written plan on another device
        fp8.gemm_time_factor(job, None)
    # casts: the amax pass, the cast to two 4-bit copies with their E4M3 scales; weights 1 + 2/16 bytes
    assert fp8.SEPARATE_CAST_BYTES["nvfp4"] == pytest.approx(2 + 2 + 0.5 + 0.5 + 2 / 16)
    assert fp8.weight_copy_bytes_per_param(job) == pytest.approx(1 + 2 / 16)
    assert fp8.saved_input_bytes(job) == pytest.approx(0.5 + 1 / 16)


def test_nvfp4_is_faster_than_mxfp8_and_keeps_less_memory():
    mx = resolve_inputs("llama3-70b", "gb200-nvl72", devices=64, global_batch_size=256, seq_length=8192,
                        dtype="fp8", fp8_recipe="mxfp8")
    nv = resolve_inputs("llama3-70b", "gb200-nvl72", devices=64, global_batch_size=256, seq_length=8192,
                        dtype="fp8", fp8_recipe="nvfp4")
    a = estimate(mx.model, mx.hardware, mx.cluster, mx.job, LAYOUT)
    b = estimate(nv.model, nv.hardware, nv.cluster, nv.job, LAYOUT)
    assert b.time_s["compute"] < a.time_s["compute"]
    assert b.tokens_per_s > a.tokens_per_s
    assert b.memory_gib.activations < a.memory_gib.activations     # the saved inputs in 4 bits


@pytest.mark.parametrize("hardware,job,words", [
    ("dgx-h100", {}, "NVFP4 runs on NVIDIA Blackwell's FP4 tensor cores, not on the H100"),
    ("gb200-nvl72", {"framework_release": "0.14"}, "runs the FP8 recipes delayed, tensorwise, mxfp8, blockwise"),
    ("gb200-nvl72", {"framework": "torchtitan"}, "runs the FP8 recipes tensorwise, mxfp8"),
    ("gb200-nvl72", {"fp8_param_gather": True}, "gathered in BF16"),
])
def test_nvfp4_where_it_cannot_run_is_refused(hardware, job, words):
    with pytest.raises(AdvisorError, match=words):
        resolve_inputs("llama3-8b", hardware, nodes=1, dtype="fp8", fp8_recipe="nvfp4", **job)


def test_the_measured_nvfp4_runs_are_in_the_set_and_predicted_within_15_percent():
    """Megatron-Bridge 26.02's four NVFP4 rows (Llama 3 70B and 3.1 405B on GB200 and GB300 NVL72): none left out,
    none fitted (the Blackwell constants are fitted on the set's FP8 and BF16 runs)."""
    runs = [r for r in load_runs() if r.id.endswith("-nvfp4")]
    assert sorted(r.id for r in runs) == sorted(
        f"mbridge-26.02-{m}-{n}-nvfp4" for m in ("gb200", "gb300") for n in ("llama3-70b", "llama3.1-405b"))
    for r in runs:
        assert r.excluded is None and r.job.recipe == "nvfp4", r.id
        assert abs(predict(r).error) < 0.15, (r.id, predict(r).error)
    same = {r.id: r for r in load_runs()}
    # the same layout measured in MXFP8 on GB200: NVFP4 predicted faster, as measured (4,458 against 3,613 tokens/s)
    nv, mx = same["mbridge-26.02-gb200-llama3-70b-nvfp4"], same["mbridge-26.02-gb200-llama3-70b-mxfp8"]
    assert replace(nv.strategy) == replace(mx.strategy)
    assert predict(nv).predicted_tokens_per_s_per_device > predict(mx).predicted_tokens_per_s_per_device


@pytest.mark.parametrize("recipe", ["nvfp4", "delayed"])
def test_a_recipe_torchtitan_does_not_run_is_named_not_a_crash(recipe):
    """Exporting a Megatron FP8 plan to torchtitan: no converter is written for a recipe torchtitan has none for, and
    the recipe is among what keeps the launch from the price (before, the exporter raised KeyError)."""
    from advisor.commands.recommend import recommend
    from advisor.export import export_plan

    i = resolve_inputs("llama3-8b", "dgx-b200", nodes=1, dtype="fp8", fp8_recipe=recipe)
    plan = recommend(i.model, i.hardware, i.cluster, i.job, top_k=1).plans[0]
    result = export_plan(plan, "torchtitan")
    assert "converters" not in result.files["torchtitan.toml"]
    assert f"training.framework = torchtitan: 'fp8_recipe' = {recipe}: framework torchtitan runs the FP8 recipes " \
        "tensorwise, mxfp8" in result.unsupported
