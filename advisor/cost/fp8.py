"""FP8 training as frameworks run it: only the linear layers' GEMMs run in FP8.

Transformer Engine (te.Linear / LayerNormLinear / LayerNormMLP under fp8_autocast) and torchao's
float8 training quantize the inputs of each linear layer's forward GEMM (activations and weights,
E4M3) and of its backward GEMMs (the output gradient, E5M2 in the hybrid format); attention,
norms, softmax, the loss, the LM head and the optimizer stay in BF16/FP32 (Micikevicius et al.
2022, "FP8 Formats for Deep Learning", arXiv 2209.05433, section 4; Transformer Engine user guide,
"Using FP8 with Transformer Engine"). What that costs beyond the GEMMs:

* Casting (memory-bound): each quantized tensor gets an FP8 copy (1 byte) and a second one laid
  out for the other GEMM operand (Hopper's FP8 tensor cores take only the TN layout, so TE writes a
  transposed copy; MXFP8 on Blackwell writes row-wise and column-wise copies with their own block
  scales). TE fuses the cast into the kernel that produces the tensor (LayerNormLinear's norm,
  the fused activation, cast_transpose in the backward with the bias gradient), so the BF16 read is
  shared with that kernel and only the FP8 writes remain, except where the scale must be known
  before the cast:
  - delayed scaling: the scale comes from an amax history: 1 + 1 bytes;
  - tensorwise (per-tensor current scaling): the amax of the tensor itself is needed first, so the
    BF16 tensor is written and read once more: 2 + 2 + 1 + 1 bytes;
  - mxfp8: the 1x32 block scale is computed where the block is cast: 1 + 1 + 2/32 bytes;
  - blockwise (1x128 and 128x128 blocks, FP32 scales): 1 + 1 + 2 x 4/128 bytes.
  Per micro-batch the activation inputs (forward) and output gradients (backward) are cast; the
  weights once per step (TE keeps them cached across a step's micro-batches: is_first_microbatch).
* Memory: the cached FP8 weights (both copies, 2 bytes per linear-layer parameter) beside the
  BF16 weights and FP32 master copy, and the linear layers' saved inputs in FP8 (1 byte per
  element: TE saves the quantized input for the weight-gradient GEMM instead of the BF16 one).
"""

from __future__ import annotations

import numpy as np

from advisor.specs.job import TrainingJob

# Bytes moved per element quantized (see the module docstring for each recipe's passes).
CAST_BYTES = {
    "delayed": 1.0 + 1.0,
    "tensorwise": 2.0 + 2.0 + 1.0 + 1.0,
    "mxfp8": 1.0 + 1.0 + 2.0 / 32.0,
    "blockwise": 1.0 + 1.0 + 2.0 * 4.0 / 128.0,
}
WEIGHT_COPY_BYTES = {"delayed": 2.0, "tensorwise": 2.0, "mxfp8": 2.0 + 2.0 / 32.0, "blockwise": 2.0 + 2.0 * 4.0 / 128.0}
SAVED_INPUT_BYTES = 1.0


def cast_bytes(job: TrainingJob, elements, fused: bool = True) -> np.ndarray:
    """Memory traffic of quantizing `elements` (0 unless the job runs FP8). Unfused casts (torchao
    in eager mode) read the BF16 tensor in a kernel of their own: 2 bytes more per element."""
    if job.recipe is None:
        return np.zeros_like(np.asarray(elements, dtype=float))
    return (CAST_BYTES[job.recipe] + (0.0 if fused else 2.0)) * np.asarray(elements, dtype=float)


def weight_copy_bytes_per_param(job: TrainingJob) -> float:
    """Device memory of the cached FP8 weights per linear-layer parameter (0 without FP8)."""
    return WEIGHT_COPY_BYTES[job.recipe] if job.recipe is not None else 0.0
