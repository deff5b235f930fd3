"""A Megatron-Bridge configuration (``ConfigContainer`` as YAML) as advisor's settings (``--from FILE``).

Megatron-Bridge writes the whole configuration of a run as ``run_config.yaml`` beside every checkpoint
(training/utils/checkpoint_utils.py CONFIG_FILE) and ``ConfigContainer.to_yaml()`` prints the same; its recipes
take override files of the same structure (``--config-file``). The sections are dataclasses whose fields are
Megatron-Core's (model: TransformerConfig and GPTModelProvider, ddp: DistributedDataParallelConfig, optimizer:
OptimizerConfig) under the names Megatron-LM's arguments use, so each priced key is read as the Megatron-LM flag
it stands for (the translation below, after Megatron-Bridge's own scripts/translate_mlm_to_bridge.py) and the
flags go through advisor.importers.megatron_args: one reading of Megatron's settings for both launchers.

Every key is read, listed as price-neutral with its reason, whole sections that name data, logging, checkpoints
or hyper-parameters are neutral, and any other key is accepted only at the default of its dataclass (transcribed
in advisor.importers._bridge_defaults from Megatron-LM core_v0.15.0 and Megatron-Bridge v0.2.0, the release
pairing advisor's Megatron record targets); any other value is refused naming the file, the key and the value.
A serialised callable or dtype (``_target_``) is read by its name only; nothing in the file is imported or run.
"""

from __future__ import annotations

from typing import Any

from advisor.errors import AdvisorError
from advisor.importers._bridge_defaults import DEFAULTS, UNKNOWN
from advisor.importers.imported import Imported, refuse, where
from advisor.importers.megatron_args import read_megatron
from advisor.specs.untrusted import check_tree, parse, prefix

# ConfigContainer sections that do not change a step's time or memory as advisor prices it, and why
NEUTRAL_SECTIONS = {
    "rng": "reproducibility", "rerun_state_machine": "fault handling", "validation": "evaluation",
    "scheduler": "the learning-rate schedule, a hyper-parameter", "logger": "logging", "tokenizer": "tokenisation",
    "checkpoint": "checkpoints", "profiling": "profiling", "ft": "fault tolerance", "straggler": "straggler detection",
    "nvrx_straggler": "straggler detection", "inprocess_restart": "fault tolerance", "tensor_inspect": "debugging",
    "env_vars": "the process environment (NCCL and CUDA tuning is the hardware profile's)",
    "optimizer_config_override_provider": "per-parameter hyper-parameters", "dataset": "the data",
}
KNOWN_SECTIONS = {"model", "train", "ddp", "optimizer", "dist", "mixed_precision", "comm_overlap", "peft",
                  "dataset", *NEUTRAL_SECTIONS}

# key -> Megatron-LM flag: "value" passes the value, "switch" writes the flag when true, "invert" when false
VALUE, SWITCH, INVERT = "value", "switch", "invert"
FLAGS: dict[str, tuple[str, str]] = {
    # the model's shape (checked against --model)
    "model.num_layers": ("--num-layers", VALUE), "model.hidden_size": ("--hidden-size", VALUE),
    "model.ffn_hidden_size": ("--ffn-hidden-size", VALUE),
    "model.num_attention_heads": ("--num-attention-heads", VALUE),
    "model.num_query_groups": ("--num-query-groups", VALUE), "model.kv_channels": ("--kv-channels", VALUE),
    "model.vocab_size": ("--vocab-size", VALUE),
    "model.position_embedding_type": ("--position-embedding-type", VALUE),
    "model.normalization": ("--normalization", VALUE),
    "model.share_embeddings_and_output_weights": ("--untie-embeddings-and-output-weights", INVERT),
    "model.add_bias_linear": ("--disable-bias-linear", INVERT),
    "model.num_moe_experts": ("--num-experts", VALUE), "model.moe_router_topk": ("--moe-router-topk", VALUE),
    "model.moe_ffn_hidden_size": ("--moe-ffn-hidden-size", VALUE),
    "model.moe_shared_expert_intermediate_size": ("--moe-shared-expert-intermediate-size", VALUE),
    "model.moe_layer_freq": ("--moe-layer-freq", VALUE),
    "model.multi_latent_attention": ("--multi-latent-attention", SWITCH),
    "model.q_lora_rank": ("--q-lora-rank", VALUE), "model.kv_lora_rank": ("--kv-lora-rank", VALUE),
    "model.qk_head_dim": ("--qk-head-dim", VALUE), "model.qk_pos_emb_head_dim": ("--qk-pos-emb-head-dim", VALUE),
    "model.v_head_dim": ("--v-head-dim", VALUE),
    "model.window_size": ("--window-size", VALUE), "model.window_attn_skip_freq": ("--window-attn-skip-freq", VALUE),
    # the layout
    "model.tensor_model_parallel_size": ("--tensor-model-parallel-size", VALUE),
    "model.pipeline_model_parallel_size": ("--pipeline-model-parallel-size", VALUE),
    "model.context_parallel_size": ("--context-parallel-size", VALUE),
    "model.expert_model_parallel_size": ("--expert-model-parallel-size", VALUE),
    "model.expert_tensor_parallel_size": ("--expert-tensor-parallel-size", VALUE),
    "model.virtual_pipeline_model_parallel_size": ("--num-virtual-stages-per-pipeline-rank", VALUE),
    "model.num_layers_in_first_pipeline_stage": ("--decoder-first-pipeline-num-layers", VALUE),
    "model.num_layers_in_last_pipeline_stage": ("--decoder-last-pipeline-num-layers", VALUE),
    "model.account_for_embedding_in_pipeline_split": ("--account-for-embedding-in-pipeline-split", SWITCH),
    "model.account_for_loss_in_pipeline_split": ("--account-for-loss-in-pipeline-split", SWITCH),
    "model.pipeline_model_parallel_layout": ("--pipeline-model-parallel-layout", VALUE),
    "model.sequence_parallel": ("--sequence-parallel", SWITCH),
    "model.cp_comm_type": ("--cp-comm-type", VALUE),
    "model.seq_length": ("--seq-length", VALUE), "dataset.seq_length": ("--seq-length", VALUE),
    "dataset.sequence_length": ("--seq-length", VALUE),
    "train.micro_batch_size": ("--micro-batch-size", VALUE), "train.global_batch_size": ("--global-batch-size", VALUE),
    # memory and runtime
    "model.recompute_granularity": ("--recompute-granularity", VALUE),
    "model.recompute_method": ("--recompute-method", VALUE),
    "model.recompute_num_layers": ("--recompute-num-layers", VALUE),
    "model.recompute_modules": ("--recompute-modules", VALUE),
    "model.attention_dropout": ("--attention-dropout", VALUE), "model.hidden_dropout": ("--hidden-dropout", VALUE),
    "model.moe_expert_capacity_factor": ("--moe-expert-capacity-factor", VALUE),
    "model.moe_pad_expert_input_to_capacity": ("--moe-pad-expert-input-to-capacity", SWITCH),
    "model.tp_comm_overlap": ("--tp-comm-overlap", SWITCH), "comm_overlap.tp_comm_overlap": ("--tp-comm-overlap", SWITCH),
    "ddp.use_distributed_optimizer": ("--use-distributed-optimizer", SWITCH),
    "optimizer.use_distributed_optimizer": ("--use-distributed-optimizer", SWITCH),
    "ddp.overlap_grad_reduce": ("--overlap-grad-reduce", SWITCH),
    "comm_overlap.overlap_grad_reduce": ("--overlap-grad-reduce", SWITCH),
    "ddp.overlap_param_gather": ("--overlap-param-gather", SWITCH),
    "ddp.bucket_size": ("--ddp-bucket-size", VALUE),
    "ddp.use_megatron_fsdp": ("--use-megatron-fsdp", SWITCH), "dist.use_megatron_fsdp": ("--use-megatron-fsdp", SWITCH),
    "ddp.use_custom_fsdp": ("--use-megatron-fsdp", SWITCH),
    "optimizer.optimizer": ("--optimizer", VALUE),
    "optimizer.optimizer_cpu_offload": ("--optimizer-cpu-offload", SWITCH),
    "dist.use_tp_pp_dp_mapping": ("--use-tp-pp-dp-mapping", SWITCH),
}
# keys read by a function of their own below
SPECIAL = {"model.activation_func", "model.gated_linear_unit", "model.attention_backend",
           "ddp.data_parallel_sharding_strategy", "ddp.grad_reduce_in_fp32", "optimizer.optimizer_offload_fraction",
           "model.overlap_moe_expert_parallel_comm", "comm_overlap.overlap_moe_expert_parallel_comm",
           "model.cuda_graph_impl", "model.cuda_graph_scope"}
# precision: the model's, optimizer's and DDP's copies of the mixed_precision section (Bridge writes one onto the
# others, training/mixed_precision.py update_config_with_precision_overrides), read together
PRECISION = ("bf16", "fp16", "fp8", "fp8_recipe", "fp8_param", "fp8_param_gather", "fp4", "params_dtype",
             "grad_reduce_in_fp32")
# the precision-aware optimizer's state dtypes (optimizer_config.py @core_v0.15.0, torch.float32 by default): what
# advisor prices, so only float32 is read
FP32_STATES = {f"optimizer.{k}" for k in ("main_grads_dtype", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype")}
_why_hyper = ("a hyper-parameter (initialisation, normalisation epsilon, rotary scaling, router losses; qk_layernorm: a "
              "norm over each head's query and key, elementwise work not in the price)")
_why_kernel = "kernel choice or fusion inside the framework record's pricing (Megatron-Core with Transformer Engine)"
_why_sched = "how the priced pipeline or overlap is scheduled, not what is sent or computed"
_why_fp8 = "FP8 scaling details under the priced FP8 recipe"
_why_run = "the run's identity, initialisation, inference or debugging, not a training step"
NEUTRAL_KEYS: dict[str, str] = {
    **{f"model.{k}": _why_hyper for k in (
        "rotary_base", "rotary_percent", "rotary_interleaved", "rotary_scaling_factor", "seq_len_interpolation_factor",
        "original_max_position_embeddings", "rope_type", "beta_fast", "beta_slow", "mscale", "mscale_all_dim",
        "init_method_std", "embedding_init_method_std", "layernorm_epsilon", "layernorm_zero_centered_gamma",
        "apply_query_key_layer_scaling", "attention_softmax_in_fp32", "softmax_scale", "moe_aux_loss_coeff",
        "moe_z_loss_coeff", "moe_input_jitter_eps", "moe_router_load_balancing_type", "moe_router_score_function",
        "moe_router_pre_softmax", "moe_router_topk_scaling_factor", "moe_router_enable_expert_bias",
        "moe_router_bias_update_rate", "moe_router_num_groups", "moe_router_group_topk", "moe_router_dtype",
        "moe_token_drop_policy", "mtp_loss_scaling_factor", "make_vocab_size_divisible_by", "should_pad_vocab",
        "calculate_per_token_loss", "fp16_lm_cross_entropy", "init_method", "output_layer_init_method",
        "embedding_init_method", "no_rope_freq", "qk_layernorm", "mrope_section", "glu_linear_offset", "activation_func_clamp_value")},
    **{f"model.{k}": _why_kernel for k in (
        "apply_rope_fusion", "bias_activation_fusion", "bias_dropout_fusion", "masked_softmax_fusion",
        "persist_layer_norm", "memory_efficient_layer_norm", "cross_entropy_loss_fusion", "cross_entropy_fusion_impl",
        "gradient_accumulation_fusion", "moe_permute_fusion", "moe_router_fusion", "moe_grouped_gemm",
        "moe_use_legacy_grouped_gemm", "fused_single_qkv_rope", "use_te_activation_func", "use_te_rng_tracker",
        "use_transformer_engine_full_layer_spec", "use_transformer_engine_op_fuser", "transformer_layer_spec",
        "moe_token_dispatcher_type", "moe_shared_expert_overlap", "disable_parameter_transpose_cache",
        "activation_func_fp8_input_store", "moe_router_padding_for_fp8", "symmetric_ar_type",
        "async_tensor_model_parallel_allreduce", "tp_comm_bootstrap_backend", "tp_comm_overlap_cfg",
        "tp_comm_overlap_ag", "tp_comm_overlap_rs", "tp_comm_bulk_dgrad", "tp_comm_bulk_wgrad", "tp_comm_split_ag",
        "tp_comm_split_rs", "tp_comm_atomic_ag", "tp_comm_atomic_rs", "tp_comm_overlap_rs_dgrad",
        "tp_comm_overlap_disable_qkv", "tp_comm_overlap_disable_fc1", "tp_only_amax_red", "cuda_graph_warmup_steps",
        "cuda_graph_use_single_mempool", "cuda_graph_retain_backward_graph")},
    **{f"model.{k}": _why_sched for k in (
        "deallocate_pipeline_outputs", "batch_p2p_comm", "batch_p2p_sync", "overlap_p2p_comm",
        "overlap_p2p_comm_warmup_flush", "microbatch_group_size_per_vp_stage", "pipeline_dtype",
        "variable_seq_lengths", "pipeline_model_parallel_comm_backend", "scatter_embedding_sequence_parallel",
        "defer_embedding_wgrad_compute", "wgrad_deferral_limit", "clone_scatter_output_in_embedding",
        "finalize_model_grads_func", "grad_scale_func", "no_sync_func", "grad_sync_func", "param_sync_func",
        "parallel_output", "timers", "barrier_with_L1_time")},
    **{f"model.{k}": _why_fp8 for k in (
        "fp8_margin", "fp8_interval", "fp8_amax_history_len", "fp8_amax_compute_algo", "first_last_layers_bf16",
        "num_layers_at_start_in_bf16", "num_layers_at_end_in_bf16", "autocast_dtype", "enable_autocast")},
    **{f"model.{k}": _why_run for k in (
        "hf_model_id", "generation_config", "config_logger_dir", "test_mode", "perform_initialization",
        "use_cpu_initialization", "init_model_with_meta_device", "restore_modelopt_state", "hetereogenous_dist_checkpoint",
        "inference_rng_tracker", "inference_sampling_seed", "flash_decode", "mlp_chunks_for_prefill", "cache_mla_latents",
        "moe_per_layer_logging", "mtp_enabled", "_target_")},
    **{f"ddp.{k}": why for k, why in {
        "check_for_nan_in_grad": "a check", "check_for_large_grads": "a check",
        "average_in_collective": "one scaling of the gradients", "gradient_reduce_div_fusion": _why_kernel,
        "pad_buckets_for_high_nccl_busbw": _why_sched, "align_param_gather": _why_sched,
        "suggested_communication_unit_size": _why_sched, "preserve_fp32_weights": "read with the precision",
        "keep_fp8_transpose_cache": _why_fp8, "reuse_grad_buf_for_mxfp8_param_ag": _why_fp8,
        "disable_symmetric_registration": _why_kernel, "fsdp_double_buffer": _why_sched, "_target_": _why_run,
        "delay_wgrad_compute": _why_sched}.items()},
    **{f"optimizer.{k}": _why_hyper for k in (
        "lr", "min_lr", "decoupled_lr", "decoupled_min_lr", "adam_beta1", "adam_beta2", "adam_eps", "weight_decay",
        "decoupled_weight_decay", "clip_grad", "sgd_momentum", "loss_scale", "initial_loss_scale", "min_loss_scale",
        "loss_scale_window", "hysteresis")},
    **{f"optimizer.{k}": why for k, why in {
        "log_num_zeros_in_grad": "logging", "barrier_with_L1_time": "logging", "timers": "logging",
        "config_logger_dir": "logging", "overlap_param_gather_with_optimizer_step": _why_sched,
        "overlap_param_gather": _why_sched, "overlap_cpu_optimizer_d2h_h2d": _why_sched, "pin_cpu_grads": _why_sched,
        "pin_cpu_params": _why_sched, "use_torch_optimizer_for_cpu_offload": _why_kernel,
        "store_param_remainders": "read with the precision", "reuse_grad_buf_for_mxfp8_param_ag": _why_fp8,
        "use_precision_aware_optimizer": "read with the optimizer-state dtypes", "_target_": _why_run}.items()},
    **{f"train.{k}": "the run's length, evaluation or memory housekeeping, not a step" for k in (
        "train_iters", "train_samples", "exit_interval", "exit_duration_in_mins", "exit_signal", "exit_signal_handler",
        "exit_signal_handler_for_dataloader", "eval_interval", "eval_iters", "manual_gc", "manual_gc_interval",
        "manual_gc_eval", "skip_train", "iterations_to_skip", "train_sync_interval", "empty_unused_memory_level",
        "check_weight_hash_across_dp_replicas_interval", "_target_")},
    **{f"dist.{k}": "process-group set-up, not a step" for k in (
        "distributed_backend", "distributed_timeout_minutes", "align_grad_reduce", "lazy_init", "local_rank",
        "use_gloo_process_groups", "nccl_communicator_config_path", "external_gpu_device_mapping",
        "high_priority_stream_groups", "disable_jit_fuser", "enable_megatron_core_experimental", "_target_")},
    **{f"mixed_precision.{k}": _why_fp8 for k in (
        "fp8_margin", "fp8_amax_history_len", "fp8_amax_compute_algo", "first_last_layers_bf16",
        "num_layers_at_start_in_bf16", "num_layers_at_end_in_bf16", "autocast_dtype", "autocast_enabled",
        "pipeline_dtype", "reuse_grad_buf_for_mxfp8_param_ag", "fp4_recipe", "hysteresis", "initial_loss_scale",
        "loss_scale", "loss_scale_window", "min_loss_scale", "_target_")},
    **{f"comm_overlap.{k}": _why_sched for k in (
        "tp_comm_overlap_cfg", "tp_comm_bootstrap_backend", "overlap_p2p_comm", "batch_p2p_comm", "align_param_gather",
        "defer_embedding_wgrad_compute", "wgrad_deferral_limit", "overlap_param_gather",
        "overlap_param_gather_with_optimizer_step", "data_parallel_size", "bucket_size", "delay_wgrad_compute",
        "_target_")},
}
# Megatron-Bridge's named mixed-precision recipes (training/mixed_precision.py @v0.2.0), as the fields they set
_BF16 = {"bf16": True, "grad_reduce_in_fp32": True}
NAMED_PRECISION = {
    "bf16_mixed": _BF16,
    "fp16_mixed": {"fp16": True, "grad_reduce_in_fp32": False},
    "bf16_with_fp8_delayed_scaling_mixed": {**_BF16, "fp8": "hybrid", "fp8_recipe": "delayed", "fp8_param_gather": True},
    "bf16_with_mxfp8_mixed": {**_BF16, "fp8": "hybrid", "fp8_recipe": "mxfp8", "fp8_param_gather": True},
    "bf16_with_fp8_current_scaling_mixed": {**_BF16, "fp8": "hybrid", "fp8_recipe": "tensorwise",
                                            "fp8_param_gather": True},
    "bf16_with_fp8_subchannel_scaling_mixed": {**_BF16, "fp8": "hybrid", "fp8_recipe": "blockwise",
                                               "fp8_param_gather": False},
    "bf16_with_nvfp4_mixed": {**_BF16, "fp4": "e2m1", "fp8_param_gather": False},
}
# Megatron-Core's attention backends (transformer/enums.py AttnBackend) -> --attention-backend
# (transformer/enums.py @core_v0.15.0: Bridge serialises an enum as {_target_: its class, _args_: [its value]})
ATTENTION_BACKENDS = {1: "flash", 2: "fused", 3: "unfused", 4: "local", 5: "auto"}
ACTIVATIONS = {"silu": "silu", "gelu": "gelu"}


def is_bridge_config(doc: Any) -> bool:
    """Whether a parsed YAML document is a Megatron-Bridge ConfigContainer (its ``train``/``ddp``/``model``
    sections) rather than a MindFormers YAML (``parallel_config``, ``model.model_config``)."""
    if not isinstance(doc, dict) or "parallel_config" in doc or "runner_config" in doc:
        return False
    model = doc.get("model")
    in_model = isinstance(model, dict) and "model_config" not in model and (
        "tensor_model_parallel_size" in model or "num_layers" in model)
    return in_model or any(k in doc for k in ("train", "ddp", "mixed_precision", "comm_overlap"))


def _target(value: Any) -> str | None:
    """The name a serialised callable or dtype gives ({_target_: torch.nn.functional.silu} -> "silu"), or None."""
    if isinstance(value, dict) and isinstance(value.get("_target_"), str):
        return str(value["_target_"]).rsplit(".", 1)[-1]
    if isinstance(value, str):
        return value.rsplit(".", 1)[-1]
    return None


def _default(key: str) -> Any:
    section, _, name = key.partition(".")
    return DEFAULTS.get(section, {}).get(name, UNKNOWN)


def read_bridge(text: str, source: str) -> Imported:
    """The settings a Megatron-Bridge ConfigContainer YAML gives (module docstring)."""
    doc = parse(text, where(source), "yaml")
    check_tree(doc, where(source))
    if not isinstance(doc, dict):
        raise AdvisorError(f"{where(source)}: a Megatron-Bridge configuration is a mapping of sections")
    for section, value in doc.items():
        if section not in KNOWN_SECTIONS and section != "_target_":
            raise refuse(source, section, "...", "not a Megatron-Bridge ConfigContainer section advisor knows")
        if section == "peft" and value is not None:
            raise refuse(source, "peft", _target(value) or value, "parameter-efficient fine-tuning; advisor prices "
                         "training every parameter")
        if value is not None and not isinstance(value, dict) and not (section == "mixed_precision"
                                                                     and isinstance(value, str)):
            raise refuse(source, section, value, "a ConfigContainer section is a mapping of its fields")
    precision = doc.get("mixed_precision")
    if isinstance(precision, str):
        name = precision.replace("-", "_")
        if name not in NAMED_PRECISION:
            raise refuse(source, "mixed_precision", precision, f"not a recipe advisor prices "
                         f"({', '.join(NAMED_PRECISION)})")
        doc = {**doc, "mixed_precision": dict(NAMED_PRECISION[name])}
    # section.key -> value, one level down: a mapping value is one serialised object (a callable, a dtype, an
    # enum, a sub-config) read by its key
    flat = {f"{section}.{k}": v for section, body in doc.items() if isinstance(body, dict) for k, v in body.items()}
    flags: dict[str, tuple[list[str], str]] = {}       # flag -> (its values, the key that gave it)
    job: dict[str, Any] = {}

    def give(flag: str, values: list[str], key: str) -> None:
        if flag in flags and flags[flag][0] != values:
            other = flags[flag][1]
            raise AdvisorError(f"{where(source)}: {key} = {prefix(' '.join(values) or 'true')} disagrees with "
                               f"{other} = {prefix(' '.join(flags[flag][0]) or 'true')}")
        flags.setdefault(flag, (values, key))

    precision_given = isinstance(doc.get("mixed_precision"), dict)
    for key, value in flat.items():
        section, _, name = key.partition(".")
        if value is None or name == "_target_" or key in NEUTRAL_KEYS or key in SPECIAL:
            continue
        if section in NEUTRAL_SECTIONS and key not in FLAGS:
            continue
        if name in PRECISION and section in ("model", "optimizer", "ddp", "mixed_precision"):
            continue                                   # read together in _precision
        if precision_given and section in ("model", "optimizer", "ddp") and name in DEFAULTS["mixed_precision"]:
            continue                                   # mixed_precision's value is the one that runs
        if key in FLAGS and _inert(key, flat):
            continue
        if key in FLAGS:
            flag, how = FLAGS[key]
            if how == VALUE:
                give(flag, _values(value, key, source), key)
            elif not isinstance(value, bool):
                raise refuse(source, key, value, "takes true or false")
            elif value == (how == SWITCH):
                give(flag, [], key)
            continue
        if key in FP32_STATES:
            if _dtype(value) != "fp32":
                raise refuse(source, key, _shown(value), "advisor prices the optimizer's master weights, gradients "
                             "and moments in float32 (the precision-aware optimizer's default)")
            continue
        default = _default(key)
        if default == UNKNOWN:
            raise refuse(source, key, _shown(value), "a setting advisor does not price")
        if value != default:
            raise refuse(source, key, _shown(value), f"a setting advisor does not price at this value "
                         f"(Megatron-Core's default: {default})")
    _special(flat, give, job, source)
    _precision(flat, give, source)
    words: list[str] = []
    for flag, (values, _key) in flags.items():
        words += [flag, *values]
    try:
        imported = read_megatron(" ".join(_quote(w) for w in words), source)
    except AdvisorError as exc:
        raise AdvisorError(_as_keys(str(exc), flags)) from None
    return Imported(source=source, framework="megatron", job={**imported.job, **job}, strategy=imported.strategy,
                    nodes=None, devices=None, model=imported.model)


def _inert(key: str, flat: dict) -> bool:
    """A key that means nothing without the one it qualifies (a dump holds every field): the MoE fields without
    experts, the latent-attention widths without multi-latent attention, the window's skip without a window."""
    if key.startswith("model.moe_") or key in ("model.expert_tensor_parallel_size",):
        return flat.get("model.num_moe_experts") in (None, 0)
    if key in ("model.q_lora_rank", "model.kv_lora_rank", "model.qk_head_dim", "model.qk_pos_emb_head_dim",
               "model.v_head_dim"):
        return not flat.get("model.multi_latent_attention")
    if key == "model.window_attn_skip_freq":
        return flat.get("model.window_size") is None
    return False


def _scalar(value: Any, key: str, source: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise refuse(source, key, _shown(value), "takes a number or a name")
    return str(value)


def _values(value: Any, key: str, source: str) -> list[str]:
    """A key's value as the words of its Megatron-LM flag: a list as its items (a window as "W,0")."""
    if isinstance(value, list):
        items = [_scalar(v, key, source) for v in value]
        return [",".join(items)] if key == "model.window_size" else items
    return [_scalar(value, key, source)]


def _shown(value: Any) -> Any:
    """A value as a message names it: a serialised object by its target."""
    return _target(value) or value if isinstance(value, dict) else value


def _quote(word: str) -> str:
    import shlex

    return shlex.quote(word)


def _as_keys(message: str, flags: dict[str, tuple[list[str], str]]) -> str:
    """A Megatron-LM importer message about a flag, naming the Bridge key that gave it too."""
    for flag, (_values, key) in flags.items():
        if flag in message:
            return message.replace(flag, f"{key} ({flag})", 1)
    return message


def _special(flat: dict, give, job: dict, source: str) -> None:
    """The keys read by what they mean rather than as one flag."""
    activation = _target(flat.get("model.activation_func")) if flat.get("model.activation_func") is not None else None
    gated = flat.get("model.gated_linear_unit", False)
    if activation is not None and activation not in ACTIVATIONS:
        raise refuse(source, "model.activation_func", activation, "advisor prices silu (SwiGLU) or gelu")
    if gated and activation not in (None, "silu"):
        raise refuse(source, "model.gated_linear_unit", f"true with {activation}", "advisor prices the gated unit "
                     "as SwiGLU (silu)")
    if gated:
        give("--swiglu", [], "model.gated_linear_unit")
    elif activation == "silu":
        raise refuse(source, "model.activation_func", "silu without gated_linear_unit", "advisor prices silu as "
                     "SwiGLU (gated) only")
    backend = _enum(flat.get("model.attention_backend"), ATTENTION_BACKENDS)
    if backend is not None:
        if backend not in ATTENTION_BACKENDS.values():
            raise refuse(source, "model.attention_backend", backend,
                         f"none of {', '.join(ATTENTION_BACKENDS.values())}")
        if backend != "local":
            give("--attention-backend", [backend], "model.attention_backend")
    use_fsdp = flat.get("ddp.use_megatron_fsdp") or flat.get("dist.use_megatron_fsdp") or flat.get("ddp.use_custom_fsdp")
    strategy = flat.get("ddp.data_parallel_sharding_strategy")
    if strategy not in (None, "no_shard") or use_fsdp:
        if not use_fsdp:
            raise refuse(source, "ddp.data_parallel_sharding_strategy", strategy, "shards only under Megatron FSDP "
                         "(ddp.use_megatron_fsdp)")
        give("--data-parallel-sharding-strategy", [str(strategy or "no_shard")], "ddp.data_parallel_sharding_strategy")
    fraction = flat.get("optimizer.optimizer_offload_fraction")
    if flat.get("optimizer.optimizer_cpu_offload") and fraction is not None:
        give("--optimizer-offload-fraction", [_scalar(fraction, "optimizer.optimizer_offload_fraction", source)],
             "optimizer.optimizer_offload_fraction")
    elif fraction not in (None, 0, 0.0, 1, 1.0):
        raise refuse(source, "optimizer.optimizer_offload_fraction", fraction, "a fraction without "
                     "optimizer_cpu_offload offloads nothing; set both")
    overlap = [flat.get(k) for k in ("model.overlap_moe_expert_parallel_comm",
                                     "comm_overlap.overlap_moe_expert_parallel_comm") if flat.get(k) is not None]
    if any(v is not False and v is not True for v in overlap):
        raise refuse(source, "comm_overlap.overlap_moe_expert_parallel_comm", overlap, "takes true or false")
    if len(set(overlap)) > 1:
        raise refuse(source, "comm_overlap.overlap_moe_expert_parallel_comm", overlap[1], "disagrees with "
                     f"model.overlap_moe_expert_parallel_comm = {overlap[0]}")
    if overlap and overlap[0]:
        job["ep_comm_overlap"] = True
    impl = flat.get("model.cuda_graph_impl")
    if impl not in (None, "none"):
        raise refuse(source, "model.cuda_graph_impl", impl, "CUDA graphs are priced from a Megatron-LM launch "
                     "(--cuda-graph-impl with --cuda-graph-scope) only")


def _enum(value: Any, names: dict[int, str]) -> str | None:
    """An enum as Bridge serialises it ({_target_: ...AttnBackend, _args_: [1]}) or by name, as its name."""
    if isinstance(value, dict) and isinstance(value.get("_args_"), list) and len(value["_args_"]) == 1:
        arg = value["_args_"][0]
        return names.get(arg, str(arg)) if isinstance(arg, int) and not isinstance(arg, bool) else str(arg)
    return _target(value)


def _dtype(value: Any) -> str | None:
    name = _target(value)
    return None if name is None else {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32",
                                      "float": "fp32"}.get(name, name)


def _precision(flat: dict, give, source: str) -> None:
    """The precision: the mixed_precision section where there is one (Bridge writes its fields over the model's,
    the optimizer's and DDP's, training/mixed_precision.py update_config_with_precision_overrides @v0.2.0), else the
    model's and the optimizer's copies, which must agree, and DDP's gradient-reduce dtype."""
    sections = ("mixed_precision",) if any(k.startswith("mixed_precision.") for k in flat) else ("model", "optimizer")
    seen: dict[str, tuple[Any, str]] = {}
    for section in sections:
        for name in PRECISION:
            key = f"{section}.{name}"
            if key not in flat or flat[key] is None:
                continue
            value = _dtype(flat[key]) if name == "params_dtype" else flat[key]
            if name not in seen:
                seen[name] = (value, key)
            elif seen[name][0] != value:
                raise refuse(source, key, value, f"disagrees with {seen[name][1]} = {seen[name][0]}")
    if sections != ("mixed_precision",) and flat.get("ddp.grad_reduce_in_fp32") is not None:
        seen["grad_reduce_in_fp32"] = (flat["ddp.grad_reduce_in_fp32"], "ddp.grad_reduce_in_fp32")
    get = {name: value for name, (value, _key) in seen.items()}
    if get.get("bf16"):
        give("--bf16", [], seen["bf16"][1])
        if get.get("grad_reduce_in_fp32") is False:
            give("--grad-reduce-in-bf16", [], seen["grad_reduce_in_fp32"][1])
    elif get.get("fp16"):
        give("--fp16", [], seen["fp16"][1])
        if get.get("grad_reduce_in_fp32"):
            give("--accumulate-allreduce-grads-in-fp32", [], seen["grad_reduce_in_fp32"][1])
    elif get.get("params_dtype") not in (None, "fp32"):
        raise refuse(source, seen["params_dtype"][1], get["params_dtype"], "parameters in a low precision without "
                     "bf16 or fp16 mixed precision")
    fp8 = get.get("fp8")
    if fp8 is not None and fp8 is not False:
        if fp8 not in ("hybrid", "e4m3"):
            raise refuse(source, seen["fp8"][1], fp8, "advisor prices the hybrid and e4m3 FP8 formats")
        give("--fp8-format", [str(fp8)], seen["fp8"][1])
        if get.get("fp8_recipe") is not None:
            give("--fp8-recipe", [str(get["fp8_recipe"])], seen["fp8_recipe"][1])
        if get.get("fp8_param_gather") or get.get("fp8_param"):
            give("--fp8-param-gather", [], (seen.get("fp8_param_gather") or seen["fp8_param"])[1])
    elif get.get("fp8_param_gather") or get.get("fp8_param"):
        raise refuse(source, (seen.get("fp8_param_gather") or seen["fp8_param"])[1], True, "FP8 parameters without "
                     "an FP8 format (mixed_precision.fp8)")
    fp4 = get.get("fp4")
    if fp4 is not None and fp4 is not False:
        if fp4 != "e2m1":
            raise refuse(source, seen["fp4"][1], fp4, "advisor prices NVFP4 (fp4 e2m1)")
        give("--fp4-format", ["e2m1"], seen["fp4"][1])
