"""Compute time per layer and micro-batch on one device: linear GEMMs, the attention core,
memory-bound kernels and FP8 casts, forward and backward.

* GEMM FLOPs: 2mnk per matmul (Narayanan et al. SC'21, appendix). Each linear layer's backward
  runs two GEMMs of its forward's size (input gradient, weight gradient). The calls are the
  framework's: Megatron-Core fuses Q, K and V into one GEMM (linear_qkv) and the SwiGLU gate and up
  projections into one (linear_fc1); PyTorch models (torchtitan) keep them apart. Routed experts
  are priced per local expert (the tokens one expert sees), shared experts as a dense MLP.
* GEMM throughput: the peak of the GEMM's dtype times the profile's achievable efficiency at the
  call's work (its curve for that dtype), so tensor parallelism's smaller GEMMs run less
  efficiently (SC'21 Fig. 7; vendor GEMM benchmarks). With FP8 only the linear layers' GEMMs use
  the FP8 peak and curve, and each pays for casting its inputs (advisor.cost.fp8).
* Attention core: advisor.cost.attention (its own efficiency; causal masking halves the work).
* Memory-bound kernels (norms, activation functions, rotary, residual adds, dropout, MoE
  permutation): their traffic, fused or eager (advisor.cost.kernels), at the profile's achievable
  memory bandwidth; backward moves twice that. Unfused attention's softmax, mask and dropout pass
  over the score tensors (twice their saved bytes).
* Optimizer step (Adam): memory-bound; per local parameter it reads the gradient, reads and writes
  fp32 master weights, momentum and variance, and writes the 16-bit weights (ZeRO section 3.1 states).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from advisor.cost import fp8, kernels, optimizer_step
from advisor.cost.attention import attention_core
from advisor.cost.activations import layer_activation_terms
from advisor.space.strategy import StrategyBatch
from advisor.specs.architectures import architecture_of
from advisor.specs.hardware import HardwareProfile, interpolate_efficiency
from advisor.specs.job import TrainingJob
from advisor.specs.model import ModelSpec


# Operators one transformer layer's forward + backward dispatches in eager PyTorch, by feature,
# counted with TorchDispatchMode on advisor's executor blocks (PyTorch 2.13, CPU; the counts add up
# within 3 of every combination measured; re-counted by tests/test_executor.py). The cost model's kernels per layer (KERNELS_FORWARD +
# KERNELS_BACKWARD in advisor.cost.host_launch) describe the Megatron GPT-3 layer -- LayerNorm, GELU,
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


def gemm_time_s(hw: HardwareProfile, dtype: str, flops):
    """Seconds for GEMM calls of the given FLOPs each (array), at the dtype's size-dependent efficiency."""
    flops = np.asarray(flops, dtype=float)
    eff = interpolate_efficiency(hw.device.gemm_curve(dtype), flops / 1e9)
    return np.where(flops > 0, flops / (hw.device.peak_flops(dtype) * eff), 0.0)


def linear_gemm_time_s(hw: HardwareProfile, job: TrainingJob, dtype: str, flops):
    """A linear layer's GEMM calls: gemm_time_s, at the FP8 recipe's rate when they run in FP8
    (advisor.cost.fp8.gemm_time_factor: MXFP8's block-scaled GEMMs are slower)."""
    return gemm_time_s(hw, dtype, flops) * (fp8.gemm_time_factor(job, fp4_per_fp8_peak(hw)) if dtype == "fp8" else 1.0)


def fp4_per_fp8_peak(hw: HardwareProfile) -> float | None:
    """The device's dense FP4 over FP8 peak (advisor.specs.architectures; None without FP4 tensor cores)."""
    arch = architecture_of(hw.device.architecture)
    return arch.fp4_per_fp8_peak if arch is not None else None


def memory_time_s(hw: HardwareProfile, nbytes):
    return np.asarray(nbytes, dtype=float) / (hw.device.memory_bandwidth_gbps * 1e9 * hw.device.memory_efficiency)


@dataclass(frozen=True)
class LayerCompute:
    """One layer, one micro-batch, one device: seconds and FLOPs (arrays)."""

    forward_s: np.ndarray           # everything of the forward
    backward_s: np.ndarray          # everything of the backward
    linear_forward_s: np.ndarray    # the forward's linear GEMMs (what overlapped TP collectives hide behind)
    core_forward_s: np.ndarray      # the attention core, forward and backward (what ring CP hides behind)
    core_backward_s: np.ndarray
    attention_core_s: np.ndarray    # forward attention core (what Megatron's selective recompute replays)
    alternate_linear_s: np.ndarray  # forward of every other linear call (torchtitan's op-level SAC replays them)
    expert_forward_s: np.ndarray    # an MoE layer's router, expert and shared-expert GEMMs, forward
    elementwise_s: np.ndarray       # forward memory-bound kernels
    activation_s: np.ndarray        # of those, the MLP activation function's (reads its inputs, writes the FC2 input)
    forward_flops: np.ndarray       # GEMM and attention FLOPs of the forward
    attention_core_flops: np.ndarray  # of those, what selective recomputation replays
    alternate_linear_flops: np.ndarray
    up_projection_s: np.ndarray     # MLA's Q and KV up-projections, forward (Megatron's mla_up_proj recompute)
    up_projection_flops: np.ndarray
    mlp_forward_s: np.ndarray       # a dense layer's MLP GEMMs and activation, forward (Megatron's mlp recompute)
    mlp_forward_flops: np.ndarray


class LinearCall(NamedTuple):
    """One linear GEMM call of a layer's forward."""

    fan_in: int
    fan_out: int
    split: bool                 # divided by tensor parallelism
    count: float | None         # how many such calls run (None: one per local expert)
    share: float                # fraction of the micro-batch's tokens it sees (routed experts: top-k over experts)
    kind: str                   # attention | up_projection (MLA) | router | mlp
    norm_fused: bool = False    # its input comes from a norm fused with it (TE LayerNormLinear; advisor.cost.fp8)


def _linear_calls(model: ModelSpec, job: TrainingJob, moe_layer: bool) -> list[LinearCall]:
    """The layer's linear calls in execution order, as the framework issues them."""
    fused = job.framework_record.fused_kernels
    te = job.framework_record.norm_fused_linears     # Transformer Engine's LayerNorm-fused linears (advisor.cost.fp8)
    h = model.hidden_size
    attn = model.attention_linears()
    latent = {model.mla.q_lora_rank, model.mla.kv_lora_rank} if model.mla is not None else set()
    calls = []
    if fused and model.mla is None:
        q, k, v, out = attn
        # Megatron-Core: TELayerNormColumnParallelLinear (the input norm fused with linear_qkv)
        calls.append(LinearCall(h, q.fan_out + k.fan_out + v.fan_out, True, 1.0, 1.0, "attention", te))
        calls.append(LinearCall(out.fan_in, out.fan_out, True, 1.0, 1.0, "attention"))
    else:
        # MLA's up-projections read the latents (fan-in = a LoRA rank) and are tensor-parallel
        calls += [LinearCall(x.fan_in, x.fan_out, x.tp is not None, 1.0, 1.0,
                             "up_projection" if (x.fan_in in latent and x.tp == "column") else "attention") for x in attn]
    up = model.ffn_matrices - 1

    def mlp(ff, share, count, norm_fused=False):
        if fused or up == 1:
            return [LinearCall(h, up * ff, True, count, share, "mlp", norm_fused),
                    LinearCall(ff, h, True, count, share, "mlp")]
        return [LinearCall(h, ff, True, count, share, "mlp")] * up + [LinearCall(ff, h, True, count, share, "mlp")]

    if moe_layer and model.moe is not None:
        moe = model.moe
        calls.append(LinearCall(h, moe.num_experts, False, 1.0, 1.0, "router"))
        calls += mlp(moe.expert_ffn_hidden_size, moe.top_k / moe.num_experts, None)  # per local expert
        if moe.shared_ffn:
            calls += mlp(moe.shared_ffn, 1.0, 1.0)
    else:
        # a dense layer's linear_fc1 is TELayerNormColumnParallelLinear too; an MoE layer's
        # pre-MLP norm is a separate TENorm before the router and experts
        calls += mlp(model.ffn_hidden_size, 1.0, 1.0, norm_fused=te)
    return calls


def layer_compute(model: ModelSpec, hw: HardwareProfile, job: TrainingJob, b: StrategyBatch, moe_layer: bool) -> LayerCompute:
    t = b.tp.astype(float)
    tokens = b.micro_batch_size * job.seq_length / b.cp          # tokens of the micro-batch on this rank
    zero = np.zeros(len(b))
    linear_s, linear_flops = zero, zero
    alternate_s, alternate_flops = zero, zero
    by_kind = {kind: (zero, zero) for kind in ("attention", "up_projection", "router", "mlp")}
    cast_elements = zero                   # forward inputs + backward output gradients, per micro-batch
    norm_fused_elements = zero             # of those, inputs of norm-fused linears
    # the routed experts' tensor parallelism: tp, or 1 folded (each rank then keeps its sequence-parallel tokens)
    etp = b.expert_tp.astype(float)
    for position, call in enumerate(_linear_calls(model, job, moe_layer)):
        expert = call.count is None
        div = (etp if expert else t) if call.split else 1.0
        # a local expert sees ep x its share of the tokens, a tp / etp-th of them when folded
        rows = tokens * call.share * (b.ep * etp / t if expert else 1.0)
        n_calls = model.moe.num_experts / b.ep if expert else call.count
        flops = 2.0 * rows * call.fan_in * call.fan_out / div
        # the router is a plain higher-precision linear in Megatron-Core (TopKRouter), not an FP8 GEMM
        dtype = job.compute_dtype if call.kind == "router" else job.gemm_dtype
        seconds = n_calls * linear_gemm_time_s(hw, job, dtype, flops)
        linear_s, linear_flops = linear_s + seconds, linear_flops + n_calls * flops
        kind_s, kind_flops = by_kind[call.kind]
        by_kind[call.kind] = (kind_s + seconds, kind_flops + n_calls * flops)
        if position % 2 == 1:
            alternate_s, alternate_flops = alternate_s + seconds, alternate_flops + n_calls * flops
        if call.kind != "router":
            cast_elements = cast_elements + n_calls * rows * (call.fan_in + call.fan_out) / div
            if call.norm_fused:
                norm_fused_elements = norm_fused_elements + n_calls * rows * call.fan_in / div
    cast_s = memory_time_s(hw, fp8.cast_bytes(job, cast_elements, kernels.fused(job), norm_fused_elements))
    core = attention_core(model, hw, job, b, lambda f, dtype: gemm_time_s(hw, dtype, f))
    terms = layer_activation_terms(model, job, b, moe_layer, stored=False)
    elementwise_s = memory_time_s(hw, kernels.layer_forward_bytes(model, job, b, moe_layer))
    core_elementwise_s = memory_time_s(hw, 2.0 * terms.attention_core)
    activation_s = memory_time_s(hw, kernels.activation_bytes(model, job, b, moe_layer))
    # casts: activation inputs in the forward, output gradients in the backward, one pass each over
    # tensors of about the same total size, so half of the cast traffic on each side
    forward = linear_s + core.forward_s + elementwise_s + core_elementwise_s + 0.5 * cast_s
    backward = 2.0 * linear_s + core.backward_s + 2.0 * (elementwise_s + core_elementwise_s) + 0.5 * cast_s
    mlp_s, mlp_flops = by_kind["mlp"]
    up_s, up_flops = by_kind["up_projection"]
    router_s, _ = by_kind["router"]
    # Selective recomputation replays the attention core: unfused attention's score tensors, and with
    # fused attention its kernel's forward (Megatron-Core checkpoints the core_attn call either way;
    # the fused kernel stores no scores, so nothing is saved by it).
    return LayerCompute(
        forward_s=forward, backward_s=backward, linear_forward_s=linear_s,
        core_forward_s=core.forward_s, core_backward_s=core.backward_s,
        attention_core_s=core.forward_s + core_elementwise_s,
        alternate_linear_s=alternate_s, elementwise_s=elementwise_s + core_elementwise_s, activation_s=activation_s,
        expert_forward_s=(router_s + mlp_s) if (moe_layer and model.moe is not None) else zero,
        forward_flops=linear_flops + core.forward_flops,
        attention_core_flops=core.forward_flops,
        alternate_linear_flops=alternate_flops, up_projection_s=up_s, up_projection_flops=up_flops,
        mlp_forward_s=mlp_s + activation_s, mlp_forward_flops=mlp_flops,
    )


def weight_cast_s(hw: HardwareProfile, job: TrainingJob, linear_params):
    """Casting the local linear-layer weights to FP8 once per step (0 without FP8)."""
    return memory_time_s(hw, fp8.cast_bytes(job, linear_params))


def head_compute_s(model: ModelSpec, hw: HardwareProfile, job: TrainingJob, b: StrategyBatch):
    """(forward seconds, forward FLOPs) of the LM head and loss on the last stage, per micro-batch.
    The output layer stays in the compute dtype under FP8 (Megatron-Core's output_layer is not a
    Transformer Engine module)."""
    t = b.tp.astype(float)
    tokens = b.micro_batch_size * job.seq_length / b.cp
    flops = 2.0 * tokens * model.hidden_size * model.vocab_size / t
    # Cross entropy in fp32 over the vocabulary shard (advisor.cost.kernels: fused or eager)
    loss_bytes = kernels.loss_traffic_per_logit(job) * tokens * model.vocab_size / t
    return gemm_time_s(hw, job.compute_dtype, flops) + memory_time_s(hw, loss_bytes), flops


def optimizer_step_s(hw: HardwareProfile, local_params, job: TrainingJob | None = None):
    """The optimizer step on the device's (possibly ZeRO-sharded) parameters, memory-bound: the traffic
    of the job's implementation (advisor.cost.optimizer_step; no job: a fused Adam's one pass, or the
    profile's measured traffic of its optimizer)."""
    per_param = optimizer_step.bytes_per_param(hw, job)
    return memory_time_s(hw, per_param * np.asarray(local_params, dtype=float))
