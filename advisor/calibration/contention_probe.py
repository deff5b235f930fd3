"""Contention probe of ``advisor calibrate``: a data-parallel-like all-reduce and a pipeline-like
point-to-point transfer between the same two ranks, alone and started together, each on its own
process group (as a training step runs them: gradient buckets on the data-parallel group while the
pipeline sends on its own). Rank 0 reports the medians; advisor.calibration.profile sets them next to
what the cost model predicts from the measured links (advisor.cost.contention: a link shared byte by
byte, against the contention-free assumption of the other parts of the step)."""

from __future__ import annotations

import statistics
import time

CONTENTION_BYTES = (4 << 20, 16 << 20)
QUICK_CONTENTION_BYTES = (16 << 20,)


def measure(rank: int, device, sync, sizes=CONTENTION_BYTES, repeats: int = 15, warmup: int = 3) -> list[dict] | None:
    """[{bytes, all_reduce_s, p2p_s, together_s}] on rank 0 (None on the others); every rank must call
    it (the process groups are created collectively); ranks beyond 1 only wait."""
    import torch
    import torch.distributed as dist

    reduce_group, send_group = dist.new_group([0, 1]), dist.new_group([0, 1])
    points = []
    for nbytes in sizes:
        if rank > 1:
            continue
        grads, acts = torch.ones(nbytes // 4, device=device), torch.ones(nbytes // 4, device=device)

        def reduce(async_op=False):
            return dist.all_reduce(grads, group=reduce_group, async_op=async_op)

        def send(async_op=False):
            if async_op:
                return dist.isend(acts, 1, group=send_group) if rank == 0 else dist.irecv(acts, 0, group=send_group)
            return dist.send(acts, 1, group=send_group) if rank == 0 else dist.recv(acts, 0, group=send_group)

        def together():
            for work in (reduce(True), send(True)):
                work.wait()

        timed = {}
        for name, fn in (("all_reduce_s", reduce), ("p2p_s", send), ("together_s", together)):
            times = []
            for i in range(warmup + repeats):
                sync()
                dist.barrier(group=reduce_group)
                dist.barrier(group=send_group)
                start = time.perf_counter()
                fn()
                sync()
                times.append(time.perf_counter() - start)
            timed[name] = statistics.median(times[warmup:])
        points.append({"bytes": nbytes, **timed})
    dist.barrier()
    return points if rank == 0 else None


def predicted(hw, point: dict) -> dict:
    """The cost model's figures for one measured point: each transfer alone, and both together on a
    shared link (advisor.cost.contention.shared_makespan_s) or on links of their own (the larger)."""
    import numpy as np

    from advisor.cost import comm
    from advisor.cost.contention import shared_makespan_s

    size = float(point["bytes"])
    one = np.array(1.0)
    two = np.array(2.0)
    reduce_s = float(comm.fanout_time_s(hw, "all_reduce", size, two, one, one))
    reduce_busy = float(comm.fanout_time_s(hw, "all_reduce", size, two, one, one)
                        - comm.fanout_time_s(hw, "all_reduce", 0.0, two, one, one))
    send_s = float(comm.tier_p2p_time_s(hw, size, 0))
    send_busy = send_s - float(comm.tier_p2p_time_s(hw, 0.0, 0))
    return {"all_reduce_s": reduce_s, "p2p_s": send_s,
            "together_shared_s": shared_makespan_s((reduce_s, send_s), (reduce_busy, send_busy)),
            "together_independent_s": max(reduce_s, send_s)}
