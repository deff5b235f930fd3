"""Fits from raw calibration measurements to the cost model's parameters: every one is the value
that makes the cost model's own formula reproduce the measurement."""

from __future__ import annotations

import statistics
from typing import Any

# A one-layer GPT at a working size (fp32, math attention): its forward + backward, less the GEMM
# and host time the cost model predicts from the other measurements, prices the element-wise work
# (norms, activations, softmax, residuals), which on a CPU core runs well below streaming bandwidth.
PROBE_MODEL = dict(name="calibration-probe", source="advisor calibrate", num_layers=1, hidden_size=256,
                   num_attention_heads=4, num_kv_heads=4, ffn_hidden_size=1024, ffn_activation="gelu",
                   vocab_size=64, seq_length=128, tie_embeddings=False, norm="layernorm", use_bias=True,
                   position_embedding="learned")
PROBE_BATCH = 2


# ---- fitting (no torch) ------------------------------------------------------------------------------
def ring_terms(op: str, g: int) -> tuple[float, float]:
    """(bandwidth factor, latency steps) of the cost model's ring formulas (advisor.cost.comm)."""
    if op == "all_reduce":
        return 2.0 * (g - 1) / g, 2.0 * (g - 1)
    if op in ("all_gather", "reduce_scatter"):
        return (g - 1) / g, float(g - 1)
    return 1.0, 1.0   # p2p


def fit_alpha_beta(points: list[dict]) -> dict[str, dict[str, float]]:
    """Per (op, ranks): least-squares t = a + S * c; reported as latency_us = a and the bus
    bandwidth (ring bandwidth factor x S / (t - a)) in GB/s."""
    import numpy as np

    out = {}
    keys = sorted({(p["op"], p["ranks"]) for p in points})
    for op, g in keys:
        pts = [p for p in points if p["op"] == op and p["ranks"] == g and p["seconds"] is not None]
        if len(pts) < 2:
            continue
        s = np.array([p["bytes"] for p in pts], dtype=float)
        t = np.array([p["seconds"] for p in pts], dtype=float)
        c, a = np.polyfit(s, t, 1)
        bw_factor, _ = ring_terms(op, g)
        out[f"{op}@{g}"] = {"latency_us": max(a, 0.0) * 1e6,
                            # None: the time did not grow with the size (noise at small sizes), no bandwidth
                            "bus_bandwidth_gbps": (bw_factor / c / 1e9) if c > 0 else None,
                            "spread": float(np.max(np.abs(a + c * s - t) / t))}
    return out


def fit_link(points: list[dict], max_bandwidth_gbps: float | None = None) -> tuple[float, float, float]:
    """(latency_us, bandwidth_gbps, rms log error) of the single link that reproduces every
    measurement best through the cost model's formulas. ``max_bandwidth_gbps`` bounds the bandwidth:
    a transfer writes every byte into the receiver's memory at least once, so no link is faster than
    the measured memory bandwidth; without the bound, noisy times that hardly grow with the size fit
    a latency-only line and a bandwidth of petabytes per second."""
    import numpy as np
    from scipy.optimize import least_squares

    pts = [p for p in points if p["seconds"]]
    bw_f = np.array([ring_terms(p["op"], p["ranks"])[0] for p in pts])
    steps = np.array([ring_terms(p["op"], p["ranks"])[1] for p in pts])
    s = np.array([p["bytes"] for p in pts], dtype=float)
    t = np.array([p["seconds"] for p in pts], dtype=float)

    def residual(x):
        alpha, inv_bw = np.exp(x)
        return np.log(steps * alpha + bw_f * s * inv_bw) - np.log(t)

    lowest_inv_bw = 1.0 / (max_bandwidth_gbps * 1e9) if max_bandwidth_gbps else 0.0
    x0 = np.log([np.median(t / steps) / 2, max(1e-9, 2.0 * lowest_inv_bw)])
    bounds = ([-np.inf, np.log(lowest_inv_bw) if lowest_inv_bw else -np.inf], [np.inf, np.inf])
    sol = least_squares(residual, x0, bounds=bounds)
    alpha, inv_bw = np.exp(sol.x)
    rms = float(np.sqrt(np.mean(sol.fun ** 2)))
    return alpha * 1e6, 1.0 / inv_bw / 1e9, rms


def fit_per_op(points: list[dict], max_bandwidth_gbps: float | None = None) -> dict[str, dict[str, float]]:
    """Per operation, the (latency_us, bandwidth_gbps) pair fitted like ``fit_link`` over that
    operation's measurements alone (every group size): the profile's ``collectives:``."""
    out = {}
    for op in sorted({p["op"] for p in points}):
        mine = [p for p in points if p["op"] == op and p["seconds"]]
        if len({p["bytes"] for p in mine}) >= 2:
            latency_us, bandwidth_gbps, _ = fit_link(mine, max_bandwidth_gbps)
            out[op] = {"latency_us": round(latency_us, 3), "bandwidth_gbps": round(bandwidth_gbps, 6)}
    return out


def monotone_envelope(values: list[float]) -> list[float]:
    """The running maximum: each value raised to the largest before it, so the sequence never decreases.

    A GEMM's achievable efficiency does not decrease with its size: a larger product can be computed
    as blocks of a smaller one (the blocked algorithm of Goto and van de Geijn, "Anatomy of
    High-Performance Matrix Multiplication", ACM TOMS 34(3), 2008), at that smaller size's rate. A
    measured dip at a larger size is noise or a library's choice of kernel, not a property the cost
    model should learn; the raw rates stay in the profile's notes."""
    out: list[float] = []
    for v in values:
        out.append(v if not out else max(v, out[-1]))
    return out


def efficiency_curve(points: list[list[float]]) -> tuple[float, list[list[float]]]:
    """(peak TFLOP/s, [[GFLOP per call, fraction of peak], ...]) from [[GFLOP, TFLOP/s], ...]:
    the rate at each size over the best rate, made non-decreasing in size (``monotone_envelope``)."""
    peak = max(rate for _, rate in points)
    sizes, fractions = [], []
    for gflop, rate in sorted(points):
        if sizes and gflop <= sizes[-1]:
            continue
        sizes.append(gflop)
        fractions.append(min(1.0, max(rate / peak, 1e-4)))
    curve = [[float(f"{g:.6g}"), float(f"{e:.4f}")] for g, e in zip(sizes, monotone_envelope(fractions))]
    return peak, curve


def pipeline_action_overhead_us(probe: dict[str, float], p2p_s: float) -> float:
    """Per-action host cost implied by a probe run, in the cost model's terms: with stage time
    v (chunk + 2 a) per micro-batch, the pipeline takes (m + (p - 1) / v) v (chunk + 2 a) plus
    2 (m v + p - 1) point-to-point transfers (advisor.cost.estimate); solved for a, at least 0."""
    m, v, p = probe["micro_batches"], probe["virtual_stages"], probe["stages"]
    transfers = 2.0 * p2p_s * (m * v + p - 1)
    per_stage_mb = (probe["step_s"] - transfers) / (m + (p - 1) / v) / v
    return max((per_stage_mb - probe["chunk_s"]) / 2.0, 0.0) * 1e6


def elementwise_efficiency(profile: dict[str, Any], probe_s: float) -> float:
    """The ``memory_efficiency`` that makes the cost model reproduce the probe's time: the
    element-wise seconds it predicts at full bandwidth over the seconds left after its GEMM and
    host predictions (clamped to [0.02, 1])."""
    from dataclasses import replace

    from advisor.cost.estimate import estimate
    from advisor.space.strategy import Strategy
    from advisor.specs.hardware import hardware_from_dict
    from advisor.specs.job import Cluster, TrainingJob
    from advisor.specs.model import model_from_dict

    hw = hardware_from_dict(profile, "calibrated profile")
    hw = replace(hw, device=replace(hw.device, memory_efficiency=1.0))
    no_memory = replace(hw, device=replace(hw.device, memory_bandwidth_gbps=hw.device.memory_bandwidth_gbps * 1e6))
    model = model_from_dict(PROBE_MODEL, "calibration probe")
    job = TrainingJob(global_batch_size=PROBE_BATCH, seq_length=PROBE_MODEL["seq_length"], dtype="fp32",
                      attention="math", framework="pytorch")
    strategy = Strategy(dp=1, tp=1, pp=1, micro_batch_size=PROBE_BATCH, num_micro_batches=1)
    cluster = Cluster(nodes=1, devices=1)
    full, gemm_only = (estimate(model, h, cluster, job, strategy).time_s for h in (hw, no_memory))
    elementwise = full["compute"] - gemm_only["compute"]
    left = probe_s - gemm_only["compute"] - full["host_overhead"]
    if elementwise <= 0 or left <= 0:
        return 1.0
    return min(1.0, max(0.02, elementwise / left))


def _median_points(lists: list[list[list[float]]]) -> list[list[float]]:
    """[[x, y], ...] lists measured at the same x's -> [[x, median y], ...]."""
    return [[pts[0][0], statistics.median(p[1] for p in pts)] for pts in zip(*lists)]


def merge_rounds(rounds: list[dict[str, Any]]) -> tuple[dict, dict, dict, dict | None]:
    """One rank's repeated measurements -> the median of each figure over the rounds: the
    machine's typical speed, as the executor's median steps see it."""
    first = rounds[0]
    matmul = {k: _median_points([r["matmul"][k] for r in rounds]) for k in first["matmul"]}
    memory = {k: statistics.median(r["memory"][k] for r in rounds) for k in first["memory"]}
    points = [dict(p, seconds=None if p["seconds"] is None else statistics.median(
        r["comm"]["points"][i]["seconds"] for r in rounds)) for i, p in enumerate(first["comm"]["points"])]
    comm = {"groups": first["comm"]["groups"], "points": points}
    pipeline = None
    if first["pipeline"] is not None:
        pipeline = {name: dict(probe, step_s=statistics.median(r["pipeline"][name]["step_s"] for r in rounds),
                               chunk_s=statistics.median(r["pipeline"][name]["chunk_s"] for r in rounds))
                    for name, probe in first["pipeline"].items()}
    return matmul, memory, comm, pipeline
