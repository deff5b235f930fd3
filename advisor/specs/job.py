"""The training job and the cluster size, given on the command line or in a plan."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from advisor.errors import AdvisorError
from advisor.specs import limits
from advisor.specs.frameworks import (ATTENTION_KERNELS, FRAMEWORKS as FRAMEWORK_RECORDS, Framework, for_release,
                                     frameworks_with)
from advisor.specs.hardware import HardwareProfile
from advisor.specs.setting import check_fields, check_frameworks, setting
from advisor.specs.site import Site
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
# Whose implementation runs the plan: the names of the framework records (advisor.specs.frameworks),
# which decide what "selective" recomputation keeps, what sequence parallelism saves, fusion, overlap...
FRAMEWORKS = tuple(FRAMEWORK_RECORDS)
# FP8 scaling recipes, named as Megatron-LM's --fp8-recipe: delayed (amax history, Transformer
# Engine's DelayedScaling), tensorwise (per-tensor current scaling, TE Float8CurrentScaling, torchao
# tensorwise), mxfp8 (1x32 blocks with E8M0 scales, TE MXFP8BlockScaling; Blackwell), blockwise
# (1x128 / 128x128 blocks, TE Float8BlockScaling, DeepSeek-V3's recipe); and nvfp4, the low-precision GEMMs in
# NVFP4 instead (E2M1 with E4M3 scales per 16 elements, TE NVFP4BlockScaling, Megatron-LM --fp4-format e2m1
# --fp4-recipe nvfp4; Blackwell FP4 tensor cores; advisor.cost.fp8).
FP8_RECIPES = ("delayed", "tensorwise", "mxfp8", "blockwise", "nvfp4")
GRAD_DTYPES = ("fp32", "bf16", "fp16")
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
    if not FRAMEWORK_RECORDS[framework].recompute_modules:
        raise AdvisorError(f"{where} is Megatron's setting; it goes with framework {frameworks_with('recompute_modules')}, "
                           f"not {framework!r}")


def check_optimizer_impl(impl, framework: str, where: str) -> None:
    """An OPTIMIZER_IMPLS name that the framework offers; `where` names the key or flag in the error."""
    if impl not in OPTIMIZER_IMPLS:
        raise AdvisorError(f"{where} must be one of {', '.join(OPTIMIZER_IMPLS)}, got {prefix(impl)}")
    if impl == "unfused" and not FRAMEWORK_RECORDS[framework].unfused_optimizer:
        raise AdvisorError(f"{where} = unfused: Megatron-LM's Adam is always a fused kernel (Transformer Engine's "
                           f"or Apex's FusedAdam); use framework {frameworks_with('unfused_optimizer')}")


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
    if not FRAMEWORK_RECORDS[framework].cuda_graphs:
        raise AdvisorError(f"{where} is Megatron-Core's per-layer CUDA graphs; it goes with framework "
                           f"{frameworks_with('cuda_graphs')}, not {framework!r}")
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


def check_job_relations(job, where: Callable[[str], str]) -> None:
    """The checks between a job's settings (each value alone is checked by its Setting); ``where`` names a
    setting in the error (a flag, or the plan key)."""
    check_optimizer_impl(job.optimizer_impl, job.framework, where("optimizer_impl"))
    record = FRAMEWORK_RECORDS[job.framework]
    if job.framework_release is not None:
        if job.framework_release not in record.releases:
            recorded = (f"records the releases {', '.join(record.releases)}" if record.releases else
                        "has one record for all the releases it names (advisor/specs/frameworks.py)")
            raise AdvisorError(f"{where('framework_release')} = {job.framework_release}: framework {job.framework} "
                               f"{recorded}")
        record = for_release(record, job.framework_release)
    if job.attention_kernel is not None and job.attention_kernel not in record.attention_kernels:
        raise AdvisorError(f"{where('attention_kernel')} = {job.attention_kernel}: framework {job.framework} runs the "
                           f"attention kernels {', '.join(record.attention_kernels)} (advisor/specs/frameworks.py)")
    if job.dtype not in record.dtypes:
        raise AdvisorError(f"{where('dtype')} = {job.dtype}: framework {job.framework} trains in "
                           f"{', '.join(record.dtypes)} only")
    if job.fp8_recipe is not None and job.dtype != "fp8":
        raise AdvisorError(f"{where('fp8_recipe')} must be one of {', '.join(FP8_RECIPES)} with dtype fp8, "
                           f"got {job.fp8_recipe!r} with dtype {job.dtype!r}")
    if job.fp8_recipe is not None and job.fp8_recipe not in record.fp8_recipes:
        raise AdvisorError(f"{where('fp8_recipe')} = {job.fp8_recipe}: framework {job.framework} runs the FP8 recipes "
                           f"{', '.join(record.fp8_recipes)}")
    if job.fp8_param_gather and job.dtype != "fp8":
        raise AdvisorError(f"{where('fp8_param_gather')} needs dtype fp8")
    if job.fp8_param_gather and job.fp8_recipe == "nvfp4":
        raise AdvisorError(f"{where('fp8_param_gather')} gathers FP8 weights; with fp8_recipe nvfp4 the weights are "
                           "gathered in BF16 (Megatron-Bridge's bf16_with_nvfp4_mixed)")
    if job.recompute_modules is not None:
        check_recompute_modules(job.recompute_modules, job.framework, where("recompute_modules"))
    if job.cuda_graphs:
        check_cuda_graphs(job.cuda_graphs, job.framework, None, job.moe_dropless, where("cuda_graphs"))
    check_frameworks(TrainingJob, job, job.framework, "bf16" if job.dtype == "fp8" else job.dtype, where)


def _names(text: str) -> tuple[str, ...]:
    """A comma-separated list of names ('attn,mlp') as the tuple a setting holds."""
    return tuple(m.strip() for m in str(text).split(",") if m.strip())


@dataclass(frozen=True)
class Workload:
    """What is trained: how many sequences of how many tokens a step takes, in which precision, with
    which optimizer, for how many tokens."""

    global_batch_size: int = setting(
        kind="positive_int", maximum=limits.MAX_GLOBAL_BATCH, flags=("--global-batch", "--gbs"), cli_default=None,
        plan="always", required=True, help="global batch (sequences); default ~4M tokens",
        doc="Sequences per optimizer step (default: about 4M tokens, advisor.commands.inputs).")
    seq_length: int = setting(
        kind="positive_int", maximum=limits.MAX_SEQ_LENGTH, flags=("--seq-len",), cli_default=None, plan="always",
        required=True, help="sequence length in tokens (default: the model's seq_length)",
        doc="Tokens per sequence (default: the model's seq_length).")
    dtype: str = setting(
        "bf16", kind="choice", choices=tuple(DTYPE_BYTES), flags=("--dtype",), cli_default=None, plan="always",
        help="bf16 | fp16 | fp32 | fp8 (default: bf16 if the device has it)",
        doc="The compute dtype; fp32 master weights with fp16/bf16 (mixed precision). fp8 runs the linear "
            "layers' GEMMs in FP8 and keeps everything else in bf16 (DTYPE_BYTES).")
    optimizer: str = setting(
        "adamw", kind="choice", choices=OPTIMIZERS, plan="always",
        doc="The optimizer whose states are kept (Adam's two moments; SGD's momentum; Adagrad for "
            "recommendation models only).")
    train_tokens: float | None = setting(
        None, kind="positive_float", optional=True, flags=("--tokens",), help="token budget for time/cost to train, e.g. 2T",
        parse=lambda text: parse_token_count(text), doc="The token budget, for the time, cost and energy to train.")


@dataclass(frozen=True)
class Runtime:
    """How the framework runs it: whose implementation, which kernels, what overlaps what."""

    attention: str = setting(
        "flash", kind="choice", choices=ATTENTION, flags=("--attention",), plan="always",
        help="flash | math (unfused, stores the s x s scores)",
        doc='The attention kernel: "flash" (FlashAttention / fused SDPA, the default in Megatron-Core with '
            "Transformer Engine, torchtitan and MindSpore's FlashAttentionScore) keeps no s x s score tensors; "
            '"math" is the unfused softmax(QK^T)V of Megatron-LM 2021-22 that Korthikanti et al. 2022 measured.')
    dropout: bool = setting(
        False, kind="boolean", flags=("--dropout",), plan="always",
        help="train with dropout (its masks are kept for backward)",
        doc="Dropout on attention probabilities and hidden states (Megatron GPT's default 0.1/0.1, used in the "
            "Korthikanti and SC'21 runs); Llama-style pre-training runs without it, saving its masks.")
    framework: str = setting(
        "megatron", kind="choice", choices=FRAMEWORKS, flags=("--framework",), plan="always",
        help="megatron | pytorch | torchtitan | deepspeed | mindspore: whose implementation runs the plan (what "
             "it can run, what selective recomputation means, fused kernels, the attention kernel)",
        doc="Whose implementation runs the plan: a framework record (advisor.specs.frameworks) decides what "
            '"selective" recomputation keeps, what sequence parallelism saves, the default attention kernel, '
            "fusion and overlap.")
    framework_release: str | None = setting(
        None, kind="choice", choices=tuple(sorted({r for f in FRAMEWORK_RECORDS.values() for r in f.releases})),
        optional=True, flags=("--framework-release",),
        help="the framework's release, for frameworks that record several (megatron: Megatron-Core 0.13, 0.14 or "
             "0.15): only what that release runs is searched and priced, and exports write for it; default the newest",
        doc="The release of the framework that runs the plan (advisor.specs.frameworks.for_release: the record's "
            "releases and what the older ones do not run, e.g. Megatron-Core 0.13 has no Megatron FSDP, so no ZeRO-2/3, "
            "and 0.13/0.14 no sliding-window attention). None: the newest; exports default --target-version to it.")
    overlap_grad_reduce: bool = setting(
        True, kind="boolean", plan="always", flags=("--overlap-grad-reduce",),
        help="overlap the gradient reduction with the last micro-batch's backward (--no-overlap-grad-reduce: after it)",
        doc="Gradient reduction overlapped with the last micro-batch's backward (PyTorch DDP/FSDP buckets, "
            "Megatron-Core --overlap-grad-reduce, DeepSpeed overlap_comm); false reduces after the backward.")
    fp8_recipe: str | None = setting(
        None, kind="choice", choices=FP8_RECIPES, optional=True, flags=("--fp8-recipe",),
        help="with --dtype fp8: delayed | tensorwise | mxfp8 | blockwise, or nvfp4 (the linear layers' GEMMs in NVFP4 "
             "instead, Blackwell) (default: the framework's, Megatron-LM's delayed, torchtitan's tensorwise)",
        doc="The FP8 scaling recipe (dtype fp8 only; None: the framework's default, the first of its fp8_recipes); "
            "nvfp4 runs the linear layers' GEMMs in NVFP4 instead (Blackwell FP4 tensor cores).")
    tp_comm_overlap: bool = setting(
        False, kind="boolean", flags=("--tp-comm-overlap",),
        help="overlap tensor-parallel collectives with the GEMMs (Megatron --tp-comm-overlap, needs sequence "
             "parallelism; torchtitan async TP; MindFormers fine_grain_interleave)",
        frameworks={
            # megatron/training/arguments.py (core_v0.13-0.15); validate_args wants --sequence-parallel with it
            "megatron": {"true": "--tp-comm-overlap"},
            # torchtitan/config/job_config.py (v0.2.0) [parallelism]; async TP runs under torch.compile
            "torchtitan": {"true": "parallelism.enable_async_tensor_parallel = true"},
            # MindFormers' legacy LlamaConfig (models/llama/llama_config.py, v1.7.0): the slices advisor prices
            "mindspore": {"true": f"model.model_config.fine_grain_interleave = "
                                  f"{FRAMEWORK_RECORDS['mindspore'].tp_overlap_slices}"},
        },
        doc="Tensor-parallel collectives overlapped with the GEMMs they feed (Megatron --tp-comm-overlap with "
            "Transformer Engine userbuffers; MindFormers' fine_grain_interleave; torchtitan's async TP).")
    memory_margin: float = setting(
        # at most 0.9: an input bound (a plan keeps at least a tenth of the device), not a measured figure
        0.0, kind="fraction", minimum=0.0, maximum=0.9, flags=("--memory-margin",),
        help="share of each device's memory a plan must leave free, e.g. 0.1 (plans must fit in 90%%); recommend "
             "and whatif default to the memory band's upper end (advisor/cost/error_bands.json), estimate to 0",
        doc="A share of each device's memory a plan must leave free: for what the model does not count (allocator "
            "fragmentation beyond its allowance, communication buffers, workspaces) and the error of its memory "
            "figure; 0.1 needs every plan to fit in 90% of the device (TrainingJob.usable_memory_gib). Not given, "
            "recommend and whatif leave the share that makes a plan fit at the upper end of its memory band "
            "(advisor.cost.band.memory_headroom: measured peaks up to predicted / (1 + the band's low end)); "
            "estimate judges the point figure and prints the band.")
    ep_comm_overlap: bool = setting(
        False, kind="boolean", flags=("--ep-comm-overlap",),
        help="overlap the expert-parallel all-to-alls with another micro-batch's compute (Megatron-Core "
             "--overlap-moe-expert-parallel-comm)",
        doc="Expert-parallel all-to-alls overlapped with another micro-batch's compute (Megatron-Core "
            "overlap_moe_expert_parallel_comm).")
    grad_reduce_dtype: str | None = setting(
        None, kind="choice", choices=GRAD_DTYPES, optional=True, flags=("--grad-reduce-dtype",),
        help="fp32 | bf16 | fp16: the dtype data-parallel gradients are reduced in (default: the framework's)",
        frameworks={
            # Megatron-LM arguments.py (core_v0.13-0.15): --bf16 forces accumulate_allreduce_grads_in_fp32
            # unless --grad-reduce-in-bf16; fp16 models reduce in fp16 unless --accumulate-allreduce-grads-in-fp32
            "megatron": {"fp32@bf16": "", "bf16@bf16": "--grad-reduce-in-bf16", "fp16@fp16": "",
                         "fp32@fp16": "--accumulate-allreduce-grads-in-fp32", "fp32@fp32": "", "fp32@tf32": ""},
            # FSDP2's MixedPrecisionPolicy(reduce_dtype=...), any dtype
            "pytorch": {"fp32": "MixedPrecisionPolicy(reduce_dtype=torch.float32)",
                        "bf16": "MixedPrecisionPolicy(reduce_dtype=torch.bfloat16)",
                        "fp16": "MixedPrecisionPolicy(reduce_dtype=torch.float16)"},
            # ds_config communication_data_type (deepspeed/runtime/config.py), the deepspeed export's spelling
            "deepspeed": {"fp32": "communication_data_type = fp32", "bf16": "communication_data_type = bf16",
                          "fp16": "communication_data_type = fp16"},
            # torchtitan 0.2.0 [training] mixed_precision_reduce accepts only "float32"
            "torchtitan": {"fp32": "training.mixed_precision_reduce = float32"},
            # MindSpore as advisor prices it: fp32 parameters, so fp32 gradients (gradient_fp32_sync's default)
            "mindspore": {"fp32": ""},
        },
        doc="The dtype gradients are reduced (and, in Megatron, accumulated) in; None: the framework's default "
            "(Megatron-LM: fp32 for bf16 models, --accumulate-allreduce-grads-in-fp32; PyTorch FSDP in "
            "torchtitan: reduce_dtype fp32; MindSpore: fp32 parameters, fp32 gradients).")
    attention_kernel: str | None = setting(
        None, kind="choice", choices=ATTENTION_KERNELS, optional=True, flags=("--attention-kernel",),
        help="te | sdpa | triton | npu: the fused attention kernel (Transformer Engine/cuDNN, PyTorch SDPA flash, "
             "flash-attn Triton, Ascend FlashAttentionScore; default: the framework's)",
        doc="The fused attention kernel (ATTENTION_KERNELS): one the framework calls (Framework.attention_kernels) "
            "and the device runs (Architecture.attention_kernels); None: the framework's.")
    fp8_param_gather: bool = setting(
        False, kind="boolean", flags=("--fp8-param-gather",),
        help="with --dtype fp8: FP8 primary weights, gathered in FP8 (Megatron --fp8-param-gather, torchtitan "
             "enable_fsdp_float8_all_gather)",
        frameworks={"megatron": {"true": "--fp8-param-gather"},
                    "torchtitan": {"true": "quantize.linear.float8.enable_fsdp_float8_all_gather = true"},
                    "pytorch": {"true": "torchao Float8LinearConfig(enable_fsdp_float8_all_gather=True)"}},
        doc="FP8 primary weights (Megatron --fp8-param-gather, Transformer Engine fp8_model_init): the linear "
            "layers' weights live in FP8 (no BF16 copy, no separate FP8 cache) and are gathered in FP8.")
    fsdp_backward_prefetch: str = setting(
        "pre", kind="choice", choices=("pre", "post"), flags=("--fsdp-backward-prefetch",),
        help="pre | post: FSDP's backward prefetch (FSDP1 BACKWARD_PRE / BACKWARD_POST)",
        doc="FSDP's backward prefetch: \"pre\" issues the next unit's all-gather before the current unit's "
            "gradient computation (FSDP1 BACKWARD_PRE, FSDP2's implicit prefetch, Megatron-FSDP), \"post\" after "
            "it, so that the next unit waits for it (FSDP1 BACKWARD_POST).")
    fused_kernels: bool | None = setting(
        None, kind="boolean", optional=True, flags=("--fused-kernels",),
        help="memory-bound kernels fused (torchtitan: torch.compile; Megatron-LM and MindSpore always) or, "
             "--no-fused-kernels, run one by one (eager PyTorch, DeepSpeed); default: the framework's",
        frameworks={
            "megatron": {"true": ""},                          # Transformer Engine's fused kernels, always
            "mindspore": {"true": ""},                         # graph mode (jit_level O1/O2) fuses them
            # torchtitan/config/job_config.py (v0.2.0): [compile] enable, components model and loss by default
            "torchtitan": {"true": "compile.enable = true", "false": ""},
            "deepspeed": {"false": ""},                        # eager modules: no compile switch in ds_config
            "pytorch": {"false": ""},                          # advisor's executor runs eager
        },
        doc="Memory-bound kernels fused (Transformer Engine, MindSpore graph mode, torch.compile) or run "
            "operator by operator (eager PyTorch); None: the framework's default.")
    comm_priority: bool = setting(
        False, kind="boolean", flags=("--comm-priority",),
        help="price the layers' transfers ahead of overlapped data-parallel traffic on shared links "
             "(MindPipe-style communication priority; default: fair sharing)",
        doc="Critical-path traffic (TP/EP/CP collectives, pipeline transfers) ahead of overlapped data-parallel "
            "traffic on a shared link (MindPipe's communication scheduling; ByteScheduler): the data-parallel "
            "collective yields instead of slowing the layers (advisor.cost.contention).")
    recompute_modules: tuple[str, ...] | None = setting(
        None, kind="names", choices=RECOMPUTE_MODULES, optional=True, flags=("--recompute-modules",), parse=_names,
        help="with --framework megatron: what selective recomputation replays, comma-separated core_attn, "
             "layernorm, moe_act, mla_up_proj, mlp (Megatron's --recompute-modules; default core_attn)",
        doc="What Megatron's selective recomputation replays (--recompute-modules, RECOMPUTE_MODULES; framework "
            "megatron only); None: Megatron-Core's default, the attention core.")
    cuda_graphs: tuple[str, ...] = setting(
        (), kind="names", choices=CUDA_GRAPH_MODULES, flags=("--cuda-graphs",), parse=_names,
        help="with --framework megatron: per-layer CUDA graphs over these modules, comma-separated full (the "
             "whole layer), full_iteration, attn, mlp, moe, moe_router, moe_preprocess (Megatron's "
             "--cuda-graph-scope); default none",
        doc="Megatron-Core's per-layer CUDA graphs (--cuda-graph-impl transformer_engine with --cuda-graph-scope; "
            'CUDA_GRAPH_MODULES, "full" = the whole layer; advisor.cost.cuda_graphs): the captured kernels launch '
            "as one graph. Empty: eager launches.")
    moe_dropless: bool = setting(
        True, kind="boolean", flags=("--moe-token-drop",), invert=True,
        help="MoE: drop tokens beyond capacity factor 1 and pad each expert to it (Megatron's "
             "--moe-expert-capacity-factor 1 --moe-pad-expert-input-to-capacity): static shapes, no host "
             "synchronization, whole-layer CUDA graphs; default: dropless",
        doc="Dropless MoE (every routed token computed; Megatron-Core's default without a capacity factor): the "
            "tokens per expert are copied to the host before the grouped GEMMs and all-to-alls can be sized, a "
            "device-to-host synchronization per MoE layer and pass. False: a capacity factor with padding keeps "
            "shapes static (no synchronization; advisor.cost.step prices both).")
    optimizer_impl: str = setting(
        "fused", kind="choice", choices=OPTIMIZER_IMPLS, flags=("--optimizer-impl",),
        help="fused | unfused: the optimizer step as one fused kernel (the default; Megatron's only choice) or "
             "one kernel per operation (torch.optim foreach / for-loop, torchtitan implementation foreach, "
             "MindFormers AdamW use_fused False)",
        doc="The optimizer step's kernels (OPTIMIZER_IMPLS; advisor.cost.optimizer_step).")


@dataclass(frozen=True)
class TrainingJob(Site, Runtime, Workload):
    """The training job: what is trained (Workload), how the framework runs it (Runtime) and where it
    runs (advisor.specs.site.Site), one flat set of fields declared by concern. Each field's Setting
    record (advisor.specs.setting) says how it is given, checked, saved and searched."""

    def usable_memory_gib(self, device_memory_gib: float) -> float:
        """The device memory a plan may use: the device's less the memory margin."""
        return device_memory_gib * (1.0 - self.memory_margin)

    def __post_init__(self) -> None:
        check_fields(self, lambda name: f"training: '{name}'")
        check_job_relations(self, lambda name: f"training: '{name}'")

    @property
    def framework_record(self) -> Framework:
        """The record of the framework that runs the plan (advisor.specs.frameworks), narrowed to its release."""
        return for_release(FRAMEWORK_RECORDS[self.framework], self.framework_release)

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
        return (self.fp8_recipe or self.framework_record.fp8_recipes[0]) if self.dtype == "fp8" else None

    @property
    def compute_dtype(self) -> str:
        """The dtype of everything that is not a linear layer's GEMM (attention, LM head, kernels)."""
        return "bf16" if self.dtype == "fp8" else self.dtype

    @property
    def kernel(self) -> str:
        """The fused attention kernel in force."""
        return self.attention_kernel or self.framework_record.attention_kernel

    @property
    def grad_reduce_bytes(self) -> float:
        """Bytes per gradient element as accumulated and reduced over data parallelism."""
        if self.grad_reduce_dtype is not None:
            return float(DTYPE_BYTES[self.grad_reduce_dtype])
        if not self.mixed_precision:
            return 4.0
        if self.compute_dtype == "fp16":
            return self.framework_record.fp16_grad_reduce_bytes
        return self.framework_record.bf16_grad_reduce_bytes

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
