"""The attention core (scores, softmax, context) of one layer and micro-batch on one device.

* Fused ("flash") attention: FlashAttention (Dao et al. 2022; FlashAttention-2, Dao 2023, arXiv
  2307.08691), cuDNN fused attention in Transformer Engine, torch SDPA and MindSpore's
  FlashAttentionScore tile the s x s product and skip the tiles a causal mask removes, so a causal
  query attends to s/2 keys on average (ModelSpec.attended_keys; a sliding window caps it). The
  forward runs two matmuls (QK^T and PV); the backward recomputes the scores and runs five
  (QK^T, dP = dO V^T, dV, dQ, dK): 2.5 times the forward FLOPs (FlashAttention-2, section 3.1).
  Its throughput is not the GEMM curve's: the profile's ``attention_efficiency`` gives the
  achievable fraction of the BF16 peak by sequence length (FlashAttention-2 Fig. 4-6 and
  FlashAttention-3, Shah et al. 2024, arXiv 2407.08608, Fig. 5-7, measure it) for the job's kernel
  (Transformer Engine/cuDNN, PyTorch SDPA, Triton, Ascend's FlashAttentionScore), fitted per device
  (benchmarks/fit_profiles.py). A profile without one prices attention on the GEMM curve and is
  flagged as extrapolating.
* Unfused ("math") attention (Megatron-LM 2021-22, Korthikanti et al. 2022): two batched GEMMs over
  the whole s x s product (the causal mask is applied to computed scores), backward twice the
  forward; softmax, mask and dropout are memory-bound passes over the scores.
* Head width: the curves hold for the usual head width d = 128. A fused kernel's softmax work is
  per score and its matmul work per score grows with d, and each kernel's tiles suit some widths
  better than others, so the achievable fraction moves with d, differently per kernel
  (HEAD_WIDTH_EFFICIENCY, relative to d = 128; the median over sequence lengths 512-16k, causal and
  not, of the FlashAttention repository's figures, Dao-AILab/flash-attention assets/):
  cuDNN (Transformer Engine's fused attention; H100 forward, flash3_fp16_fwd.png, the FlashAttention-3
  paper's Fig. 5-6): 0.69 at d = 64, 0.95 at d = 256; FlashAttention-2 (PyTorch SDPA's flash
  backend; A100 and H100 forward + backward, flash2_{a100,h100}_fwd_bwd_benchmark.png): 0.875 at
  d = 64, and 0.89 at d = 256 (forward, flash3_fp16_fwd.png); flash-attn 1.x's Triton kernel: no
  loss at d = 64 in either figure (1.0-1.2 of d = 128), so 1.0. Ascend's FlashAttentionScore has
  no published figure by head width: 1.0. Between the listed widths the factor is interpolated in
  log2(d) and held beyond them; MLA's 192-wide query/key heads and 128-wide values count as their
  mean.
* Context parallelism splits the queries of a sequence over cp ranks; with Megatron's load-balanced
  causal split (2 x cp chunks) every rank does the same share, s/2 keys per query. The ring (p2p,
  Transformer Engine's and torch's context parallelism) runs the work as cp kernel calls per pass,
  each over the local s/cp queries and one s/cp block of keys (or half of either), so the kernel
  runs at the efficiency of an s/cp-long attention (the curve read at s/cp; the blocks off the
  diagonal are unmasked, which a causal curve read at their length prices conservatively).
  Ulysses (a2a) trades heads for the whole sequence: full-length kernels over heads/cp.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from advisor.space.strategy import CP_COMM, StrategyBatch
from advisor.specs.hardware import HardwareProfile, interpolate_efficiency
from advisor.specs.job import TrainingJob
from advisor.specs.model import ModelSpec

FLASH_BACKWARD_FLOPS = 2.5     # FlashAttention-2 section 3.1: 5 matmuls backward vs 2 forward
# Achievable efficiency at a head width relative to d = 128, per fused kernel (module docstring)
HEAD_WIDTH_EFFICIENCY = {
    "te": ((64, 0.69), (128, 1.0), (256, 0.95)),
    "sdpa": ((64, 0.875), (128, 1.0), (256, 0.89)),
}


@dataclass(frozen=True)
class AttentionCore:
    """Forward and backward seconds and FLOPs of one layer's attention core (arrays)."""

    forward_s: np.ndarray
    backward_s: np.ndarray
    forward_flops: np.ndarray


def core_flops(model: ModelSpec, job: TrainingJob, b: StrategyBatch, causal_skip: bool) -> np.ndarray:
    """Forward FLOPs of the score and context matmuls on one device (TP splits the heads)."""
    tokens = b.micro_batch_size * job.seq_length / b.cp
    keys = model.attended_keys(job.seq_length) if causal_skip else model.attended_keys(job.seq_length, causal=False)
    return 2.0 * tokens * keys * (model.q_size + model.attention_out_size) / b.tp.astype(float)


def ring_steps(b: StrategyBatch) -> np.ndarray:
    """Kernel calls per head a fused attention makes: cp for a p2p ring, one otherwise."""
    ring = (b.cp > 1) & (b.cp_comm != CP_COMM.index("a2a"))
    return np.where(ring, np.maximum(b.cp, 1), 1).astype(float)


def kernel_length(job: TrainingJob, b: StrategyBatch) -> np.ndarray:
    """The sequence length each fused-attention call covers: s/cp per ring step, s otherwise."""
    return job.seq_length / ring_steps(b)


def head_width(model: ModelSpec) -> float:
    """The width a fused kernel's work per score follows: the mean of the query/key and value heads."""
    return (model.head_dim + model.v_head_dim) / 2.0


def head_width_factor(model: ModelSpec, kernel: str) -> float:
    """The kernel's achievable efficiency at the model's head width relative to d = 128 (1.0 for a
    kernel without figures)."""
    table = HEAD_WIDTH_EFFICIENCY.get(kernel)
    if table is None:
        return 1.0
    widths, factors = zip(*table)
    return float(np.interp(np.log2(head_width(model)), np.log2(widths), factors))


def attention_core(model: ModelSpec, hw: HardwareProfile, job: TrainingJob, b: StrategyBatch, gemm_time_s) -> AttentionCore:
    """`gemm_time_s(flops, dtype)` prices unfused matmuls (and fused ones where the profile has no
    attention curve)."""
    if job.attention == "flash":
        fwd = core_flops(model, job, b, causal_skip=True)
        curve = hw.device.attention_curve(job.kernel)
        if not curve:
            # no attention curve: per-head-and-sequence work (per ring step) on the GEMM curve
            # (flagged by confidence)
            calls = b.micro_batch_size * model.num_attention_heads / b.tp.astype(float) * ring_steps(b)
            per_call = fwd / calls
            return AttentionCore(calls * gemm_time_s(per_call, job.compute_dtype),
                                 FLASH_BACKWARD_FLOPS * calls * gemm_time_s(per_call, job.compute_dtype), fwd)
        eff = interpolate_efficiency(curve, kernel_length(job, b))
        peak = hw.device.peak_flops(job.compute_dtype) * eff * head_width_factor(model, job.kernel)
        return AttentionCore(fwd / peak, FLASH_BACKWARD_FLOPS * fwd / peak, fwd)
    fwd = core_flops(model, job, b, causal_skip=False)
    # two batched GEMMs (scores, context), each half of the FLOPs, sized as Megatron's baddbmm calls
    half = fwd / 2.0
    t = 2.0 * gemm_time_s(half, job.compute_dtype)
    return AttentionCore(t, 2.0 * t, fwd)
