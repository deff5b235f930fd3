"""One record per framework: how it runs a plan (what the cost model prices) and what it can run.

The training setting ``framework`` names one of these records; the cost model, the legality rules,
the searchers and the exports read its fields instead of comparing framework names. Each field
says what it decides and where the behaviour was read (file and release); the module that prices it
cites the details.

Records:

* ``megatron``: Megatron-LM / Megatron-Core (core_v0.13-0.15) with Transformer Engine; the training setting
  ``framework_release`` narrows it to one release (for_release: what 0.13 and 0.14 do not run).
* ``pytorch``: plain torch.distributed (FSDP, DTensor tensor parallelism) as llm-foundry and
  advisor's executor run it.
* ``deepspeed``: DeepSpeed 0.15-0.19 (ZeRO stages, its pipeline engine, Ulysses sequence parallelism)
  on the PyTorch stack.
* ``torchtitan``: torchtitan 0.2 (FSDP2, its activation-checkpointing and pipeline policies).
* ``mindspore``: MindSpore 2.x with MindFormers 1.3-1.7 (graph mode on Ascend).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

# Fused attention kernels, each with its own efficiency curve in a profile (advisor.cost.attention):
# te = Transformer Engine's fused attention (cuDNN; FlashAttention-3-class on Hopper and later),
# sdpa = PyTorch scaled_dot_product_attention's flash backend (FlashAttention-2), triton = the
# Triton FlashAttention of flash-attn 1.x that llm-foundry's attn_impl "triton" ran, npu = Ascend's
# FlashAttentionScore (MindSpore).
ATTENTION_KERNELS = ("te", "sdpa", "triton", "npu")
# CPU Adam implementations a framework's optimizer offload runs on the host (Framework.cpu_adam), each with its
# own measured rate in a profile (host.cpu_adam_params_per_s; advisor.cost.offload)
CPU_ADAMS = ("torch", "deepspeed", "mindspore")


@dataclass(frozen=True)
class Framework:
    name: str
    """The value of the training setting ``framework`` (``--framework``)."""
    title: str
    """How users name it (in messages and exports)."""

    # ---- kernels ------------------------------------------------------------------------------
    fused_kernels: bool
    """Memory-bound kernels fused (Transformer Engine, MindSpore graph mode) rather than run operator by
    operator (eager PyTorch; advisor.cost.kernels), and Q/K/V and the gated MLP's gate/up projections
    run as one GEMM each (advisor.cost.compute)."""
    one_qkv_weight: bool
    """Q, K and V are one weight tensor (Megatron-Core's linear_qkv) rather than one each (PyTorch models,
    MindFormers' wq/wk/wv): the tensors a per-tensor optimizer cost counts (advisor.cost.optimizer)."""
    norm_fused_linears: bool
    """The input norms fused with the QKV and FC1 GEMMs (Transformer Engine's LayerNormLinear: the norm
    writes the FP8 cast; advisor.cost.compute, fp8)."""
    quantized_saved_inputs: bool
    """FP8 GEMMs keep their inputs for the backward in FP8, not the compute dtype (Transformer Engine's
    Linear and GroupedLinear save the quantized copy; advisor.cost.activations)."""
    attention_kernel: str
    """The fused attention kernel it runs by default (ATTENTION_KERNELS)."""
    attention_kernels: tuple[str, ...]
    """The fused attention kernels it can run (ATTENTION_KERNELS; the training setting attention_kernel is one of
    them): Megatron-Core's attention goes through Transformer Engine's DotProductAttention (--attention-backend
    flash/fused/auto pick among TE's backends, megatron/training/arguments.py @core_v0.15.0), and on Ascend through
    MindSpeed's patch to torch_npu's npu_fusion_attention (Ascend/MindSpeed); torchtitan 0.2's models call SDPA
    (or FlexAttention, which advisor does not price; models/attention.py @v0.2.0); MindSpore's fused attention is
    Ascend's FlashAttentionScore; plain PyTorch and DeepSpeed run whatever kernel the model calls."""
    expert_gemm_per_expert: bool
    """Grouped expert GEMMs issued as one GEMM launch per local expert (Transformer Engine's GroupedLinear,
    multi_stream_cublas_gemm) rather than one grouped kernel (torch._grouped_mm, MindSpore GroupedMatmul;
    advisor.cost.host_launch)."""

    # ---- activations and recomputation --------------------------------------------------------
    keeps_gathered_sp_inputs: bool
    """Autograd keeps the all-gathered sequence-parallel inputs of the QKV, FC1 and LM-head GEMMs (PyTorch
    DTensor sequence parallelism, verified in shared/notes) instead of re-gathering them in the backward
    (Megatron-LM, Korthikanti et al. 2022 section 4.2.2; advisor.cost.activations)."""
    loss_logit_bytes: tuple[float | None, float | None]
    """(bytes per logit kept from the forward to the backward, bytes per logit the loss's backward adds);
    None: the compute dtype's bytes (advisor.cost.activations.loss_bytes_per_logit cites each)."""
    selective_recompute: tuple[str, ...] | None
    """What ``recompute: selective`` replays, as units of advisor.cost.recompute.UNITS; None: the units the
    training setting ``recompute_modules`` names (Megatron's --recompute-modules)."""
    recompute_layer_counts: str | None
    """How many layers a stage recomputes can be given: "per_stage" (MindFormers' recompute and
    select_recompute lists), "uniform" (Megatron's --recompute-num-layers with --recompute-method block),
    None (all layers or none: the PyTorch stacks; advisor.search.vpipe)."""
    selective_layer_counts: bool
    """A per-stage layer count applies to selective recomputation too (MindFormers' select_recompute)."""

    # ---- memory -------------------------------------------------------------------------------
    reshards_under_pipeline: bool
    """ZeRO-3 frees the gathered weights after each micro-batch's forward also under pipeline parallelism;
    False: FSDP2 under pipelining keeps them for the step (torchtitan's default policy; advisor.cost.memory)."""
    grad_buffer_in_reduce_dtype: bool
    """The gradient buffer is kept in the reduction dtype (Megatron-Core's main_grad, fp32 for bf16 by
    default) rather than the compute dtype (advisor.cost.memory.state_bytes_per_param)."""
    fp16_grad_reduce_bytes: float
    """Bytes per gradient element reduced for fp16 models when the plan does not say
    (Megatron-LM reduces fp16 gradients in fp16 unless --accumulate-allreduce-grads-in-fp32; the others 4)."""
    bf16_grad_reduce_bytes: float
    """The same for bf16 models: 4 (Megatron-LM forces accumulate_allreduce_grads_in_fp32 for bf16 unless
    --grad-reduce-in-bf16), 2 for DeepSpeed (communication_data_type defaults to the model dtype:
    deepspeed/runtime/engine.py communication_data_type, v0.15-0.19)."""

    # ---- the input pipeline (advisor.cost.dataset) --------------------------------------------
    sample_bytes_per_token: float
    """Bytes one sample holds per token as the loader hands it over: Megatron's GPTDataset tokens, labels and
    position ids as int64 and the loss mask as float32 (28); int64 ids and labels (16); MindSpore's int32
    token ids (4)."""
    sample_extra_tokens: int
    """Tokens a sample holds beyond the sequence (MindFormers reads seq_length + 1 ids and shifts them)."""
    builds_attention_mask: bool
    """The loader builds an s x s boolean attention mask per sample for unfused attention (Megatron-LM
    unless --no-create-attention-mask-in-dataloader)."""
    reads_on_end_stages_only: bool
    """Only the first and last pipeline stages read samples, once per data- and context-parallel rank
    (Megatron's get_batch); otherwise every rank reads."""
    sinks_whole_step: bool
    """A step's samples go to the device at once (MindSpore's data sink) rather than a micro-batch at a time."""

    # ---- communication ------------------------------------------------------------------------
    gathers_under_next_forward: tuple[int, ...]
    """ZeRO stages whose updated weights are gathered under the next step's first forward (Megatron's
    --overlap-param-gather for ZeRO-1; MindSpore's optimizer parallel for ZeRO-1 and level2;
    advisor.cost.data_parallel)."""
    bucket_params: int | None
    """Default gradient bucket in parameters, at least bucket_params_per_dp_rank x dp (Megatron-Core's
    DistributedDataParallelConfig.bucket_size: max(40e6, 1e6 x dp)); None: bucket_mb."""
    bucket_params_per_dp_rank: int
    """See bucket_params."""
    bucket_mb: float
    """Default gradient bucket in MiB where bucket_params is None (PyTorch DDP's bucket_cap_mb 25;
    MindSpore comm_fusion's 64 MB threshold; advisor.cost.fusion)."""
    tp_overlap_slices: int | None
    """With tensor-parallel communication overlap: the slices a layer's collective and GEMM are split into
    (MindFormers' fine_grain_interleave: 2); None: tp chunks (Megatron's ring exchange; advisor.cost.layer_comm)."""
    overlaps_interleaved_p2p: bool
    """The interleaved schedule overlaps each chunk's sends and receives with the next chunk's compute
    (Megatron's --overlap-p2p-communication, on by default; advisor.cost.pipeline_p2p)."""

    # ---- the optimizer (advisor.cost.optimizer_step) ------------------------------------------
    optimizer_step: str
    """Whose kernels run the optimizer step (advisor.cost.optimizer_step.bytes_per_param): "torch" (fused
    Adam of Transformer Engine / Apex / torch.optim, or torch.optim's per-operation AdamW) or
    "mindformers" (MindSpore's AdamWeightDecay on fp32 weights with MindFormers' clipping, loss-scale
    division and MindSpore's gradient accumulation pass)."""
    offload_grads_at_step: bool
    """Optimizer offload copies the gradients to the host at the step (Megatron's HybridDeviceOptimizer)
    rather than per micro-batch as the backward produces them (DeepSpeed ZeRO-Offload; advisor.cost.offload)."""
    cpu_adam: str
    """Whose CPU Adam steps the offloaded optimizer on the host, the key of a profile's
    host.cpu_adam_params_per_s (advisor.cost.offload): "torch" (torch.optim.AdamW, Megatron-Core's
    HybridDeviceOptimizer cpu_optimizer_cls in megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py,
    and FSDP2's CPUOffloadPolicy, which steps the optimizer where the sharded parameters live), "deepspeed"
    (DeepSpeedCPUAdam, deepspeed/ops/adam/cpu_adam.py, which ZeRO-Offload builds) or "mindspore" (MindSpore's
    host optimizer)."""

    # ---- what it can run ----------------------------------------------------------------------
    recompute_modules: bool
    """Selective recomputation takes a list of modules (Megatron-Core --recompute-modules)."""
    cuda_graphs: bool
    """Per-layer CUDA graphs (Megatron-Core --cuda-graph-impl / --cuda-graph-scope)."""
    unfused_optimizer: bool
    """An unfused, per-operation optimizer step exists (torch.optim foreach, torchtitan implementation
    foreach, MindFormers AdamW use_fused False); Megatron-LM's Adam is always fused."""
    parameter_offload: bool
    """ZeRO-3 parameter offload (DeepSpeed offload_param, torchtitan enable_cpu_offload, MindSpore
    set_offload_context); Megatron-LM has none."""
    offload_fraction_zero_stages: tuple[int, ...]
    """ZeRO stages under which a share below 1 of the optimizer can be offloaded (Megatron
    --optimizer-offload-fraction; DeepSpeed offload_optimizer.ratio, ZeRO-3 only)."""
    host_embedding: bool
    """The word embedding, its lookup and its optimizer on the host (MindSpore Host&Device training)."""
    full_batch: bool
    """Every rank reads the whole global batch (MindSpore full_batch=True)."""
    multi_copy: bool
    """Micro-batches split into copies whose collectives overlap each other (MindSpore
    micro_batch_interleave_num)."""
    activation_swap: bool
    """Per-layer activation swapping to the host under pipelining (MindFormers swap_config layer_swap)."""
    zero_stages: tuple[int, ...]
    """ZeRO stages it runs without pipeline parallelism (0: replicated data parallelism)."""
    zero_stages_under_pipeline: tuple[int, ...]
    """ZeRO stages it runs with pp > 1: Megatron-LM's distributed optimizer (ZeRO-1) works under pipelining,
    Megatron FSDP (ZeRO-2/3) is documented with TP, CP and EP only (docs/source/api-guide/custom_fsdp.md,
    core_v0.15.0); DeepSpeed's pipeline engine asserts stage < 2 (runtime/pipe/engine.py, v0.15-0.19)."""
    optimizer_offload: bool
    """The optimizer states alone can move to the host (Megatron --optimizer-cpu-offload, DeepSpeed
    offload_optimizer, MindFormers optimizer swap); False: FSDP2's CPUOffloadPolicy moves the parameters and
    gradients with them (torch/distributed/fsdp/_fully_shard/_fsdp_api.py; torchtitan enable_cpu_offload)."""
    schedules: tuple[str, ...]
    """Pipeline schedules it runs (advisor.space.strategy.SCHEDULES): Megatron-LM has no GPipe; DeepSpeed's
    pipeline engine runs 1F1B only (runtime/pipe/schedule.py TrainSchedule); MindSpore's set_pipeline_config
    takes the gpipe scheduler only with pipeline_interleave on, which advisor prices as interleaved 1F1B."""
    uneven_stages: bool
    """Per-stage layer counts can differ (Megatron --pipeline-model-parallel-layout, torchtitan
    module_fqns_per_model_part, MindFormers offset); DeepSpeed's PipelineModule partitions 'uniform'ly or
    by 'parameters', so its plans split the layers evenly."""
    uneven_chunks: bool
    """With interleaving, a stage's layers need not split evenly over its virtual stages (Megatron
    --pipeline-model-parallel-layout, as the Llama 3.1 405B recipes give 126 layers over pp 8 x vpp 4 or 8;
    MindFormers offset per (chunk, stage); torchtitan module_fqns_per_model_part); advisor's executor and
    DeepSpeed need equal chunks."""
    cp_kinds: tuple[str, ...]
    """Context-parallel communication it runs (advisor.space.strategy.CP_COMM): Megatron --cp-comm-type p2p /
    a2a, MindFormers colossalai_cp / ulysses_cp, torchtitan's and PyTorch's ring attention only, DeepSpeed's
    Ulysses (all-to-all) only."""
    cp_unfused_attention: tuple[str, ...]
    """The context-parallel kinds it runs with the unfused (math) attention: none in Megatron-Core (its local
    DotProductAttention asserts context_parallel_size == 1, "Context parallelism is only supported by
    TEDotProductAttention!", transformer/dot_product_attention.py @core_v0.15.0) and in torchtitan and PyTorch
    (torch's context_parallel runs on SDPA's cuDNN, flash and memory-efficient kernels, torchtitan
    models/attention.py @v0.2.0); DeepSpeed's Ulysses wraps whatever local attention the model has
    (DistributedAttention). MindSpore is not restricted here (no source checked)."""
    cp_attention_kernels: tuple[str, ...]
    """The fused attention kernels (ATTENTION_KERNELS) its context parallelism runs on: Megatron-Core's only on
    Transformer Engine's (TEDotProductAttention, "Context parallelism is only supported by TEDotProductAttention!",
    transformer/dot_product_attention.py @core_v0.15.0), and on Ascend on MindSpeed's ring and Ulysses attention
    over npu_fusion_attention (--context-parallel-algo megatron_cp_algo / ulysses_cp_algo, Ascend/MindSpeed
    features_manager/context_parallel); PyTorch's and torchtitan's on SDPA only (torch's
    context_parallel puts its ring in place of the SDPA flash, memory-efficient and cuDNN operators only,
    torch/distributed/tensor/experimental/_context_parallel/_attention.py in torch 2.13; torchtitan
    models/attention.py @v0.2.0), so not on flash-attn 1.x's Triton kernel, which
    llm-foundry's attn_impl "triton" calls directly and which has no context-parallel form; DeepSpeed's Ulysses
    wraps whatever local attention the model has (DistributedAttention). MindSpore is not restricted here (no
    source checked)."""
    cp_under_pipeline: bool
    """Context parallelism together with pipeline parallelism (DeepSpeed's Ulysses sequence parallelism is not
    wired into its pipeline engine)."""
    sequence_parallel: tuple[bool, ...]
    """The values sequence parallelism can take with tp > 1: torchtitan's tensor-parallel plan always shards
    the norms along the sequence (True only); DeepSpeed has no Megatron-style sequence parallelism (False only)."""
    dtypes: tuple[str, ...]
    """Compute dtypes it trains in: no FP8 training in DeepSpeed's config or MindFormers (r1.8.0: "Not Support
    FP8 Training"); torchtitan trains in bfloat16 or float32, FP8 through its float8 converters, not fp16."""
    fp8_recipes: tuple[str, ...]
    """FP8 scaling recipes it runs (advisor.specs.job.FP8_RECIPES), its default first: Megatron-LM --fp8-recipe
    (delayed by default; core_v0.13-0.15 arguments.py); torchtitan 0.2's float8 converter (tensorwise) and
    mx converter (mxfp8; config/job_config.py); none where it has no FP8 training."""
    mesh_orders: tuple[tuple[str, ...], ...] | None
    """The rank orders it builds its groups in, outermost first (advisor.space.strategy.MESH_DIMS); None: any
    (advisor's executor builds the plan's mesh). Megatron-LM: tp-cp-ep-dp-pp, or tp-cp-ep-pp-dp with
    --use-tp-pp-dp-mapping; DeepSpeed: pipe > data > model; torchtitan: pp > dp > cp > tp; MindSpore: stages
    outermost, model parallelism innermost."""
    experts_from_sharded_dp: bool
    """Expert parallelism borrows ranks from the FSDP shard dimension (torchtitan parallel_dims.py): ep > 1
    needs sharded data parallelism (ZeRO >= 1) and ep a multiple of cp."""
    recompute_kinds: tuple[str, ...] = ("none", "selective", "full")
    """Recomputation policies it launches (advisor.space.strategy.RECOMPUTE): DeepSpeed's config checkpoints
    every layer in full or none (activation_checkpointing with deepspeed.checkpointing in the model, or the
    pipeline engine's activation_checkpoint_interval 1; runtime/activation_checkpointing/config.py, v0.15-0.19):
    its selective recomputation is Megatron-DeepSpeed's model code, which the export cannot write."""
    shards_over_cp: bool = False
    """Its data parallelism shards the parameters over dp x cp whenever cp > 1, so it has no replicated data
    parallelism with context parallelism (torchtitan: ParallelDims.fsdp_enabled = dp_shard or cp enabled, and
    apply_fsdp over the dp_shard_cp mesh; distributed/parallel_dims.py, models/llama3/infra/parallelize.py, v0.2.0)."""
    recompute_some_layers: bool = True
    """Recomputation can cover some of a stage's layers (Megatron --recompute-num-layers, MindFormers' per-stage
    lists, advisor's executor); DeepSpeed's config checkpoints every layer or none."""
    sliding_window: bool = True
    """Sliding-window attention runs (Megatron-LM --window-size / --window-attn-skip-freq from Megatron-Core 0.15
    on: megatron/training/arguments.py at core_v0.15.0; absent at core_v0.13.0 and core_v0.14.0)."""
    activation_swap_absent: str = ""
    """Why it has no per-layer activation swap, where a user may expect one (the export's sentence when a plan
    carries swapped layers)."""

    # ---- releases -----------------------------------------------------------------------------
    releases: tuple[str, ...] = ()
    """The releases the record can be narrowed to (the training setting ``framework_release``), oldest first;
    the record itself describes the newest. Empty: one record for every release it names in its docstring."""
    release_changes: tuple[tuple[str, tuple[tuple[str, object], ...]], ...] = ()
    """(release, ((field, value), ...)): what an older release runs differently from the newest, each change with
    the release's source in the record's comment (for_release applies them)."""
    release: str | None = None
    """The release this record describes (None: the only one)."""

    @property
    def label(self) -> str:
        """The name as messages give it: with the release where narrowed to an older one ("megatron 0.13")."""
        older = self.releases and self.release is not None and self.release != self.releases[-1]
        return f"{self.name} {self.release}" if older else self.name


MEGATRON = Framework(
    name="megatron", title="Megatron-LM",
    fused_kernels=True, one_qkv_weight=True, norm_fused_linears=True, quantized_saved_inputs=True, attention_kernel="te", attention_kernels=("te", "npu"), expert_gemm_per_expert=True,
    keeps_gathered_sp_inputs=False, loss_logit_bytes=(4.0, None), selective_recompute=None,
    recompute_layer_counts="uniform", selective_layer_counts=False,
    reshards_under_pipeline=True, grad_buffer_in_reduce_dtype=True, fp16_grad_reduce_bytes=2.0, bf16_grad_reduce_bytes=4.0,
    sample_bytes_per_token=8.0 + 8.0 + 4.0 + 8.0, sample_extra_tokens=0, builds_attention_mask=True,
    reads_on_end_stages_only=True, sinks_whole_step=False,
    gathers_under_next_forward=(1,), bucket_params=40_000_000, bucket_params_per_dp_rank=1_000_000, bucket_mb=25.0,
    tp_overlap_slices=None, overlaps_interleaved_p2p=True,
    optimizer_step="torch", offload_grads_at_step=True, cpu_adam="torch",
    recompute_modules=True, cuda_graphs=True, unfused_optimizer=False, parameter_offload=False,
    offload_fraction_zero_stages=(0, 1, 2, 3), host_embedding=False, full_batch=False, multi_copy=False,
    activation_swap=False,
    # TransformerConfig.__post_init__ refuses cpu_offloading with pp > 1 (core_v0.13-0.15), and without pipelining
    # Megatron-LM's command line has no flag for it before core_v0.16.0 (--cpu-offloading-num-layers,
    # megatron/training/arguments.py, commit 310671436c): Megatron-Bridge's recipes set it in Python
    activation_swap_absent=("Megatron-Core refuses cpu_offloading under pipeline parallelism, and without it "
                            "Megatron-LM 0.13-0.15 has no command-line flag for it (--cpu-offloading-num-layers "
                            "arrives in core_v0.16.0)"),
    zero_stages=(0, 1, 2, 3), zero_stages_under_pipeline=(0, 1), optimizer_offload=True,
    schedules=("1f1b", "interleaved-1f1b"), uneven_stages=True, uneven_chunks=True, cp_kinds=("p2p", "a2a"),
    cp_unfused_attention=(), cp_attention_kernels=("te", "npu"), cp_under_pipeline=True,
    sequence_parallel=(False, True), dtypes=("fp32", "tf32", "fp16", "bf16", "fp8"),
    fp8_recipes=("delayed", "tensorwise", "mxfp8", "blockwise", "nvfp4"),
    mesh_orders=(("pp", "dp", "cp", "tp"), ("dp", "pp", "cp", "tp")), experts_from_sharded_dp=False,
    # Megatron-Core releases (NVIDIA/Megatron-LM tags core_v0.13.0, core_v0.14.0, core_v0.15.0, megatron/training/
    # arguments.py; the same tables advisor.export.megatron writes flags from): Megatron FSDP (--use-megatron-fsdp with
    # the fsdp_dtensor checkpoint format, which ZeRO-2/3 plans launch with) first appears in 0.14, --window-size and
    # --fp4-format (NVFP4) in 0.15
    releases=("0.13", "0.14", "0.15"), release="0.15",
    release_changes=(
        ("0.13", (("zero_stages", (0, 1)), ("sliding_window", False),
                  ("fp8_recipes", ("delayed", "tensorwise", "mxfp8", "blockwise")))),
        ("0.14", (("sliding_window", False), ("fp8_recipes", ("delayed", "tensorwise", "mxfp8", "blockwise")))),
    ),
)

PYTORCH = Framework(
    name="pytorch", title="PyTorch",
    fused_kernels=False, one_qkv_weight=False, norm_fused_linears=False, quantized_saved_inputs=False, attention_kernel="sdpa", attention_kernels=ATTENTION_KERNELS, expert_gemm_per_expert=False,
    keeps_gathered_sp_inputs=True, loss_logit_bytes=(None, None), selective_recompute=("core_attn",),
    recompute_layer_counts=None, selective_layer_counts=False,
    reshards_under_pipeline=True, grad_buffer_in_reduce_dtype=False, fp16_grad_reduce_bytes=4.0, bf16_grad_reduce_bytes=4.0,
    sample_bytes_per_token=8.0 + 8.0, sample_extra_tokens=0, builds_attention_mask=False,
    reads_on_end_stages_only=False, sinks_whole_step=False,
    gathers_under_next_forward=(), bucket_params=None, bucket_params_per_dp_rank=0, bucket_mb=25.0,
    tp_overlap_slices=None, overlaps_interleaved_p2p=False,
    optimizer_step="torch", offload_grads_at_step=False, cpu_adam="torch",
    recompute_modules=False, cuda_graphs=False, unfused_optimizer=True, parameter_offload=True,
    offload_fraction_zero_stages=(), host_embedding=False, full_batch=False, multi_copy=False,
    activation_swap=False,
    zero_stages=(0, 1, 2, 3), zero_stages_under_pipeline=(0, 1, 2, 3), optimizer_offload=False,
    schedules=("gpipe", "1f1b", "interleaved-1f1b"), uneven_stages=True, uneven_chunks=False, cp_kinds=("p2p",),
    cp_unfused_attention=(), cp_attention_kernels=("sdpa",), cp_under_pipeline=True,
    sequence_parallel=(False, True), dtypes=("fp32", "tf32", "fp16", "bf16", "fp8"), mesh_orders=None,
    fp8_recipes=("delayed", "tensorwise", "mxfp8", "blockwise"), experts_from_sharded_dp=False,
)

# torchtitan runs the PyTorch stack with its own policies: op-level selective checkpointing, FSDP2 keeping the
# gathered weights under pipelining, the loss in fp32 (advisor.cost.activations), and no partial optimizer offload;
# its data parallelism is DDP or FSDP2 (no optimizer-only sharding), its tensor parallelism always sequence-parallel
TORCHTITAN = replace(
    PYTORCH, name="torchtitan", title="torchtitan", loss_logit_bytes=(4.0, 8.0), selective_recompute=("op_sac",),
    attention_kernels=("sdpa",),
    reshards_under_pipeline=False, zero_stages=(0, 2, 3), zero_stages_under_pipeline=(0, 2, 3), uneven_chunks=True,
    sequence_parallel=(True,), dtypes=("fp32", "tf32", "bf16", "fp8"), fp8_recipes=("tensorwise", "mxfp8"),
    mesh_orders=(("pp", "dp", "cp", "tp"),), experts_from_sharded_dp=True, shards_over_cp=True,
)

# DeepSpeed runs the PyTorch stack (eager kernels, torch's attention) with its own data parallelism: ZeRO 0-3
# (ZeRO-0/1 under its pipeline engine), 5e8-element reduce buckets (zero/config.py reduce_bucket_size),
# gradients reduced in the model dtype by default, optimizer offload (a share below 1 with ZeRO-3 only:
# zero/config.py asserts "Partial offloading only supported for ZeRO Stage 3"), parameter offload with ZeRO-3
DEEPSPEED = replace(
    PYTORCH, name="deepspeed", title="DeepSpeed", bucket_params=500_000_000, bucket_params_per_dp_rank=0, cpu_adam="deepspeed",
    bf16_grad_reduce_bytes=2.0, fp16_grad_reduce_bytes=2.0, offload_fraction_zero_stages=(3,),
    zero_stages=(0, 1, 2, 3), zero_stages_under_pipeline=(0, 1), optimizer_offload=True, schedules=("1f1b",),
    uneven_stages=False, cp_kinds=("a2a",), cp_unfused_attention=("a2a",), cp_attention_kernels=ATTENTION_KERNELS,
    cp_under_pipeline=False,
    sequence_parallel=(False,),
    dtypes=("fp32", "tf32", "fp16", "bf16"), fp8_recipes=(), mesh_orders=(("pp", "dp", "cp", "tp"),),
    recompute_kinds=("none", "full"), recompute_some_layers=False,
)

MINDSPORE = Framework(
    name="mindspore", title="MindSpore",
    fused_kernels=True, one_qkv_weight=False, norm_fused_linears=False, quantized_saved_inputs=False, attention_kernel="npu", attention_kernels=("npu",), expert_gemm_per_expert=False,
    keeps_gathered_sp_inputs=False, loss_logit_bytes=(4.0, 4.0), selective_recompute=("ffn_act", "math_scores"),
    recompute_layer_counts="per_stage", selective_layer_counts=True,
    reshards_under_pipeline=True, grad_buffer_in_reduce_dtype=False, fp16_grad_reduce_bytes=4.0, bf16_grad_reduce_bytes=4.0,
    sample_bytes_per_token=4.0, sample_extra_tokens=1, builds_attention_mask=False,
    reads_on_end_stages_only=False, sinks_whole_step=True,
    gathers_under_next_forward=(1, 2), bucket_params=None, bucket_params_per_dp_rank=0, bucket_mb=64.0,
    tp_overlap_slices=2, overlaps_interleaved_p2p=False,
    optimizer_step="mindformers", offload_grads_at_step=False, cpu_adam="mindspore",
    recompute_modules=False, cuda_graphs=False, unfused_optimizer=True, parameter_offload=True,
    offload_fraction_zero_stages=(), host_embedding=True, full_batch=True, multi_copy=True,
    activation_swap=True,
    zero_stages=(0, 1, 2, 3), zero_stages_under_pipeline=(0, 1, 2, 3), optimizer_offload=True,
    schedules=("1f1b", "interleaved-1f1b"), uneven_stages=True, uneven_chunks=True, cp_kinds=("p2p", "a2a"),
    cp_unfused_attention=("p2p", "a2a"), cp_attention_kernels=ATTENTION_KERNELS, cp_under_pipeline=True,
    sequence_parallel=(False, True),
    dtypes=("fp32", "fp16", "bf16"), fp8_recipes=(),
    mesh_orders=(("pp", "dp", "cp", "tp"),), experts_from_sharded_dp=False,
)

FRAMEWORKS: dict[str, Framework] = {f.name: f for f in (MEGATRON, PYTORCH, TORCHTITAN, DEEPSPEED, MINDSPORE)}


def for_release(record: Framework, release: str | None) -> Framework:
    """The record narrowed to one of its releases (None: the record as it is, its newest release)."""
    if release is None or release == record.release:
        return record
    record = FRAMEWORKS.get(record.name, record)      # the changes are from the newest release's record
    if release == record.release:
        return record
    if release not in record.releases:
        known = ", ".join(record.releases) if record.releases else "none (one record for all its releases)"
        # the job's checks refuse an unknown release first (advisor.specs.job.check_job_relations, AdvisorError)
        raise ValueError(f"framework release {release[:20]!r}: {record.title} records the releases {known}")
    changes = dict(dict(record.release_changes).get(release, ()))
    return replace(record, release=release, **changes)


def frameworks_with(capability: str) -> str:
    """The frameworks whose record has ``capability`` set, for messages: 'pytorch, torchtitan or mindspore'."""
    names = [f.name for f in FRAMEWORKS.values() if getattr(f, capability)]
    return " or ".join(names) if len(names) < 3 else f"{', '.join(names[:-1])} or {names[-1]}"
