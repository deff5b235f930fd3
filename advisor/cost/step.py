"""Step time of N candidates at once (vectorized): the cost model's batch orchestrator.

Step time = m x (slowest stage's micro-batch time) + pipeline fill/drain (bubble)
          + exposed pipeline point-to-point + exposed data-parallel communication
          + optimizer step and, in MindSpore, its per-micro-batch gradient accumulation
          (advisor.cost.optimizer_step) (+ host transfers under offload).
A stage's micro-batch time adds, per layer, forward and backward compute (advisor.cost.compute),
recomputation (advisor.cost.recompute), the exposed tensor-, expert- and context-parallel
collectives (advisor.cost.layer_comm) and the host's kernel launches; every collective is priced
where its group's members sit (advisor.cost.placement). See each module for its sources.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from advisor.cost import (bubble, comm, compute, contention, cuda_graphs, dataset, multi_copy, optimizer_step, recompute,
                          swap)
from advisor.cost.host_embedding import host_embedding, node_host_bytes
from advisor.cost.data_parallel import dp_time_s
from advisor.cost.layer_comm import layer_comm
from advisor.cost.memory import (GIB, MemoryArrays, col, linear_params, memory, stage_layer_counts, stage_masks, stage_params,
                                 resharding, state_bytes_per_param, swapped_layer_bytes)
from advisor.cost.placement import cp_ring_tier, pipeline_neighbour_tier, placements
from advisor.space.strategy import INTERLEAVED, SCHEDULES, StrategyBatch
from advisor.specs.hardware import HardwareProfile
from advisor.specs.job import Cluster, TrainingJob
from advisor.specs.model import ModelSpec

TIME_PARTS = ("compute", "recompute", "tp_comm", "cp_comm", "ep_comm", "host_overhead", "pp_comm", "dp_comm",
              "contention", "bubble", "optimizer", "offload")
# the parts of a stage's micro-batch time (the first six of TIME_PARTS, per micro-batch)
STAGE_PARTS = TIME_PARTS[:6]
# Kernels one transformer layer launches per micro-batch, counted in Megatron-LM's
# ParallelTransformerLayer with its fused kernels (norm, QKV GEMM, layout copies, score batched
# matmul, fused scale-mask-softmax, dropout, context batched matmul, output GEMM, TP all-reduce,
# fused bias-dropout-add, norm, FC1 GEMM, fused bias-GELU, FC2 GEMM, TP all-reduce,
# bias-dropout-add): about 20 forward; the backward launches about twice as many. Layers of other
# designs (rotary, RMSNorm, gated MLP, fused attention) scale it by compute.layer_ops_factor.
KERNELS_FORWARD = 20
KERNELS_BACKWARD = 40
# Full recomputation replays a layer's forward: its share of the layer's launches (and of the
# dropless MoE synchronizations, whose forward and backward parts scale the same way)
REPLAYED_LAUNCHES = KERNELS_FORWARD / (KERNELS_FORWARD + KERNELS_BACKWARD)


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
    # per-stage micro-batch seconds, for mixed clusters (advisor.cost.mixed), whose stages run on
    # different devices: the (N, P) total, and its parts (STAGE_PARTS) as arrays that broadcast to
    # (N, P), meaningful on active stages only
    stage_micro_batch_s: np.ndarray | None = None
    stage_parts_s: dict[str, np.ndarray] | None = None
    # host memory of the fullest node (advisor.cost.host_embedding.node_host_bytes); None: host_total
    # times the node's devices
    host_node_bytes: np.ndarray | None = None

    @property
    def feasible(self) -> np.ndarray:
        return self.fits & self.host_fits



def _host_layer_s(hw, launch_s, lc, lcomm, extra_forward, extra_backward):
    """Host time of one layer per micro-batch that the device does not hide (a layer cannot finish
    before the host has issued its kernels; its collectives keep the device busy too)."""
    kernels_f, kernels_b = KERNELS_FORWARD * launch_s + extra_forward, KERNELS_BACKWARD * launch_s + extra_backward
    if not hw.device.asynchronous_launch:
        return col(np.broadcast_to(kernels_f + kernels_b, lc.forward_s.shape))
    gpu_fwd = lc.forward_s + lcomm.tp_forward + lcomm.cp_forward + lcomm.ep_forward
    gpu_bwd = lc.backward_s + lcomm.tp_backward + lcomm.cp_backward + lcomm.ep_backward
    return col(np.maximum(kernels_f - gpu_fwd, 0.0) + np.maximum(kernels_b - gpu_bwd, 0.0))


def _host_s(model, hw, job, b, dense, dense_c, moe, moe_c, dense_n, moe_n, full_share, moe_launches):
    """Host time of the stage's layers per micro-batch that the devices do not hide; MoE layers add
    their routing and expert kernels (``moe_launches``: the eager ones, forward and backward); CUDA
    graphs launch what they capture at once (advisor.cost.cuda_graphs)."""
    # each copy of a split micro-batch launches its own kernels (advisor.cost.multi_copy)
    plain = hw.device.launch_overhead_us * 1e-6 * multi_copy.launch_scale(b)
    launch_s = plain * compute.layer_ops_factor(model, job)
    graphs = job.cuda_graphs

    def layer(lc, lcomm, moe_layer):
        eager = 1.0 - cuda_graphs.captured_share(graphs, moe_layer)
        replays = cuda_graphs.graph_launches(graphs, moe_layer) * plain
        if not moe_layer:
            return _host_layer_s(hw, eager * launch_s, lc, lcomm, replays, replays)
        forward, backward = moe_launches
        return _host_layer_s(hw, eager * launch_s, lc, lcomm, replays + forward * plain, replays + backward * plain)

    host_s = dense_n * layer(dense, dense_c, False)
    if model.moe is not None:
        host_s = host_s + moe_n * layer(moe, moe_c, True)
    host_s = host_s * (1.0 + full_share * REPLAYED_LAUNCHES)
    # A pipeline schedule runs a forward and a backward action per chunk and micro-batch; where the
    # host pays its bookkeeping in line (CPU ranks), each costs the profile's per-action overhead.
    action_s = np.select([b.pipeline_schedule == i for i in range(len(SCHEDULES))],
                         [hw.device.action_overhead_us(name) * 1e-6 for name in SCHEDULES], 0.0)
    return host_s + col(np.where(b.pp > 1, 2.0 * b.virtual_pipeline_stages * action_s, 0.0))


# Kernels an MoE layer launches after its routing, counted in Megatron-Core's MoELayer with the
# alltoall dispatcher and fused permutation (token_dispatcher.py, experts.py): permute, dispatch
# all-to-all, sort by local expert, grouped FC1, activation, grouped FC2, unsort, combine all-to-all,
# unpermute and their bookkeeping: about 12 forward, twice as many backward.
MOE_KERNELS_FORWARD = 12
MOE_KERNELS_BACKWARD = 24
# Megatron-Core's grouped experts (TEGroupedMLP) run Transformer Engine's GroupedLinear, whose
# grouped GEMM issues one cuBLAS GEMM per local expert over a few streams
# (transformer_engine/common/gemm/cublaslt_gemm.cu, multi_stream_cublas_gemm: the CUTLASS grouped
# kernel is opt-in, Hopper and BF16 only): FC1 and FC2 forward, and their data and weight gradients
# backward, are 2 and 4 launches per local expert where the generic count has 2 and 4 in all; the
# host cost around each is PyTorch-operator-sized (TransformerEngine issue #1499: per-GEMM tensor
# allocations besides the cuBLAS call), so each is priced as one of the layer's counted launches.
# PyTorch (torch._grouped_mm) and MindSpore (GroupedMatmul) launch one kernel per grouped GEMM.
EXPERT_GEMMS_FORWARD = 2
EXPERT_GEMMS_BACKWARD = 4


def _moe_launches(model, job, b):
    """Kernels an MoE layer launches after routing that stay eager (CUDA graphs take the rest),
    forward and backward, per candidate."""
    if not job.framework_record.expert_gemm_per_expert:
        forward, backward = np.full(len(b), float(MOE_KERNELS_FORWARD)), np.full(len(b), float(MOE_KERNELS_BACKWARD))
    else:
        local = model.moe.num_experts / b.ep
        forward = MOE_KERNELS_FORWARD + EXPERT_GEMMS_FORWARD * (local - 1.0)
        backward = MOE_KERNELS_BACKWARD + EXPERT_GEMMS_BACKWARD * (local - 1.0)
    return cuda_graphs.eager_moe_launches(job.cuda_graphs, forward, backward)


def _dropless_sync_s(hw, moe, moe_c, moe_launches):
    """Dropless MoE: the tokens per expert are copied to the host before the expert kernels can be
    sized (Megatron-Core's MoE docs: dropless routing synchronizes device and host; a capacity factor
    with padding avoids it), so the host stops running ahead: the routing's kernels launch only after
    the device has drained, and each pass pays its launch time wherever the expert work on the device
    is shorter (small experts) and one synchronization latency (a launch) in any case."""
    launch_s = hw.device.launch_overhead_us * 1e-6
    gpu_fwd = moe.expert_forward_s + moe_c.ep_forward
    gpu_bwd = 2.0 * moe.expert_forward_s + moe_c.ep_backward
    forward, backward = moe_launches
    return (2.0 * launch_s + np.maximum(forward * launch_s - gpu_fwd, 0.0)
            + np.maximum(backward * launch_s - gpu_bwd, 0.0))


def _pair_group(tier):
    """Fan-outs of a two-member group whose members sit `tier` apart (tied-embedding all-reduce)."""
    one = np.ones_like(tier, dtype=float)
    return (np.where(tier == 0, 2.0, 1.0), np.where(tier == 1, 2.0, one), np.where(tier == 2, 2.0, one))


def estimate_batch(model: ModelSpec, hw: HardwareProfile, cluster: Cluster, job: TrainingJob, b: StrategyBatch) -> EstimateBatch:
    """Score N candidates at once. Legality is not checked here (see advisor.space.rules)."""
    n_cand = len(b)
    mem = memory(model, job, b)
    active, first, last = stage_masks(b)
    dense_n, moe_n = stage_layer_counts(model, b)
    n_layers = dense_n + moe_n
    groups = placements(hw, b, ("tp", "cp", "dp_cp", "ep", "edp"))    # the groups the step's collectives use

    # ---- per layer, per micro-batch, one device ----------------------------------------------
    dense = multi_copy.with_copies(model, hw, job, b, False, compute.layer_compute(model, hw, job, b, moe_layer=False))
    moe = (multi_copy.with_copies(model, hw, job, b, True, compute.layer_compute(model, hw, job, b, moe_layer=True))
           if model.moe is not None else dense)
    ring = cp_ring_tier(hw, b)
    dense_c = layer_comm(model, hw, job, b, groups, ring, dense.linear_forward_s, dense.forward_s,
                         dense.core_forward_s, dense.core_backward_s)
    moe_c = layer_comm(model, hw, job, b, groups, ring, moe.linear_forward_s, moe.forward_s,
                       moe.core_forward_s, moe.core_backward_s) if model.moe is not None else dense_c
    head_s, head_flops = multi_copy.head_with_copies(model, hw, job, b, *compute.head_compute_s(model, hw, job, b))

    def layers(d, m):
        return dense_n * col(d) + moe_n * col(m)

    fwd = layers(dense.forward_s, moe.forward_s) + np.where(last, col(head_s), 0.0)
    bwd = layers(dense.backward_s, moe.backward_s) + np.where(last, col(2.0 * head_s), 0.0)
    comp = fwd + bwd
    # recomputation replays forward work of the recomputed layers (their TP/CP/EP collectives too
    # when a whole layer is replayed)
    rl = b.recompute_layers
    recomputed = np.where(rl < 0, n_layers, np.minimum(rl, n_layers))
    share = np.where(n_layers > 0, recomputed / np.maximum(n_layers, 1), 0.0)
    rc = b.recompute

    recompute_s = share * layers(recompute.replay_s(rc, job, dense),
                                 recompute.replay_s(rc, job, moe, moe_layer=model.moe is not None))
    full_share = np.where(col(rc) == recompute.FULL, share, 0.0)
    tp_s = dense_n * col(dense_c.tp_forward + dense_c.tp_backward) + moe_n * col(moe_c.tp_forward + moe_c.tp_backward)
    tp_s = tp_s + full_share * layers(dense_c.tp_forward, moe_c.tp_forward)
    ep_s = moe_n * col(moe_c.ep_forward + moe_c.ep_backward) + full_share * moe_n * col(moe_c.ep_forward)
    cp_s = layers(dense_c.cp_forward + dense_c.cp_backward, moe_c.cp_forward + moe_c.cp_backward)
    cp_s = cp_s + full_share * layers(dense_c.cp_forward, moe_c.cp_forward)
    moe_launches = _moe_launches(model, job, b) if model.moe is not None else None
    host_s = _host_s(model, hw, job, b, dense, dense_c, moe, moe_c, dense_n, moe_n, full_share, moe_launches)
    if model.moe is not None and job.moe_dropless and hw.device.asynchronous_launch:
        host_s = host_s + moe_n * col(_dropless_sync_s(hw, moe, moe_c, moe_launches)) * (1.0 + full_share * REPLAYED_LAUNCHES)
    # activations swapped to the host: what the copies add beyond the stage's forward and backward
    swap_s = (swap.exposed_s(hw, b, swapped_layer_bytes(model, job, b), fwd, bwd) if b.swap_layers.any()
              else np.zeros_like(comp))
    # the word embedding on the host: its lookups and their gradients cross PCIe on the first stage
    host_embed_step_s, first_per_node = 0.0, None
    if b.host_embedding.any():
        host_embed = host_embedding(model, hw, job, b, groups["dp_cp"], placements(hw, b, ("pp",))["pp"])
        swap_s = swap_s + np.where(first, col(host_embed.micro_batch_s), 0.0)
        host_embed_step_s, first_per_node = host_embed.step_s, host_embed.first_per_node
        mem = replace(mem, host_embedding=host_embed.host_bytes)
    stage_mb = np.where(active, comp + recompute_s + tp_s + ep_s + cp_s + host_s + swap_s, 0.0)
    stage_parts = dict(zip(STAGE_PARTS, (comp, recompute_s, tp_s, cp_s, ep_s, host_s)))

    pipe_s, bubble_s, slowest = bubble.pipeline_time_s(stage_mb, active, b.num_micro_batches, b.virtual_pipeline_stages)
    rows = np.arange(n_cand)
    m = b.num_micro_batches.astype(float)

    def at_slowest(x):
        return np.broadcast_to(x, stage_mb.shape)[rows, slowest]

    # ---- pipeline point-to-point (activations forward, gradients backward) -------------------
    # Megatron's scatter/gather optimization sends 1/t of the activation per TP rank (SC'21 sec. 4.1);
    # the slowest pair of neighbouring stages sets the pace (interleaving adds the last -> first hop).
    p2p_bytes = b.micro_batch_size * job.seq_length / b.cp * model.hidden_size * job.dtype_bytes / b.tp
    neighbour = pipeline_neighbour_tier(hw, b, wrap=b.pipeline_schedule == INTERLEAVED)
    p2p = comm.tier_p2p_time_s(hw, p2p_bytes, neighbour)
    # Megatron's interleaved schedule overlaps each chunk's sends and receives with the next chunk's
    # compute (--overlap-p2p-communication, on by default; schedules.py); only the fill and drain
    # transfers and what a chunk's compute cannot hide stay exposed. Otherwise every transfer waits.
    steady = 2.0 * m * b.virtual_pipeline_stages
    chunk_s = at_slowest(stage_mb) / b.virtual_pipeline_stages / 2.0      # a chunk's forward or backward
    overlapped = ((b.pipeline_schedule == INTERLEAVED) & job.framework_record.overlaps_interleaved_p2p
                  & hw.device.overlaps_communication)
    exposed_steady = np.where(overlapped, np.maximum(p2p - chunk_s, 0.0), p2p)
    pp_s = np.where(b.pp > 1, steady * exposed_steady + 2.0 * p2p * (b.pp - 1), 0.0)

    # ---- data-parallel gradient reduction and ZeRO gathers ----------------------------------
    dense_p, expert_p = stage_params(model, b)
    dense_max, expert_max = np.max(dense_p, axis=1), np.max(expert_p, axis=1)
    wb, gb, _ = state_bytes_per_param(job)
    gather_bytes = 1.0 if job.fp8_param_gather else wb     # FP8 primary weights are gathered in FP8
    units = np.max(np.where(active, n_layers, 0), axis=1)
    dp_s = dp_time_s(hw, job, b, dense_max, expert_max, groups["dp_cp"], groups["edp"],
                     units, at_slowest(fwd), at_slowest(bwd), gather_bytes)
    # overlapped data-parallel traffic sharing links with the slowest stage's critical path
    critical = contention.critical_busy_s(model, hw, job, b, groups, ring, neighbour,
                                          at_slowest(dense_n), at_slowest(moe_n))
    contention_s = contention.contention_s(hw, job, b, critical, dense_max, expert_max, groups["dp_cp"], groups["edp"],
                                           at_slowest(fwd), at_slowest(bwd), gather_bytes)
    # Tied embeddings under pipelining: the first and last stages all-reduce the word-embedding
    # gradient every step (Megatron's embedding group, _allreduce_embedding_grads).
    if model.tie_embeddings:
        emb_bytes = model.vocab_size * model.hidden_size / b.tp * job.grad_reduce_bytes
        ends = pipeline_neighbour_tier(hw, b, wrap=True)
        emb_s = comm.fanout_time_s(hw, "all_reduce", emb_bytes, *_pair_group(ends))
        dp_s = dp_s + np.where(b.pp > 1, emb_s, 0.0)

    # ---- optimizer ---------------------------------------------------------------------------
    z = b.zero_stage
    n_dp, n_edp = groups["dp_cp"].n.astype(float), groups["edp"].n.astype(float)
    local = dense_max / np.where(z >= 1, n_dp, 1) + expert_max / np.where(z >= 1, n_edp, 1)
    offload = b.offload_optimizer
    # Unfused optimizers pay a host cost per parameter tensor (profile constant; 0 on accelerators).
    # (the word embedding on the host is stepped there: advisor.cost.host_embedding)
    embed_tensors = 1 + (model.position_embedding == "learned") - b.host_embedding.astype(np.int64)
    head_tensors = (2 if model.norm == "layernorm" else 1) + (not model.tie_embeddings)
    ends_t = np.where(b.pp == 1, embed_tensors + head_tensors, np.maximum(embed_tensors, head_tensors))
    tensors = units * model.parameter_tensors_per_layer(job.framework_record.one_qkv_weight) + ends_t
    opt_host = tensors * hw.device.optimizer_overhead_us_per_tensor * 1e-6
    host_share = np.where(offload, b.offload_fraction, 0.0)
    opt_s = np.where(host_share < 1.0, (1.0 - host_share) * compute.optimizer_step_s(hw, local, job) + opt_host, 0.0)
    # MindSpore's per-micro-batch gradient accumulation (advisor.cost.optimizer_step), priced with the step
    accumulate_bytes = optimizer_step.accumulation_bytes_per_param(job)
    if accumulate_bytes:
        accumulated = np.where(z >= 2, local, dense_max + expert_max)
        opt_s = opt_s + np.where((m > 1) | (b.pp > 1), m * compute.memory_time_s(hw, accumulate_bytes * accumulated), 0.0)
    pcie = hw.host.pcie_bandwidth_gbps * 1e9
    host_bw = (hw.host.memory_bandwidth_gbps or hw.host.pcie_bandwidth_gbps * hw.node.devices_per_node) * 1e9
    # Offload: gradients to the host, updated 16-bit weights back (unless they live there: parameter
    # offload), and Adam on the host CPU sharing the host's memory bandwidth with the node's other
    # devices (Ren et al., ZeRO-Offload, sec. 4). With a fraction offloaded (Megatron's
    # HybridDeviceOptimizer, DeepSpeed's offload ratio), the device steps its share while the host
    # copies and steps the rest (HybridDeviceOptimizer.step: the GPU optimizer's kernels are queued
    # first, the CPU optimizers run meanwhile): only what the host part takes beyond the device part shows.
    # Megatron's HybridDeviceOptimizer copies the gradients down at the step; DeepSpeed's ZeRO-Offload
    # copies each micro-batch's gradients as the backward produces them (Ren et al. sec. 4.2: the
    # transfer overlaps the backward), so only what outlasts a backward shows. The updated 16-bit
    # weights go back after the host's step in both.
    down = local * gb / pcie
    grads_s = np.where(job.framework_record.offload_grads_at_step, down, m * np.maximum(down - at_slowest(bwd), 0.0))
    host_part = host_share * (local * optimizer_step.ADAM_BYTES_PER_PARAM * hw.node.devices_per_node / host_bw
                              + np.where(b.offload_params, 0.0, grads_s + local * wb / pcie))
    offload_s = np.maximum(host_part - opt_s, 0.0)
    # Parameter offload (ZeRO-Infinity, Rajbhandari et al. SC'21, sec. 5-6; FSDP2's CPUOffloadPolicy):
    # every micro-batch each layer's weight shard crosses PCIe before its gather, in the forward and
    # again in the backward, and its gradient shard comes back after the reduce-scatter; prefetching
    # hides the transfers under the stage's compute, and what outlasts it shows. The node's devices
    # share the host's memory bandwidth.
    shard_bytes = local * (2.0 * wb + gb)
    shard_s = np.maximum(shard_bytes / pcie, shard_bytes * hw.node.devices_per_node / host_bw)
    # FSDP2 under pipelining keeps the gathered weights for the step (advisor.cost.memory.resharding):
    # the shards cross once per step there
    fetches = np.where(resharding(job, b), m, 1.0)
    offload_s = offload_s + np.where(b.offload_params, fetches * np.maximum(shard_s - at_slowest(comp), 0.0), 0.0)
    # FP8: the linear layers' weights are quantized once per step (cached across micro-batches)
    weight_cast = compute.weight_cast_s(hw, job, np.max(np.where(active, sum(linear_params(model, b)), 0.0), axis=1))

    # the word embedding on the host: its gradient exchange and update, once per step
    offload_s = offload_s + host_embed_step_s
    step = pipe_s + pp_s + dp_s + contention_s + opt_s + offload_s + weight_cast
    # the input pipeline's host-to-device copies, where they outlast the step they run under
    input_s = dataset.exposed_s(hw, job, b, step)
    time_s = {
        "compute": at_slowest(comp) * m + weight_cast,
        "recompute": at_slowest(recompute_s) * m,
        "tp_comm": at_slowest(tp_s) * m,
        "cp_comm": at_slowest(cp_s) * m,
        "ep_comm": at_slowest(ep_s) * m,
        "host_overhead": at_slowest(host_s) * m + input_s,
        "pp_comm": pp_s,
        "dp_comm": dp_s,
        "contention": contention_s,
        "bubble": bubble_s,
        "optimizer": opt_s,
        # optimizer offload, activation swapping and a host embedding's copies and update
        "offload": offload_s + at_slowest(swap_s) * m,
    }
    step = step + input_s

    tokens = job.tokens_per_step
    model_flops = model.training_flops_per_token(job.seq_length) * tokens
    # Hardware FLOPs add the recomputed forward work, counted over the whole model (all stages, all
    # micro-batches): the replayed GEMM and attention FLOPs of each recomputed layer.
    replayed = layers(recompute.replay_flops(rc, job, dense),
                      recompute.replay_flops(rc, job, moe, moe_layer=model.moe is not None))
    per_mb_device = np.sum(np.where(active, share * replayed, 0.0), axis=1)
    # per_mb_device is one micro-batch on one tp x cp slice of one dp replica's stages: scale to the cluster
    recompute_flops = per_mb_device * b.tp * b.cp * b.dp * m
    devices = float(cluster.devices)
    peak = hw.device.peak_flops(job.dtype)
    tflops = model_flops / step / devices / 1e12
    hfu_tflops = (model_flops + recompute_flops) / step / devices / 1e12

    capacity = hw.device.memory_gib * GIB
    host_node = node_host_bytes(mem.host_total, mem.host_embedding, hw.node.devices_per_node, first_per_node)
    return EstimateBatch(
        fits=mem.total <= capacity,
        host_fits=host_node <= hw.host.memory_gib * GIB,
        host_node_bytes=host_node,
        memory=mem,
        time_s=time_s,
        step_time_s=step,
        tokens_per_s=tokens / step,
        tflops_per_device=tflops,
        hfu_tflops_per_device=hfu_tflops,
        mfu=tflops * 1e12 / peak,
        hfu=hfu_tflops * 1e12 / peak,
        slowest_stage=slowest,
        stage_micro_batch_s=stage_mb,
        stage_parts_s=stage_parts,      # the arrays as computed (no copies on the search's path)
    )
