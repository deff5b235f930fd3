"""The cost model's one orchestrator: estimate a batch of strategies (vectorized) or one strategy.

Step time = m x (slowest stage's micro-batch time) + pipeline fill/drain (bubble)
          + exposed pipeline point-to-point + exposed data-parallel communication
          + optimizer step (+ host transfers under offload).
A stage's micro-batch time adds, per layer, forward and backward compute (backward = 2 x forward
GEMMs), recomputation, tensor-parallel collectives (2 all-reduces, or reduce-scatter + all-gather
pairs with sequence parallelism, in the forward and 2 in the backward: Megatron SC'21 section 3,
Korthikanti 2022 section 4.2.2), expert-parallel all-to-alls (dispatch and combine, forward and
backward: Lepikhin et al., GShard 2020) and context-parallel ring exchanges of K and V overlapped with
attention (Liu et al., Ring Attention 2023; Megatron-Core context parallelism). See memory.py,
compute.py, comm.py and bubble.py for each part's sources.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from advisor.cost import bubble, comm, compute
from advisor.cost.memory import (
    GIB, RECOMPUTE_FULL, RECOMPUTE_SELECTIVE, MemoryArrays, memory, stage_layer_counts, stage_masks,
    state_bytes_per_param, stage_params,
)
from advisor.space.rules import violations
from advisor.space.strategy import SCHEDULES, Strategy, StrategyBatch
from advisor.specs.hardware import HardwareProfile
from advisor.specs.job import Cluster, TrainingJob
from advisor.specs.model import ModelSpec

TIME_PARTS = ("compute", "recompute", "tp_comm", "cp_comm", "ep_comm", "host_overhead", "pp_comm", "dp_comm", "bubble",
              "optimizer", "offload")
# Kernels one transformer layer launches per micro-batch, counted in Megatron-LM's
# ParallelTransformerLayer with its fused kernels (norm, QKV GEMM, layout copies, score batched
# matmul, fused scale-mask-softmax, dropout, context batched matmul, output GEMM, TP all-reduce,
# fused bias-dropout-add, norm, FC1 GEMM, fused bias-GELU, FC2 GEMM, TP all-reduce,
# bias-dropout-add): about 20 forward; the backward launches about twice as many. Layers of other
# designs (rotary, RMSNorm, gated MLP, fused attention) scale it by compute.layer_ops_factor.
KERNELS_FORWARD = 20
KERNELS_BACKWARD = 40
MEMORY_PARTS = ("parameters", "gradients", "optimizer", "activations", "buffers", "total")


@dataclass(frozen=True)
class EstimateBatch:
    """Figures for N candidates; every field an (N,) array. Memory in bytes, times in seconds."""

    fits: np.ndarray
    host_fits: np.ndarray
    memory: MemoryArrays
    time_s: dict[str, np.ndarray]
    step_time_s: np.ndarray
    tokens_per_s: np.ndarray
    tflops_per_device: np.ndarray
    hfu_tflops_per_device: np.ndarray
    mfu: np.ndarray
    hfu: np.ndarray
    slowest_stage: np.ndarray

    @property
    def feasible(self) -> np.ndarray:
        return self.fits & self.host_fits


def _col(x):
    return np.asarray(x)[:, None]


def _tp_comm_per_layer_s(model, hw, job, b):
    """Forward TP communication of one layer and micro-batch (the backward repeats it)."""
    msg = b.micro_batch_size * job.seq_length / b.cp * model.hidden_size * job.dtype_bytes
    ar = comm.collective_time_s(hw, "all_reduce", msg, b.tp, b.tp_stride)
    rs_ag = comm.collective_time_s(hw, "reduce_scatter", msg, b.tp, b.tp_stride) + comm.collective_time_s(hw, "all_gather", msg, b.tp, b.tp_stride)
    return 2.0 * np.where(b.sequence_parallel, rs_ag, ar)


def _ep_comm_per_layer_s(model, hw, job, b):
    """Forward all-to-alls (dispatch + combine) of one MoE layer and micro-batch."""
    if model.moe is None:
        return np.zeros(len(b))
    tokens = b.micro_batch_size * job.seq_length / b.cp / np.where(b.sequence_parallel, b.tp, 1)
    msg = tokens * model.moe.top_k * model.hidden_size * job.dtype_bytes
    return 2.0 * comm.collective_time_s(hw, "all_to_all", msg, b.ep, b.dp_stride)


def _cp_comm_per_layer_s(model, hw, job, b, core_forward_s):
    """Exposed forward ring exchange of K and V (cp - 1 steps), overlapped with attention."""
    kv_bytes = b.micro_batch_size * job.seq_length / b.cp * 2 * model.kv_hidden_size / b.tp * job.dtype_bytes
    ring = (b.cp - 1) * comm.p2p_time_s(hw, kv_bytes, b.cp_stride)
    return np.where(b.cp > 1, np.maximum(ring - core_forward_s, 0.0), 0.0)


def _dp_group(b):
    n = b.dp * b.cp
    stride = np.where(b.cp > 1, np.minimum(b.dp_stride, b.cp_stride), b.dp_stride)
    return n, stride


def estimate_batch(model: ModelSpec, hw: HardwareProfile, cluster: Cluster, job: TrainingJob, b: StrategyBatch) -> EstimateBatch:
    """Score N candidates at once. Legality is not checked here (see advisor.space.rules)."""
    n_cand = len(b)
    mem = memory(model, job, b)
    active, first, last = stage_masks(b)
    dense_n, moe_n = stage_layer_counts(model, b)

    # ---- per layer, per micro-batch, one device ----------------------------------------------
    dense = compute.layer_compute(model, hw, job, b, moe_layer=False)
    moe = compute.layer_compute(model, hw, job, b, moe_layer=True) if model.moe is not None else dense
    tp_layer = _tp_comm_per_layer_s(model, hw, job, b)
    ep_layer = _ep_comm_per_layer_s(model, hw, job, b)
    cp_layer = _cp_comm_per_layer_s(model, hw, job, b, dense.attention_core_s)
    head_s, head_flops = compute.head_compute_s(model, hw, job, b)

    # forward + backward (2x) compute of each stage for one micro-batch
    fwd = dense_n * _col(dense.forward_s) + moe_n * _col(moe.forward_s) + np.where(last, _col(head_s), 0.0)
    comp = 3.0 * fwd
    # recomputation replays forward work (and its TP communication for full recompute)
    n_layers = dense_n + moe_n
    rl = _col(b.recompute_layers)
    recomputed = np.where(rl < 0, n_layers, np.minimum(rl, n_layers))
    share = np.where(n_layers > 0, recomputed / np.maximum(n_layers, 1), 0.0)
    rc = _col(b.recompute)
    layers_fwd = dense_n * _col(dense.forward_s) + moe_n * _col(moe.forward_s)
    layers_core = dense_n * _col(dense.attention_core_s) + moe_n * _col(moe.attention_core_s)
    recompute_s = np.select([rc == RECOMPUTE_FULL, rc == RECOMPUTE_SELECTIVE], [share * layers_fwd, layers_core], 0.0)
    tp_s = n_layers * _col(tp_layer) * (2.0 + np.where(rc == RECOMPUTE_FULL, share, 0.0))
    ep_s = moe_n * _col(ep_layer) * (2.0 + np.where(rc == RECOMPUTE_FULL, share, 0.0))
    cp_s = n_layers * _col(cp_layer) * 3.0  # forward exchange, backward exchanges K/V and their gradients
    # Host-bound layers: a layer cannot finish before the host has issued its kernels.
    launch_s = hw.device.launch_overhead_us * 1e-6 * compute.layer_ops_factor(model, job)
    gpu_fwd = _col(dense.forward_s + tp_layer + cp_layer)
    gpu_bwd = _col(2.0 * dense.forward_s + tp_layer + 2.0 * cp_layer)
    if hw.device.asynchronous_launch:
        host_layer = (np.maximum(KERNELS_FORWARD * launch_s - gpu_fwd, 0.0)
                      + np.maximum(KERNELS_BACKWARD * launch_s - gpu_bwd, 0.0))
    else:
        host_layer = np.broadcast_to((KERNELS_FORWARD + KERNELS_BACKWARD) * launch_s, gpu_fwd.shape)
    host_s = n_layers * host_layer * (1.0 + np.where(rc == RECOMPUTE_FULL, share / 3.0, 0.0))
    # A pipeline schedule runs a forward and a backward action per chunk and micro-batch; where the
    # host pays its bookkeeping in line (CPU ranks), each costs the profile's per-action overhead.
    action_s = np.select([b.pipeline_schedule == i for i in range(len(SCHEDULES))],
                         [hw.device.action_overhead_us(name) * 1e-6 for name in SCHEDULES], 0.0)
    host_s = host_s + _col(np.where(b.pp > 1, 2.0 * b.virtual_pipeline_stages * action_s, 0.0))
    stage_mb = np.where(active, comp + recompute_s + tp_s + ep_s + cp_s + host_s, 0.0)

    pipe_s, bubble_s, slowest = bubble.pipeline_time_s(stage_mb, active, b.num_micro_batches, b.virtual_pipeline_stages)
    rows = np.arange(n_cand)
    m = b.num_micro_batches.astype(float)

    def at_slowest(x):
        return np.broadcast_to(x, stage_mb.shape)[rows, slowest] * m

    # ---- pipeline point-to-point (activations forward, gradients backward) -------------------
    # Megatron's scatter/gather optimization sends 1/t of the activation per TP rank (SC'21 sec. 4.1).
    p2p_bytes = b.micro_batch_size * job.seq_length / b.cp * model.hidden_size * job.dtype_bytes / b.tp
    p2p = comm.p2p_time_s(hw, p2p_bytes, b.pp_stride)
    pp_s = np.where(b.pp > 1, 2.0 * p2p * (m * b.virtual_pipeline_stages + b.pp - 1), 0.0)

    # ---- data-parallel gradient reduction and ZeRO gathers ----------------------------------
    dense_p, expert_p = stage_params(model, b)
    dense_max = np.max(dense_p, axis=1)
    expert_max = np.max(expert_p, axis=1)
    wb, gb, _ = state_bytes_per_param(job)
    n_dp, dp_stride = _dp_group(b)
    n_edp = np.maximum(n_dp // np.maximum(b.ep, 1), 1)
    edp_stride = dp_stride * b.ep

    def coll(op, nbytes_dense, nbytes_expert):
        return (comm.collective_time_s(hw, op, nbytes_dense, n_dp, dp_stride)
                + comm.collective_time_s(hw, op, nbytes_expert, n_edp, edp_stride))

    grad_ar = coll("all_reduce", dense_max * gb, expert_max * gb)
    grad_rs = coll("reduce_scatter", dense_max * gb, expert_max * gb)
    param_ag = coll("all_gather", dense_max * wb, expert_max * wb)
    # the last micro-batch's backward, which gradient reduction can hide behind
    overlap = hw.device.overlaps_communication
    slow_bwd = 2.0 * np.broadcast_to(fwd, stage_mb.shape)[rows, slowest] if (job.overlap_grad_reduce and overlap) else 0.0
    z = b.zero_stage
    # ZeRO-0: all-reduce overlapped with the last backward (PyTorch DDP, Megatron overlap-grad-reduce);
    # ZeRO-1: reduce-scatter overlapped likewise, then the updated weights all-gathered (Megatron's
    # distributed optimizer); ZeRO-2: below;
    # ZeRO-3: weights gathered for forward and backward and gradients reduce-scattered every
    # micro-batch, overlapped with that micro-batch's compute (FSDP prefetching).
    # FSDP and ZeRO-3 gather and reduce one layer (wrapping unit) at a time, so each of those
    # collectives pays its start-up latency once per layer: time is affine in bytes, hence
    # n x t(bytes / n) = the bandwidth term plus n latencies.
    units = np.maximum(np.max(np.where(active, n_layers, 0), axis=1), 1)

    def per_layer(op, nbytes_dense, nbytes_expert):
        return units * coll(op, nbytes_dense / units, nbytes_expert / units)

    mb_time = stage_mb[rows, slowest]
    layer_rs = per_layer("reduce_scatter", dense_max * gb, expert_max * gb)
    zero3_mb = 2.0 * per_layer("all_gather", dense_max * wb, expert_max * wb) + layer_rs
    # ZeRO-2 partitions gradients: every micro-batch's backward reduce-scatters them, layer by
    # layer (DeepSpeed stage 2, FSDP SHARD_GRAD_OP), hidden behind that backward where collectives
    # overlap; the updated weights are gathered once per step.
    mb_bwd = 2.0 * np.broadcast_to(fwd, stage_mb.shape)[rows, slowest]
    zero2_rs = m * (np.maximum(layer_rs - mb_bwd, 0.0) if overlap else layer_rs)
    dp_s = np.select(
        [z == 0, z == 1, z == 2],
        [np.maximum(grad_ar - slow_bwd, 0.0), np.maximum(grad_rs - slow_bwd, 0.0) + param_ag,
         zero2_rs + per_layer("all_gather", dense_max * wb, expert_max * wb)],
        m * (np.maximum(zero3_mb - mb_time, 0.0) if overlap else zero3_mb),
    )

    # Tied embeddings under pipelining: the first and last stages all-reduce the word-embedding
    # gradient every step (Megatron's embedding group, _allreduce_embedding_grads).
    if model.tie_embeddings:
        emb_bytes = model.vocab_size * model.hidden_size / b.tp * gb
        emb_s = comm.collective_time_s(hw, "all_reduce", emb_bytes, 2, (b.pp - 1) * b.pp_stride)
        dp_s = dp_s + np.where(b.pp > 1, emb_s, 0.0)

    # ---- optimizer ---------------------------------------------------------------------------
    local = dense_max / np.where(z >= 1, n_dp, 1) + expert_max / np.where(z >= 1, n_edp, 1)
    offload = b.offload_optimizer
    # Unfused optimizers pay a host cost per parameter tensor (profile constant; 0 on accelerators).
    embed_tensors = 1 + (model.position_embedding == "learned")
    head_tensors = (2 if model.norm == "layernorm" else 1) + (not model.tie_embeddings)
    ends = np.where(b.pp == 1, embed_tensors + head_tensors, max(embed_tensors, head_tensors))
    tensors = np.max(np.where(active, n_layers, 0), axis=1) * model.parameter_tensors_per_layer(job.framework == "megatron") + ends
    opt_host = tensors * hw.device.optimizer_overhead_us_per_tensor * 1e-6
    opt_s = np.where(offload, 0.0, compute.optimizer_step_s(hw, local) + opt_host)
    pcie = hw.host.pcie_bandwidth_gbps * 1e9
    host_bw = (hw.host.memory_bandwidth_gbps or hw.host.pcie_bandwidth_gbps * hw.node.devices_per_node) * 1e9
    # Offload: gradients to the host, updated 16-bit weights back, and Adam on the host CPU sharing
    # the host's memory bandwidth with the node's other devices (Ren et al., ZeRO-Offload, sec. 4).
    offload_s = np.where(
        offload,
        local * (gb + wb) / pcie + local * compute.ADAM_BYTES_PER_PARAM * hw.node.devices_per_node / host_bw,
        0.0,
    )

    time_s = {
        "compute": at_slowest(comp),
        "recompute": at_slowest(recompute_s),
        "tp_comm": at_slowest(tp_s),
        "cp_comm": at_slowest(cp_s),
        "ep_comm": at_slowest(ep_s),
        "host_overhead": at_slowest(host_s),
        "pp_comm": pp_s,
        "dp_comm": dp_s,
        "bubble": bubble_s,
        "optimizer": opt_s,
        "offload": offload_s,
    }
    step = pipe_s + pp_s + dp_s + opt_s + offload_s

    tokens = job.tokens_per_step
    model_flops = model.training_flops_per_token(job.seq_length) * tokens
    # Hardware FLOPs add the recomputed forward work, counted over the whole model (all stages,
    # all micro-batches): full recompute replays the recomputed layers' forward, selective the
    # attention cores.
    layer_fwd_flops = (model.num_layers - model.num_moe_layers) * dense.forward_flops + model.num_moe_layers * moe.forward_flops
    core_flops = (model.num_layers - model.num_moe_layers) * dense.attention_core_flops + model.num_moe_layers * moe.attention_core_flops
    total_layers = np.maximum(np.sum(np.where(active, n_layers, 0), axis=1), 1)
    full_share = np.where(b.recompute_layers < 0, 1.0, np.minimum(b.recompute_layers * b.pp, total_layers) / total_layers)
    per_mb_device = np.select([b.recompute == RECOMPUTE_FULL, b.recompute == RECOMPUTE_SELECTIVE],
                              [full_share * layer_fwd_flops, core_flops], 0.0)
    # per_mb_device is one micro-batch on one tp x cp slice of the whole model: scale to the cluster
    recompute_flops = per_mb_device * b.tp * b.cp * b.dp * m
    devices = float(cluster.devices)
    peak = hw.device.peak_flops(job.dtype)
    tflops = model_flops / step / devices / 1e12
    hfu_tflops = (model_flops + recompute_flops) / step / devices / 1e12

    capacity = hw.device.memory_gib * GIB
    host_capacity = hw.host.memory_gib * GIB
    return EstimateBatch(
        fits=mem.total <= capacity,
        host_fits=mem.host_optimizer * hw.node.devices_per_node <= host_capacity,
        memory=mem,
        time_s=time_s,
        step_time_s=step,
        tokens_per_s=tokens / step,
        tflops_per_device=tflops,
        hfu_tflops_per_device=hfu_tflops,
        mfu=tflops * 1e12 / peak,
        hfu=hfu_tflops * 1e12 / peak,
        slowest_stage=slowest,
    )


# ---- one strategy ------------------------------------------------------------------------------
@dataclass(frozen=True)
class MemoryBreakdown:
    parameters: float
    gradients: float
    optimizer: float
    activations: float
    buffers: float
    total: float


@dataclass(frozen=True)
class Estimate:
    feasible: bool
    reasons: tuple[str, ...]
    memory_gib: MemoryBreakdown
    capacity_gib: float
    activation_gib_per_microbatch: float
    host_optimizer_gib: float
    time_s: dict[str, float]
    step_time_s: float
    tokens_per_s: float
    tokens_per_s_per_device: float
    tflops_per_device: float
    hfu_tflops_per_device: float
    mfu: float
    hfu: float
    worst_memory_stage: int
    slowest_stage: int
    bottleneck: str
    time_to_train_s: float | None = None
    cost_to_train_usd: float | None = None
    energy_to_train_kwh: float | None = None
    devices: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("extra")
        out["reasons"] = list(self.reasons)
        return out


def bottleneck_name(time_parts: dict[str, float], memory_fraction: float) -> str:
    """The largest time part; 'memory headroom' when the plan uses more than 95% of the device."""
    if memory_fraction > 0.95:
        return "memory headroom"
    return max(time_parts, key=lambda k: time_parts[k])


def estimate(model: ModelSpec, hw: HardwareProfile, cluster: Cluster, job: TrainingJob, strategy: Strategy) -> Estimate:
    """Score one strategy. Illegal strategies and plans that do not fit are results, with reasons."""
    reasons = violations(model, cluster, job, strategy)
    malformed = (strategy.stage_layers is not None and len(strategy.stage_layers) != strategy.pp) or min(
        strategy.dp, strategy.tp, strategy.pp, strategy.cp, strategy.ep, strategy.micro_batch_size,
        strategy.num_micro_batches, strategy.virtual_pipeline_stages) < 1
    if malformed:   # no shape to price: the reasons say why
        return _illegal(hw, cluster, reasons[0])
    batch = StrategyBatch.from_strategies([strategy], model.num_layers)
    e = estimate_batch(model, hw, cluster, job, batch)
    return from_batch(e, 0, model, hw, cluster, job, extra_reasons=reasons)


def from_batch(e: EstimateBatch, i: int, model: ModelSpec, hw: HardwareProfile, cluster: Cluster, job: TrainingJob,
               extra_reasons: list[str] | tuple[str, ...] = ()) -> Estimate:
    """Candidate i of a batch estimate as an Estimate (with reasons and time to train)."""
    mem = {k: float(getattr(e.memory, k)[i]) / GIB for k in MEMORY_PARTS}
    capacity = hw.device.memory_gib
    reasons = list(extra_reasons)
    if not bool(e.fits[i]):
        reasons.append(f"needs {mem['total']:.1f} GiB per device on pipeline stage {int(e.memory.worst_stage[i])}, "
                       f"the device has {capacity:g} GiB")
    if not bool(e.host_fits[i]):
        need = float(e.memory.host_optimizer[i]) * hw.node.devices_per_node / GIB
        reasons.append(f"offloaded optimizer states need {need:.0f} GiB of host memory per node, the host has {hw.host.memory_gib:g} GiB")
    times = {k: float(v[i]) for k, v in e.time_s.items()}
    step = float(e.step_time_s[i])
    tps = float(e.tokens_per_s[i])
    train_s = cost = energy = None
    if job.train_tokens is not None:
        train_s = job.train_tokens / tps
        hours = train_s / 3600.0 * cluster.devices
        cost = hours * hw.price_per_device_hour_usd if hw.price_per_device_hour_usd else None
        energy = hours * hw.power_watts / 1000.0 if hw.power_watts else None
    return Estimate(
        feasible=not reasons,
        reasons=tuple(reasons),
        memory_gib=MemoryBreakdown(**mem),
        capacity_gib=capacity,
        activation_gib_per_microbatch=float(e.memory.activation_per_microbatch[i]) / GIB,
        host_optimizer_gib=float(e.memory.host_optimizer[i]) / GIB,
        time_s=times,
        step_time_s=step,
        tokens_per_s=tps,
        tokens_per_s_per_device=tps / cluster.devices,
        tflops_per_device=float(e.tflops_per_device[i]),
        hfu_tflops_per_device=float(e.hfu_tflops_per_device[i]),
        mfu=float(e.mfu[i]),
        hfu=float(e.hfu[i]),
        worst_memory_stage=int(e.memory.worst_stage[i]),
        slowest_stage=int(e.slowest_stage[i]),
        bottleneck=bottleneck_name(times, mem["total"] / capacity),
        time_to_train_s=train_s,
        cost_to_train_usd=cost,
        energy_to_train_kwh=energy,
        devices=cluster.devices,
    )


def _illegal(hw: HardwareProfile, cluster: Cluster, reason: str) -> Estimate:
    zero = MemoryBreakdown(0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    return Estimate(
        feasible=False, reasons=(reason,), memory_gib=zero, capacity_gib=hw.device.memory_gib,
        activation_gib_per_microbatch=0.0, host_optimizer_gib=0.0, time_s={k: 0.0 for k in TIME_PARTS},
        step_time_s=0.0, tokens_per_s=0.0, tokens_per_s_per_device=0.0, tflops_per_device=0.0,
        hfu_tflops_per_device=0.0, mfu=0.0, hfu=0.0, worst_memory_stage=0, slowest_stage=0,
        bottleneck="illegal", devices=cluster.devices,
    )
