"""The cost model on the calibration set (338 measured runs) and torchtitan's held-out tables.

Thresholds: the issue's goals where the fitted profiles meet them (llm-foundry, ranking, feasibility),
and otherwise the figures measured when the profiles were last fitted, with a small margin, so that
a change that makes a source worse fails here (benchmarks/accuracy.py prints every figure).
"""

from __future__ import annotations

import statistics

import pytest

from advisor.specs.hardware import load_hardware
from advisor.validation.accuracy import by_group, mape, predict, predictions
from advisor.validation.ranking import foundry_rankings
from advisor.errors import AdvisorError
from advisor.validation import runs as runs_module
from advisor.validation.runs import PRESET_CONFLICT, load_runs
from advisor.validation.torchtitan import load_torchtitan_runs


@pytest.fixture(scope="module")
def preds():
    return predictions()


@pytest.fixture(scope="module")
def titan():
    return [predict(r) for r in load_torchtitan_runs()]


def test_every_run_is_read_and_each_left_out_run_says_why():
    runs = load_runs()
    assert len(runs) == 338
    left_out = [r for r in runs if r.excluded]
    assert all(len(r.excluded) > 10 for r in left_out)
    reasons = {r.excluded.split(":")[0].split(" of ")[0] for r in left_out}
    assert reasons == {"doubtful", "implausible", "CPU activation offload", PRESET_CONFLICT}   # NVFP4 is priced
    # the only implausible run: 340 tokens/s/NPU for a 7B model, a twelfth of its 7B sibling
    assert [r.id for r in left_out if r.excluded.startswith("implausible")] == \
        ["mindformers-deepseek-coder1.5-7b-atlas-900-a2-podc"]
    assert len(runs) - len(left_out) == 306


def test_each_preset_conflict_names_the_table_value_and_the_preset_it_disagrees_with():
    conflicts = [r for r in load_runs() if r.excluded and r.excluded.startswith(PRESET_CONFLICT)]
    assert len(conflicts) == 14
    for r in conflicts:
        assert r.source == "Megatron-Bridge"
        text = r.excluded
        assert "table " in text and ("_CONFIG" in text or "perf_matrix" in text), text
        release_commit = {"25.09": "@684a68616", "25.11": "@7af9601c9"}[r.id.split("-")[1]]
        assert release_commit in text, text


# measured at the last fit (benchmarks/fit_profiles.py --write), MAPE of tokens/s per device: the
# issue's 10% goal, and guards at the measured misses (910B: 12.3%; B300: 33.4% over four runs, two of
# them, gpt-oss-120B and Qwen3-235B across nodes, measured no faster than on DGX B200 -- README)
GOALS = {
    "llm-foundry A100": 0.10,
    "llm-foundry H100": 0.10,
    "Megatron-Bridge GB200": 0.10,
    "MindFormers 910B": 0.13,
    "Megatron-Bridge B200": 0.10,
    "Megatron-Bridge H100": 0.10,
    "Megatron-Bridge GB300": 0.10,
    "Megatron-Bridge B300": 0.35,
}


def test_throughput_error_per_source(preds):
    groups = by_group(preds)
    assert set(groups) == set(GOALS)
    for group, ps in groups.items():
        assert mape(ps) <= GOALS[group], (group, mape(ps))


def test_no_measured_run_is_judged_not_to_fit(preds, titan):
    assert [p.run.id for p in preds + titan if not p.fits] == []


def test_ranking_inside_each_llm_foundry_table(preds):
    scores = foundry_rankings(preds)
    assert len(scores) == 23
    assert statistics.median(s.kendall_tau for s in scores) >= 0.8
    assert min(s.kendall_tau for s in scores) >= 0.7


def test_torchtitan_held_out(titan):
    groups = by_group(titan)
    assert mape(groups["torchtitan A100"]) <= 0.06
    assert mape(groups["torchtitan H100"]) <= 0.15
    memory = [abs(p.memory_error) for p in titan if p.memory_error is not None]
    assert len(memory) == 18
    assert statistics.mean(memory) <= 0.10


def test_no_prediction_beats_the_profiles_best_gemm_efficiency(preds, titan):
    """MFU counts model FLOPs over the peak; the fastest a run can go is every FLOP at the profile's
    best GEMM efficiency for its dtype (NVFP4: over the FP8 peak, at its GEMM time's share of FP8's)."""
    from advisor.cost.compute import fp4_per_fp8_peak
    from advisor.cost.fp8 import gemm_time_factor

    for p in preds + titan:
        hw = load_hardware(p.run.profile)
        best = max(y for _, y in hw.device.gemm_curve(p.run.job.gemm_dtype))
        if p.run.job.recipe == "nvfp4":
            best /= gemm_time_factor(p.run.job, fp4_per_fp8_peak(hw))
        assert 0 < p.mfu <= best, (p.run.id, p.mfu, best)


def test_fp8_predictions_stay_in_the_published_range(preds):
    """The best FP8 runs on H100 reach 35-39% of the FP8 peak (Megatron-Bridge 405B): no FP8 run of
    the calibration set is predicted above 45% of it."""
    fp8 = [p for p in preds if p.run.job.dtype == "fp8" and p.run.profile == "dgx-h100"]
    assert len(fp8) >= 15
    assert max(p.mfu for p in fp8) <= 0.45


def test_mindformers_rows_follow_their_yamls_flash_attention_and_dropout():
    """GPT-2 13B's and GLM3-6B's linked yamls turn flash attention off (GPT-2's keeps dropout 0.1);
    every other MindFormers row runs flash attention without dropout."""
    jobs = {r.id: r.job for r in load_runs() if r.source == "MindFormers"}
    math = {i for i, j in jobs.items() if j.attention == "math"}
    assert math == {"mindformers-gpt2-13b-atlas-800t-a2", "mindformers-glm3-6b-atlas-800t-a2"}
    assert {i for i, j in jobs.items() if j.dropout} == {"mindformers-gpt2-13b-atlas-800t-a2"}


def test_mindformers_pipeline_rows_run_their_yamls_layer_offsets():
    """MindFormers' LayerSetting: stage p holds num_layers // pp + offset[p] layers (GLM4-9B offset
    [-1, 0, 1, 0], Yi-34B [-1, 1, 1, -1]); the other pipeline rows split their layers evenly."""
    runs = {r.id: r for r in load_runs() if r.source == "MindFormers" and r.strategy.pp > 1}
    uneven = {i: r.strategy.stage_layers for i, r in runs.items() if r.strategy.stage_layers is not None}
    assert uneven == {"mindformers-glm4-9b-atlas-900-a2-podc": (9, 10, 11, 10),
                      "mindformers-yi-34b-atlas-800t-a2": (14, 16, 16, 14)}
    for i, layers in uneven.items():
        assert sum(layers) == runs[i].model.num_layers


def test_a_settings_entry_for_a_run_the_set_does_not_have_is_refused(monkeypatch):
    monkeypatch.setitem(runs_module.MINDFORMERS_YAML_SETTINGS, "mindformers-no-such-run", {"attention": "math"})
    runs_module.load_runs.cache_clear()
    try:
        with pytest.raises(AdvisorError, match="MINDFORMERS_YAML_SETTINGS: run 'mindformers-no-such-run'"):
            runs_module.load_runs()
    finally:
        monkeypatch.undo()
        runs_module.load_runs.cache_clear()
