"""Compute time per layer and micro-batch on one device: GEMMs and memory-bound kernels.

* GEMM FLOPs: 2mnk per matmul (Narayanan et al. SC'21, appendix); the backward pass costs twice
  the forward (one GEMM for the input gradient, one for the weight gradient). Attention's score and
  context batched matmuls cost 2 * b * s_q * s_k * h each (Megatron counts the whole s x s product).
* GEMM throughput: peak FLOP/s of the compute dtype times the profile's achievable efficiency at the
  GEMM's size (work per call), so tensor parallelism's smaller GEMMs run less efficiently
  (the effect measured in SC'21 Fig. 7 and in vendor GEMM benchmarks).
* Memory-bound kernels (norms, activation functions, softmax, dropout, residual adds): their traffic
  is taken as twice the bytes of the activations the layer saves without recomputation (each saved
  tensor is written by one kernel and read by the next; Korthikanti et al. 2022 section 4.1 lists
  exactly those tensors), at the profile's achievable memory bandwidth; backward moves twice that.
* Optimizer step (Adam): memory-bound; per local parameter it reads the gradient, reads and writes
  fp32 master weights, momentum and variance, and writes the 16-bit weights (ZeRO section 3.1 states).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from advisor.cost.memory import layer_activation_terms
from advisor.space.strategy import StrategyBatch
from advisor.specs.hardware import HardwareProfile, interpolate_efficiency
from advisor.specs.job import TrainingJob
from advisor.specs.model import ModelSpec

ADAM_BYTES_PER_PARAM = 2 + 8 + 8 + 8 + 2  # grad read, master r/w, m r/w, v r/w, weight write


# Operators one transformer layer's forward + backward dispatches in eager PyTorch, by feature,
# counted with TorchDispatchMode on advisor's executor blocks (PyTorch 2.13, CPU; the counts add up
# within 3 of every combination measured; re-counted by tests/test_executor.py). The cost model's kernels per layer (KERNELS_FORWARD +
# KERNELS_BACKWARD in advisor.cost.estimate) describe the Megatron GPT-3 layer -- LayerNorm, GELU,
# learned positions, biases, unfused attention -- whose count is REFERENCE_LAYER_OPS; other layers
# issue proportionally more or fewer.
LAYER_OPS = {"base": 157, "bias": 18, "rotary": 32, "rmsnorm": 24, "gated_mlp": 23, "fused_attention": -39}
REFERENCE_LAYER_OPS = LAYER_OPS["base"] + LAYER_OPS["bias"]


def layer_ops_factor(model: ModelSpec, job: TrainingJob) -> float:
    """Host operators of one layer of this model relative to the reference GPT-3 layer."""
    ops = LAYER_OPS["base"]
    ops += LAYER_OPS["bias"] if model.use_bias else 0
    ops += LAYER_OPS["rotary"] if model.position_embedding == "rotary" else 0
    ops += LAYER_OPS["rmsnorm"] if model.norm == "rmsnorm" else 0
    ops += LAYER_OPS["gated_mlp"] if model.ffn_matrices == 3 else 0
    ops += LAYER_OPS["fused_attention"] if job.attention == "flash" else 0
    return ops / REFERENCE_LAYER_OPS


def gemm_time_s(hw: HardwareProfile, job: TrainingJob, flops):
    """Seconds for GEMM calls of the given FLOPs each (array), at the size-dependent efficiency."""
    flops = np.asarray(flops, dtype=float)
    eff = interpolate_efficiency(hw.device.matmul_efficiency, flops / 1e9)
    return np.where(flops > 0, flops / (hw.device.peak_flops(job.dtype) * eff), 0.0)


def memory_time_s(hw: HardwareProfile, nbytes):
    return np.asarray(nbytes, dtype=float) / (hw.device.memory_bandwidth_gbps * 1e9 * hw.device.memory_efficiency)


@dataclass(frozen=True)
class LayerCompute:
    """One layer, one micro-batch, one device: forward seconds and FLOPs (arrays)."""

    forward_s: np.ndarray           # all GEMMs and memory-bound kernels of the forward
    attention_core_s: np.ndarray    # the part selective recomputation replays (scores, softmax, context)
    forward_flops: np.ndarray       # GEMM FLOPs of the forward
    attention_core_flops: np.ndarray


def layer_compute(model: ModelSpec, hw: HardwareProfile, job: TrainingJob, b: StrategyBatch, moe_layer: bool) -> LayerCompute:
    t = b.tp.astype(float)
    tokens = b.micro_batch_size * job.seq_length / b.cp          # tokens of the micro-batch on this rank
    h, kv = model.hidden_size, model.kv_hidden_size
    qkv = 2.0 * tokens * h * (h + 2 * kv) / t
    proj = 2.0 * tokens * h * h / t
    score = 2.0 * tokens * job.seq_length * h / t                # QK^T; the context matmul is the same size
    gemm_s = gemm_time_s(hw, job, qkv) + gemm_time_s(hw, job, proj)
    core_s = 2.0 * gemm_time_s(hw, job, score)
    flops = qkv + proj
    core_flops = 2.0 * score
    if moe_layer and model.moe is not None:
        moe = model.moe
        router = 2.0 * tokens * h * moe.num_experts
        routed = tokens * moe.top_k                               # token copies processed per rank
        per_expert = routed * b.ep / moe.num_experts              # tokens one local expert sees
        up = 2.0 * per_expert * h * moe.expert_ffn_hidden_size * (model.ffn_matrices - 1) / t
        down = 2.0 * per_expert * moe.expert_ffn_hidden_size * h / t
        local_experts = moe.num_experts / b.ep
        gemm_s = gemm_s + gemm_time_s(hw, job, router) + local_experts * (gemm_time_s(hw, job, up) + gemm_time_s(hw, job, down))
        flops = flops + router + local_experts * (up + down)
    else:
        up = 2.0 * tokens * h * model.ffn_hidden_size * (model.ffn_matrices - 1) / t
        down = 2.0 * tokens * model.ffn_hidden_size * h / t
        gemm_s = gemm_s + gemm_time_s(hw, job, up) + gemm_time_s(hw, job, down)
        flops = flops + up + down
    terms = layer_activation_terms(model, job, b, moe_layer)
    elementwise_s = memory_time_s(hw, 2.0 * (terms.replicated + terms.sharded))
    core_elementwise_s = memory_time_s(hw, 2.0 * terms.attention_core)
    # Selective recomputation replays the attention core only where it was not kept: with flash
    # attention nothing of it is stored, so there is nothing to replay.
    replay = 1.0 if job.attention == "math" else 0.0
    return LayerCompute(
        forward_s=gemm_s + core_s + elementwise_s + core_elementwise_s,
        attention_core_s=replay * (core_s + core_elementwise_s),
        forward_flops=flops + core_flops,
        attention_core_flops=replay * core_flops,
    )


def head_compute_s(model: ModelSpec, hw: HardwareProfile, job: TrainingJob, b: StrategyBatch):
    """(forward seconds, forward FLOPs) of the LM head and loss on the last stage, per micro-batch."""
    t = b.tp.astype(float)
    tokens = b.micro_batch_size * job.seq_length / b.cp
    flops = 2.0 * tokens * model.hidden_size * model.vocab_size / t
    # Cross entropy in fp32 over the vocabulary shard: logits written, read for max/sum, gradient written.
    loss_bytes = 3.0 * 4.0 * tokens * model.vocab_size / t
    return gemm_time_s(hw, job, flops) + memory_time_s(hw, loss_bytes), flops


def optimizer_step_s(hw: HardwareProfile, local_params):
    """Adam on the device's (possibly ZeRO-sharded) parameters, memory-bound: a fused kernel's one
    pass unless the profile gives the measured traffic of its optimizer."""
    per_param = hw.device.optimizer_bytes_per_param or ADAM_BYTES_PER_PARAM
    return memory_time_s(hw, per_param * np.asarray(local_params, dtype=float))
