"""FP8 training as frameworks run it: only the linear layers' GEMMs run in FP8.

Transformer Engine (te.Linear / LayerNormLinear / LayerNormMLP under fp8_autocast) and torchao's
float8 training quantize the inputs of each linear layer's forward GEMM (activations and weights,
E4M3) and of its backward GEMMs (the output gradient, E5M2 in the hybrid format); attention,
norms, softmax, the loss, the LM head and the optimizer stay in BF16/FP32 (Micikevicius et al.
2022, "FP8 Formats for Deep Learning", arXiv 2209.05433, section 4; Transformer Engine user guide,
"Using FP8 with Transformer Engine"). What that costs beyond the GEMMs:

* Casting (memory-bound). Each quantized tensor gets an FP8 copy (1 byte) and a second one laid
  out for the other GEMM operand (Hopper's FP8 tensor cores take only the TN layout, so TE writes a
  transposed copy; MXFP8 on Blackwell writes row-wise and column-wise copies with 1x32 block scales,
  blockwise 1x128 / 128x128 FP32 scales). Which passes a cast needs depends on the recipe and on
  the kernel that produced the tensor, as Transformer Engine chooses them
  (transformer_engine/pytorch/csrc/extensions/normalization.cpp, the Impl of layernorm_fwd /
  rmsnorm_fwd; Megatron-Core only: other frameworks do not fuse a norm with a Transformer Engine
  linear): bytes beyond the producer's own BF16 traffic, per element:

  ==================  =======================================  ==================================
  recipe              input of a LayerNorm-fused linear         any other tensor (a separate cast:
                      (Megatron's qkv and dense fc1:            attention output, activation output,
                      TELayerNormColumnParallelLinear)         expert inputs, output gradients)
  ==================  =======================================  ==================================
  delayed             1 + 1 + 1: FULLY_FUSED, the norm writes   2 read + 1 + 1 (cast_transpose)
                      FP8, then nvte_transpose reads it and
                      writes the column-wise copy (ln_api.cpp)
  tensorwise          2 read + 1 + 1: FUSED_NORM_AMAX_FP8 (the  2 (amax) + 2 + 1 + 1: the amax
  (current scaling)   norm computes the amax as it writes)      must be known before the cast
  mxfp8               2 read + 1 + 1 + 2/32: UNFUSED by default 2 + 1 + 1 + 2/32 (block amax in
                      (the fused kernel needs cuDNN and an      the casting kernel)
                      opt-in environment variable)
  blockwise           2 read + 1 + 1 + 2 x 4/128: UNFUSED       2 + 1 + 1 + 2 x 4/128
  ==================  =======================================  ==================================

  Per micro-batch the activation inputs (forward) and output gradients (backward) are cast; the
  weights once per step (TE keeps them cached across a step's micro-batches: is_first_microbatch),
  as a separate cast. Unfused frameworks (torchao in eager mode) cast every tensor separately and
  read it once more in a kernel of their own (2 bytes).
* GEMM rate. MXFP8's block-scaled GEMMs run slower than per-tensor-scaled FP8 GEMMs of the same
  shapes: 7.161 against 6.812 ms per layer on a B300 with the inputs quantized beforehand (kernel
  time only; Transformer Engine's GEMM profiling guide, docs/examples/gemm_profiling, "Autocast vs
  Pre-quantized", 5B model, hidden 4096, 15,872 tokens): MXFP8_GEMM_TIME. The profiles' FP8 curve is
  the per-tensor one. Hopper's blockwise recipe has no kernel-only figure there (its inputs cannot
  be pre-quantized for Hopper's cuBLAS) and keeps the per-tensor rate.
* Memory: the cached FP8 weights (both copies, 2 bytes per linear-layer parameter) beside the
  BF16 weights and FP32 master copy, and the linear layers' saved inputs in FP8 (1 byte per
  element: TE saves the quantized input for the weight-gradient GEMM instead of the BF16 one).
"""

from __future__ import annotations

import numpy as np

from advisor.specs.job import TrainingJob

MX_SCALE = 2.0 / 32.0                  # two E8M0 scales per 32 elements (row- and column-wise copies)
BLOCK_SCALE = 2.0 * 4.0 / 128.0        # two FP32 scales per 128 elements
# Bytes moved per element quantized, beyond the producing kernel's own traffic (module docstring).
NORM_FUSED_CAST_BYTES = {
    "delayed": 1.0 + 1.0 + 1.0,
    "tensorwise": 2.0 + 1.0 + 1.0,
    "mxfp8": 2.0 + 1.0 + 1.0 + MX_SCALE,
    "blockwise": 2.0 + 1.0 + 1.0 + BLOCK_SCALE,
}
SEPARATE_CAST_BYTES = {
    "delayed": 2.0 + 1.0 + 1.0,
    "tensorwise": 2.0 + 2.0 + 1.0 + 1.0,
    "mxfp8": 2.0 + 1.0 + 1.0 + MX_SCALE,
    "blockwise": 2.0 + 1.0 + 1.0 + BLOCK_SCALE,
}
UNFUSED_EXTRA_BYTES = 2.0
MXFP8_GEMM_TIME = 7.161 / 6.812        # block-scaled over per-tensor GEMM time (module docstring)
WEIGHT_COPY_BYTES = {"delayed": 2.0, "tensorwise": 2.0, "mxfp8": 2.0 + MX_SCALE, "blockwise": 2.0 + BLOCK_SCALE}
SAVED_INPUT_BYTES = 1.0


def cast_bytes(job: TrainingJob, elements, fused: bool = True, norm_fused_elements=0.0) -> np.ndarray:
    """Memory traffic of quantizing ``elements`` (0 unless the job runs FP8), of which
    ``norm_fused_elements`` are inputs of LayerNorm-fused linears (cast by the norm's kernel when the
    framework fuses its kernels). Unfused frameworks cast each tensor on its own, reading it once more."""
    elements = np.asarray(elements, dtype=float)
    if job.recipe is None:
        return np.zeros_like(elements)
    separate = SEPARATE_CAST_BYTES[job.recipe]
    if not fused:
        return (separate + UNFUSED_EXTRA_BYTES) * elements
    norm = np.asarray(norm_fused_elements, dtype=float)
    return separate * (elements - norm) + NORM_FUSED_CAST_BYTES[job.recipe] * norm


def gemm_time_factor(job: TrainingJob) -> float:
    """FP8 GEMM time relative to the per-tensor-scaled rate of the profile's FP8 curve."""
    return MXFP8_GEMM_TIME if job.recipe == "mxfp8" else 1.0


def weight_copy_bytes_per_param(job: TrainingJob) -> float:
    """Device memory of the cached FP8 weights per linear-layer parameter (0 without FP8)."""
    return WEIGHT_COPY_BYTES[job.recipe] if job.recipe is not None else 0.0
