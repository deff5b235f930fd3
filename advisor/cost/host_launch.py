"""The host's kernel launches, as far as the devices do not hide them: a layer cannot finish before the
host has issued its kernels (per micro-batch, per stage), dropless MoE makes the host wait for the
device once per layer and pass, and CUDA graphs launch what they capture at once
(advisor.cost.cuda_graphs). The kernel counts and their sources are below; the per-launch cost is the
profile's launch_overhead_us (fitted per device, advisor.validation.fit)."""

from __future__ import annotations

import numpy as np

from advisor.cost import compute, cuda_graphs, multi_copy
from advisor.cost.memory import col
from advisor.space.strategy import SCHEDULES

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


def _host_layer_s(hw, launch_s, lc, lcomm, extra_forward, extra_backward):
    """Host time of one layer per micro-batch that the device does not hide (a layer cannot finish
    before the host has issued its kernels; its collectives keep the device busy too)."""
    kernels_f, kernels_b = KERNELS_FORWARD * launch_s + extra_forward, KERNELS_BACKWARD * launch_s + extra_backward
    if not hw.device.asynchronous_launch:
        return col(np.broadcast_to(kernels_f + kernels_b, lc.forward_s.shape))
    gpu_fwd = lc.forward_s + lcomm.tp_forward + lcomm.cp_forward + lcomm.ep_forward
    gpu_bwd = lc.backward_s + lcomm.tp_backward + lcomm.cp_backward + lcomm.ep_backward
    return col(np.maximum(kernels_f - gpu_fwd, 0.0) + np.maximum(kernels_b - gpu_bwd, 0.0))


def host_s(model, hw, job, b, dense, dense_c, moe, moe_c, dense_n, moe_n, full_share, moe_launches):
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

    total = dense_n * layer(dense, dense_c, False)
    if model.moe is not None:
        total = total + moe_n * layer(moe, moe_c, True)
    total = total * (1.0 + full_share * REPLAYED_LAUNCHES)
    # A pipeline schedule runs a forward and a backward action per chunk and micro-batch; where the
    # host pays its bookkeeping in line (CPU ranks), each costs the profile's per-action overhead.
    action_s = np.select([b.pipeline_schedule == i for i in range(len(SCHEDULES))],
                         [hw.device.action_overhead_us(name) * 1e-6 for name in SCHEDULES], 0.0)
    return total + col(np.where(b.pp > 1, 2.0 * b.virtual_pipeline_stages * action_s, 0.0))


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


def eager_moe_launches(model, job, b):
    """Kernels an MoE layer launches after routing that stay eager (CUDA graphs take the rest),
    forward and backward, per candidate."""
    if not job.framework_record.expert_gemm_per_expert:
        forward, backward = np.full(len(b), float(MOE_KERNELS_FORWARD)), np.full(len(b), float(MOE_KERNELS_BACKWARD))
    else:
        local = model.moe.num_experts / b.ep
        forward = MOE_KERNELS_FORWARD + EXPERT_GEMMS_FORWARD * (local - 1.0)
        backward = MOE_KERNELS_BACKWARD + EXPERT_GEMMS_BACKWARD * (local - 1.0)
    return cuda_graphs.eager_moe_launches(job.cuda_graphs, forward, backward)


def dropless_sync_s(hw, moe, moe_c, moe_launches):
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
