"""The hardware profile (advisor.specs.hardware's schema) built from the ranks' measurements,
written as YAML, and shown as a table."""

from __future__ import annotations

import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

from advisor.calibration.fit import (efficiency_curve, elementwise_efficiency, fit_alpha_beta, fit_link, fit_per_op,
                                     pipeline_action_overhead_us)
from advisor.calibration.rounds import summarize
from advisor.calibration.probes import PS_MESSAGES_PER_ROUND, PS_PROBE
from advisor.runtime.files import write_atomic


def build_profile(ranks: list[dict], nproc: int, name: str | None = None) -> dict[str, Any]:
    """The profile mapping (hardware_from_dict's schema) from the per-rank measurements; the
    element-wise efficiency last, since it is fitted through the cost model with everything else.
    On GPUs (nccl) the probe layer is too small to time anything but kernel launches, and Megatron's
    fused Adam moves its 28 bytes per parameter: both keep the cost model's defaults there."""
    profile = _measured_profile(ranks, nproc, name)
    if ranks[0].get("contention"):
        profile["node"]["intra_node"]["notes"]["contention"] = contention_notes(profile, ranks[0]["contention"])
    if all("rounds" in r for r in ranks):
        profile["notes"] = {"rounds": summarize([r["rounds"] for r in ranks])}
    if ranks[0]["backend"] == "nccl":
        profile["device"].pop("optimizer_bytes_per_param")
        return profile
    probes = [r["memory"]["elementwise_probe_s"] for r in ranks if "elementwise_probe_s" in r["memory"]]
    if probes:
        device = profile["device"]
        eff = elementwise_efficiency(profile, statistics.median(probes))
        device["memory_efficiency"] = round(eff, 4)
        # bytes per parameter were counted at full bandwidth; the cost model divides by bandwidth x efficiency
        device["optimizer_bytes_per_param"] = round(device["optimizer_bytes_per_param"] * eff, 2)
        device["notes"]["memory_efficiency"] = (
            "element-wise work of a one-layer GPT (hidden 256, 128 tokens, batch 2, fp32) at this fraction of "
            f"memory_bandwidth_gbps reproduces its measured forward + backward ({statistics.median(probes) * 1e3:.2f} ms) "
            "with the GEMM and host times the cost model predicts from the other figures")
    return profile


def _measured_profile(ranks: list[dict], nproc: int, name: str | None = None) -> dict[str, Any]:
    backend = ranks[0]["backend"]
    peaks, curves = {}, {}
    for dtype in ranks[0]["matmul"]:
        # per size: the slowest rank (every rank computes at once; the slowest sets the pace)
        merged = [[pt[0], min(r["matmul"][dtype][i][1] for r in ranks)] for i, pt in enumerate(ranks[0]["matmul"][dtype])]
        peaks[dtype], curves[dtype] = efficiency_curve(merged)
    comm_points = ranks[0]["comm"]["points"]
    bandwidth = min(r["memory"]["bandwidth_gbps"] for r in ranks)
    latency_us, bandwidth_gbps, rms = fit_link(comm_points, bandwidth)
    collectives = fit_per_op(comm_points, bandwidth)
    actions = _action_overheads(ranks[0].get("pipeline"), collectives.get("p2p"), latency_us, bandwidth_gbps)
    per_op = fit_alpha_beta(comm_points)
    from advisor.cost.optimizer_step import ADAM_BYTES_PER_PARAM
    from advisor.cost.estimate import KERNELS_BACKWARD, KERNELS_FORWARD

    layer_us = statistics.median(r["memory"]["layer_host_us"] for r in ranks)
    op_us = layer_us / (KERNELS_FORWARD + KERNELS_BACKWARD)
    host_bytes = _host_memory_bytes()
    device_bytes = ranks[0]["device_memory_bytes"] or host_bytes / nproc
    reference = "fp32" if "fp32" in peaks else next(iter(peaks))
    kind = "GPU" if backend == "nccl" else "CPU rank"
    return {
        "name": name or f"local-{platform.node() or 'machine'}-{nproc}x{backend}",
        "source": f"advisor calibrate on {platform.node()} ({time.strftime('%Y-%m-%d %H:%M')}): {nproc} {kind}s over "
                  f"{backend}, measured all at once",
        "device": {
            "name": ranks[0]["device"],
            "memory_gib": round(device_bytes / 2 ** 30, 3),
            "memory_bandwidth_gbps": round(bandwidth, 3),
            "memory_efficiency": 1.0,
            "launch_overhead_us": round(op_us, 3),
            # a CPU rank runs each operator on its own thread: overhead adds to compute (nccl: GPUs overlap)
            "asynchronous_launch": backend == "nccl",
            # ... and its collectives on that same core, in turn with the compute (nccl: overlapped)
            "overlaps_communication": backend == "nccl",
            "optimizer_overhead_us_per_tensor": round(statistics.median(r["memory"]["optimizer_us_per_tensor"] for r in ranks), 3),
            "optimizer_bytes_per_param": round(statistics.median(r["memory"].get("optimizer_bytes_per_param", ADAM_BYTES_PER_PARAM)
                                                                 for r in ranks), 2),
            # CPU ranks run the schedule's bookkeeping in line with the compute (nccl: hidden)
            **({"pipeline_action_overhead_us": actions} if actions and backend != "nccl" else {}),
            "peak_tflops": {k: round(v, 6) for k, v in peaks.items()},
            "matmul_efficiency": curves[reference],
            "notes": {"matmul_tflops_by_dtype": {k: [[g, round(r, 6)] for g, r in v] for k, v in _raw_matmul(ranks).items()},
                      "efficiency_by_dtype": curves, "threads_per_rank": ranks[0]["threads"],
                      "matmul_efficiency": "measured rate over peak at each size, raised to the running maximum "
                                           "over smaller sizes (never decreasing with size; raw rates in "
                                           "matmul_tflops_by_dtype): advisor.calibration.fit.monotone_envelope",
                      "memory_bandwidth_gbps_by_rank": [round(r["memory"]["bandwidth_gbps"], 3) for r in ranks],
                      "op_with_autograd_us_by_rank": [round(r["memory"]["op_with_autograd_us"], 3) for r in ranks],
                      "layer_host_us_by_rank": [round(r["memory"]["layer_host_us"], 1) for r in ranks],
                      "launch_overhead_us": "host time of one tiny transformer layer (forward + backward) divided by "
                                            "the cost model's kernels per layer (KERNELS_FORWARD + KERNELS_BACKWARD)",
                      "memory_efficiency": "1.0: memory_bandwidth_gbps is already the achieved figure",
                      "pipeline_action_overhead_us": "two-stage pipeline of Linear(8, 8) chunks per schedule "
                                                     "(torch.distributed.pipelining): step time less the "
                                                     "transfers and chunk compute the cost model counts, per "
                                                     "forward or backward action",
                      "pipeline_probe": ranks[0].get("pipeline")},
        },
        "node": {
            "devices_per_node": nproc,
            "intra_node": {
                "topology": "switch", "bandwidth_gbps": round(bandwidth_gbps, 6), "latency_us": round(latency_us, 3),
                "efficiency": 1.0, "collectives": collectives,
                "notes": {"fit": "collectives: each operation's own latency and bandwidth through the cost "
                                 "model's ring formulas; latency_us / bandwidth_gbps: one link for all of them "
                                 f"(rms log error {rms:.2f}), used by operations without their own",
                          "per_op": {k: {kk: vv if vv is None else round(vv, 4) for kk, vv in v.items()}
                                     for k, v in per_op.items()},
                          "raw": comm_points},
            },
        },
        "inter_node": _inter_node(ranks[0].get("ps_round_s"), bandwidth_gbps, latency_us),
        "host": {"memory_gib": round(host_bytes / 2 ** 30, 3),
                 "pcie_bandwidth_gbps": round(bandwidth, 3),
                 **({"cpu_adam_params_per_s": {k: float(f"{v:.4g}") for k, v in ranks[0]["cpu_adam"].items()}}
                    if ranks[0].get("cpu_adam") else {}),
                 "notes": {"pcie_bandwidth_gbps": "CPU ranks have no PCIe hop: host memory bandwidth"
                           if backend != "nccl" else "not measured: set to the device memory bandwidth",
                           "cpu_adam_params_per_s": "torch.optim.AdamW on one fp32 tensor with all the host's "
                                                    f"{os.cpu_count()} cores (advisor.calibration.probes._cpu_adam)"}},
    }


def contention_notes(profile: dict[str, Any], points: list[dict]) -> dict[str, Any]:
    """The contention probe's medians beside the cost model's figures for them, from this profile's own
    fitted links (advisor.calibration.contention_probe)."""
    from advisor.calibration.contention_probe import predicted
    from advisor.specs.hardware import hardware_from_dict

    hw = hardware_from_dict(_plain(profile), "the measured profile")
    rows = []
    for point in points:
        model = predicted(hw, point)
        rows.append({"bytes": point["bytes"],
                     "measured_ms": {k[:-2]: round(point[k] * 1e3, 3) for k in ("all_reduce_s", "p2p_s", "together_s")},
                     "predicted_ms": {k[:-2]: round(v * 1e3, 3) for k, v in model.items()}})
    return {"probe": "an all-reduce and a send between ranks 0 and 1, each on its own process group, alone and "
                     "started together (median); predicted: together_shared = the link shared byte by byte "
                     "(advisor.cost.contention), together_independent = each on links of its own",
            "points": rows}


def _action_overheads(probes: dict | None, p2p: dict | None, latency_us: float, bandwidth_gbps: float) -> dict[str, float]:
    """Per schedule, the per-action overhead from the pipeline probe, with point-to-point priced as
    the profile will price it (its own fit when measured, else the link's)."""
    if not probes:
        return {}
    lat, bw = (p2p["latency_us"], p2p["bandwidth_gbps"]) if p2p else (latency_us, bandwidth_gbps)
    return {name: round(pipeline_action_overhead_us(probe, lat * 1e-6 + probe["message_bytes"] / (bw * 1e9)), 3)
            for name, probe in probes.items()}


def _raw_matmul(ranks):
    return {dtype: [[pt[0], min(r["matmul"][dtype][i][1] for r in ranks)] for i, pt in enumerate(ranks[0]["matmul"][dtype])]
            for dtype in ranks[0]["matmul"]}


def _host_memory_bytes() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return float(line.split()[1]) * 1024
    except OSError:
        pass
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def _plain(obj):
    """numpy scalars -> Python numbers, recursively (YAML-safe)."""
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if hasattr(obj, "item") and not isinstance(obj, (str, bytes)):
        return obj.item()
    return obj


def write_profile(profile: dict[str, Any], path: str | Path) -> None:
    import yaml

    from advisor.specs.hardware import hardware_from_dict

    from advisor.specs.untrusted import check_tree

    profile = _plain(profile)
    check_tree(profile, str(path))           # the loader's own checks (no infinite numbers, sizes)
    hardware_from_dict(profile, str(path))   # the result must load
    header = ("# Measured by `advisor calibrate` (advisor/calibration/). Units: *_gbps = 10^9 bytes/s,\n"
              "# *_gib = 2^30 bytes, *_us = microseconds, peak_tflops = 10^12 FLOP/s. Raw figures under notes.\n")
    text = header + yaml.safe_dump(_plain(profile), sort_keys=False, width=110, default_flow_style=None)
    write_atomic(path, text, what="the profile")


def render_profile(console, profile: dict[str, Any], saved_to: str | None = None) -> None:
    """A short table of the measured figures."""
    from rich.table import Table

    dev, link = profile["device"], profile["node"]["intra_node"]
    table = Table(title=profile["name"])
    table.add_column("figure")
    table.add_column("value")
    for dtype, peak in dev["peak_tflops"].items():
        table.add_row(f"matmul peak {dtype}", f"{peak * 1e3:.1f} GFLOP/s")
    table.add_row("matmul efficiency (GFLOP per call: fraction)",
                  ", ".join(f"{g:g}: {e:.2f}" for g, e in dev["matmul_efficiency"]))
    table.add_row("memory bandwidth (element-wise efficiency)",
                  f"{dev['memory_bandwidth_gbps']:.1f} GB/s ({dev['memory_efficiency']:.2f})")
    table.add_row("operator overhead", f"{dev['launch_overhead_us']:.1f} us")
    table.add_row("optimizer", f"{dev['optimizer_overhead_us_per_tensor']:.1f} us per tensor, "
                               f"{dev.get('optimizer_bytes_per_param', 28):.1f} bytes per parameter")
    for kind, rate in profile["host"].get("cpu_adam_params_per_s", {}).items():
        table.add_row(f"host CPU Adam ({kind}, all cores)", f"{rate / 1e6:,.0f} M parameters/s")
    for schedule, us in dev.get("pipeline_action_overhead_us", {}).items():
        table.add_row(f"pipeline action, {schedule}", f"{us:.0f} us")
    table.add_row("link latency / bandwidth (all operations)",
                  f"{link['latency_us']:.1f} us / {link['bandwidth_gbps']:.2f} GB/s")
    for op, fit in link.get("collectives", {}).items():
        table.add_row(f"  {op}", f"{fit['latency_us']:.1f} us per step / {fit['bandwidth_gbps']:.2f} GB/s")
    for row in (link.get("notes") or {}).get("contention", {}).get("points", []):
        got, model = row["measured_ms"], row["predicted_ms"]
        table.add_row(f"all-reduce + send together, {row['bytes'] >> 20} MiB",
                      f"{got['together']:.2f} ms (alone {got['all_reduce']:.2f} + {got['p2p']:.2f}); predicted "
                      f"{model['together_shared']:.2f} ms shared, {model['together_independent']:.2f} ms on own links")
    rounds = (profile.get("notes") or {}).get("rounds") if isinstance(profile.get("notes"), dict) else None
    if rounds:
        table.add_row("rounds", f"{rounds['count']} (stopped: {rounds['stopped'] or 'all done'})")
    console.print(table)
    if saved_to:
        console.print(f"profile written to {saved_to} (use it with --hardware {saved_to})", markup=False, highlight=False)


def _inter_node(ps_round_s: float | None, bandwidth_gbps: float, latency_us: float) -> dict[str, Any]:
    """The inter-node link of a single machine: the intra-node figures, and (gloo) the host time of one
    parameter-server message from the measured worker-server round (advisor.calibration.probes)."""
    link = {"bandwidth_gbps": round(bandwidth_gbps, 6), "latency_us": round(latency_us, 3), "topology": "fat-tree",
            "notes": "single machine: same as intra_node (not measured)"}
    if ps_round_s:
        link["message_overhead_us"] = round(ps_round_s / PS_MESSAGES_PER_ROUND * 1e6, 3)
        link["notes"] = {"link": link["notes"],
                         "message_overhead_us": f"a worker-server round of the executor's messages (pull request, "
                                                f"answer, push of {PS_PROBE['rows']} rows x {PS_PROBE['dim']}) took "
                                                f"{ps_round_s * 1e6:.0f} us (median of {PS_PROBE['rounds']}): per message, "
                                                f"a third"}
    return link
