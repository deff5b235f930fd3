"""What each rank measures for ``advisor calibrate`` (``python -m advisor.calibrate --worker``,
one process per device, all at once): matmul rates, memory bandwidth, host overheads, element-wise
and pipeline probes, and collectives. Figures go to out/rank<R>.json for advisor.calibration.profile."""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any, NoReturn

from advisor.calibration.contention_probe import CONTENTION_BYTES, QUICK_CONTENTION_BYTES
from advisor.calibration.contention_probe import measure as measure_contention
from advisor.calibration.fit import PROBE_BATCH, PROBE_MODEL, merge_rounds
from advisor.calibration.rounds import RoundRule, rank_summary, stop_reason, worst_spread
from advisor.executor.host_probe import layer_host_us
from advisor.runtime.rank import (die_if_asked, fail, leave_without_finalization, mark_ready, report_progress,
                                  start_watchdog, write_result)

MESSAGE_BYTES = (4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20)
QUICK_MESSAGE_BYTES = (4 << 10, 256 << 10, 4 << 20)
GEMM_SIZES = (32, 64, 128, 256, 512, 1024, 1536)   # n for an n x n by n x n matmul: 2n^3 FLOPs
QUICK_GEMM_SIZES = (32, 128, 512)
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "p2p")


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


def _cpu_adam(numel: int = 1 << 23, repeats: int = 5) -> dict[str, float]:
    """Parameters per second of one step of torch.optim.AdamW on the host with all its cores, over one
    fp32 tensor of ``numel`` parameters: the CPU Adam that Megatron-Core's HybridDeviceOptimizer and FSDP2's
    CPU offload run (the framework records' cpu_adam "torch"). Rank 0 measures it while the others wait:
    in a run the node's ranks share the host's cores for their offloaded steps."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() or 1)
    try:
        param = torch.nn.Parameter(torch.randn(numel))
        param.grad = torch.randn_like(param)
        opt = torch.optim.AdamW([param], lr=1e-3, weight_decay=0.01)
        seconds = _timeit(opt.step, repeats, lambda: None, warmup=1)
        return {"torch": numel / seconds}
    finally:
        torch.set_num_threads(threads)


def _elementwise_probe_s(device, sync) -> float:
    """Median seconds of the probe model's forward + backward (one micro-batch of PROBE_BATCH)."""
    import torch

    from advisor.executor.config import model_config_from_plan
    from advisor.executor.model import GPT, cross_entropy

    cfg = model_config_from_plan(PROBE_MODEL, attention="math")
    model = GPT(cfg, range(cfg.num_layers), True, True, init_seed=0).to(device)
    tokens = torch.randint(0, cfg.vocab_size, (PROBE_BATCH, cfg.seq_length + 1), device=device)
    return _timeit(lambda: cross_entropy(model(tokens[:, :-1]), tokens[:, 1:]).backward(), 10, sync, warmup=2)


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
                t = _one_collective(op, nbytes, g, rank, group, device, sync, repeats) if rank < g else None
                dist.barrier()
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


PS_PROBE = {"rows": 64, "dim": 8, "rounds": 40, "warmup": 5}
PS_MESSAGES_PER_ROUND = 3     # pull request, answer, push


def _ps_messages(rank: int) -> float | None:
    """Seconds of one parameter-server round between rank 0 (a server) and rank 1 (a worker) with
    the executor's own messages (advisor.executor.ps.wire): a pull request of PS_PROBE rows, their
    answer, the push of their gradients; no compute, so the round is the messages' host cost. The
    median round, on rank 0 (None elsewhere); the other ranks wait."""
    import torch
    import torch.distributed as dist

    from advisor.executor.ps import wire

    pg = dist.distributed_c10d._get_default_group()
    rows, dim = PS_PROBE["rows"], PS_PROBE["dim"]
    request, answer = wire.Layout(ids=(rows,)), wire.Layout(values=(rows * dim,))
    push = wire.Layout(values=(1, rows * dim))
    times = []
    for step in range(PS_PROBE["warmup"] + PS_PROBE["rounds"]):
        start = time.perf_counter()
        if rank == 0:
            wire.receive(pg, 1, request)
            wire.wait_all(wire.send(pg, 1, wire.Message(wire.PULL, step, [], [torch.ones(rows * dim)]), answer))
            wire.receive(pg, 1, push)
        elif rank == 1:
            sends = wire.send(pg, 0, wire.Message(wire.PULL, step, [torch.arange(rows)], []), request)
            wire.receive(pg, 0, answer)
            wire.wait_all(sends)
            wire.wait_all(wire.send(pg, 0, wire.Message(wire.PUSH, step, [], [torch.ones(1), torch.ones(rows * dim)]),
                                    push))
        times.append(time.perf_counter() - start)
    return statistics.median(times[PS_PROBE["warmup"]:]) if rank == 0 else None


def worker_main(argv: list[str] | None = None) -> NoReturn:
    """Per-rank entry (``python -m advisor.calibrate --worker``), started by the launcher."""
    import datetime

    import torch
    import torch.distributed as dist

    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--min-rounds", type=int, default=RoundRule.min_rounds)
    ap.add_argument("--max-rounds", type=int, default=RoundRule.max_rounds)
    ap.add_argument("--spread-target", type=float, default=RoundRule.spread_target)
    ap.add_argument("--budget-s", type=float, default=RoundRule.budget_s)
    ap.add_argument("--out-dir", required=True)
    args = ap.parse_args(argv)
    out = Path(args.out_dir)
    rank = int(os.environ.get("RANK", "0"))
    start_watchdog()
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
        mark_ready(out, rank)
        die_if_asked(rank)
        dist.barrier()
        sizes = QUICK_GEMM_SIZES if args.quick else GEMM_SIZES
        rule = RoundRule(args.min_rounds, args.max_rounds, args.spread_target, args.budget_s)
        rounds: list[dict[str, Any]] = []
        n_rounds = rule.max_rounds
        probes = len(dtypes) + 3      # per round: matmul per dtype, memory, collectives, pipeline

        def step(r: int, i: int, what: str) -> None:   # for the launcher's progress bar
            report_progress(out, rank, r * probes + i, n_rounds * probes, f"round {r + 1} (at most {n_rounds}): {what}")
        started, stopped = time.perf_counter(), None
        for r in range(n_rounds):   # spread over time: the machine's speed drifts (advisor.calibration.rounds)
            round_start = time.perf_counter()
            matmul = {}
            for i, (name, dtype) in enumerate(dtypes.items()):   # all ranks at once: contention as in a run
                step(r, i, f"matmul {name}")
                if backend == "nccl":
                    torch.backends.cuda.matmul.allow_tf32 = name == "tf32"
                matmul.update(_matmul(device, {name: dtype}, sizes, sync))
                dist.barrier()
            step(r, len(dtypes), "memory and host overheads")
            memory = _memory(device, sync)
            dist.barrier()
            step(r, len(dtypes) + 1, "collectives")
            comm = _collectives(QUICK_MESSAGE_BYTES if args.quick else MESSAGE_BYTES, 3 if args.quick else 7)
            dist.barrier()
            step(r, len(dtypes) + 2, "pipeline schedules")
            pipeline = _pipeline_actions(device, sync, 5 if args.quick else PIPELINE_PROBE["steps"])
            dist.barrier()
            rounds.append({"matmul": matmul, "memory": memory, "comm": comm, "pipeline": pipeline})
            now = time.perf_counter()
            # the worst figure of the last rounds over all ranks, and the slowest rank's clock: every
            # rank takes the same decision
            state = torch.tensor([worst_spread(rounds, rule.min_rounds), now - started, now - round_start], dtype=torch.float64,
                                 device=device)
            dist.all_reduce(state, op=dist.ReduceOp.MAX)
            stopped = stop_reason(len(rounds), *state.tolist(), rule)
            if stopped:
                break
        report_progress(out, rank, n_rounds * probes, n_rounds * probes, "writing the results")
        matmul, memory, comm, pipeline = merge_rounds(rounds)
        ps_round_s = _ps_messages(rank) if backend == "gloo" else None
        dist.barrier()
        report_progress(out, rank, n_rounds * probes, n_rounds * probes, "the host's CPU Adam")
        cpu_adam = _cpu_adam(1 << 20 if args.quick else 1 << 23) if rank == 0 else None
        dist.barrier()
        report_progress(out, rank, n_rounds * probes, n_rounds * probes, "contention: all-reduce and send together")
        contention = measure_contention(rank, device, sync, QUICK_CONTENTION_BYTES if args.quick else CONTENTION_BYTES)
        result = {"rank": rank, "backend": backend, "device": _device_name(device), "matmul": matmul,
                  "memory": memory, "comm": comm if rank == 0 else None, "pipeline": pipeline if rank == 0 else None,
                  "device_memory_bytes": _device_memory(device), "threads": torch.get_num_threads(),
                  "ps_round_s": ps_round_s, "contention": contention, "cpu_adam": cpu_adam,
                  "rounds": rank_summary(rounds, stopped, rule)}
        write_result(out / f"rank{rank}.json", result)
        dist.barrier()
        dist.destroy_process_group()
    except BaseException as exc:   # report and leave at once; the others are stopped by the launcher
        fail(out, rank, exc)
    leave_without_finalization(0)   # as the executor's worker: PyTorch's teardown can abort a finished run


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
