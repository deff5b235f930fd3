"""What a device generation can run: the kernels and number formats the cost model would otherwise price on a
device that has none of them. A hardware profile names its device's ``architecture``; a profile without one is
not checked (a user's own profile: say it to have the checks).

Each fact with its source:

* FlashAttention: FlashAttention-2 runs on Ampere, Ada and Hopper (Dao, flash-attention README, "Installation
  and features": "Ampere, Ada, or Hopper GPUs"; FlashAttention 1 added Turing, never Volta), and PyTorch's
  scaled_dot_product_attention picks its flash kernel from sm80 (torch/backends/cuda: "flash attention
  requires sm80 or newer"); Blackwell runs Transformer Engine's cuDNN fused attention; Ascend runs
  FlashAttentionScore (MindSpore ops, Atlas A2 training series).
* Which fused attention kernels (advisor.specs.frameworks.ATTENTION_KERNELS) run where: Transformer Engine's
  fused attention (cuDNN, and flash-attn behind TE), PyTorch SDPA's flash backend and flash-attn 1.x's Triton kernel
  are CUDA kernels for NVIDIA Ampere and later (the FlashAttention sources above; Triton's FlashAttention tutorial
  and flash_attn_triton.py were written and tested for sm80); Ascend's FlashAttentionScore ("npu") is an Ascend
  operator (CANN's aclnnFlashAttentionScore, called by MindSpore and by torch_npu's npu_fusion_attention) and
  runs on no NVIDIA device.
* Block-scaled FP8 (MXFP8, 1x32 blocks with E8M0 scales): Blackwell's fifth-generation tensor cores
  (NVIDIA Blackwell architecture technical brief; Transformer Engine's MXFP8BlockScaling recipe needs compute
  capability 10.0). Hopper runs per-tensor and blockwise FP8 (Transformer Engine Float8BlockScaling), not MXFP8.
* FP8 at all: the device's ``peak_tflops`` has an fp8 entry (Hopper, Ada, Blackwell); that check lives with the
  dtype (advisor.commands.inputs.check_dtype).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Architecture:
    """One device generation's abilities that pricing depends on."""

    name: str
    block_scaled_fp8: bool
    """MXFP8 (block-scaled FP8 with E8M0 scales) runs on its tensor cores."""
    attention_kernels: tuple[str, ...] = ()
    """The fused attention kernels (advisor.specs.frameworks.ATTENTION_KERNELS) that run on it; () where none
    does."""
    fp4_per_fp8_peak: float | None = None
    """Dense NVFP4 over dense FP8 tensor-core peak (None: no FP4 tensor cores): 2 on Blackwell (B200 and GB200:
    9 and 4.5 PFLOPS per GPU), 3 on Blackwell Ultra (GB300 15 and 5, B300 14 and 4.5): NVIDIA's technical blog
    "Inside NVIDIA Blackwell Ultra" (2025: 15 PFLOPS dense NVFP4) and the per-GPU table of verda.com's "GB300 NVL72
    architecture" (dense figures of NVIDIA's datasheets)."""
    title: str = ""
    """The generation as messages name it ("NVIDIA Volta")."""

    @property
    def flash_attention(self) -> bool:
        """A fused (FlashAttention-style) attention kernel runs on it."""
        return bool(self.attention_kernels)


# the CUDA fused attention kernels of Ampere and later
CUDA_ATTENTION = ("te", "sdpa", "triton")

ARCHITECTURES = {a.name: a for a in (
    Architecture("volta", block_scaled_fp8=False, title="NVIDIA Volta"),
    Architecture("turing", block_scaled_fp8=False, title="NVIDIA Turing"),
    Architecture("ampere", block_scaled_fp8=False, attention_kernels=CUDA_ATTENTION, title="NVIDIA Ampere"),
    Architecture("ada", block_scaled_fp8=False, attention_kernels=CUDA_ATTENTION, title="NVIDIA Ada"),
    Architecture("hopper", block_scaled_fp8=False, attention_kernels=CUDA_ATTENTION, title="NVIDIA Hopper"),
    Architecture("blackwell", block_scaled_fp8=True, attention_kernels=CUDA_ATTENTION, fp4_per_fp8_peak=2.0,
                 title="NVIDIA Blackwell"),
    Architecture("blackwell-ultra", block_scaled_fp8=True, attention_kernels=CUDA_ATTENTION, fp4_per_fp8_peak=3.0,
                 title="NVIDIA Blackwell Ultra"),
    Architecture("davinci", block_scaled_fp8=False, attention_kernels=("npu",), title="Huawei Ascend (Da Vinci)"),
    Architecture("cpu", block_scaled_fp8=False, title="a CPU"),
)}


def architecture_of(name: str | None) -> Architecture | None:
    """The record a profile's ``device.architecture`` names (None where it names none; names are checked at load)."""
    return ARCHITECTURES.get(name or "")
