"""FP8 (and NVFP4) training as frameworks run it: only the linear layers' GEMMs run in the low precision.

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
* NVFP4 (Blackwell's FP4 tensor cores: E2M1 values, an E4M3 scale per 16 elements and an FP32 scale
  per tensor; Transformer Engine's NVFP4BlockScaling, Megatron-LM --fp4-format e2m1 --fp4-recipe
  nvfp4 from Megatron-Core 0.15, Megatron-Bridge's bf16_with_nvfp4_mixed: every linear layer's fprop,
  dgrad and wgrad GEMM in FP4, a random Hadamard transform on the wgrad inputs and stochastic rounding of
  the gradients inside the casting kernels). The same guide measures 3.764 ms per layer of NVFP4 GEMMs
  against 6.812 ms per-tensor FP8 on the B300 (NVFP4_GEMM_TIME, 0.553): 1.81x, far short of the 3x
  between its dense FP4 and FP8 peaks (advisor.specs.architectures.fp4_per_fp8_peak), so what bounds
  the FP4 kernels there is not the tensor cores' rate (the guide: "well short of the theoretical 2-3x")
  and the same kernels keep that ratio on Blackwell, whose 2x peak ratio bounds it only below 0.5:
  the GEMM time is max(0.553, 1 / r) of the per-tensor FP8 time on a device with peak ratio r.
  Casts: the per-tensor amax pass (2 bytes read), then 2 read, 0.5 + 0.5 written (row- and
  column-wise copies) and two E4M3 scales per 16 elements; the cached weights 1 + 2/16 bytes, the
  saved inputs 0.5 + 1/16 bytes per element.
* Memory: the cached FP8 weights (both copies, 2 bytes per linear-layer parameter) beside the
  BF16 weights and FP32 master copy, and the linear layers' saved inputs in FP8 (1 byte per
  element: TE saves the quantized input for the weight-gradient GEMM instead of the BF16 one).
"""

from __future__ import annotations

import numpy as np

from advisor.errors import AdvisorError
from advisor.specs.job import TrainingJob

MX_SCALE = 2.0 / 32.0                  # two E8M0 scales per 32 elements (row- and column-wise copies)
BLOCK_SCALE = 2.0 * 4.0 / 128.0        # two FP32 scales per 128 elements
# Bytes moved per element quantized, beyond the producing kernel's own traffic (module docstring).
NV_SCALE = 2.0 / 16.0                  # two E4M3 scales per 16 elements (NVFP4's row- and column-wise copies)
NORM_FUSED_CAST_BYTES = {
    "delayed": 1.0 + 1.0 + 1.0,
    "tensorwise": 2.0 + 1.0 + 1.0,
    "mxfp8": 2.0 + 1.0 + 1.0 + MX_SCALE,
    "blockwise": 2.0 + 1.0 + 1.0 + BLOCK_SCALE,
    "nvfp4": 2.0 + 2.0 + 0.5 + 0.5 + NV_SCALE,      # not fused with the norm: the amax pass, then the cast
}
SEPARATE_CAST_BYTES = {
    "delayed": 2.0 + 1.0 + 1.0,
    "tensorwise": 2.0 + 2.0 + 1.0 + 1.0,
    "mxfp8": 2.0 + 1.0 + 1.0 + MX_SCALE,
    "blockwise": 2.0 + 1.0 + 1.0 + BLOCK_SCALE,
    "nvfp4": 2.0 + 2.0 + 0.5 + 0.5 + NV_SCALE,
}
UNFUSED_EXTRA_BYTES = 2.0
MXFP8_GEMM_TIME = 7.161 / 6.812        # block-scaled over per-tensor GEMM time (module docstring)
NVFP4_GEMM_TIME = 3.764 / 6.812        # NVFP4 over per-tensor FP8 GEMM time on the B300 (module docstring)
WEIGHT_COPY_BYTES = {"delayed": 2.0, "tensorwise": 2.0, "mxfp8": 2.0 + MX_SCALE, "blockwise": 2.0 + BLOCK_SCALE,
                     "nvfp4": 1.0 + NV_SCALE}
SAVED_INPUT_BYTES = {"nvfp4": 0.5 + NV_SCALE / 2.0}      # the rest: 1 byte per element


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


def gemm_time_factor(job: TrainingJob, fp4_per_fp8_peak: float | None = None) -> float:
    """The recipe's GEMM time relative to the per-tensor-scaled rate of the profile's FP8 curve;
    ``fp4_per_fp8_peak``: the device's dense FP4 over FP8 peak (advisor.specs.architectures), which NVFP4 needs."""
    if job.recipe == "nvfp4":
        if not fp4_per_fp8_peak:       # refused at the input (advisor.commands.inputs); a hand-written plan lands here
            raise AdvisorError("training.fp8_recipe = nvfp4: the profile's device has no FP4 tensor cores "
                               "(device.architecture blackwell or blackwell-ultra; advisor/specs/architectures.py)")
        return max(NVFP4_GEMM_TIME, 1.0 / fp4_per_fp8_peak)
    return MXFP8_GEMM_TIME if job.recipe == "mxfp8" else 1.0


def saved_input_bytes(job: TrainingJob) -> float:
    """Bytes per element of a linear layer's quantized input kept for its weight-gradient GEMM."""
    return SAVED_INPUT_BYTES.get(job.recipe, 1.0)


def weight_copy_bytes_per_param(job: TrainingJob) -> float:
    """Device memory of the cached FP8 weights per linear-layer parameter (0 without FP8)."""
    return WEIGHT_COPY_BYTES[job.recipe] if job.recipe is not None else 0.0
