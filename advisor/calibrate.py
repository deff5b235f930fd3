"""Measure this machine into a hardware profile (the schema of advisor.specs.hardware).

``advisor calibrate [--backend gloo|nccl] [--nproc N] [--out PROFILE.yaml]`` starts N processes (one
per device: GPUs with nccl, CPU ranks with gloo), each pinned to its share of the cores exactly as
``advisor execute`` runs ranks, and measures, all ranks at once (so shared cores and memory are
contended as in a real run), every figure in five rounds spread over the run, keeping the median
of each (a virtual machine's speed drifts over seconds; ``--quick``: one round):

* matmul throughput at GEMM sizes from 2 MFLOP to a few GFLOP per call, for each dtype the device
  runs (fp32 and bf16 on CPU; fp32, tf32, bf16, fp16 on CUDA): ``peak_tflops`` is the best rate seen and
  ``matmul_efficiency`` the rate at each size over that peak (log-linear in GFLOP per call, as the
  cost model reads it);
* memory bandwidth (a large out-of-place add, counted as two reads and one write) ->
  ``memory_bandwidth_gbps``; the host time of one transformer layer's forward and backward at a
  negligible size, divided by the cost model's kernels per layer -> ``launch_overhead_us`` (eager
  PyTorch's per-operator cost, which dominates small layers);
* all-reduce, all-gather, reduce-scatter and point-to-point send/recv for groups of 2..N ranks at
  message sizes from 4 KiB to 16 MiB (the ranks start each call together; the first calls on a
  group are left out). Each operation gets the (alpha, B) pair that best reproduces its
  measurements through the cost model's own ring formulas (advisor.cost.comm: all-reduce
  2(g-1)/g S/B + 2(g-1) alpha, all-gather and reduce-scatter (g-1)/g S/B + (g-1) alpha,
  point-to-point alpha + S/B), least squares on log time -> the link's ``collectives:``; the
  link's own ``latency_us`` and ``bandwidth_gbps`` are the single pair fitted to all of them;
* on CPU ranks, a two-stage pipeline of trivial chunks under each torch.distributed.pipelining
  schedule -> ``pipeline_action_overhead_us`` (the schedule's host cost per forward or backward
  action, which the cost model adds to every pipeline stage's time per micro-batch);
* AdamW built as the executor builds it, over many tiny tensors -> ``optimizer_overhead_us_per_tensor``,
  and over one large tensor, at the measured bandwidth -> ``optimizer_bytes_per_param``.

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
ROUNDS = 5   # full calibration: every measurement five times, spread over the run, the median kept


@dataclass(frozen=True)
class CalibrateOptions:
    backend: str = "auto"
    nproc: int | None = None
    quick: bool = False
    timeout_s: float = 900.0


# ---- worker side (one per rank) ------------------------------------------------------------------
def _timeit(fn, repeats: int, sync, align=None, warmup: int = 1) -> float:
    """Median seconds of fn() (and the device sync) over repeats, after warm-up calls; ``align``
    (a barrier) runs before each timing starts, outside it."""
    for _ in range(warmup):
        fn()
        sync()
    times = []
    for _ in range(repeats):
        if align is not None:
            align()
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
    bandwidth = 3 * 4 * n / t / 1e9
    per_tensor = _optimizer_us_per_tensor(device, sync)
    return {"bandwidth_gbps": bandwidth, "op_with_autograd_us": op * 1e6 / 3,
            "layer_host_us": layer_host_us(device, sync),
            "optimizer_us_per_tensor": per_tensor,
            "optimizer_bytes_per_param": _optimizer_bytes_per_param(device, sync, bandwidth, per_tensor),
            "elementwise_probe_s": _elementwise_probe_s(device, sync)}


def _optimizer_us_per_tensor(device, sync, tensors: int = 64) -> float:
    """One AdamW step, built exactly as the executor builds it (multi-tensor kernels), over many tiny
    parameter tensors, per tensor: the optimizer's host cost that does not depend on the parameter
    count."""
    import torch

    from advisor.executor.parallel import make_torch_optimizer

    params = [torch.nn.Parameter(torch.randn(16, device=device)) for _ in range(tensors)]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = make_torch_optimizer("adamw", 1e-3)(params)
    opt.step()
    return _timeit(opt.step, 50, sync) * 1e6 / tensors


def _optimizer_bytes_per_param(device, sync, bandwidth_gbps: float, per_tensor_us: float,
                                numel: int = 4 << 20) -> float:
    """The executor's AdamW over one large tensor: its time beyond the per-tensor overhead, at the
    measured memory bandwidth, as bytes moved per parameter (a fused Adam moves about 28)."""
    import torch

    from advisor.executor.parallel import make_torch_optimizer

    param = torch.nn.Parameter(torch.randn(numel, device=device))
    param.grad = torch.randn_like(param)
    opt = make_torch_optimizer("adamw", 1e-3)([param])
    seconds = _timeit(opt.step, 10, sync, warmup=2) - per_tensor_us * 1e-6
    return max(seconds, 0.0) * bandwidth_gbps * 1e9 / numel


# A one-layer GPT at a working size (fp32, math attention): its forward + backward, less the GEMM
# and host time the cost model predicts from the other measurements, prices the element-wise work
# (norms, activations, softmax, residuals), which on a CPU core runs well below streaming bandwidth.
PROBE_MODEL = dict(name="calibration-probe", source="advisor calibrate", num_layers=1, hidden_size=256,
                   num_attention_heads=4, num_kv_heads=4, ffn_hidden_size=1024, ffn_activation="gelu",
                   vocab_size=64, seq_length=128, tie_embeddings=False, norm="layernorm", use_bias=True,
                   position_embedding="learned")
PROBE_BATCH = 2


def _elementwise_probe_s(device, sync) -> float:
    """Median seconds of the probe model's forward + backward (one micro-batch of PROBE_BATCH)."""
    import torch

    from advisor.executor.config import model_config_from_plan
    from advisor.executor.model import GPT, cross_entropy

    cfg = model_config_from_plan(PROBE_MODEL, attention="math")
    model = GPT(cfg, range(cfg.num_layers), True, True, init_seed=0).to(device)
    tokens = torch.randint(0, cfg.vocab_size, (PROBE_BATCH, cfg.seq_length + 1), device=device)
    return _timeit(lambda: cross_entropy(model(tokens[:, :-1]), tokens[:, 1:]).backward(), 10, sync, warmup=2)


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


def layer_host_us(device, sync, repeats: int = 300) -> float:
    """Forward + backward of one transformer layer of the executor's model at a negligible size
    (hidden 32, 8 tokens): what eager PyTorch spends per layer besides the arithmetic."""
    import torch

    from advisor.executor.model import Block, ModelConfig

    cfg = ModelConfig(num_layers=1, hidden_size=32, num_attention_heads=2, num_kv_heads=2, ffn_hidden_size=64,
                      ffn_activation="gelu", vocab_size=64, seq_length=8, norm="layernorm", use_bias=True,
                      position_embedding="learned", attention="math")   # the cost model's reference layer
    block = Block(cfg).to(device)
    x = torch.randn(1, 8, 32, device=device, requires_grad=True)
    return _timeit(lambda: block(x).sum().backward(), repeats, sync, warmup=10) * 1e6


def _collectives(sizes, repeats: int, rounds: int = 1) -> dict[str, Any]:
    """Median seconds per (op, group size, bytes) over groups of the first g ranks (the median of
    ``rounds`` sweeps over every operation and size)."""
    import torch
    import torch.distributed as dist

    world, rank = dist.get_world_size(), dist.get_rank()
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    groups = sorted({g for g in (2, 4, 8, 16, world) if 2 <= g <= world})
    samples: dict[tuple[str, int, int], list[float]] = {}
    for g in groups:
        group = dist.new_group(list(range(g)))
        for _ in range(rounds):
            for op in COLLECTIVES:
                for nbytes in sizes:
                    if rank < g:
                        t = _one_collective(op, nbytes, g, rank, group, device, sync, repeats)
                        samples.setdefault((op, g, nbytes), []).append(t)
                    dist.barrier()
    results = [{"op": op, "ranks": g, "bytes": nbytes, "seconds": statistics.median(samples[(op, g, nbytes)])
                if (op, g, nbytes) in samples else None}
               for g in groups for op in COLLECTIVES for nbytes in sizes]
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
    # the ranks start each call together (barrier outside the timing); the first calls of an
    # operation on a group set up its connections and buffers, so several are left out
    t = _timeit(fn, repeats, sync, align=lambda: (sync(), dist.barrier(group=group)), warmup=3)
    return t / 2 if op == "p2p" else t


PIPELINE_PROBE = dict(micro_batches=8, width=8, steps=20)


def _pipeline_actions(device, sync, steps: int) -> dict[str, dict[str, float]] | None:
    """Ranks 0 and 1 run a two-stage pipeline of trivial chunks (one Linear(8, 8) each) with every
    schedule of torch.distributed.pipelining the executor uses; per schedule, the median step time
    with the shape it was run at. ``pipeline_action_overhead`` turns it into the per-action cost."""
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

    rank, m, w = dist.get_rank(), PIPELINE_PROBE["micro_batches"], PIPELINE_PROBE["width"]
    group = dist.new_group([0, 1])
    if rank > 1:
        return None
    chunk = torch.nn.Linear(w, w).to(device)
    x = torch.randn(1, w, device=device, requires_grad=True)
    chunk_s = _timeit(lambda: chunk(x).sum().backward(), 200, sync, warmup=10)
    out = {}
    for name, kind, v in (("gpipe", ScheduleGPipe, 1), ("1f1b", Schedule1F1B, 1),
                          ("interleaved-1f1b", ScheduleInterleaved1F1B, 2)):
        stages = [PipelineStage(torch.nn.Linear(w, w).to(device), rank + 2 * c, 2 * v, device,
                                input_args=(torch.zeros(1, w, device=device, requires_grad=True),),
                                output_args=(torch.zeros(1, w, device=device, requires_grad=True),), group=group)
                  for c in range(v)]
        loss = lambda out, target: out.sum()  # noqa: E731
        schedule = kind(stages[0], m, loss_fn=loss) if v == 1 else kind(stages, m, loss_fn=loss)
        inputs, targets = torch.randn(m, w, device=device), torch.randn(m, w, device=device)
        step = (lambda: schedule.step(inputs)) if rank == 0 else (lambda: schedule.step(target=targets, losses=[]))
        seconds = _timeit(step, steps, sync, align=lambda: dist.barrier(group=group), warmup=3)
        out[name] = {"step_s": seconds, "chunk_s": chunk_s, "micro_batches": m, "virtual_stages": v, "stages": 2,
                     "message_bytes": 4 * w}
    return out


def pipeline_action_overhead_us(probe: dict[str, float], p2p_s: float) -> float:
    """Per-action host cost implied by a probe run, in the cost model's terms: with stage time
    v (chunk + 2 a) per micro-batch, the pipeline takes (m + (p - 1) / v) v (chunk + 2 a) plus
    2 (m v + p - 1) point-to-point transfers (advisor.cost.estimate); solved for a, at least 0."""
    m, v, p = probe["micro_batches"], probe["virtual_stages"], probe["stages"]
    transfers = 2.0 * p2p_s * (m * v + p - 1)
    per_stage_mb = (probe["step_s"] - transfers) / (m + (p - 1) / v) / v
    return max((per_stage_mb - probe["chunk_s"]) / 2.0, 0.0) * 1e6


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
            # (fp16 matmul on CPU is a slow fallback path that nobody trains with: not measured)
            dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
        timeout = datetime.timedelta(seconds=float(os.environ.get("ADVISOR_EXECUTOR_PG_TIMEOUT_S", "120")))
        dist.init_process_group(backend, timeout=timeout)
        dist.barrier()
        sizes = QUICK_GEMM_SIZES if args.quick else GEMM_SIZES
        rounds = []
        for _ in range(1 if args.quick else ROUNDS):   # spread over time: the machine's speed drifts
            matmul = {}
            for name, dtype in dtypes.items():   # all ranks at once: contention as in a run
                if backend == "nccl":
                    torch.backends.cuda.matmul.allow_tf32 = name == "tf32"
                matmul.update(_matmul(device, {name: dtype}, sizes, sync))
                dist.barrier()
            memory = _memory(device, sync)
            dist.barrier()
            comm = _collectives(QUICK_MESSAGE_BYTES if args.quick else MESSAGE_BYTES, 3 if args.quick else 7)
            dist.barrier()
            pipeline = _pipeline_actions(device, sync, 5 if args.quick else PIPELINE_PROBE["steps"])
            dist.barrier()
            rounds.append({"matmul": matmul, "memory": memory, "comm": comm, "pipeline": pipeline})
        matmul, memory, comm, pipeline = merge_rounds(rounds)
        result = {"rank": rank, "backend": backend, "device": _device_name(device), "matmul": matmul,
                  "memory": memory, "comm": comm if rank == 0 else None, "pipeline": pipeline if rank == 0 else None,
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


def fit_per_op(points: list[dict]) -> dict[str, dict[str, float]]:
    """Per operation, the (latency_us, bandwidth_gbps) pair fitted like ``fit_link`` over that
    operation's measurements alone (every group size): the profile's ``collectives:``."""
    out = {}
    for op in sorted({p["op"] for p in points}):
        mine = [p for p in points if p["op"] == op and p["seconds"]]
        if len({p["bytes"] for p in mine}) >= 2:
            latency_us, bandwidth_gbps, _ = fit_link(mine)
            out[op] = {"latency_us": round(latency_us, 3), "bandwidth_gbps": round(bandwidth_gbps, 6)}
    return out


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
    """The profile mapping (hardware_from_dict's schema) from the per-rank measurements; the
    element-wise efficiency last, since it is fitted through the cost model with everything else."""
    profile = _measured_profile(ranks, nproc, name)
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
    latency_us, bandwidth_gbps, rms = fit_link(comm_points)
    collectives = fit_per_op(comm_points)
    actions = _action_overheads(ranks[0].get("pipeline"), collectives.get("p2p"), latency_us, bandwidth_gbps)
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
            "optimizer_bytes_per_param": round(statistics.median(r["memory"].get("optimizer_bytes_per_param", 28.0)
                                                                 for r in ranks), 2),
            # CPU ranks run the schedule's bookkeeping in line with the compute (nccl: hidden)
            **({"pipeline_action_overhead_us": actions} if actions and backend != "nccl" else {}),
            "peak_tflops": {k: round(v, 6) for k, v in peaks.items()},
            "matmul_efficiency": curves[reference],
            "notes": {"matmul_tflops_by_dtype": {k: [[g, round(r, 6)] for g, r in v] for k, v in _raw_matmul(ranks).items()},
                      "efficiency_by_dtype": curves, "threads_per_rank": ranks[0]["threads"],
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
