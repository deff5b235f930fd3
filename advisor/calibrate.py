"""Measure this machine into a hardware profile (the schema of advisor.specs.hardware).

``advisor calibrate [--backend gloo|nccl] [--nproc N] [--out PROFILE.yaml]`` starts N processes (one
per device: GPUs with nccl, CPU ranks with gloo), each pinned to its share of the cores exactly as
``advisor execute`` runs ranks, and measures, all ranks at once (so shared cores and memory are
contended as in a real run):

* matmul throughput at GEMM sizes from 2 MFLOP to a few GFLOP per call, for each dtype the device
  runs (fp32, bf16, fp16; tf32 on CUDA): ``peak_tflops`` is the best rate seen and
  ``matmul_efficiency`` the rate at each size over that peak (log-linear in GFLOP per call, as the
  cost model reads it);
* memory bandwidth (a large out-of-place add, counted as two reads and one write) ->
  ``memory_bandwidth_gbps``; the host time of one transformer layer's forward and backward at a
  negligible size, divided by the cost model's kernels per layer -> ``launch_overhead_us`` (eager
  PyTorch's per-operator cost, which dominates small layers);
* all-reduce, all-gather, reduce-scatter and point-to-point send/recv for groups of 2..N ranks at
  message sizes from 4 KiB to 16 MiB. Each (operation, group size) gets an alpha-beta fit
  t = a + S / b; the link's ``latency_us`` and ``bandwidth_gbps`` are then the pair that best
  reproduces every measurement through the cost model's own ring formulas (advisor.cost.comm:
  all-reduce 2(g-1)/g S/B + 2(g-1) alpha, all-gather and reduce-scatter (g-1)/g S/B + (g-1) alpha,
  point-to-point alpha + S/B), least squares on log time.

Every raw figure is kept under ``notes:`` keys of the profile. The result loads with
``advisor.specs.hardware.load_hardware`` and every command takes it with ``--hardware PATH``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from advisor.errors import AdvisorError

MESSAGE_BYTES = (4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20)
QUICK_MESSAGE_BYTES = (4 << 10, 256 << 10, 4 << 20)
GEMM_SIZES = (32, 64, 128, 256, 512, 1024, 1536)   # n for an n x n by n x n matmul: 2n^3 FLOPs
QUICK_GEMM_SIZES = (32, 128, 512)
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "p2p")


@dataclass(frozen=True)
class CalibrateOptions:
    backend: str = "auto"
    nproc: int | None = None
    quick: bool = False
    timeout_s: float = 900.0


# ---- worker side (one per rank) ------------------------------------------------------------------
def _timeit(fn, repeats: int, sync) -> float:
    """Median seconds of fn() over repeats (one warm-up call)."""
    fn()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _matmul(device, dtypes, sizes, sync, budget_s: float = 0.2) -> dict[str, list[list[float]]]:
    import torch

    out = {}
    for name, dtype in dtypes.items():
        points = []
        for n in sizes:
            a = torch.randn(n, n, device=device).to(dtype)
            b = torch.randn(n, n, device=device).to(dtype)
            one = _timeit(lambda: torch.mm(a, b), 2, sync)
            reps = max(3, min(50, int(budget_s / max(one, 1e-6))))
            t = _timeit(lambda: torch.mm(a, b), reps, sync)
            points.append([2.0 * n ** 3 / 1e9, 2.0 * n ** 3 / t / 1e12])   # [GFLOP per call, TFLOP/s]
        out[name] = points
    return out


def _memory(device, sync) -> dict[str, float]:
    import torch

    n = 32 << 20 if device.type == "cuda" else 8 << 20          # floats: 128 MiB / 32 MiB
    x, y = torch.randn(n, device=device), torch.randn(n, device=device)
    z = torch.empty_like(x)
    t = _timeit(lambda: torch.add(x, y, out=z), 10, sync)
    small_x = torch.randn(256, device=device, requires_grad=True)

    def tiny_op():
        (small_x * 1.5).sum().backward()   # one op forward, its backward, and the reduction's
    op = _timeit(tiny_op, 200, sync)
    return {"bandwidth_gbps": 3 * 4 * n / t / 1e9, "op_with_autograd_us": op * 1e6 / 3,
            "layer_host_us": _layer_host_us(device, sync),
            "optimizer_us_per_tensor": _optimizer_us_per_tensor(device, sync)}


def _optimizer_us_per_tensor(device, sync, tensors: int = 64) -> float:
    """One AdamW step (PyTorch's default implementation for the device) over many tiny parameter
    tensors, per tensor: the optimizer's host cost that does not depend on the parameter count."""
    import torch

    params = [torch.nn.Parameter(torch.randn(16, device=device)) for _ in range(tensors)]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW(params, lr=1e-3)
    opt.step()
    return _timeit(opt.step, 50, sync) * 1e6 / tensors


def _layer_host_us(device, sync) -> float:
    """Forward + backward of one transformer layer of the executor's model at a negligible size
    (hidden 32, 8 tokens): what eager PyTorch spends per layer besides the arithmetic."""
    import torch

    from advisor.executor.model import Block, ModelConfig

    cfg = ModelConfig(num_layers=1, hidden_size=32, num_attention_heads=2, num_kv_heads=2, ffn_hidden_size=64,
                      ffn_activation="gelu", vocab_size=64, seq_length=8)
    block = Block(cfg).to(device)
    x = torch.randn(1, 8, 32, device=device, requires_grad=True)
    return _timeit(lambda: block(x).sum().backward(), 50, sync) * 1e6


def _collectives(sizes, repeats: int) -> dict[str, Any]:
    """Median seconds per (op, group size, bytes) over groups of the first g ranks."""
    import torch
    import torch.distributed as dist

    world, rank = dist.get_world_size(), dist.get_rank()
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    groups = sorted({g for g in (2, 4, 8, 16, world) if 2 <= g <= world})
    results = []
    for g in groups:
        group = dist.new_group(list(range(g)))
        for op in COLLECTIVES:
            for nbytes in sizes:
                t = None
                if rank < g:
                    t = _one_collective(op, nbytes, g, rank, group, device, sync, repeats)
                dist.barrier()
                if rank == 0:
                    results.append({"op": op, "ranks": g, "bytes": nbytes, "seconds": t})
    return {"groups": groups, "points": results}


def _one_collective(op, nbytes, g, rank, group, device, sync, repeats) -> float:
    import torch
    import torch.distributed as dist

    n = max(g, nbytes // 4)
    n -= n % g
    buf = torch.ones(n, device=device)
    shard = torch.ones(n // g, device=device)
    if op == "all_reduce":
        fn = lambda: dist.all_reduce(buf, group=group)  # noqa: E731
    elif op == "all_gather":
        fn = lambda: dist.all_gather_into_tensor(buf, shard, group=group)  # noqa: E731
    elif op == "reduce_scatter":
        fn = lambda: dist.reduce_scatter_tensor(shard, buf, group=group)  # noqa: E731
    else:   # ping-pong between ranks 0 and 1 of the group: half a round trip per transfer
        def fn():
            if rank == 0:
                dist.send(buf, 1, group=group)
                dist.recv(buf, 1, group=group)
            elif rank == 1:
                dist.recv(buf, 0, group=group)
                dist.send(buf, 0, group=group)
    t = _timeit(fn, repeats, lambda: (sync(), dist.barrier(group=group)))
    return t / 2 if op == "p2p" else t


def worker_main(argv: list[str] | None = None) -> int:
    """Per-rank entry (``python -m advisor.calibrate --worker``), started by the launcher."""
    import datetime

    import torch
    import torch.distributed as dist

    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out-dir", required=True)
    args = ap.parse_args(argv)
    out = Path(args.out_dir)
    rank = int(os.environ.get("RANK", "0"))
    from advisor.executor.worker import _watchdog, _write

    _watchdog()
    try:
        backend = args.backend if args.backend != "auto" else ("nccl" if torch.cuda.is_available() else "gloo")
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            device = torch.device("cuda", torch.cuda.current_device())
            sync = lambda: torch.cuda.synchronize(device)  # noqa: E731
            dtypes = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
        else:
            device = torch.device("cpu")
            torch.set_num_threads(int(os.environ.get("ADVISOR_EXECUTOR_THREADS", "1")))
            sync = lambda: None  # noqa: E731
            dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
        timeout = datetime.timedelta(seconds=float(os.environ.get("ADVISOR_EXECUTOR_PG_TIMEOUT_S", "120")))
        dist.init_process_group(backend, timeout=timeout)
        dist.barrier()
        sizes = QUICK_GEMM_SIZES if args.quick else GEMM_SIZES
        matmul = {}
        for name, dtype in dtypes.items():   # all ranks at once: contention as in a run
            if backend == "nccl":
                torch.backends.cuda.matmul.allow_tf32 = name == "tf32"
            matmul.update(_matmul(device, {name: dtype}, sizes, sync))
            dist.barrier()
        memory = _memory(device, sync)
        dist.barrier()
        comm = _collectives(QUICK_MESSAGE_BYTES if args.quick else MESSAGE_BYTES, 3 if args.quick else 7)
        result = {"rank": rank, "backend": backend, "device": _device_name(device), "matmul": matmul,
                  "memory": memory, "comm": comm if rank == 0 else None,
                  "device_memory_bytes": _device_memory(device), "threads": torch.get_num_threads()}
        _write(out / f"rank{rank}.json", result)
        dist.barrier()
        dist.destroy_process_group()
        return 0
    except BaseException as exc:
        import traceback

        _write(out / f"rank{rank}.error.json", {"rank": rank, "error": f"{type(exc).__name__}: {exc}",
                                                "traceback": traceback.format_exc()})
        os._exit(1)


def _device_name(device) -> str:
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine() or "cpu"


def _device_memory(device) -> int | None:
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return None


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
                            "bus_bandwidth_gbps": (bw_factor / c / 1e9) if c > 0 else float("inf"),
                            "spread": float(np.max(np.abs(a + c * s - t) / t))}
    return out


def fit_link(points: list[dict]) -> tuple[float, float, float]:
    """(latency_us, bandwidth_gbps, rms log error) of the single link that reproduces every
    measurement best through the cost model's formulas."""
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

    x0 = np.log([np.median(t / steps) / 2, 1e-9])
    sol = least_squares(residual, x0)
    alpha, inv_bw = np.exp(sol.x)
    rms = float(np.sqrt(np.mean(sol.fun ** 2)))
    return alpha * 1e6, 1.0 / inv_bw / 1e9, rms


def efficiency_curve(points: list[list[float]]) -> tuple[float, list[list[float]]]:
    """(peak TFLOP/s, [[GFLOP per call, fraction of peak], ...]) from [[GFLOP, TFLOP/s], ...]."""
    peak = max(rate for _, rate in points)
    curve = []
    for gflop, rate in sorted(points):
        eff = min(1.0, max(rate / peak, 1e-4))
        if curve and gflop <= curve[-1][0]:
            continue
        curve.append([float(f"{gflop:.6g}"), float(f"{eff:.4f}")])
    return peak, curve


def build_profile(ranks: list[dict], nproc: int, name: str | None = None) -> dict[str, Any]:
    """The profile mapping (hardware_from_dict's schema) from the per-rank measurements."""
    backend = ranks[0]["backend"]
    peaks, curves = {}, {}
    for dtype in ranks[0]["matmul"]:
        # per size: the slowest rank (every rank computes at once; the slowest sets the pace)
        merged = [[pt[0], min(r["matmul"][dtype][i][1] for r in ranks)] for i, pt in enumerate(ranks[0]["matmul"][dtype])]
        peaks[dtype], curves[dtype] = efficiency_curve(merged)
    comm_points = ranks[0]["comm"]["points"]
    latency_us, bandwidth_gbps, rms = fit_link(comm_points)
    per_op = fit_alpha_beta(comm_points)
    bandwidth = min(r["memory"]["bandwidth_gbps"] for r in ranks)
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
            "optimizer_overhead_us_per_tensor": round(statistics.median(r["memory"]["optimizer_us_per_tensor"] for r in ranks), 3),
            "peak_tflops": {k: round(v, 6) for k, v in peaks.items()},
            "matmul_efficiency": curves[reference],
            "notes": {"matmul_tflops_by_dtype": {k: [[g, round(r, 6)] for g, r in v] for k, v in _raw_matmul(ranks).items()},
                      "efficiency_by_dtype": curves, "threads_per_rank": ranks[0]["threads"],
                      "memory_bandwidth_gbps_by_rank": [round(r["memory"]["bandwidth_gbps"], 3) for r in ranks],
                      "op_with_autograd_us_by_rank": [round(r["memory"]["op_with_autograd_us"], 3) for r in ranks],
                      "layer_host_us_by_rank": [round(r["memory"]["layer_host_us"], 1) for r in ranks],
                      "launch_overhead_us": "host time of one tiny transformer layer (forward + backward) divided by "
                                            "the cost model's kernels per layer (KERNELS_FORWARD + KERNELS_BACKWARD)",
                      "memory_efficiency": "1.0: memory_bandwidth_gbps is already the achieved figure"},
        },
        "node": {
            "devices_per_node": nproc,
            "intra_node": {
                "topology": "switch", "bandwidth_gbps": round(bandwidth_gbps, 6), "latency_us": round(latency_us, 3),
                "efficiency": 1.0,
                "notes": {"fit": "one link for all collectives through the cost model's ring formulas, "
                                 f"rms log error {rms:.2f}",
                          "per_op": {k: {kk: round(vv, 4) for kk, vv in v.items()} for k, v in per_op.items()},
                          "raw": comm_points},
            },
        },
        "inter_node": {"bandwidth_gbps": round(bandwidth_gbps, 6), "latency_us": round(latency_us, 3),
                       "topology": "fat-tree", "notes": "single machine: same as intra_node (not measured)"},
        "host": {"memory_gib": round(host_bytes / 2 ** 30, 3),
                 "pcie_bandwidth_gbps": round(bandwidth, 3) if backend != "nccl" else round(bandwidth, 3),
                 "notes": "CPU ranks have no PCIe hop: host memory bandwidth" if backend != "nccl"
                 else "not measured: set to the device memory bandwidth"},
    }


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


# ---- the command ---------------------------------------------------------------------------------
def default_nproc(backend: str) -> int:
    try:
        import torch
        if backend != "gloo" and torch.cuda.is_available():
            return torch.cuda.device_count()
    except ImportError:
        pass
    return max(2, min(os.cpu_count() or 2, 8))


def calibrate(options: CalibrateOptions, workdir: str | None = None) -> dict[str, Any]:
    """Measure and return the profile mapping."""
    import tempfile

    from advisor.executor.launch import LaunchOptions, launch_module

    if options.backend not in ("auto", "gloo", "nccl"):
        raise AdvisorError(f"--backend must be gloo or nccl, got {options.backend!r}")
    nproc = options.nproc or default_nproc(options.backend)
    if nproc < 2:
        raise AdvisorError(f"--nproc must be at least 2 (collectives need two ranks), got {nproc}")
    out = Path(workdir or tempfile.mkdtemp(prefix="advisor-calibrate-"))
    out.mkdir(parents=True, exist_ok=True)
    args = ["--worker", "--backend", options.backend] + (["--quick"] if options.quick else [])
    launch_module("advisor.calibrate", args, out, LaunchOptions(nproc=nproc, timeout_s=options.timeout_s,
                                                               pg_timeout_s=120.0, backend=options.backend))
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)]
    return build_profile(ranks, nproc)


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

    profile = _plain(profile)
    hardware_from_dict(profile, str(path))   # the result must load
    header = ("# Measured by `advisor calibrate` (advisor/calibrate.py). Units: *_gbps = 10^9 bytes/s,\n"
              "# *_gib = 2^30 bytes, *_us = microseconds, peak_tflops = 10^12 FLOP/s. Raw figures under notes.\n")
    try:
        Path(path).write_text(header + yaml.safe_dump(_plain(profile), sort_keys=False, width=110, default_flow_style=None))
    except OSError as exc:
        raise AdvisorError(f"cannot write profile to {path}: {exc.strerror}") from None


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
    table.add_row("memory bandwidth", f"{dev['memory_bandwidth_gbps']:.1f} GB/s")
    table.add_row("operator overhead", f"{dev['launch_overhead_us']:.1f} us")
    table.add_row("link latency / bandwidth", f"{link['latency_us']:.1f} us / {link['bandwidth_gbps']:.2f} GB/s")
    for key, fit in link["notes"]["per_op"].items():
        table.add_row(f"  {key}", f"{fit['latency_us']:.1f} us + bus {fit['bus_bandwidth_gbps']:.2f} GB/s")
    console.print(table)
    if saved_to:
        console.print(f"profile written to {saved_to} (use it with --hardware {saved_to})", markup=False, highlight=False)


if __name__ == "__main__":
    if "--worker" in sys.argv:
        sys.exit(worker_main(sys.argv[1:]))
    sys.exit("use `advisor calibrate`")
