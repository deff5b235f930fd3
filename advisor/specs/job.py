"""The training job and the cluster size, given on the command line or in a plan."""

from __future__ import annotations

from dataclasses import dataclass

from advisor.errors import AdvisorError
from advisor.specs.hardware import HardwareProfile

DTYPE_BYTES = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1}
OPTIMIZERS = ("adamw", "adam", "sgd")
ATTENTION = ("flash", "math")
FRAMEWORKS = ("megatron", "pytorch")


@dataclass(frozen=True)
class TrainingJob:
    global_batch_size: int          # sequences per optimizer step
    seq_length: int                 # tokens per sequence
    dtype: str = "bf16"             # compute dtype; fp32 master weights with fp16/bf16 (mixed precision)
    optimizer: str = "adamw"
    train_tokens: float | None = None  # token budget for time/cost to train
    # Attention kernel: "flash" (FlashAttention / fused SDPA, default in Megatron-Core with Transformer
    # Engine, torchtitan and MindSpore's FlashAttentionScore) keeps no s x s score tensors; "math" is the
    # unfused softmax(QK^T)V of Megatron-LM 2021-22 that Korthikanti et al. 2022 measured.
    attention: str = "flash"
    # Dropout on attention probabilities and hidden states (Megatron GPT's default 0.1/0.1, used in
    # the Korthikanti and SC'21 runs); Llama-style pre-training runs without it, saving its masks.
    dropout: bool = False
    # Whose tensor/sequence-parallel layers: "megatron" (Megatron-LM/Core re-gathers the sequence-
    # parallel inputs of the column-parallel matmuls in backward, Korthikanti et al. 2022 section
    # 4.2.2) or "pytorch" (torch.distributed.tensor.parallel, as in torchtitan and advisor's executor:
    # autograd keeps the all-gathered QKV/FC1/LM-head inputs; verified in shared/notes).
    framework: str = "megatron"
    # Gradient reduction overlapped with the last micro-batch's backward (PyTorch DDP/FSDP buckets,
    # Megatron-Core --overlap-grad-reduce, DeepSpeed overlap_comm); False reduces after backward.
    overlap_grad_reduce: bool = True

    def __post_init__(self) -> None:
        for key in ("global_batch_size", "seq_length"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise AdvisorError(f"training: '{key}' must be a positive integer, got {value!r}")
        if self.dtype not in DTYPE_BYTES:
            raise AdvisorError(f"training: 'dtype' must be one of {', '.join(DTYPE_BYTES)}, got {self.dtype!r}")
        if self.optimizer not in OPTIMIZERS:
            raise AdvisorError(f"training: 'optimizer' must be one of {', '.join(OPTIMIZERS)}, got {self.optimizer!r}")
        if self.attention not in ATTENTION:
            raise AdvisorError(f"training: 'attention' must be one of {', '.join(ATTENTION)}, got {self.attention!r}")
        if self.framework not in FRAMEWORKS:
            raise AdvisorError(f"training: 'framework' must be one of {', '.join(FRAMEWORKS)}, got {self.framework!r}")
        if self.train_tokens is not None and not self.train_tokens > 0:
            raise AdvisorError(f"training: 'train_tokens' must be positive, got {self.train_tokens!r}")

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def mixed_precision(self) -> bool:
        return self.dtype_bytes < 4

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch_size * self.seq_length


@dataclass(frozen=True)
class Cluster:
    nodes: int
    devices: int

    @staticmethod
    def of(hardware: HardwareProfile, nodes: int | None = None, devices: int | None = None) -> "Cluster":
        """From --nodes or --devices (exactly one). Devices need not fill the last node."""
        per_node = hardware.node.devices_per_node
        if (nodes is None) == (devices is None):
            raise AdvisorError("give the cluster size with exactly one of --nodes or --devices")
        if nodes is not None:
            if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes <= 0:
                raise AdvisorError(f"--nodes must be a positive integer, got {nodes!r}")
            return Cluster(nodes=nodes, devices=nodes * per_node)
        if isinstance(devices, bool) or not isinstance(devices, int) or devices <= 0:
            raise AdvisorError(f"--devices must be a positive integer, got {devices!r}")
        return Cluster(nodes=-(-devices // per_node), devices=devices)


def parse_token_count(text: str) -> float:
    """'2T', '300B', '1.5e12' -> tokens."""
    units = {"K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}
    raw = str(text).strip().upper()
    try:
        if raw and raw[-1] in units:
            value = float(raw[:-1]) * units[raw[-1]]
        else:
            value = float(raw)
    except ValueError:
        raise AdvisorError(f"--tokens: cannot read {text!r} as a token count (examples: 300B, 2T, 1.5e12)") from None
    if not value > 0:
        raise AdvisorError(f"--tokens must be positive, got {text!r}")
    return value
