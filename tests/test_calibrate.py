"""advisor calibrate: the fits (fast) and one real quick measurement (slow)."""

from __future__ import annotations

import math
import sys
import tempfile

import pytest

from advisor.calibrate import (COLLECTIVES, RoundRule, build_profile, calibration_warnings, efficiency_curve,
                               fit_alpha_beta, fit_link, fit_per_op, merge_rounds, pipeline_action_overhead_us,
                               ring_terms, write_profile)
from advisor.specs.hardware import hardware_from_dict, load_hardware


def _synthetic_points(alpha_s=200e-6, bandwidth=2e9, noise=0.0):
    points = []
    for g in (2, 4):
        for op in COLLECTIVES:
            for nbytes in (4096, 1 << 20, 16 << 20):
                bw_f, steps = ring_terms(op, g)
                t = steps * alpha_s + bw_f * nbytes / bandwidth
                points.append({"op": op, "ranks": g, "bytes": nbytes, "seconds": t * (1 + noise)})
    return points


def test_link_fit_recovers_the_cost_models_parameters():
    latency_us, bandwidth_gbps, rms = fit_link(_synthetic_points())
    assert math.isclose(latency_us, 200.0, rel_tol=1e-3)
    assert math.isclose(bandwidth_gbps, 2.0, rel_tol=1e-3)
    assert rms < 1e-6


def test_link_fit_never_exceeds_the_memory_bandwidth():
    # times that do not grow with the size (noise on a loaded machine): a latency-only line would
    # fit with an impossible bandwidth (a loaded run fitted 2.3e12 GB/s); the memory bandwidth bounds it
    flat = [{"op": "p2p", "ranks": 2, "bytes": b, "seconds": 1.6e-3 * (1 + 0.01 * i)}
            for i, b in enumerate((4096, 1 << 20, 16 << 20))]
    assert fit_link(flat)[1] > 10 * 24.8          # unbounded: far faster than memory can be written
    latency_us, bandwidth_gbps, _ = fit_link(flat, max_bandwidth_gbps=24.8)
    assert bandwidth_gbps == pytest.approx(24.8, rel=1e-6) and 1000 < latency_us < 1700
    # a well-determined fit below the bound is unchanged
    assert fit_link(_synthetic_points(), max_bandwidth_gbps=24.8)[1] == pytest.approx(2.0, rel=1e-3)


def test_per_op_alpha_beta():
    fits = fit_alpha_beta(_synthetic_points())
    ar = fits["all_reduce@4"]
    assert math.isclose(ar["latency_us"], 6 * 200.0, rel_tol=1e-3)           # 2(g-1) steps
    assert math.isclose(ar["bus_bandwidth_gbps"], 2.0, rel_tol=1e-3)
    assert math.isclose(fits["p2p@2"]["latency_us"], 200.0, rel_tol=1e-3)


def test_efficiency_curve_is_a_fraction_of_the_best_rate():
    peak, curve = efficiency_curve([[0.01, 5.0], [0.001, 1.0], [1.0, 10.0], [10.0, 8.0]])
    assert peak == 10.0
    assert [g for g, _ in curve] == sorted(g for g, _ in curve)
    assert curve[-2] == [1.0, 1.0] and curve[0] == [0.001, 0.1]
    assert all(0 < e <= 1 for _, e in curve)


def _fake_ranks(n=2):
    matmul = {"fp32": [[6.5e-5, 0.01], [0.0042, 0.05], [0.27, 0.06]], "bf16": [[6.5e-5, 0.005], [0.0042, 0.02], [0.27, 0.1]]}
    comm = {"groups": [2], "points": _synthetic_points()}
    return [{"rank": r, "backend": "gloo", "device": "x86_64", "matmul": matmul,
             "memory": {"bandwidth_gbps": 10.0, "op_with_autograd_us": 8.0, "layer_host_us": 1200.0,
                        "optimizer_us_per_tensor": 25.0},
             "comm": comm if r == 0 else None, "device_memory_bytes": None, "threads": 1} for r in range(n)]


def test_profile_has_the_projects_schema(tmp_path):
    profile = build_profile(_fake_ranks(), 2, name="local-test")
    hw = hardware_from_dict(profile, "calibrated")
    assert hw.node.devices_per_node == 2
    assert hw.device.peak_flops("fp32") == pytest.approx(0.06e12)
    assert hw.device.launch_overhead_us == pytest.approx(1200.0 / 60)
    assert hw.device.optimizer_overhead_us_per_tensor == pytest.approx(25.0)
    assert hw.device.asynchronous_launch is False          # gloo: CPU ranks run operators on their own thread
    assert hw.device.overlaps_communication is False       # ... and their collectives, in turn with the compute
    assert hw.node.intra.latency_us == pytest.approx(200.0, rel=1e-3)
    assert profile["node"]["intra_node"]["notes"]["raw"]           # raw measurements kept
    path = tmp_path / "local.yaml"
    write_profile(profile, path)
    assert load_hardware(str(path)).name == "local-test"


@pytest.mark.slow
def test_calibrate_command_writes_a_loadable_profile(tmp_path, monkeypatch, capsys):
    pytest.importorskip("torch")
    from advisor import cli

    out = tmp_path / "this-machine.yaml"
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    monkeypatch.setattr(sys, "argv", ["advisor", "calibrate", "--quick", "--nproc", "2", "--out", str(out)])
    try:
        cli.main()
    except SystemExit as done:
        assert done.code in (0, None)
    assert [p for p in scratch.iterdir() if p.name.startswith("advisor-")] == []   # the ranks' folder is gone
    hw = load_hardware(str(out))
    assert hw.device.peak_flops("fp32") > 1e9            # more than 1 GFLOP/s per rank
    assert 0 < hw.node.intra.latency_us < 1e5
    assert hw.node.intra.bandwidth_gbps > 0.01
    raw = hw.raw["node"]["intra_node"]["notes"]["raw"]
    assert {p["op"] for p in raw} == set(COLLECTIVES)
    # a worker-server round of the PS executor's messages, a third of it per message
    assert 1.0 < hw.inter.message_overhead_us < 1e5
    assert hw.inter.message_s == pytest.approx(hw.inter.message_overhead_us * 1e-6)
    # the contention probe: an all-reduce and a send, alone and together, beside the model's figures
    (point,) = hw.raw["node"]["intra_node"]["notes"]["contention"]["points"]
    assert point["bytes"] == 16 << 20
    assert all(v > 0 for v in point["measured_ms"].values())
    model = point["predicted_ms"]
    assert model["together_independent"] == pytest.approx(max(model["all_reduce"], model["p2p"]), abs=1e-3)
    assert model["together_shared"] > model["together_independent"]
    # the host's CPU Adam with all its cores: torch's AdamW, what Megatron's and FSDP2's CPU offload step with
    rate = hw.host.cpu_adam_rate("torch")
    assert rate is not None and 1e6 < rate < 1e11
    assert hw.host.cpu_adam_rate("deepspeed") is None


def test_contention_prediction_shares_the_link_byte_by_byte():
    """Two transfers started together on one link: the longer start-up, then both data parts in turn."""
    ranks = _fake_ranks()
    ranks[0]["contention"] = [{"bytes": 16 << 20, "all_reduce_s": 0.010, "p2p_s": 0.004, "together_s": 0.013}]
    profile = build_profile(ranks, 2)
    (row,) = profile["node"]["intra_node"]["notes"]["contention"]["points"]
    assert row["measured_ms"] == {"all_reduce": 10.0, "p2p": 4.0, "together": 13.0}
    link = hardware_from_dict(profile, "probe").node.intra
    reduce, send = link.for_op("all_reduce"), link.for_op("p2p")
    size = 16 << 20
    # two ranks: the all-reduce is 2 x 1/2 of the buffer plus 2 start-ups; the send one start-up and the buffer
    reduce_data, send_data = size / reduce.effective_bandwidth_bytes_per_s, size / send.effective_bandwidth_bytes_per_s
    expected = max(2 * reduce.latency_s, send.latency_s) + reduce_data + send_data
    assert row["predicted_ms"]["together_shared"] == pytest.approx(expected * 1e3, abs=2e-3)
    assert row["predicted_ms"]["all_reduce"] == pytest.approx((2 * reduce.latency_s + reduce_data) * 1e3, abs=2e-3)


def test_ps_round_becomes_the_per_message_time():
    ranks = _fake_ranks()
    ranks[0]["ps_round_s"] = 600e-6
    hw = hardware_from_dict(build_profile(ranks, 2), "with-ps")
    assert hw.inter.message_overhead_us == pytest.approx(200.0)
    without = hardware_from_dict(build_profile(_fake_ranks(), 2), "without-ps")
    assert without.inter.message_overhead_us is None and without.inter.message_s == without.inter.latency_s


def _per_op_points(alphas_s: dict[str, float], bandwidths: dict[str, float]):
    points = []
    for g in (2, 4):
        for op in COLLECTIVES:
            for nbytes in (4096, 1 << 20, 16 << 20):
                bw_f, steps = ring_terms(op, g)
                t = steps * alphas_s[op] + bw_f * nbytes / bandwidths[op]
                points.append({"op": op, "ranks": g, "bytes": nbytes, "seconds": t})
    return points


def test_each_operation_gets_its_own_latency_and_bandwidth():
    alphas = {"all_reduce": 300e-6, "all_gather": 150e-6, "reduce_scatter": 600e-6, "p2p": 80e-6}
    bws = {"all_reduce": 1.5e9, "all_gather": 1.0e9, "reduce_scatter": 0.4e9, "p2p": 3.0e9}
    fits = fit_per_op(_per_op_points(alphas, bws))
    for op in COLLECTIVES:
        assert fits[op]["latency_us"] == pytest.approx(alphas[op] * 1e6, rel=1e-3)
        assert fits[op]["bandwidth_gbps"] == pytest.approx(bws[op] / 1e9, rel=1e-3)


def test_pipeline_probe_inverts_the_cost_models_pipeline_time():
    a, chunk, p2p, m, v, p = 250e-6, 60e-6, 130e-6, 8, 2, 2
    step = (m + (p - 1) / v) * v * (chunk + 2 * a) + 2 * p2p * (m * v + p - 1)
    probe = {"step_s": step, "chunk_s": chunk, "micro_batches": m, "virtual_stages": v, "stages": p,
             "message_bytes": 32}
    assert pipeline_action_overhead_us(probe, p2p) == pytest.approx(250.0)
    assert pipeline_action_overhead_us(dict(probe, step_s=1e-6), p2p) == 0.0      # never negative


def test_rounds_keep_the_median_of_each_figure():
    def round_(k):
        return {"matmul": {"fp32": [[0.1, 0.05 * k]]}, "memory": {"layer_host_us": 100.0 * k},
                "comm": {"groups": [2], "points": [{"op": "p2p", "ranks": 2, "bytes": 4096, "seconds": 1e-4 * k}]},
                "pipeline": {"1f1b": {"step_s": 0.01 * k, "chunk_s": 1e-4, "micro_batches": 8, "virtual_stages": 1,
                                      "stages": 2, "message_bytes": 32}}}
    matmul, memory, comm, pipeline = merge_rounds([round_(1), round_(5), round_(2)])
    assert matmul["fp32"] == [[0.1, pytest.approx(0.1)]]
    assert memory["layer_host_us"] == 200.0
    assert comm["points"][0]["seconds"] == pytest.approx(2e-4)
    assert pipeline["1f1b"]["step_s"] == pytest.approx(0.02)


def test_profile_carries_per_op_links_pipeline_overheads_and_elementwise_efficiency():
    ranks = _fake_ranks()
    m = 8
    probe = {"step_s": (m + 1) * (60e-6 + 2 * 300e-6) + 2 * 400e-6 * (m + 1), "chunk_s": 60e-6, "micro_batches": m,
             "virtual_stages": 1, "stages": 2, "message_bytes": 32}
    ranks[0]["pipeline"] = {"1f1b": probe}
    profile = build_profile(ranks, 2, name="with-probes")
    hw = hardware_from_dict(profile, "calibrated")
    assert {op for op, _, _ in hw.node.intra.per_op} == set(COLLECTIVES)
    # p2p priced with its own fit (the synthetic points have 200 us everywhere, so 200 + 32 B at 2 GB/s)
    assert hw.device.action_overhead_us("1f1b") == pytest.approx((probe["step_s"] / (m + 1) - 60e-6) / 2 * 1e6
                                                                 - (200.0 + 32 / 2e9 * 1e6), rel=1e-3)
    assert hw.device.action_overhead_us("gpipe") == 0.0
    # elementwise efficiency: a probe timed as if element-wise work ran at 25% of the bandwidth
    base = build_profile(_fake_ranks(), 2)
    target = 0.25
    probe_s = _probe_time(base, target)
    ranks = _fake_ranks()
    for r in ranks:
        r["memory"]["elementwise_probe_s"] = probe_s
    fitted = build_profile(ranks, 2)
    assert fitted["device"]["memory_efficiency"] == pytest.approx(target, rel=1e-3)


def _probe_time(profile, efficiency):
    """The calibration probe's forward + backward as the cost model prices it at this efficiency."""
    from dataclasses import replace

    from advisor.calibrate import PROBE_BATCH, PROBE_MODEL
    from advisor.cost.estimate import estimate
    from advisor.space.strategy import Strategy
    from advisor.specs.job import Cluster, TrainingJob
    from advisor.specs.model import model_from_dict

    hw = hardware_from_dict(profile, "p")
    hw = replace(hw, device=replace(hw.device, memory_efficiency=efficiency))
    job = TrainingJob(global_batch_size=PROBE_BATCH, seq_length=PROBE_MODEL["seq_length"], dtype="fp32",
                      attention="math", framework="pytorch")
    est = estimate(model_from_dict(PROBE_MODEL, "probe"), hw, Cluster(nodes=1, devices=1), job,
                   Strategy(dp=1, tp=1, pp=1, micro_batch_size=PROBE_BATCH))
    return est.time_s["compute"] + est.time_s["host_overhead"]


def test_gpu_profiles_keep_the_fused_defaults():
    ranks = _fake_ranks()
    for r in ranks:
        r["backend"] = "nccl"
        r["memory"].update(elementwise_probe_s=0.05, optimizer_bytes_per_param=70.0)
    hw = hardware_from_dict(build_profile(ranks, 2), "gpu")
    assert hw.device.asynchronous_launch and hw.device.overlaps_communication
    assert hw.device.optimizer_bytes_per_param is None and hw.device.memory_efficiency == 1.0
    assert hw.device.pipeline_action_overhead_us == ()


# ---- stability: monotone curve, spread warnings, stopping rule -------------------------------------
def test_efficiency_curve_never_decreases_with_size():
    from advisor.calibration.fit import monotone_envelope

    assert monotone_envelope([0.2, 0.5, 0.4, 0.9, 0.7, 1.0]) == [0.2, 0.5, 0.5, 0.9, 0.9, 1.0]
    # a dip at 0.1 GFLOP and a drop after the peak, given out of order
    peak, curve = efficiency_curve([[1.0, 9.0], [0.001, 2.0], [0.1, 3.0], [0.01, 6.0], [10.0, 7.5], [3.0, 10.0]])
    assert peak == 10.0
    assert [g for g, _ in curve] == [0.001, 0.01, 0.1, 1.0, 3.0, 10.0]
    assert [e for _, e in curve] == [0.2, 0.6, 0.6, 0.9, 1.0, 1.0]


def _round(bandwidth=10.0, host_us=1000.0, peak=0.05, allreduce_s=0.01, step_s=0.02):
    return {"matmul": {"fp32": [[0.001, peak / 2], [0.1, peak]]},
            "memory": {"bandwidth_gbps": bandwidth, "layer_host_us": host_us, "optimizer_us_per_tensor": 20.0},
            "comm": {"groups": [2], "points": [
                {"op": "all_reduce", "ranks": 2, "bytes": 4096, "seconds": 1e-4},
                {"op": "all_reduce", "ranks": 2, "bytes": 16 << 20, "seconds": allreduce_s},
                {"op": "all_reduce", "ranks": 3, "bytes": 4096, "seconds": None}]},
            "pipeline": {"1f1b": {"step_s": step_s, "chunk_s": 1e-4, "micro_batches": 8, "virtual_stages": 1,
                                  "stages": 2, "message_bytes": 32}}}


def test_spreads_name_the_figures_whose_rounds_disagree():
    from advisor.calibration.rounds import figure_spreads, key_figures, rank_summary, summarize

    assert set(key_figures(_round())) == {
        "peak_tflops fp32", "memory_bandwidth_gbps", "launch_overhead_us (probe layer host time)",
        "optimizer_overhead_us_per_tensor", "all_reduce (2 ranks, 4 KiB)", "all_reduce (2 ranks, 16 MiB)",
        "pipeline 1f1b step"}
    rule = RoundRule()
    # rank 0: bandwidth 10, 14, 11 -> (14 - 10) / 11 = 36%; host time 1000, 1100, 1050 -> 9.5%
    rank0 = [_round(10.0, 1000.0), _round(14.0, 1100.0), _round(11.0, 1050.0)]
    spreads = figure_spreads(rank0)
    assert spreads["memory_bandwidth_gbps"] == pytest.approx(4 / 11)
    assert spreads["launch_overhead_us (probe layer host time)"] == pytest.approx(100 / 1050)
    assert spreads["peak_tflops fp32"] == 0.0
    # rank 1: its all-reduce disagrees (0.01, 0.013, 0.01 -> 30%), its bandwidth does not
    rank1 = [_round(allreduce_s=0.01), _round(allreduce_s=0.013), _round(allreduce_s=0.01)]
    notes = summarize([rank_summary(rank0, "3 rounds (the bound)", rule), rank_summary(rank1, None, rule)])
    assert notes["count"] == 3 and notes["stopped"] == "3 rounds (the bound)"
    assert notes["spread"]["memory_bandwidth_gbps"] == pytest.approx(0.3636, abs=1e-4)   # worst over ranks
    assert notes["spread"]["all_reduce (2 ranks, 16 MiB)"] == pytest.approx(0.3, abs=1e-4)
    named = [w.split(":")[0] for w in notes["warnings"]]
    assert named == ["memory_bandwidth_gbps", "all_reduce (2 ranks, 16 MiB)"]      # worst first; 9.5% not named
    assert "36%" in notes["warnings"][0]
    # the built profile records them, and the CLI's accessor finds them
    ranks = _fake_ranks()
    ranks[0]["rounds"] = rank_summary(rank0, "3 rounds (the bound)", rule)
    ranks[1]["rounds"] = rank_summary(rank1, None, rule)
    profile = build_profile(ranks, 2, name="noisy")
    assert calibration_warnings(profile) == notes["warnings"]
    assert profile["notes"]["rounds"]["rule"]["spread_target"] == 0.10
    hardware_from_dict(profile, "noisy")                                            # still a valid profile


def test_rounds_stop_when_the_figures_agree_or_at_a_bound():
    from advisor.calibration.rounds import stop_reason, worst_spread

    rule = RoundRule(min_rounds=3, max_rounds=6, spread_target=0.10, budget_s=100.0)

    def run(bandwidths, round_s=1.0):
        rounds = []
        for i, bw in enumerate(bandwidths):
            rounds.append(_round(bandwidth=bw))
            reason = stop_reason(len(rounds), worst_spread(rounds, rule.min_rounds), (i + 1) * round_s, round_s, rule)
            if reason:
                return len(rounds), reason
        return len(rounds), None

    # agreeing within 5% from the start: stops at the minimum of three rounds
    n, reason = run([10.0, 10.5, 10.2, 10.1, 10.3, 10.4])
    assert n == 3 and "agree" in reason
    # a first round 30% off: the last three rounds agree from round 4 on (the window forgets round 1)
    n, reason = run([13.0, 10.0, 10.1, 10.0, 10.2, 10.1, 10.0])
    assert n == 4 and "the last 3 rounds agree within 1%" in reason
    # every round 15-30% off the one before: runs to the bound of six rounds
    n, reason = run([10.0, 13.0, 10.5, 12.5, 10.0, 13.0, 10.0])
    assert n == 6 and reason == "the bound of 6 rounds"
    # slow rounds: 40 s each in a 100 s budget -> a third round would end at 120 s
    n, reason = run([13.0, 10.0, 10.1, 10.0], round_s=40.0)
    assert n == 2 and "time bound" in reason
    # one round never agrees with itself: the quick rule stops after it by its bound
    assert worst_spread([_round()], 1) == math.inf and worst_spread([_round()] * 2, 3) == math.inf
    assert "bound" in stop_reason(1, math.inf, 1.0, 1.0, RoundRule.quick())


def test_calibrate_options_are_checked_before_any_process_starts():
    from advisor.calibrate import CalibrateOptions, check_options
    from advisor.errors import AdvisorError

    with pytest.raises(AdvisorError, match="--rounds"):
        check_options(CalibrateOptions(nproc=2, max_rounds=0))
    with pytest.raises(AdvisorError, match="--spread-target"):
        check_options(CalibrateOptions(nproc=2, spread_target=float("nan")))
    rule = CalibrateOptions(max_rounds=2, timeout_s=300.0).rule()
    assert (rule.min_rounds, rule.max_rounds, rule.budget_s) == (2, 2, 200.0)
    assert CalibrateOptions(quick=True).rule().max_rounds == 1


def test_a_collective_whose_time_does_not_grow_has_no_bandwidth(tmp_path):
    points = [{"op": "all_gather", "ranks": 2, "bytes": b, "seconds": t}
              for b, t in ((4096, 3e-4), (1 << 20, 2e-4), (16 << 20, 1e-4))]     # noise: faster when larger
    assert fit_alpha_beta(points)["all_gather@2"]["bus_bandwidth_gbps"] is None
    profile = build_profile(_fake_ranks(), 2, name="noisy-comm")
    profile["node"]["intra_node"]["notes"]["per_op"] = fit_alpha_beta(points)
    write_profile(profile, tmp_path / "p.yaml")                                    # written, and loads again
    assert load_hardware(str(tmp_path / "p.yaml")).name == "noisy-comm"
