"""A MindFormers training YAML as advisor's settings (``--from FILE``).

Sections and keys as MindFormers reads them for its legacy model path (mindformers/tools/register/template.py:
ParallelConfig, RecomputeConfig, RunnerConfig, the ``parallel`` section passed to
mindspore.set_auto_parallel_context; models/llama/llama_config.py LlamaConfig; moe.py MoEConfig; the
LayerSetting of layers per stage, num_layers // (pp x pp_interleave_num) + offset[v][p]). Every key of the
sections read is read into a setting, listed as price-neutral with its reason, or refused naming the file, the key
and its value; whole sections that only name files, data, logging or hyper-parameters are neutral. The export
(advisor.export.mindspore) writes only keys read here, and parameter offload in its parallel_context.py, which is
read beside the YAML (literals only), so an exported plan reads back as itself.

The YAML is read with advisor's bounded loader (advisor.specs.untrusted: size, nesting and alias limits).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from advisor.errors import AdvisorError
from advisor.export.mindspore import COMPUTE_DTYPE
from advisor.importers._records import read_spelled, spelled_paths
from advisor.importers.imported import Imported, flatten, refuse, where
from advisor.specs import limits
from advisor.specs.untrusted import check_tree, parse

TARGET = "mindspore"
DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
# settings a record spells "on" whose "off" a YAML may also write: one slice is no fine-grain interleave (LlamaConfig)
OFF = {"model.model_config.fine_grain_interleave": 1}
# MindFormers' Adam-family optimizers -> fused by default: FusedAdamW, or AdamW with use_fused; the per-operation
# AdamWeightDecay family (advisor.cost.optimizer_step: MindFormers' unfused step)
ADAMW = {"AdamW": False, "FusedAdamW": True, "AdamWeightDecay": False, "FP32StateAdamWeightDecay": False,
         "AdamWeightDecayX": False}
assert all(DTYPES[COMPUTE_DTYPE[k]] == k for k in ("bf16", "fp16", "fp32"))     # the export's table, read backwards

# whole top-level sections that do not change a step's time or memory as advisor prices it, and why
NEUTRAL_SECTIONS = {
    "run_mode": "the task (train)", "seed": "reproducibility", "output_dir": "folders", "load_checkpoint": "checkpoints",
    "src_strategy_path_or_dir": "checkpoints", "auto_trans_ckpt": "checkpoints", "only_save_strategy": "checkpoints",
    "resume_training": "checkpoints", "load_ckpt_format": "checkpoints", "transform_process_num": "checkpoints",
    "trainer": "the task and model names", "runner_wrapper": "loss scaling, a hyper-parameter",
    "lr_schedule": "a hyper-parameter", "layer_scale": "a hyper-parameter", "layer_decay": "a hyper-parameter",
    "lr_scale": "a hyper-parameter", "lr_scale_factor": "a hyper-parameter", "metric": "evaluation",
    "processor": "tokenisation", "callbacks": "logging and checkpoints", "eval_callbacks": "evaluation",
    "eval_dataset": "evaluation", "eval_dataset_task": "evaluation", "do_eval": "evaluation",
    "eval_step_interval": "evaluation", "eval_epoch_interval": "evaluation", "profile": "profiling",
    "profile_start_step": "profiling", "profile_stop_step": "profiling", "profile_communication": "profiling",
    "profile_memory": "profiling", "init_start_profile": "profiling", "train_dataset_task": "the data pipeline",
    "remove_redundancy": "checkpoints", "use_parallel": "read with parallel_config (its degrees)",
    "auto_tune": "a tuning run, not a step", "filepath_prefix": "folders", "autotune_per_step": "a tuning run",
    "remote_save_url": "folders",
}
NEUTRAL_KEYS = {
    "train_dataset": None,         # the whole data pipeline (the input columns and the dataset strategy are the data)
    "parallel": {"gradients_mean": "one scaling of the gradients", "enable_alltoall": "read with expert_parallel",
                 "dataset_strategy": "the data shards (dp of them, as priced)", "strategy_ckpt_save_file": "a file",
                 "strategy_ckpt_config": "a file", "loss_repeated_mean": "one scaling of the loss",
                 "search_mode": "read with parallel_mode"},
    "parallel.parallel_optimizer_config": {"parallel_optimizer_threshold": "small parameters left whole (64 KB)",
                                           "optimizer_weight_shard_size": "checked against data_parallel"},
    "parallel_config": {"gradient_aggregation_group": "gradient fusion groups", "vocab_emb_dp": "checked against "
                        "model_parallel", "mem_coeff": "a search hint"},
    "runner_config": {"epochs": "the run's length", "sink_mode": "graph sinking (the mindspore record prices it)",
                      "sink_size": "graph sinking (the mindspore record prices it)", "stop_step": "the run's length",
                      "num_classes": "a classifier's head"},
    "model": {"arch": "the model is --model"},
    "model.model_config": {
        **dict.fromkeys(("type", "checkpoint_name_or_path", "max_position_embedding", "rms_norm_eps", "bos_token_id",
                         "eos_token_id", "pad_token_id", "ignore_token_id", "theta", "scaling_factor", "extend_method",
                         "repetition_penalty", "max_decode_length", "top_k", "top_p", "do_sample", "use_past",
                         "is_dynamic", "block_size", "num_blocks", "initializer_range"),
                        "the model's identity or inference settings, not a training step"),
        **dict.fromkeys(("layernorm_compute_type", "softmax_compute_type", "rotary_dtype"),
                        "the dtype of small elementwise kernels (norms, softmax, rotary)"),
        "batch_size": "read from runner_config.batch_size", "multiple_of": "intermediate_size gives the FFN",
        "ffn_dim_multiplier": "intermediate_size gives the FFN", "qkv_concat": "one GEMM or three of the same FLOPs",
        "embedding_init_type": "parameters are priced in float32",
    },
    "moe_config": {"aux_loss_factor": "a hyper-parameter", "routing_policy": "top-k routing, as priced",
                   "router_dense_type": "the router's dtype (a d x experts GEMM)"},
    "optimizer": {"learning_rate": "a hyper-parameter", "betas": "a hyper-parameter", "eps": "a hyper-parameter",
                  "weight_decay": "a hyper-parameter", "beta1": "a hyper-parameter", "beta2": "a hyper-parameter"},
    "recompute_config": {"select_recompute_exclude": "read with select_recompute",
                         "select_comm_recompute_exclude": "read with select_recompute"},
}


def _int(source: str, key: str, value: Any, low: int = 1) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise refuse(source, key, value, f"an integer of at least {low} is needed")
    return value


def _bool(source: str, key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise refuse(source, key, value, "true or false")
    return value


def _load(text: str, source: str) -> dict:
    doc = parse(text, where(source), "yaml")
    check_tree(doc, where(source))
    if not isinstance(doc, dict):
        raise AdvisorError(f"{where(source)}: a MindFormers YAML is a mapping, got {type(doc).__name__}")
    return doc


def _section(doc: dict, path: str, source: str) -> dict:
    node: Any = doc
    for part in path.split("."):
        node = node.get(part, {}) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            raise refuse(source, path, node, "a mapping is needed")
    neutral = NEUTRAL_KEYS.get(path, {})
    return {k: v for k, v in node.items() if k not in neutral}


def read_mindformers(text: str, source: str) -> Imported:
    """The settings a MindFormers training YAML gives (module docstring)."""
    doc = _load(text, source)
    for key in doc:
        if key not in NEUTRAL_SECTIONS and key not in READ_SECTIONS and key not in NEUTRAL_KEYS:
            raise refuse(source, key, "...", "a section advisor does not price")
    if doc.get("use_legacy", True) not in (True, False):
        raise refuse(source, "use_legacy", doc["use_legacy"], "true (the legacy Llama path) or false (the mcore "
                      "path of the registered models, read by their Hugging Face keys)")
    flat = flatten({k: v for k, v in doc.items() if k in ("model", "parallel", "parallel_config", "recompute_config")})
    flat = {k: v for k, v in flat.items() if OFF.get(k, object()) != v}
    job, strategy, spelled = read_spelled(TARGET, flat)
    for path in spelled_paths(TARGET) & set(flat):
        if path not in spelled:
            raise refuse(source, path, flat[path], "a value advisor does not price")
    job.update(framework=TARGET, dropout=False)
    model: dict[str, Any] = {}
    state = {"spelled": {p.rpartition(".")[2] for p in spelled | set(OFF)}, "devices": None}
    for name, reader in READ_SECTIONS.items():
        reader(doc, job, strategy, model, state, source)
    degrees = strategy["dp"] * strategy["tp"] * strategy["pp"] * strategy["cp"]
    if state["devices"] is not None and state["devices"] != degrees:
        raise refuse(source, "parallel.device_num", state["devices"], f"data x model x pipeline x context parallel "
                      f"= {degrees} devices")
    state["devices"] = degrees          # MindFormers' degrees cover every device (msrun starts that many)
    return Imported(source=source, framework=TARGET, job=job, strategy=strategy, devices=state["devices"], model=model)


def _left(rest: dict, section: str, source: str, state: dict) -> None:
    for key, value in rest.items():
        if key not in state["spelled"]:
            raise refuse(source, f"{section}.{key}", value)


# ---- the sections read ---------------------------------------------------------------------------


def _parallel_config(doc, job, strategy, model, state, source):
    k = _section(doc, "parallel_config", source)
    for key, field in (("data_parallel", "dp"), ("model_parallel", "tp"), ("context_parallel", "cp"),
                       ("pipeline_stage", "pp")):
        strategy[field] = _int(source, f"parallel_config.{key}", k.pop(key, 1))
    ep = _int(source, "parallel_config.expert_parallel", k.pop("expert_parallel", 1))
    if ep > 1:
        strategy["ep"] = ep
    strategy["sequence_parallel"] = _bool(source, "parallel_config.use_seq_parallel", k.pop("use_seq_parallel", False))
    state["micro_batch_num"] = _int(source, "parallel_config.micro_batch_num", k.pop("micro_batch_num", 1))
    algo = k.pop("context_parallel_algo", "colossalai_cp")
    if algo not in ("colossalai_cp", "ulysses_cp"):
        raise refuse(source, "parallel_config.context_parallel_algo", algo, "advisor prices colossalai_cp (the ring) "
                      "and ulysses_cp (all-to-all)")
    if strategy["cp"] > 1:
        strategy["cp_comm"] = "a2a" if algo == "ulysses_cp" else "p2p"
    for key in ("seq_split_num", "ulysses_degree_in_cp"):
        if key in k and k.pop(key) not in (1, None):
            raise refuse(source, f"parallel_config.{key}", doc["parallel_config"][key])
    if k.pop("optimizer_shard", None) not in (None, False):
        raise refuse(source, "parallel_config.optimizer_shard", True, "the parallel optimizer is parallel."
                      "enable_parallel_optimizer with its optimizer_level")
    vocab_dp = _bool(source, "parallel_config.vocab_emb_dp",
                     (doc.get("parallel_config") or {}).get("vocab_emb_dp", strategy["tp"] == 1))
    if vocab_dp != (strategy["tp"] == 1):
        raise refuse(source, "parallel_config.vocab_emb_dp", vocab_dp, "advisor prices the embedding split over "
                      "model_parallel when it is above 1 (vocab_emb_dp false) and whole otherwise")
    _left(k, "parallel_config", source, state)


def _parallel(doc, job, strategy, model, state, source):
    k = _section(doc, "parallel", source)
    mode = k.pop("parallel_mode", "semi_auto_parallel")
    if mode not in ("semi_auto_parallel", 1):
        raise refuse(source, "parallel.parallel_mode", mode, "advisor prices the degrees given (semi_auto_parallel); "
                      "with auto_parallel MindSpore searches its own layout: price the plan JSON instead")
    if "device_num" in k:
        state["devices"] = _int(source, "parallel.device_num", k.pop("device_num"))
    strategy["full_batch"] = _bool(source, "parallel.full_batch", k.pop("full_batch", False))
    if "pipeline_stages" in k and k.pop("pipeline_stages") != strategy.get("pp", 1):
        raise refuse(source, "parallel.pipeline_stages", (doc.get("parallel") or {}).get("pipeline_stages"),
                      f"it differs from parallel_config.pipeline_stage = {strategy.get('pp', 1)}")
    enabled = _bool(source, "parallel.enable_parallel_optimizer", k.pop("enable_parallel_optimizer", False))
    config = k.pop("parallel_optimizer_config", {}) or {}
    if not isinstance(config, dict):
        raise refuse(source, "parallel.parallel_optimizer_config", config, "a mapping is needed")
    config = {c: v for c, v in config.items() if c not in NEUTRAL_KEYS["parallel.parallel_optimizer_config"]}
    level = config.pop("optimizer_level", "level1")
    shard = config.pop("gradient_accumulation_shard", None)
    if level not in ("level1", "level2", "level3"):
        raise refuse(source, "parallel.parallel_optimizer_config.optimizer_level", level, "level1, level2 or level3")
    if shard is True:
        level = "level2"                          # the older spelling of level2's sharded gradients
    strategy["zero_stage"] = int(level[-1]) if enabled else 0
    size = ((doc.get("parallel") or {}).get("parallel_optimizer_config") or {}).get("optimizer_weight_shard_size", -1)
    if enabled and size not in (-1, strategy.get("dp", 1)):
        raise refuse(source, "parallel.parallel_optimizer_config.optimizer_weight_shard_size", size, "advisor prices "
                      f"the optimizer sharded over all data_parallel = {strategy.get('dp', 1)} ranks (or -1)")
    _left(config, "parallel.parallel_optimizer_config", source, state)
    pipeline = k.pop("pipeline_config", {}) or {}
    interleave = pipeline.get("pipeline_interleave", False) if isinstance(pipeline, dict) else None
    if not isinstance(pipeline, dict) or pipeline.get("pipeline_scheduler", "1f1b") != "1f1b":
        raise refuse(source, "parallel.pipeline_config", pipeline, "advisor reads pipeline_scheduler 1f1b (with "
                      "pipeline_interleave for interleaved stages)")
    state["interleave"] = _bool(source, "parallel.pipeline_config.pipeline_interleave", interleave)
    fusion = k.pop("comm_fusion", None)
    if fusion is not None:
        sizes = {v.get("config") for v in fusion.values() if isinstance(v, dict) and v.get("mode") == "size"} \
            if isinstance(fusion, dict) else set()
        if len(sizes) != 1 or not all(isinstance(v, dict) and v.get("mode") == "size" for v in fusion.values()):
            raise refuse(source, "parallel.comm_fusion", fusion, "advisor reads one fusion size (mode size) for the "
                          "gradient collectives")
        strategy["grad_bucket_mb"] = float(_int(source, "parallel.comm_fusion config", sizes.pop()))
    _left(k, "parallel", source, state)


def _runner_config(doc, job, strategy, model, state, source):
    k = _section(doc, "runner_config", source)
    state["batch_size"] = _int(source, "runner_config.batch_size", k.pop("batch_size", 1))
    state["accumulation"] = _int(source, "runner_config.gradient_accumulation_steps",
                                 k.pop("gradient_accumulation_steps", 1))
    _left(k, "runner_config", source, state)


def _copies(doc, job, strategy, model, state, source):
    copies = _int(source, "micro_batch_interleave_num", doc.get("micro_batch_interleave_num", 1))
    if copies > 1:
        strategy["micro_batch_copies"] = copies
    # MindFormers' global batch: batch_size x dp x micro_batch_num x gradient_accumulation_steps x copies
    # (mindformers/trainer/base_trainer.py); with pipelining the micro-batches are micro_batch_num
    strategy["micro_batch_size"] = state["batch_size"] * copies
    pp = strategy.get("pp", 1)
    if pp > 1 and state["accumulation"] != 1:
        raise refuse(source, "runner_config.gradient_accumulation_steps", state["accumulation"], "with pipeline "
                      "stages the micro-batches are parallel_config.micro_batch_num (MindFormers ignores accumulation)")
    micro = state["micro_batch_num"] if pp > 1 else state["accumulation"]
    job["global_batch_size"] = strategy["micro_batch_size"] * strategy.get("dp", 1) * micro


def _recompute_config(doc, job, strategy, model, state, source):
    k = _section(doc, "recompute_config", source)
    full, select = k.pop("recompute", False), k.pop("select_recompute", False)
    if k.pop("recompute_slice_activation", False) and strategy.get("tp", 1) > 1:
        raise refuse(source, "recompute_config.recompute_slice_activation", True, "advisor prices the recomputed "
                      "layers' inputs whole (sliced over model_parallel only when it is 1, where slicing is a no-op)")
    for key, want in (("parallel_optimizer_comm_recompute", False), ("mp_comm_recompute", True),
                      ("select_comm_recompute", False)):
        if key in k and k.pop(key) is not want:
            raise refuse(source, f"recompute_config.{key}", doc["recompute_config"][key], f"advisor prices {want}")
    if full not in (False, None) and select not in (False, None):
        raise refuse(source, "recompute_config.select_recompute", select, "advisor prices one of recompute and "
                      "select_recompute per layer")
    kind, given = ("full", full) if full not in (False, None) else ("selective", select) if select not in (
        False, None) else ("none", None)
    strategy["recompute"] = kind
    if isinstance(given, list):
        state["recompute_rows"] = (kind, given)
    elif given not in (True, None):
        raise refuse(source, f"recompute_config.{'recompute' if kind == 'full' else 'select_recompute'}", given,
                      "true, false or a list of layer counts per stage")
    _left(k, "recompute_config", source, state)


def _job_keys(k: dict, job: dict, source: str, default_dtype: str) -> None:
    """The job's keys both model paths hold in model.model_config: sequence, compute dtype, flash attention."""
    if "seq_length" in k:
        job["seq_length"] = _int(source, "model.model_config.seq_length", k.pop("seq_length"))
    dtype = k.pop("compute_dtype", default_dtype)
    if dtype not in DTYPES:
        raise refuse(source, "model.model_config.compute_dtype", dtype, f"advisor prices {', '.join(DTYPES)}")
    job["dtype"] = DTYPES[dtype]
    if "use_flash_attention" in k:
        job["attention"] = "flash" if _bool(source, "model.model_config.use_flash_attention",
                                            k.pop("use_flash_attention")) else "math"


def _model_config(doc, job, strategy, model, state, source):
    k = _section(doc, "model.model_config", source)
    if doc.get("use_legacy", True) is False:
        return _mcore_model_config(k, job, strategy, model, state, source)
    for key, field in (("num_layers", "num_layers"), ("hidden_size", "hidden_size"),
                       ("num_heads", "num_attention_heads"), ("n_kv_heads", "num_kv_heads"),
                       ("intermediate_size", "ffn_hidden_size"), ("vocab_size", "vocab_size")):
        if key in k and k[key] is not None:
            model[field] = _int(source, f"model.model_config.{key}", k.pop(key))
        k.pop(key, None)
    _job_keys(k, job, source, "float16")
    param = k.pop("param_init_type", "float32")
    if param not in DTYPES:
        raise refuse(source, "model.model_config.param_init_type", param, f"advisor reads {', '.join(DTYPES)}")
    # 16-bit parameter types (most shipped v1.3.0 YAMLs) are priced with float32 parameters, as advisor.validation
    # prices those runs (advisor.cost.optimizer_step documents the casts it does not price)
    vpp = _int(source, "model.model_config.pp_interleave_num", k.pop("pp_interleave_num", 1))
    if vpp > 1 and not state.get("interleave"):
        raise refuse(source, "model.model_config.pp_interleave_num", vpp, "it needs parallel.pipeline_config."
                      "pipeline_interleave true")
    if vpp > 1:
        strategy["virtual_pipeline_stages"] = vpp
        strategy["pipeline_schedule"] = "interleaved-1f1b"
    state["offset"] = k.pop("offset", 0)
    _left(k, "model.model_config", source, state)
    _stages(job, strategy, model, state, source)


# the mcore path's own keys in model.model_config beside the Hugging Face ones (advisor.export.mindformers_mcore)
MCORE_NEUTRAL = {"moe_grouped_gemm": "one grouped GEMM kernel or several of the same FLOPs",
                 "layernorm_compute_dtype": "the dtype of the norms", "softmax_compute_dtype": "the softmax's dtype",
                 "rotary_dtype": "the rotary embedding's dtype", "input_sliced_sig": "how inputs are sliced",
                 "position_embedding_type": "read from model_type (rotary)", "add_bias_linear": "read as attention_bias",
                 "router_dense_type": "the router's dtype", "gated_linear_unit": "read from hidden_act",
                 "use_contiguous_weight_layout_attention": "a weight layout"}


def _mcore_model_config(k, job, strategy, model, state, source):
    """model.model_config of the mcore path: MindFormers' own keys, then the Hugging Face ones read by
    advisor.specs.hf_config (so a model is read the same from a config.json or this YAML)."""
    from advisor.specs.hf_config import model_from_hf_config

    k = dict(k)
    _job_keys(k, job, source, "bfloat16")
    if k.pop("params_dtype", "float32") != "float32":
        raise refuse(source, "model.model_config.params_dtype", "not float32", "advisor prices float32 parameters")
    vpp = _int(source, "model.model_config.pp_interleave_num", k.pop("pp_interleave_num", 1))
    if vpp > 1:
        strategy["virtual_pipeline_stages"] = vpp
        strategy["pipeline_schedule"] = "interleaved-1f1b"
    if "capacity_factor" in k:
        factor = k.pop("capacity_factor")
        if factor != 1.0:
            raise refuse(source, "model.model_config.capacity_factor", factor, "advisor prices 1.0 (tokens beyond "
                          "capacity dropped) or none (dropless)")
        job["moe_dropless"] = False
    if k.pop("num_nextn_predict_layers", 0) not in (0, None):
        raise refuse(source, "model.model_config.num_nextn_predict_layers", "not 0", "multi-token prediction is "
                      "not priced")
    state["offset"] = k.pop("offset", 0)
    for key in MCORE_NEUTRAL:
        k.pop(key, None)
    arch = k.get("architectures")
    if isinstance(arch, str):
        k["architectures"] = [arch]
    shape = model_from_hf_config(k, f"{source}: model.model_config", "mcore")
    for key in ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "ffn_hidden_size", "vocab_size",
                "head_dim", "mla", "sliding_window"):
        if key in shape:
            model[key] = shape[key]
    if "moe" in shape:
        moe = shape["moe"]
        model["moe"] = {name: moe[name] for name in ("num_experts", "top_k", "expert_ffn_hidden_size") if name in moe}
        job.setdefault("moe_dropless", True)
    _stages(job, strategy, model, state, source)


def _stages(job, strategy, model, state, source):
    """Layers per stage from the offset (LayerSetting), recomputed layers from the per-stage lists."""
    pp, vpp = strategy.get("pp", 1), strategy.get("virtual_pipeline_stages", 1)
    offset, layers = state["offset"], model.get("num_layers")
    rows = _rows(offset, pp, vpp, "model.model_config.offset", source)
    if rows is not None:
        if layers is None:
            raise refuse(source, "model.model_config.offset", offset, "it needs model.model_config.num_layers")
        base = layers // (pp * vpp)
        per_stage = [sum(base + rows[v][p] for v in range(vpp)) for p in range(pp)]
        if sum(per_stage) != layers or min(base + x for row in rows for x in row) < 0:
            raise refuse(source, "model.model_config.offset", offset, f"it does not split {layers} layers over "
                          f"pp {pp} x pp_interleave_num {vpp}")
        strategy["stage_layers"] = tuple(per_stage)
    elif layers is not None and layers % (pp * vpp):
        raise refuse(source, "model.model_config.num_layers", layers, f"without an offset MindFormers needs it "
                      f"divisible by pp {pp} x pp_interleave_num {vpp}")
    recomputed = state.get("recompute_rows")
    if recomputed is not None:
        kind, given = recomputed
        counts = _rows(given, pp, vpp, f"recompute_config.{'recompute' if kind == 'full' else 'select_recompute'}",
                       source, zeros=False)
        if min(x for row in counts for x in row) < 0:
            raise refuse(source, "recompute_config.recompute", given, "layer counts are not negative")
        per_stage = tuple(sum(counts[v][p] for v in range(vpp)) for p in range(pp))
        strategy["recompute_layers"] = per_stage[0] if len(set(per_stage)) == 1 else per_stage


def _rows(value: Any, pp: int, vpp: int, key: str, source: str, zeros: bool = True) -> list[list[int]] | None:
    """A per-stage list ([p]) or per-(chunk, stage) list ([[v][p]]) of integers; None for 0 (no offset)."""
    if zeros and value in (0, None):
        return None
    if isinstance(value, list) and value and all(isinstance(x, list) for x in value):
        rows = value
    elif isinstance(value, list):
        rows = [value]
    else:
        raise refuse(source, key, value, f"a list of {pp} integers (or {vpp} such lists) is needed")
    if len(rows) != vpp or any(len(r) != pp for r in rows) or not all(
            isinstance(x, int) and not isinstance(x, bool) for r in rows for x in r):
        raise refuse(source, key, value, f"{vpp} list(s) of {pp} integers are needed")
    return rows


def _moe_config(doc, job, strategy, model, state, source):
    if "moe_config" not in doc:
        return
    k = _section(doc, "moe_config", source)
    experts = _int(source, "moe_config.expert_num", k.pop("expert_num", 1))
    top_k = _int(source, "moe_config.num_experts_chosen", k.pop("num_experts_chosen", 1))
    moe = {"num_experts": experts, "top_k": top_k}
    if "moe_intermediate_size" in k:
        moe["expert_ffn_hidden_size"] = _int(source, "moe_config.moe_intermediate_size", k.pop("moe_intermediate_size"))
    model["moe"] = moe
    factor = k.pop("capacity_factor", 1.1)
    if not isinstance(factor, (int, float)) or isinstance(factor, bool):
        raise refuse(source, "moe_config.capacity_factor", factor, "a number is needed")
    if factor >= experts / top_k:
        job["moe_dropless"] = True                # every token reaches its experts (calculate_expert_capacity)
    elif factor == 1.0:
        job["moe_dropless"] = False
    else:
        raise refuse(source, "moe_config.capacity_factor", factor, f"advisor prices 1.0 (tokens beyond capacity "
                      f"dropped) or at least expert_num / num_experts_chosen = {experts / top_k:g} (none dropped)")
    ep = k.pop("expert_model_parallel", strategy.get("ep", 1))
    if ep != strategy.get("ep", 1):
        raise refuse(source, "moe_config.expert_model_parallel", ep, f"it differs from parallel_config."
                      f"expert_parallel = {strategy.get('ep', 1)}")
    _left(k, "moe_config", source, state)


def _optimizer(doc, job, strategy, model, state, source):
    if "optimizer" not in doc:
        return
    k = _section(doc, "optimizer", source)
    name = k.pop("type", "AdamW")
    if name not in ADAMW:
        raise refuse(source, "optimizer.type", name, f"advisor prices {', '.join(ADAMW)}")
    job["optimizer"] = "adamw"
    fused = _bool(source, "optimizer.use_fused", k.pop("use_fused", ADAMW[name]))
    job["optimizer_impl"] = "fused" if fused else "unfused"
    if _bool(source, "optimizer.swap", k.pop("swap", False)):
        strategy["offload_optimizer"] = True
    _left(k, "optimizer", source, state)


def _swap_config(doc, job, strategy, model, state, source):
    if "swap_config" not in doc:
        return
    k = _section(doc, "swap_config", source)
    if not _bool(source, "swap_config.swap", k.pop("swap", False)):
        return
    if k.pop("default_prefetch", 1) != 1 or k.pop("op_swap", None) or k.pop("swap_layers", None):
        raise refuse(source, "swap_config", doc["swap_config"], "advisor prices whole layers swapped with a prefetch "
                      "of one layer (layer_swap)")
    entries = k.pop("layer_swap", []) or []
    swapped: set[int] = set()
    for entry in entries if isinstance(entries, list) else [entries]:
        if not isinstance(entry, dict) or entry.get("backward_prefetch", 1) != 1 or not isinstance(
                entry.get("layers"), list):
            raise refuse(source, "swap_config.layer_swap", entry, "entries of layers with backward_prefetch 1")
        swapped.update(_int(source, "swap_config.layer_swap.layers", x, low=0) for x in entry["layers"])
    layers = strategy.get("stage_layers") or _even(model.get("num_layers"), strategy.get("pp", 1), source)
    start, counts = 0, []
    for n in layers:
        counts.append(sum(1 for x in swapped if start <= x < start + n))
        start += n
    strategy["swap_layers"] = tuple(counts)
    _left(k, "swap_config", source, state)


def _even(layers: int | None, pp: int, source: str) -> tuple[int, ...]:
    if layers is None:
        raise refuse(source, "swap_config.layer_swap", "...", "it needs model.model_config.num_layers")
    return (layers // pp,) * pp


def _context(doc, job, strategy, model, state, source):
    """``context`` goes to mindspore.set_context: its device and graph settings are priced as the mindspore record
    does, but memory_offload ON (parameter offload) is read; so is the export's parallel_context.py beside the YAML
    (its set_context / set_offload_context calls, literals only, never run)."""
    context = doc.get("context") or {}
    if not isinstance(context, dict):
        raise refuse(source, "context", context, "a mapping is needed")
    calls = _context_calls(Path(source).parent / "parallel_context.py")
    offload = calls.get("set_context", {}).get("memory_offload", context.get("memory_offload", "OFF"))
    if offload not in ("ON", "OFF"):
        raise refuse(source, "context.memory_offload", offload, "ON or OFF")
    if offload == "ON":
        config = calls.get("set_offload_context", {}).get("offload_config", {"offload_param": "cpu"})
        if not isinstance(config, dict) or config.get("offload_param", "cpu") != "cpu":
            raise refuse(source, "offload_config", config, "advisor prices the parameters offloaded to the cpu")
        strategy["offload_params"] = True


def _context_calls(path: Path) -> dict[str, dict[str, Any]]:
    """The keyword arguments of ms.set_context / ms.set_offload_context in the export's parallel_context.py."""
    if not path.is_file() or path.stat().st_size > limits.MAX_YAML_BYTES:
        return {}
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return {}
    out: dict[str, dict[str, Any]] = {}
    for node in ast.walk(tree):
        name = getattr(getattr(node, "func", None), "attr", None)
        if isinstance(node, ast.Call) and name in ("set_context", "set_offload_context"):
            try:
                out[name] = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg}
            except ValueError:
                raise AdvisorError(f"{where(str(path))}: {name} takes a value that is not a literal") from None
    return out


def _use_legacy(doc, job, strategy, model, state, source):
    """Read in read_mindformers (the legacy path only)."""


READ_SECTIONS = {"parallel_config": _parallel_config, "parallel": _parallel, "runner_config": _runner_config,
                 "micro_batch_interleave_num": _copies, "recompute_config": _recompute_config,
                 "model": _model_config, "moe_config": _moe_config, "optimizer": _optimizer,
                 "swap_config": _swap_config, "context": _context, "use_legacy": _use_legacy}
