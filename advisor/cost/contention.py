"""Contention: data-parallel traffic that runs under compute shares its links with the traffic of the
critical path (tensor-, expert- and context-parallel collectives, pipeline point-to-point).

The other parts of the step price each transfer as if it had its links to itself. Where data
parallelism is overlapped with compute (gradient buckets reduced during the last micro-batch's
backward, ZeRO/FSDP gathers and reduce-scatters during every micro-batch), its transfers are in
flight while the layers' own collectives run, and where both cross the same link of a device (the
same tier: fast group, node, or the NIC between nodes) they share its bandwidth. A link serves its
flows in turn, byte by byte: two flows started together finish, together, after the sum of their
data times (processor sharing; Bertsekas and Gallager, "Data Networks", 2nd ed., section 6.5.2, and
the fluid model of Jiang et al., BytePS, OSDI 2020, section 3). ``advisor calibrate`` measures it on the
machine at hand (advisor.calibration.contention_probe; benchmarks/mindpipe.py prints predicted
against measured).

Per overlap window (one micro-batch's backward or forward, or the whole step's when FSDP keeps its
weights gathered) and per tier k, let O_k be the seconds of critical-path data on the tier, D_k the
data-parallel data, W the window's compute and T the data-parallel collectives' time alone:

* fair sharing (NCCL/HCCL streams of equal priority): the critical transfers that meet data-parallel
  traffic run at half rate, so they take longer by the part of O_k that meets it, about
  O_k x min(1, D_k / W) (the data-parallel flow occupies that share of the window), and the step
  waits for it; the data-parallel collective is slowed as much, inside a window that is as much
  longer, so what it exposes stays what it did;
* priority to the critical path (MindPipe's scheduling; ByteScheduler, Peng et al., SOSP 2019):
  the critical transfers keep the link, the data-parallel collective yields E = sum_k O_k min(1,
  D_k / W) and exposes max(T + E - W, 0) instead of max(T - W, 0).

Compute under overlapped traffic: advisor.cost.overlap_slowdown (the step pays OVERLAP_COMPUTE_SLOWDOWN of
every second of data-parallel traffic that overlap hides).

On CPU ranks nothing overlaps (a rank runs its collectives and its compute in turn), so nothing
contends.
"""

from __future__ import annotations

import numpy as np

from advisor.cost import comm
from advisor.cost.data_parallel import gathers_under_next_forward
from advisor.cost.layer_comm import CP_A2A, ep_message_bytes, tp_blocks, tp_message_bytes
from advisor.cost.memory import resharding
from advisor.cost.placement import GroupPlacement
from advisor.space.strategy import StrategyBatch
from advisor.specs.hardware import HardwareProfile
from advisor.specs.job import TrainingJob
from advisor.specs.model import ModelSpec

def _add(*flows):
    return tuple(sum(parts) for parts in zip(*flows))


def _scale(flow, k):
    return tuple(k * x for x in flow)


def critical_busy_s(model: ModelSpec, hw: HardwareProfile, job: TrainingJob, b: StrategyBatch, groups, ring_tier,
                    neighbour_tier, dense_layers, moe_layers):
    """(forward, backward) seconds of critical-path data per tier for one micro-batch on one device of
    a stage with the given layers: its TP, EP and CP collectives and its pipeline transfer."""
    tokens = b.micro_batch_size * job.seq_length / b.cp
    layers = dense_layers + moe_layers
    msg = tp_message_bytes(model, job, b)
    tp = groups["tp"]
    sp = _add(comm.tier_busy_s(hw, "reduce_scatter", msg, tp), comm.tier_busy_s(hw, "all_gather", msg, tp))
    ar = comm.tier_busy_s(hw, "all_reduce", msg, tp)
    tp_layer = tuple(np.where(b.sequence_parallel, x, y) for x, y in zip(sp, ar))     # one block's collective
    blocks = tp_blocks(model, b, False) * dense_layers + tp_blocks(model, b, True) * moe_layers
    fwd = _scale(tp_layer, blocks)
    if model.moe is not None:
        a2a = comm.tier_busy_s(hw, "all_to_all", ep_message_bytes(model, job, b), groups["ep"])
        fwd = _add(fwd, _scale(a2a, 2.0 * moe_layers))
    t = b.tp.astype(float)
    kv = comm.tier_p2p_busy_s(hw, (b.cp - 1.0) * tokens * (model.k_size + model.v_size) / t * job.dtype_bytes, ring_tier)
    qkv = tokens * (model.q_size + model.k_size + model.v_size) / t * job.dtype_bytes
    ulysses = _add(comm.tier_busy_s(hw, "all_to_all", qkv, groups["cp"]),
                   comm.tier_busy_s(hw, "all_to_all", tokens * model.attention_out_size / t * job.dtype_bytes, groups["cp"]))
    on = b.cp > 1
    cp_f = tuple(np.where(on, np.where(b.cp_comm == CP_A2A, u, r), 0.0) for u, r in zip(ulysses, kv))
    cp_b = tuple(np.where(on, np.where(b.cp_comm == CP_A2A, u, 2.0 * r), 0.0) for u, r in zip(ulysses, kv))
    pp = comm.tier_p2p_busy_s(hw, msg / t, neighbour_tier)
    pp = tuple(np.where(b.pp > 1, x, 0.0) for x in pp)
    # the backward repeats the forward's TP and EP collectives (advisor.cost.layer_comm)
    return _add(fwd, _scale(cp_f, layers), pp), _add(fwd, _scale(cp_b, layers), pp)


def _window(critical, dp_busy, dp_s, window_s, priority: bool):
    """Extra seconds of one overlap window (see the module docstring)."""
    window_s = np.maximum(window_s, 1e-12)
    extra = sum(o * np.minimum(1.0, d / window_s) for o, d in zip(critical, dp_busy))
    if priority:
        return np.maximum(dp_s + extra - window_s, 0.0) - np.maximum(dp_s - window_s, 0.0)
    return extra


def contention_s(hw: HardwareProfile, job: TrainingJob, b: StrategyBatch, critical, dense_params, expert_params,
                 dp_group: GroupPlacement, edp_group: GroupPlacement, mb_forward_s, mb_backward_s,
                 weight_bytes: float) -> np.ndarray:
    """Seconds per step that the overlapped data-parallel traffic adds to the step by sharing links with
    the critical path. ``critical``: (forward, backward) per-tier seconds per micro-batch
    (critical_busy_s); the other arguments as advisor.cost.data_parallel.dp_time_s takes them."""
    n = len(b)
    if not hw.device.overlaps_communication:
        return np.zeros(n)
    fwd_crit, bwd_crit = critical
    m = b.num_micro_batches.astype(float)
    priority = job.comm_priority

    def dp(op, per_param_bytes):
        dense, expert = dense_params * per_param_bytes, expert_params * per_param_bytes
        busy = _add(comm.tier_busy_s(hw, op, dense, dp_group), comm.tier_busy_s(hw, op, expert, edp_group))
        alone = comm.group_time_s(hw, op, dense, dp_group) + comm.group_time_s(hw, op, expert, edp_group)
        return busy, alone

    grad = job.grad_reduce_bytes
    z = b.zero_stage
    zero = np.zeros(n)
    ar, ar_s = dp("all_reduce", grad)
    rs, rs_s = dp("reduce_scatter", grad)
    ag, ag_s = dp("all_gather", weight_bytes)
    overlapped_reduce = job.overlap_grad_reduce
    zero0 = _window(bwd_crit, ar, ar_s, mb_backward_s, priority) if overlapped_reduce else zero
    zero1 = _window(bwd_crit, rs, rs_s, mb_backward_s, priority) if overlapped_reduce else zero
    zero2 = m * _window(bwd_crit, rs, rs_s, mb_backward_s, priority)
    # the updated weights gathered under the next step's first forward (advisor.cost.data_parallel)
    # (the ZeRO-2 frameworks are among the ZeRO-1 ones)
    if gathers_under_next_forward(job, 1):
        under_forward = _window(fwd_crit, ag, ag_s, mb_forward_s, priority)
        zero1 = zero1 + under_forward
        if gathers_under_next_forward(job, 2):
            zero2 = zero2 + under_forward
    both, both_s = _add(ag, rs), ag_s + rs_s
    per_mb = _window(fwd_crit, ag, ag_s, mb_forward_s, priority) + _window(bwd_crit, both, both_s, mb_backward_s, priority)
    once = (_window(_scale(fwd_crit, m), ag, ag_s, m * mb_forward_s, priority)
            + _window(_scale(bwd_crit, m), rs, rs_s, m * mb_backward_s, priority))
    zero3 = np.where(resharding(job, b), m * per_mb, once)
    return np.select([z == 0, z == 1, z == 2], [zero0, zero1, zero2], zero3)


def shared_makespan_s(alone_s, busy_s) -> float:
    """Transfers started together on one link: the longest start-up (they overlap) and then the sum of
    their data times (the link serves them in turn). ``alone_s``: each one's time alone; ``busy_s``:
    its data part."""
    return max(a - b for a, b in zip(alone_s, busy_s)) + sum(busy_s)
