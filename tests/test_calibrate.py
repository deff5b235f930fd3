"""advisor calibrate: the fits (fast) and one real quick measurement (slow)."""

from __future__ import annotations

import math
import sys

import pytest

from advisor.calibrate import (COLLECTIVES, build_profile, efficiency_curve, fit_alpha_beta, fit_link, ring_terms,
                               write_profile)
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
