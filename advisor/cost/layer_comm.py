"""Collectives inside a layer, per micro-batch on one device: tensor, expert and context parallelism.

* Tensor parallelism: two all-reduces in the forward and two in the backward per layer, or with
  sequence parallelism a reduce-scatter + all-gather pair in their place (Megatron SC'21 section 3;
  Korthikanti et al. 2022 section 4.2.2), over the tp group's placement. With ``tp_comm_overlap``
  (Transformer Engine userbuffers in Megatron, torchtitan's async TP) each collective is cut into tp
  chunks pipelined with the GEMM it feeds or follows (TE's ring-exchange overlap; Wang et al.,
  "Overlap Communication with Dependent Computation via Decomposition", ASPLOS 2023): one chunk
  stays exposed, and whatever the layer's linear GEMMs cannot cover. MindFormers' fine_grain_interleave
  (LLamaDecodeLayerInterleave, mindformers/models/llama/llama_interleave.py at v1.3.0) instead cuts
  each layer's sequence into FINE_GRAIN_SLICES slices whose collectives run under the other slices'
  compute: one slice's collective stays exposed.
* Multi-copy parallelism (MindSpore MicroBatchInterleaved, MindFormers micro_batch_interleave_num):
  the micro-batch runs as k copies, one copy's TP collectives under another's compute
  (advisor.cost.multi_copy prices the overlap).
* Expert parallelism: dispatch and combine all-to-alls in the forward, again in the backward
  (Lepikhin et al., GShard 2020), of the top-k token copies, over the ep group's placement. With
  ``ep_comm_overlap`` (Megatron-Core overlap_moe_expert_parallel_comm, after DeepSeek-V3's DualPipe
  idea) one micro-batch's all-to-alls run under another's compute: only the excess stays exposed.
* Context parallelism, p2p (ring attention: Liu et al. 2023; Megatron-Core/Transformer Engine's
  default cp_comm_type): cp - 1 steps, each sending this rank's K and V block to the next rank
  while attention runs on the block in hand; each step pays one latency (the step waits for its
  receive) and the part of the transfer the block's attention does not hide. The backward passes K,
  V and their gradients (twice the bytes) around the ring against the backward attention.
* What any of these overlaps hides slows the compute it hides under: OVERLAP_COMPUTE_SLOWDOWN of each hidden
  second is booked with the collective's exposed seconds (advisor.cost.overlap_slowdown, Lee et al. 2025).
* Context parallelism, a2a (Ulysses, Jacobs et al. 2023 section 3): all-to-alls of Q, K, V before
  attention and of its output after, in the forward and again in the backward, not overlapped.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from advisor.cost import comm, multi_copy
from advisor.cost.overlap_slowdown import compute_slowdown_s
from advisor.cost.placement import GroupPlacement
from advisor.space.strategy import StrategyBatch
from advisor.specs.frameworks import MINDSPORE
from advisor.specs.hardware import HardwareProfile
from advisor.specs.job import TrainingJob
from advisor.specs.model import ModelSpec

CP_A2A = 1
# MindFormers' fine_grain_interleave as its configs set it (research/yi/finetune_yi_34b.yaml,
# configs/codellama/finetune_codellama_34b_32p.yaml, research/qwen2/finetune_qwen2_0.5b_32k.yaml at v1.3.0)
FINE_GRAIN_SLICES = MINDSPORE.tp_overlap_slices     # MindFormers' fine_grain_interleave (the mindspore record)


@dataclass(frozen=True)
class LayerComm:
    """Exposed seconds per layer and micro-batch (arrays): forward and backward of each kind."""

    tp_forward: np.ndarray
    tp_backward: np.ndarray
    ep_forward: np.ndarray
    ep_backward: np.ndarray
    cp_forward: np.ndarray
    cp_backward: np.ndarray


def tp_message_bytes(model: ModelSpec, job: TrainingJob, b: StrategyBatch):
    """One TP collective's full buffer: the micro-batch's activations on this cp slice."""
    return b.micro_batch_size * job.seq_length / b.cp * model.hidden_size * job.dtype_bytes


def ep_message_bytes(model: ModelSpec, job: TrainingJob, b: StrategyBatch):
    """One dispatch (or combine) all-to-all's buffer: the top-k copies of this rank's tokens."""
    tokens = b.micro_batch_size * job.seq_length / b.cp / np.where(b.sequence_parallel, b.tp, 1)
    return tokens * model.moe.top_k * model.hidden_size * job.dtype_bytes


def tp_blocks(model: ModelSpec, b: StrategyBatch, moe_layer: bool) -> np.ndarray:
    """Blocks of a layer that run a tensor-parallel collective: the attention block and the MLP block, unless the
    MLP is an MoE block whose experts are folded (no tensor parallelism in them) and has no shared expert (which
    stays tensor-parallel)."""
    folded_mlp = moe_layer and model.moe is not None and not model.moe.shared_ffn
    return np.where(b.fold_experts & folded_mlp, 1.0, 2.0)


def tp_comm_s(model: ModelSpec, hw: HardwareProfile, job: TrainingJob, b: StrategyBatch, tp: GroupPlacement,
              moe_layer: bool = False):
    """Forward TP collectives of one layer and micro-batch, before any overlap (the backward repeats them), one per
    block (tp_blocks)."""
    msg = tp_message_bytes(model, job, b)
    ar = comm.group_time_s(hw, "all_reduce", msg, tp)
    rs_ag = comm.group_time_s(hw, "reduce_scatter", msg, tp) + comm.group_time_s(hw, "all_gather", msg, tp)
    return tp_blocks(model, b, moe_layer) * np.where(b.sequence_parallel, rs_ag, ar)


def ep_comm_s(model: ModelSpec, hw: HardwareProfile, job: TrainingJob, b: StrategyBatch, ep: GroupPlacement):
    """Forward all-to-alls (dispatch + combine) of one MoE layer and micro-batch, before any overlap."""
    if model.moe is None:
        return np.zeros(len(b))
    return 2.0 * comm.group_time_s(hw, "all_to_all", ep_message_bytes(model, job, b), ep)


def cp_comm_s(model: ModelSpec, hw: HardwareProfile, job: TrainingJob, b: StrategyBatch, cp: GroupPlacement,
              ring_tier, core_forward_s, core_backward_s):
    """(forward, backward) exposed context-parallel communication of one layer and micro-batch."""
    tokens = b.micro_batch_size * job.seq_length / b.cp
    t = b.tp.astype(float)
    steps = b.cp - 1.0
    kv_bytes = tokens * (model.k_size + model.v_size) / t * job.dtype_bytes
    send = comm.tier_p2p_time_s(hw, kv_bytes, ring_tier)
    latency = comm.tier_p2p_time_s(hw, 0.0, ring_tier)
    cp_f = np.maximum(b.cp, 1.0)
    hide = 1.0 if hw.device.overlaps_communication else 0.0    # a CPU rank runs them in turn
    ring_fwd = steps * (latency + np.maximum(send - latency - hide * core_forward_s / cp_f, 0.0))
    ring_bwd = steps * (latency + np.maximum(2.0 * (send - latency) - hide * core_backward_s / cp_f, 0.0))
    # the block's attention runs slower under the part of each step's transfer it hides (overlap_slowdown)
    ring_fwd = ring_fwd + compute_slowdown_s(hw, steps * send, ring_fwd, steps * core_forward_s / cp_f)
    ring_bwd = ring_bwd + compute_slowdown_s(hw, steps * (2.0 * send - latency), ring_bwd, steps * core_backward_s / cp_f)
    qkv_bytes = tokens * (model.q_size + model.k_size + model.v_size) / t * job.dtype_bytes
    out_bytes = tokens * model.attention_out_size / t * job.dtype_bytes
    a2a = comm.group_time_s(hw, "all_to_all", qkv_bytes, cp) + comm.group_time_s(hw, "all_to_all", out_bytes, cp)
    active = b.cp > 1
    ulysses = b.cp_comm == CP_A2A
    fwd = np.where(active, np.where(ulysses, a2a, ring_fwd), 0.0)
    bwd = np.where(active, np.where(ulysses, a2a, ring_bwd), 0.0)
    return fwd, bwd


def layer_comm(model: ModelSpec, hw: HardwareProfile, job: TrainingJob, b: StrategyBatch, groups, ring_tier,
               linear_forward_s, layer_forward_s, core_forward_s, core_backward_s, moe_layer: bool = False) -> LayerComm:
    """Exposed TP, EP and CP communication of one layer and micro-batch. ``groups``: placements by
    kind; linear_forward_s / layer_forward_s: the layer's forward GEMMs / all its forward compute
    (what overlapped TP / EP collectives can hide behind; the backward has twice as much)."""
    tp = tp_comm_s(model, hw, job, b, groups["tp"], moe_layer)
    if job.tp_comm_overlap and hw.device.overlaps_communication:
        # ring-exchange overlap splits each collective and its GEMM into tp chunks (MindSpore: the
        # sequence into FINE_GRAIN_SLICES slices): the first (or last) one's transfer has nothing to hide behind
        slices = job.framework_record.tp_overlap_slices
        t = float(slices) if slices is not None else b.tp.astype(float)
        first = tp / t
        tp_fwd = first + np.maximum(tp - first - linear_forward_s, 0.0)
        tp_bwd = first + np.maximum(tp - first - 2.0 * linear_forward_s, 0.0)
    else:
        tp_fwd, tp_bwd = tp, tp
    traffic = tp
    if multi_copy.active(b):
        one_copy = tp_comm_s(model, hw, job, multi_copy.per_copy_batch(b), groups["tp"], moe_layer)
        tp_fwd, tp_bwd = multi_copy.tp_exposed(hw, job, b, one_copy, tp_fwd, tp_bwd, layer_forward_s, 2.0 * layer_forward_s)
        traffic = np.where(b.micro_batch_copies > 1, multi_copy.copies(b) * one_copy, tp)
    # the compute under the hidden part of the TP collectives runs slower (overlap_slowdown; 0 where none hides)
    tp_fwd = tp_fwd + compute_slowdown_s(hw, traffic, tp_fwd, layer_forward_s)
    tp_bwd = tp_bwd + compute_slowdown_s(hw, traffic, tp_bwd, 2.0 * layer_forward_s)
    ep = ep_comm_s(model, hw, job, b, groups["ep"])
    if job.ep_comm_overlap and hw.device.overlaps_communication:
        ep_fwd, ep_bwd = np.maximum(ep - layer_forward_s, 0.0), np.maximum(ep - 2.0 * layer_forward_s, 0.0)
        ep_fwd = ep_fwd + compute_slowdown_s(hw, ep, ep_fwd, layer_forward_s)
        ep_bwd = ep_bwd + compute_slowdown_s(hw, ep, ep_bwd, 2.0 * layer_forward_s)
    else:
        ep_fwd, ep_bwd = ep, ep
    cp_fwd, cp_bwd = cp_comm_s(model, hw, job, b, groups["cp"], ring_tier, core_forward_s, core_backward_s)
    return LayerComm(tp_fwd, tp_bwd, ep_fwd, ep_bwd, cp_fwd, cp_bwd)
