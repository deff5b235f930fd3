"""advisor calibrate: the fits (fast) and one real quick measurement (slow)."""

from __future__ import annotations

import math
import sys

import pytest

from advisor.calibrate import (COLLECTIVES, build_profile, efficiency_curve, fit_alpha_beta, fit_link, fit_per_op,
                               merge_rounds, pipeline_action_overhead_us, ring_terms, write_profile)
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
    monkeypatch.setattr(sys, "argv", ["advisor", "calibrate", "--quick", "--nproc", "2", "--out", str(out)])
    try:
        cli.main()
    except SystemExit as done:
        assert done.code in (0, None)
    hw = load_hardware(str(out))
    assert hw.device.peak_flops("fp32") > 1e9            # more than 1 GFLOP/s per rank
    assert 0 < hw.node.intra.latency_us < 1e5
    assert hw.node.intra.bandwidth_gbps > 0.01
    raw = hw.raw["node"]["intra_node"]["notes"]["raw"]
    assert {p["op"] for p in raw} == set(COLLECTIVES)


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
