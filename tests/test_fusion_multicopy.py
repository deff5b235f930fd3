"""Communication fusion (gradient buckets) and multi-copy parallelism: the cost model, the search,
the plan and the exports (advisor.cost.fusion, advisor.cost.multi_copy, advisor.search.comm_knobs,
advisor.export._comm_knobs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from advisor.cost import comm, fusion, multi_copy
from advisor.cost.estimate import estimate, estimate_batch
from advisor.cost.placement import placements
from advisor.export import export_plan
from advisor.commands.inputs import resolve_inputs
from advisor.plan import dumps_plan, plan_from_dict, plan_to_dict
from advisor.search.rank import TIE_BAND
from advisor.commands.recommend import recommend
from advisor.search import Pins
from advisor.search.comm_knobs import refine
from advisor.search.enumerate import search
from advisor.space.rules import violations
from advisor.space.strategy import Strategy, StrategyBatch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _export_plans import make_plan  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


# ---- communication fusion: the bucket model ---------------------------------------------------
def test_bucket_count_hand_computed():
    assert fusion.bucket_count(1000 * fusion.MIB, 100.0) == 10
    assert fusion.bucket_count(1000 * fusion.MIB + 1, 100.0) == 11
    assert fusion.bucket_count(10 * fusion.MIB, 500.0) == 1           # never fewer than one


def test_exposed_hand_computed():
    # 10 buckets of 10 ms behind a 50 ms backward: the stream is busy 100 ms from the first bucket
    # (ready at 5 ms): ends at 105 ms, 55 ms after the backward = 100 - 50 x (1 - 1/10)
    assert fusion.exposed_s(0.010, 10, 0.050, True) == pytest.approx(0.055)
    # a long backward hides all but the last bucket
    assert fusion.exposed_s(0.010, 10, 1.0, True) == pytest.approx(0.010)
    # one bucket waits for the whole backward; without overlap every bucket is exposed
    assert fusion.exposed_s(0.030, 1, 1.0, True) == pytest.approx(0.030)
    assert fusion.exposed_s(0.010, 10, 1.0, False) == pytest.approx(0.100)


def _simulated_tail(bucket_s: float, n: int, window_s: float) -> float:
    """Bucket i ready at i x window / n; one stream in order; what ends after the window."""
    end = 0.0
    for i in range(1, n + 1):
        end = max(end, i * window_s / n) + bucket_s
    return end - window_s


@pytest.mark.parametrize("bucket_s,n,window_s", [(0.01, 10, 0.05), (0.002, 37, 0.5), (0.2, 3, 0.1), (0.05, 1, 2.0),
                                                 (0.013, 64, 0.83)])
def test_exposed_matches_a_simulated_stream(bucket_s, n, window_s):
    assert fusion.exposed_s(bucket_s, n, window_s, True) == pytest.approx(_simulated_tail(bucket_s, n, window_s))


def test_each_bucket_pays_one_collective_start_up():
    """n collectives of G/n bytes cost one collective of G plus n - 1 start-ups (alpha-beta model)."""
    i = resolve_inputs("gpt3-1.3b", "dgx-a100-80g", devices=64)
    b = StrategyBatch.from_strategies([Strategy(dp=64, tp=1, pp=1, num_micro_batches=i.job.global_batch_size // 64)],
                                      i.model.num_layers)
    group = placements(i.hardware, b, ("dp_cp",))["dp_cp"]
    g = 2.6e9                    # bytes
    n = 40
    whole = comm.group_time_s(i.hardware, "all_reduce", g, group)[0]
    start_up = comm.group_time_s(i.hardware, "all_reduce", 0.0, group)[0]
    assert start_up > 0
    assert n * comm.group_time_s(i.hardware, "all_reduce", g / n, group)[0] == pytest.approx(whole + (n - 1) * start_up)


def test_bucket_size_trade_off():
    """Small buckets pay many start-ups, big ones leave a long tail: the exposed time is smallest in between."""
    grad_bytes, bandwidth, alpha, window = 4e9, 50e9, 2e-3, 0.5

    def exposed(mb):
        n = fusion.bucket_count(grad_bytes, mb)
        return float(fusion.exposed_s(alpha + grad_bytes / n / bandwidth, n, window, True))

    sizes = [1, 25, 100, 400, 4000]
    times = [exposed(s) for s in sizes]
    best = int(np.argmin(times))
    assert 0 < best < len(sizes) - 1
    assert times[0] > times[best] and times[-1] > times[best]


def test_longer_window_never_exposes_more():
    windows = np.linspace(0.0, 2.0, 41)
    for n in (1, 4, 16, 128):
        e = fusion.exposed_s(0.01, n, windows, True)
        assert np.all(np.diff(e) <= 1e-15)


# ---- communication fusion in the step time ----------------------------------------------------
@pytest.fixture(scope="module")
def gpt13():
    return resolve_inputs("gpt3-1.3b", "dgx-a100-80g", devices=64)


def test_default_bucket_size_reproduces_the_calibrated_figure(gpt13):
    """The framework's default bucket, given explicitly, prices exactly as no bucket size."""
    i = gpt13
    s = Strategy(dp=64, tp=1, pp=1, num_micro_batches=i.job.global_batch_size // 64, zero_stage=1)
    default_mb = float(fusion.default_bucket_bytes(i.job, 64)) / fusion.MIB
    assert default_mb == pytest.approx(max(40e6, 64e6) * 4 / 2 ** 20)       # Megatron: max(40M, 1M x dp) fp32 grads
    base = estimate(i.model, i.hardware, i.cluster, i.job, s)
    same = estimate(i.model, i.hardware, i.cluster, i.job, replace(s, grad_bucket_mb=default_mb))
    assert same.step_time_s == base.step_time_s
    assert same.time_s["dp_comm"] == base.time_s["dp_comm"]
    ms = replace(i.job, framework="mindspore")
    assert float(fusion.default_bucket_bytes(ms, 64)) == 64 * fusion.MIB
    assert (estimate(i.model, i.hardware, i.cluster, ms, replace(s, grad_bucket_mb=64.0)).step_time_s
            == estimate(i.model, i.hardware, i.cluster, ms, s).step_time_s)


def test_tiny_buckets_expose_more_and_buffers_follow_the_size(gpt13):
    i = gpt13
    s = Strategy(dp=64, tp=1, pp=1, num_micro_batches=i.job.global_batch_size // 64, zero_stage=0)
    base = estimate(i.model, i.hardware, i.cluster, i.job, s)
    tiny = estimate(i.model, i.hardware, i.cluster, i.job, replace(s, grad_bucket_mb=1.0))
    assert tiny.time_s["dp_comm"] > base.time_s["dp_comm"]
    assert tiny.time_s["compute"] == base.time_s["compute"]
    big = estimate(i.model, i.hardware, i.cluster, i.job, replace(s, grad_bucket_mb=500.0))
    # two buckets in flight: 2 x 500 MiB instead of DDP's default 2 x 25 MB (before the allocator allowance)
    assert big.memory_gib.buffers > base.memory_gib.buffers + 0.9


# ---- multi-copy parallelism ------------------------------------------------------------------
def _simulated_period(k: int, c: float, t: float, segments: int) -> float:
    """k copies, each a chain compute -> collective -> compute ...; one compute stream (copies in
    turn), one communication stream; returns the makespan."""
    comp_free = comm_free = 0.0
    ready = [0.0] * k                         # when each copy's next compute may start
    for _ in range(segments):
        for j in range(k):
            start = max(comp_free, ready[j])
            comp_free = start + c
            comm_start = max(comm_free, comp_free)
            comm_free = comm_start + t
            ready[j] = comm_free
    return comm_free


@pytest.mark.parametrize("k,c,t", [(2, 1.0, 0.4), (2, 1.0, 1.7), (4, 0.3, 1.0), (3, 1.0, 1.0), (2, 0.2, 0.1)])
def test_exposed_tp_matches_the_two_stream_period(k, c, t):
    segments = 2000
    makespan = _simulated_period(k, c, t, segments)
    per_segment_exposed = makespan / segments - k * c
    assert float(multi_copy.exposed(k * t, k * c, k)) == pytest.approx(per_segment_exposed, abs=3 * (c + t) / segments)


def test_one_copy_hides_nothing():
    assert float(multi_copy.exposed(0.7, 5.0, 1.0)) == pytest.approx(0.7)


@pytest.fixture(scope="module")
def llama70():
    i = resolve_inputs("llama3-70b", "dgx-h100", devices=64)
    return replace(i, job=replace(i.job, framework="mindspore"))


def test_two_copies_hide_tp_comm_and_cost_compute(llama70):
    i = llama70
    m = i.job.global_batch_size // 8 // 2
    s = Strategy(dp=8, tp=8, pp=1, micro_batch_size=2, num_micro_batches=m, zero_stage=1, sequence_parallel=True,
                 recompute="full")
    one = estimate(i.model, i.hardware, i.cluster, i.job, s)
    two = estimate(i.model, i.hardware, i.cluster, i.job, replace(s, micro_batch_copies=2))
    assert two.time_s["tp_comm"] < one.time_s["tp_comm"]
    assert two.time_s["compute"] > one.time_s["compute"]
    assert two.step_time_s < one.step_time_s
    # the copies' compute is exactly that of micro-batches of one sample, twice as many
    half = estimate(i.model, i.hardware, i.cluster, i.job, replace(s, micro_batch_size=1, num_micro_batches=2 * m))
    assert two.time_s["compute"] == pytest.approx(half.time_s["compute"], rel=1e-12)
    # activations are those of the whole micro-batch
    assert two.memory_gib.activations == pytest.approx(one.memory_gib.activations, rel=1e-12)


def test_copies_hide_nothing_on_devices_that_serialize(llama70):
    i = llama70
    hw = replace(i.hardware, device=replace(i.hardware.device, overlaps_communication=False))
    s = Strategy(dp=8, tp=8, pp=1, micro_batch_size=2, num_micro_batches=i.job.global_batch_size // 16)
    one = estimate(i.model, hw, i.cluster, i.job, s)
    two = estimate(i.model, hw, i.cluster, i.job, replace(s, micro_batch_copies=2))
    assert two.time_s["tp_comm"] > one.time_s["tp_comm"]          # two copies' start-ups, nothing hidden


def test_default_knobs_leave_the_batch_unchanged(llama70):
    i = llama70
    s = Strategy(dp=8, tp=8, pp=1, micro_batch_size=2, num_micro_batches=i.job.global_batch_size // 16)
    b = StrategyBatch.from_strategies([s], i.model.num_layers)
    assert b.grad_bucket_mb.tolist() == [0.0] and b.micro_batch_copies.tolist() == [1]
    back = b.strategy(0)
    assert back.grad_bucket_mb is None and back.micro_batch_copies == 1
    bare = replace(b, grad_bucket_mb=None, micro_batch_copies=None)
    a, c = (estimate_batch(i.model, i.hardware, i.cluster, i.job, x) for x in (b, bare))
    assert a.step_time_s.tolist() == c.step_time_s.tolist()


def test_rules_refuse_copies_that_do_not_divide_and_buckets_with_zero_2(llama70):
    i = llama70
    s = Strategy(dp=8, tp=8, pp=1, micro_batch_size=2, num_micro_batches=i.job.global_batch_size // 16)
    assert violations(i.model, i.cluster, i.job, replace(s, micro_batch_copies=2)) == []
    assert "micro-batch size" in violations(i.model, i.cluster, i.job, replace(s, micro_batch_copies=3))[0]
    assert "ZeRO" in violations(i.model, i.cluster, i.job, replace(s, zero_stage=2, grad_bucket_mb=40.0))[0]
    assert violations(i.model, i.cluster, i.job, replace(s, zero_stage=1, grad_bucket_mb=40.0)) == []


# ---- the search ------------------------------------------------------------------------------
def test_refine_keeps_only_gains_beyond_the_tie_band(llama70):
    i = llama70
    m = i.job.global_batch_size // 8
    cands = [Strategy(dp=8, tp=8, pp=1, micro_batch_size=mbs, num_micro_batches=m // mbs, zero_stage=z,
                      sequence_parallel=True, recompute="full") for mbs in (1, 2) for z in (0, 1)]
    b = StrategyBatch.from_strategies(cands, i.model.num_layers)
    out = refine(i.model, i.hardware, i.cluster, i.job, b)
    assert len(out) == len(b)
    before = estimate_batch(i.model, i.hardware, i.cluster, i.job, b).tokens_per_s
    after = estimate_batch(i.model, i.hardware, i.cluster, i.job, out).tokens_per_s
    changed = (out.micro_batch_copies != 1) | (out.grad_bucket_mb != 0) | (out.micro_batch_size != b.micro_batch_size)
    assert changed.any()
    assert np.all(after[changed] > before[changed] * (1.0 + TIE_BAND))
    assert np.all(after[~changed] == before[~changed])
    assert np.all(out.micro_batch_size % out.micro_batch_copies == 0)
    assert np.all(out.dp * out.micro_batch_size * out.num_micro_batches == i.job.global_batch_size)


def test_refine_leaves_megatron_jobs_without_copies(llama70):
    i = llama70
    job = replace(i.job, framework="megatron")
    m = job.global_batch_size // 8
    b = StrategyBatch.from_strategies([Strategy(dp=8, tp=8, pp=1, micro_batch_size=2, num_micro_batches=m // 2,
                                                sequence_parallel=True, recompute="full")], i.model.num_layers)
    assert refine(i.model, i.hardware, i.cluster, job, b).micro_batch_copies.tolist() == [1]


def test_recommend_picks_copies_for_a_mindspore_job():
    i = resolve_inputs("gpt3-175b", "dgx-a100-80g", devices=64)
    job = replace(i.job, framework="mindspore")
    result = recommend(i.model, i.hardware, i.cluster, job, top_k=3, suggest=False)
    best = result.plans[0].strategy
    assert best.micro_batch_copies > 1 and best.tp > 1
    plain = estimate(i.model, i.hardware, i.cluster, job, replace(best, micro_batch_copies=1))
    assert result.estimates[0].tokens_per_s > plain.tokens_per_s * (1.0 + TIE_BAND)
    # the enumerator itself prices the default knobs (its brute-force contract, tests/test_enumerate.py)
    assert search(i.model, i.hardware, i.cluster, job, Pins(), top_k=3).finalists.micro_batch_copies.max() == 1


# ---- plan and exports -----------------------------------------------------------------------
PARALLEL = {"dp": 4, "tp": 8, "pp": 2, "sequence_parallel": True, "micro_batch_size": 2, "num_micro_batches": 64,
            "zero_stage": 1, "recompute": "selective"}


def _plan(**knobs):
    return make_plan("llama3-70b", "dgx-a100-80g", 8, {**PARALLEL, **knobs}, global_batch_size=512, seq_length=4096)


def test_plan_round_trip_and_old_plans_unchanged():
    p = _plan(grad_bucket_mb=100.0, micro_batch_copies=2)
    assert p.strategy.grad_bucket_mb == 100.0 and p.strategy.micro_batch_copies == 2
    text = dumps_plan(p)
    again = plan_from_dict(json.loads(text), "round trip")
    assert dumps_plan(again) == text
    assert (again.strategy.grad_bucket_mb, again.strategy.micro_batch_copies) == (100.0, 2)
    old = _plan()
    parallel = plan_to_dict(old)["parallel"]
    assert "grad_bucket_mb" not in parallel and "micro_batch_copies" not in parallel
    with pytest.raises(Exception, match="micro_batch_copies"):
        _plan(micro_batch_copies=0)


def test_exports_write_the_knobs():
    p = _plan(grad_bucket_mb=100.0, micro_batch_copies=2)
    mb_bytes = 100 * 2 ** 20
    meg = export_plan(p, "megatron")
    script = meg.files["megatron_pretrain_gpt.sh"]
    assert f"--ddp-bucket-size {mb_bytes // 4}" in script                       # fp32 gradients
    assert any("micro_batch_copies = 2" in u for u in meg.unsupported)
    ds = export_plan(p, "deepspeed")
    cfg = json.loads(ds.files["ds_config.json"])
    assert cfg["zero_optimization"]["reduce_bucket_size"] == mb_bytes // 4
    assert cfg["zero_optimization"]["allgather_bucket_size"] == mb_bytes // 2    # bf16 weights
    ms = export_plan(p, "mindspore")
    assert ("comm_fusion={'reducescatter': {'mode': 'size', 'config': 100}, 'allgather': {'mode': 'size', "
            "'config': 100}}") in ms.files["parallel_context.py"]
    yaml_text = ms.files["mindformers_parallel.yaml"]
    assert "micro_batch_interleave_num: 2" in yaml_text
    assert "batch_size: 1," in yaml_text                                        # per copy
    tt = export_plan(p, "torchtitan")
    assert any("grad_bucket_mb" in u for u in tt.unsupported) and any("micro_batch_copies" in u for u in tt.unsupported)
    plain = export_plan(_plan(), "megatron").files["megatron_pretrain_gpt.sh"]
    assert "--ddp-bucket-size" not in plain
    zero0 = export_plan(_plan(zero_stage=0, grad_bucket_mb=40.0), "mindspore").files["parallel_context.py"]
    assert "comm_fusion={'allreduce': {'mode': 'size', 'config': 40}}" in zero0


def test_cli_estimate_flags():
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    base = [sys.executable, "-m", "advisor", "estimate", "--model", "gpt3-1.3b", "--hardware", "dgx-a100-80g",
            "--devices", "8", "--tp", "2", "--mbs", "2", "--framework", "mindspore", "--json"]
    ok = subprocess.run(base + ["--copies", "2", "--bucket-mb", "40"], capture_output=True, text=True, cwd=ROOT,
                        env=env, timeout=120)
    assert ok.returncode == 0, ok.stderr
    d = json.loads(ok.stdout)
    assert d["strategy"]["micro_batch_copies"] == 2 and d["strategy"]["grad_bucket_mb"] == 40.0
    bad = subprocess.run(base + ["--bucket-mb", "-5"], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert bad.returncode == 2 and "--bucket-mb" in bad.stderr and "Traceback" not in bad.stderr
