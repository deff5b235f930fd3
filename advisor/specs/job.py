"""The training job and the cluster size, given on the command line or in a plan."""

from __future__ import annotations

import math
from dataclasses import dataclass

from advisor.errors import AdvisorError
from advisor.specs import limits
from advisor.specs.hardware import HardwareProfile
from advisor.specs.untrusted import prefix

# Bytes per element of weights, gradients and activations as stored. FP8 training keeps them in
# BF16 and runs only the linear layers' GEMMs in FP8 (Transformer Engine, torchao float8;
# Micikevicius et al. 2022, "FP8 Formats for Deep Learning", section 4).
DTYPE_BYTES = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 2}
OPTIMIZERS = ("adamw", "adam", "sgd", "adagrad")
# How the optimizer step runs (advisor.cost.optimizer_step): "fused", one kernel per step or parameter
# (Transformer Engine / Apex FusedAdam in Megatron, torch.optim's fused=True, torchtitan's default
# implementation "fused", MindSpore's AdamWeightDecay primitive behind MindFormers'
# FP32StateAdamWeightDecay), or "unfused", one elementwise kernel per operation of the update
# (torch.optim's foreach and for-loop AdamW, torchtitan's implementation "foreach"/"for-loop",
# MindFormers' AdamW and Yi's AdamWeightDecayX). Megatron-LM has no unfused Adam.
OPTIMIZER_IMPLS = ("fused", "unfused")
# Adagrad (Duchi et al. 2011) is what sparse embedding training often uses; advisor prices it for
# recommendation models (advisor.cost.recsys) only: transformer plans train with the others.
TRANSFORMER_OPTIMIZERS = ("adamw", "adam", "sgd")
ATTENTION = ("flash", "math")
# Whose implementation runs the plan; it decides what "selective" recomputation keeps and what
# sequence parallelism saves (see advisor.cost.recompute and advisor.cost.memory).
FRAMEWORKS = ("megatron", "pytorch", "torchtitan", "mindspore")
# The PyTorch-module stacks: eager kernels unless compiled, separate Q/K/V and gate/up projections,
# autograd keeping the all-gathered sequence-parallel inputs (advisor.cost.kernels, compute, activations).
EAGER_FRAMEWORKS = ("pytorch", "torchtitan")
# FP8 scaling recipes, named as Megatron-LM's --fp8-recipe: delayed (amax history, Transformer
# Engine's DelayedScaling), tensorwise (per-tensor current scaling, TE Float8CurrentScaling, torchao
# tensorwise), mxfp8 (1x32 blocks with E8M0 scales, TE MXFP8BlockScaling; Blackwell), blockwise
# (1x128 / 128x128 blocks, TE Float8BlockScaling, DeepSeek-V3's recipe).
FP8_RECIPES = ("delayed", "tensorwise", "mxfp8", "blockwise")
DEFAULT_FP8_RECIPE = "delayed"   # Megatron-LM's --fp8-recipe default
GRAD_DTYPES = ("fp32", "bf16", "fp16")
# Fused attention kernels, each with its own efficiency curve in a profile (advisor.cost.attention):
# te = Transformer Engine's fused attention (cuDNN; FlashAttention-3-class on Hopper and later),
# sdpa = PyTorch scaled_dot_product_attention's flash backend (FlashAttention-2), triton = the
# Triton FlashAttention of flash-attn 1.x that llm-foundry's attn_impl "triton" ran, npu = Ascend's
# FlashAttentionScore (MindSpore).
ATTENTION_KERNELS = ("te", "sdpa", "triton", "npu")
DEFAULT_KERNEL = {"megatron": "te", "pytorch": "sdpa", "torchtitan": "sdpa", "mindspore": "npu"}
# Megatron-Core's selective recomputation modules (--recompute-modules) that the cost model prices
# (advisor.cost.recompute): the attention core (the default), the two norms, the MoE experts'
# activation function, MLA's up-projections and the dense layers' MLP.
RECOMPUTE_MODULES = ("core_attn", "layernorm", "moe_act", "mla_up_proj", "mlp")
DEFAULT_RECOMPUTE_MODULES = ("core_attn",)


def check_recompute_modules(modules, framework: str, where: str) -> None:
    """Megatron's recompute modules: a non-empty tuple of RECOMPUTE_MODULES, with framework megatron.
    `where` names the key or flag in the error."""
    if not isinstance(modules, tuple) or not modules or any(m not in RECOMPUTE_MODULES for m in modules):
        raise AdvisorError(f"{where} must be a non-empty list of {', '.join(RECOMPUTE_MODULES)}, got {str(modules)[:80]!r}")
    if framework != "megatron":
        raise AdvisorError(f"{where} is Megatron's setting; it goes with framework megatron, not {framework!r}")


def check_optimizer_impl(impl, framework: str, where: str) -> None:
    """An OPTIMIZER_IMPLS name that the framework offers; `where` names the key or flag in the error."""
    if impl not in OPTIMIZER_IMPLS:
        raise AdvisorError(f"{where} must be one of {', '.join(OPTIMIZER_IMPLS)}, got {prefix(impl)}")
    if impl == "unfused" and framework == "megatron":
        raise AdvisorError(f"{where} = unfused: Megatron-LM's Adam is always a fused kernel (Transformer Engine's "
                           "or Apex's FusedAdam); use framework pytorch, torchtitan or mindspore")


# Megatron-Core's CUDA-graph scopes (--cuda-graph-scope; transformer_config.py cuda_graph_modules),
# "full" standing for the whole layer (Megatron's empty scope), "full_iteration" for one graph of the
# whole forward and backward (--cuda-graph-impl local); priced in advisor.cost.cuda_graphs.
CUDA_GRAPH_MODULES = ("full", "full_iteration", "attn", "mlp", "moe", "moe_router", "moe_preprocess")
WHOLE_LAYER_GRAPHS = ("full", "full_iteration", "moe")


def check_cuda_graphs(modules: tuple[str, ...], framework: str, moe: bool | None, dropless: bool, where: str) -> None:
    """The CUDA-graph scopes Megatron-Core accepts (transformer_config.py __post_init__); `moe`: whether
    the model has experts (None: not known yet, checked again with the model); `where` names the key or flag."""
    if not isinstance(modules, tuple) or any(m not in CUDA_GRAPH_MODULES for m in modules) or len(set(modules)) != len(modules):
        raise AdvisorError(f"{where} must be a list of distinct names among {', '.join(CUDA_GRAPH_MODULES)}, "
                           f"got {str(modules)[:80]!r}")
    if not modules:
        return
    if framework != "megatron":
        raise AdvisorError(f"{where} is Megatron-Core's per-layer CUDA graphs; it goes with framework megatron, "
                           f"not {framework!r}")
    for whole in ("full", "full_iteration"):
        if whole in modules and len(modules) > 1:
            raise AdvisorError(f"{where}: '{whole}' captures whole layers and goes alone, got {', '.join(modules)}")
    if "moe" in modules and "moe_router" in modules:
        raise AdvisorError(f"{where}: 'moe' and 'moe_router' cannot go together (Megatron-Core)")
    if "moe_preprocess" in modules and "moe_router" not in modules:
        raise AdvisorError(f"{where}: 'moe_preprocess' needs 'moe_router' (Megatron-Core)")
    if moe is False and any(m in modules for m in ("moe", "moe_router", "moe_preprocess")):
        raise AdvisorError(f"{where}: the moe scopes need a mixture-of-experts model")
    if moe and dropless and any(m in modules for m in WHOLE_LAYER_GRAPHS):
        raise AdvisorError(f"{where}: Megatron-Core graphs whole MoE layers only with token dropping and "
                           "padding (dropless MoE sizes its experts every step); use attn, moe_router, moe_preprocess")


# The facility (advisor.cost.carbon): PUE 1.58, the global average of the Uptime Institute's 2018 survey
# (as Carbontracker uses it: Anthony et al. 2020, arXiv 2007.03051); bounds for what a user gives.
DEFAULT_PUE = 1.58
MAX_PUE = 3.0
MAX_GRID_GCO2E_PER_KWH = 2000.0


@dataclass(frozen=True)
class TrainingJob:
    global_batch_size: int          # sequences per optimizer step
    seq_length: int                 # tokens per sequence
    dtype: str = "bf16"             # compute dtype; fp32 master weights with fp16/bf16 (mixed precision)
    optimizer: str = "adamw"
    train_tokens: float | None = None  # token budget for time/cost to train
    # where it trains (advisor.cost.carbon): the data centre's PUE and the grid's gCO2e per kWh
    pue: float = DEFAULT_PUE
    grid_gco2e_per_kwh: float | None = None
    # Attention kernel: "flash" (FlashAttention / fused SDPA, default in Megatron-Core with Transformer
    # Engine, torchtitan and MindSpore's FlashAttentionScore) keeps no s x s score tensors; "math" is the
    # unfused softmax(QK^T)V of Megatron-LM 2021-22 that Korthikanti et al. 2022 measured.
    attention: str = "flash"
    # Dropout on attention probabilities and hidden states (Megatron GPT's default 0.1/0.1, used in
    # the Korthikanti and SC'21 runs); Llama-style pre-training runs without it, saving its masks.
    dropout: bool = False
    # Whose implementation runs the plan: "megatron" (Megatron-LM/Core: re-gathers the sequence-
    # parallel inputs of the column-parallel matmuls in backward, Korthikanti et al. 2022 section
    # 4.2.2), "pytorch" (torch.distributed with FSDP and DTensor tensor parallelism, as llm-foundry
    # and advisor's executor run: autograd keeps the all-gathered QKV/FC1/LM-head inputs, verified in
    # shared/notes; selective recomputation wraps the attention core), "torchtitan" (the same stack
    # with torchtitan's policies: op-level selective activation checkpointing, no FSDP resharding
    # under pipeline parallelism) or "mindspore" (MindFormers). It decides what "selective"
    # recomputation means (advisor.cost.recompute), the default attention kernel and fusion.
    framework: str = "megatron"
    # Gradient reduction overlapped with the last micro-batch's backward (PyTorch DDP/FSDP buckets,
    # Megatron-Core --overlap-grad-reduce, DeepSpeed overlap_comm); False reduces after backward.
    overlap_grad_reduce: bool = True
    # FP8 scaling recipe (dtype fp8 only); None: DEFAULT_FP8_RECIPE.
    fp8_recipe: str | None = None
    # Tensor-parallel collectives overlapped with the GEMMs they feed (Megatron --tp-comm-overlap with
    # Transformer Engine userbuffers; MindFormers' fine_grain_interleave; torchtitan's async TP).
    tp_comm_overlap: bool = False
    # Expert-parallel all-to-alls overlapped with another micro-batch's compute (Megatron-Core
    # overlap_moe_expert_parallel_comm).
    ep_comm_overlap: bool = False
    # dtype gradients are reduced (and, in Megatron, accumulated) in; None: the framework's default
    # (Megatron-LM: fp32 for bf16 models, --accumulate-allreduce-grads-in-fp32; PyTorch FSDP in
    # torchtitan: reduce_dtype fp32; MindSpore: fp32 parameters, fp32 gradients).
    grad_reduce_dtype: str | None = None
    # Fused attention kernel (ATTENTION_KERNELS); None: the framework's (DEFAULT_KERNEL).
    attention_kernel: str | None = None
    # FP8 primary weights (Megatron --fp8-param-gather, Transformer Engine fp8_model_init): the
    # linear layers' weights live in FP8 (no BF16 copy, no separate FP8 cache) and are gathered in FP8.
    fp8_param_gather: bool = False
    # FSDP's backward prefetch: "pre" issues the next unit's all-gather before the current unit's
    # gradient computation (FSDP1 BACKWARD_PRE, FSDP2's implicit prefetch, Megatron-FSDP), "post"
    # after it, so that the next unit waits for it (FSDP1 BACKWARD_POST).
    fsdp_backward_prefetch: str = "pre"
    # Memory-bound kernels fused (Transformer Engine, MindSpore graph mode, torch.compile) or run
    # operator by operator (eager PyTorch); None: the framework's default (fused except EAGER_FRAMEWORKS).
    fused_kernels: bool | None = None
    # Dropless MoE (every routed token computed; Megatron-Core's default without a capacity factor):
    # the tokens per expert are copied to the host before the grouped GEMMs and all-to-alls can be
    # sized, a device-to-host synchronization per MoE layer and pass. False: a capacity factor with
    # padding keeps shapes static (no synchronization; advisor.cost.step prices both).
    moe_dropless: bool = True
    # Critical-path traffic (TP/EP/CP collectives, pipeline transfers) ahead of overlapped data-parallel
    # traffic on a shared link (MindPipe's communication scheduling; ByteScheduler): the data-parallel
    # collective yields instead of slowing the layers (advisor.cost.contention).
    comm_priority: bool = False
    # What Megatron's selective recomputation replays (--recompute-modules, RECOMPUTE_MODULES; framework
    # megatron only); None: Megatron-Core's default, the attention core.
    recompute_modules: tuple[str, ...] | None = None
    # Megatron-Core's per-layer CUDA graphs (--cuda-graph-impl transformer_engine with
    # --cuda-graph-scope; CUDA_GRAPH_MODULES above, "full" = the whole layer; priced in advisor.cost.cuda_graphs):
    # the captured kernels launch as one graph. Empty: eager launches.
    cuda_graphs: tuple[str, ...] = ()
    # The optimizer step's kernels (OPTIMIZER_IMPLS).
    optimizer_impl: str = "fused"

    def __post_init__(self) -> None:
        for key, bound in (("global_batch_size", limits.MAX_GLOBAL_BATCH), ("seq_length", limits.MAX_SEQ_LENGTH)):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise AdvisorError(f"training: '{key}' must be a positive integer, got {prefix(value)}")
            if value > bound:
                raise AdvisorError(f"training: '{key}' = {value} exceeds the bound {bound:,} advisor accepts "
                                   f"(advisor/specs/limits.py)")
        if self.dtype not in DTYPE_BYTES:
            raise AdvisorError(f"training: 'dtype' must be one of {', '.join(DTYPE_BYTES)}, got {self.dtype!r}")
        if self.optimizer not in OPTIMIZERS:
            raise AdvisorError(f"training: 'optimizer' must be one of {', '.join(OPTIMIZERS)}, got {self.optimizer!r}")
        check_optimizer_impl(self.optimizer_impl, self.framework, "training: 'optimizer_impl'")
        if self.attention not in ATTENTION:
            raise AdvisorError(f"training: 'attention' must be one of {', '.join(ATTENTION)}, got {self.attention!r}")
        if self.framework not in FRAMEWORKS:
            raise AdvisorError(f"training: 'framework' must be one of {', '.join(FRAMEWORKS)}, got {self.framework!r}")
        if self.fp8_recipe is not None and (self.fp8_recipe not in FP8_RECIPES or self.dtype != "fp8"):
            raise AdvisorError(f"training: 'fp8_recipe' must be one of {', '.join(FP8_RECIPES)} with dtype fp8, "
                               f"got {self.fp8_recipe!r} with dtype {self.dtype!r}")
        if self.grad_reduce_dtype is not None and self.grad_reduce_dtype not in GRAD_DTYPES:
            raise AdvisorError(f"training: 'grad_reduce_dtype' must be one of {', '.join(GRAD_DTYPES)}, got {self.grad_reduce_dtype!r}")
        if self.attention_kernel is not None and self.attention_kernel not in ATTENTION_KERNELS:
            raise AdvisorError(f"training: 'attention_kernel' must be one of {', '.join(ATTENTION_KERNELS)}, "
                               f"got {self.attention_kernel!r}")
        if self.fsdp_backward_prefetch not in ("pre", "post"):
            raise AdvisorError(f"training: 'fsdp_backward_prefetch' must be pre or post, got {self.fsdp_backward_prefetch!r}")
        if self.fp8_param_gather and self.dtype != "fp8":
            raise AdvisorError("training: 'fp8_param_gather' needs dtype fp8")
        if self.recompute_modules is not None:
            check_recompute_modules(self.recompute_modules, self.framework, "training: 'recompute_modules'")
        if self.cuda_graphs:
            check_cuda_graphs(self.cuda_graphs, self.framework, None, self.moe_dropless, "training: 'cuda_graphs'")
        if not (math.isfinite(self.pue) and 1.0 <= self.pue <= MAX_PUE):
            raise AdvisorError(f"training: 'pue' must be between 1 and {MAX_PUE:g}, got {prefix(self.pue)}")
        if self.grid_gco2e_per_kwh is not None and not (
                math.isfinite(self.grid_gco2e_per_kwh) and 0 <= self.grid_gco2e_per_kwh <= MAX_GRID_GCO2E_PER_KWH):
            raise AdvisorError(f"training: 'grid_gco2e_per_kwh' must be between 0 and {MAX_GRID_GCO2E_PER_KWH:g}, "
                               f"got {prefix(self.grid_gco2e_per_kwh)}")
        if self.train_tokens is not None and not 0 < self.train_tokens <= limits.MAX_QUANTITY:
            raise AdvisorError(f"training: 'train_tokens' must be a positive number of at most "
                               f"{limits.MAX_QUANTITY:g}, got {prefix(self.train_tokens)}")

    @property
    def selective_modules(self) -> tuple[str, ...]:
        """Megatron's recompute modules in force."""
        return self.recompute_modules or DEFAULT_RECOMPUTE_MODULES

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def gemm_dtype(self) -> str:
        """The dtype the linear layers' GEMMs run in (the peak and efficiency curve they use)."""
        return self.dtype

    @property
    def recipe(self) -> str | None:
        """The FP8 scaling recipe in force (None unless dtype is fp8)."""
        return (self.fp8_recipe or DEFAULT_FP8_RECIPE) if self.dtype == "fp8" else None

    @property
    def compute_dtype(self) -> str:
        """The dtype of everything that is not a linear layer's GEMM (attention, LM head, kernels)."""
        return "bf16" if self.dtype == "fp8" else self.dtype

    @property
    def kernel(self) -> str:
        """The fused attention kernel in force."""
        return self.attention_kernel or DEFAULT_KERNEL[self.framework]

    @property
    def grad_reduce_bytes(self) -> float:
        """Bytes per gradient element as accumulated and reduced over data parallelism."""
        if self.grad_reduce_dtype is not None:
            return float(DTYPE_BYTES[self.grad_reduce_dtype])
        if not self.mixed_precision:
            return 4.0
        if self.framework == "megatron" and self.compute_dtype == "fp16":
            return 2.0     # Megatron-LM reduces fp16 gradients in fp16 unless asked otherwise
        return 4.0

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
        bound = limits.MAX_DEVICES
        if nodes is not None:
            if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes <= 0:
                raise AdvisorError(f"--nodes must be a positive integer, got {prefix(nodes)}")
            if nodes * per_node > bound:
                raise AdvisorError(f"--nodes {prefix(nodes)} x {per_node} devices per node exceeds the bound of "
                                   f"{bound:,} devices advisor accepts (advisor/specs/limits.py)")
            return Cluster(nodes=nodes, devices=nodes * per_node)
        if isinstance(devices, bool) or not isinstance(devices, int) or devices <= 0:
            raise AdvisorError(f"--devices must be a positive integer, got {prefix(devices)}")
        if devices > bound:
            raise AdvisorError(f"--devices {prefix(devices)} exceeds the bound of {bound:,} devices advisor accepts "
                               f"(advisor/specs/limits.py)")
        return Cluster(nodes=-(-devices // per_node), devices=devices)


def parse_token_count(text: str, flag: str = "--tokens") -> float:
    """'2T', '300B', '1.5e12' -> tokens; errors name ``flag``."""
    units = {"K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}
    raw = str(text).strip().upper()
    try:
        if raw and raw[-1] in units:
            value = float(raw[:-1]) * units[raw[-1]]
        else:
            value = float(raw)
    except ValueError:
        raise AdvisorError(f"{flag}: cannot read {prefix(str(text))} as a token count (examples: 300B, 2T, 1.5e12)") from None
    if not 0 < value <= limits.MAX_QUANTITY:
        raise AdvisorError(f"{flag} must be a positive, finite count of at most {limits.MAX_QUANTITY:g}, "
                           f"got {prefix(str(text))}")
    return value
