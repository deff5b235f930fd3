"""MindSpore / MindFormers: the set_auto_parallel_context call and a MindFormers parallel YAML.

``mindspore.set_auto_parallel_context`` keywords and values follow its API reference (MindSpore 2.x:
parallel_mode, device_num, pipeline_stages, pipeline_config {pipeline_interleave, pipeline_scheduler},
enable_parallel_optimizer, parallel_optimizer_config {optimizer_level level1/level2/level3 =
ZeRO-1/2/3, optimizer_weight_shard_size}, search_mode, gradients_mean, full_batch, dataset_strategy,
enable_alltoall).
The MindFormers sections follow mindformers/tools/register/template.py (ParallelConfig,
RecomputeConfig, RunnerConfig, MsParallelConfig: the ``parallel`` section is passed to
set_auto_parallel_context) and the LayerSetting of mindformers (layers of stage (v, p) =
num_layers // (pp x pp_interleave_num) + offset[v][p]; recompute as a per-stage list of layer counts); an
Adam plan's optimizer section is MindFormers' AdamW with use_fused as priced (advisor.cost.optimizer_step).
A D-Rec plan without operator layouts maps to MindSpore's own recursive-programming search
(parallel_mode auto_parallel, search_mode recursive_programming); a plan with layouts (drec or ilp) is
semi_auto_parallel loading them from strategy_ckpt.json (strategy_ckpt_config load_file), never both; all
others are explicit (semi_auto_parallel) with MindFormers' data_parallel / model_parallel / pipeline_stage
degrees.

Target releases (--target-version): MindFormers 1.7.0 and 2.1.0 (default). The YAML is for their
legacy model path, written explicitly as use_legacy: True (2.1.0's default too: template.py reads
config.get('use_legacy', True)): LlamaConfig keys in model.model_config and MoE plans' experts in a
top-level moe_config section, which build_parallel_config (mindformers/core/parallel_config.py)
turns into MoEConfig(**moe_config) (mindformers/modules/transformer/moe.py: expert_num,
num_experts_chosen, capacity_factor, moe_intermediate_size, expert_model_parallel). The mcore path
(use_legacy: False) builds only the models registered for it (qwen2, qwen3, qwen3_moe, glm4,
deepseek_v3 ..., chosen by model_type): a model the legacy LlamaConfig cannot express (head_dim, latent
attention, shared experts, dense first layers, windows) is written there when one of those families builds it
(advisor.export.mindformers_mcore).
"""

from __future__ import annotations

import yaml

from advisor.export import ExportResult
from advisor.export import _comm_knobs, _settings
from advisor.export._common import (
    chunk_layers, comment_block, header_lines, mesh_text, non_default_mesh, pick_version, stage_layers,
    unwritten_model_features,
)
from advisor.export._recompute import FULL, MINDSPORE_SELECT, NONE, cannot_express, priced_recompute
from advisor.export.mindformers_mcore import mcore_model_config, mcore_refusals
from advisor.plan import Plan

FRAMEWORK = "mindspore"   # the framework record this export launches (the context and YAML run MindSpore/MindFormers)
VERSIONS = ("1.7.0", "2.1.0")
DEFAULT_VERSION = "2.1.0"
# MindSpore's set_pipeline_config allows schedulers other than 1f1b only with pipeline_interleave on;
# a GPipe plan has no virtual stages, so it runs 1F1B (reported).
SCHEDULERS = {"gpipe": "1f1b", "1f1b": "1f1b", "interleaved-1f1b": "1f1b"}
# The legacy causal-LM path reads one column, seq_length + 1 token ids (the labels are its shift);
# dataset_strategy needs one [dp, 1] per column (MindFormers' parallel templates).
INPUT_COLUMNS = ("input_ids",)
# Shipped MindFormers YAMLs set parallel_optimizer_config.gradient_accumulation_shard (False); a merge keeps it,
# and MindSpore 2.x then refuses optimizer_level level1 / level3 (set_parallel_optimizer_config).
MERGE_NOTE = ("parallel.parallel_optimizer_config: delete gradient_accumulation_shard from the YAML you merge this "
              "into; MindSpore refuses that key, whatever its value, with optimizer_level level1 or level3")
COMPUTE_DTYPE = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "tf32": "float32", "fp8": "bfloat16"}


def has_layouts(plan: Plan) -> bool:
    """Whether the plan carries per-operator layouts the export writes (advisor.export.mindspore_strategy)."""
    rec = plan.operator_strategies
    return isinstance(rec, dict) and isinstance(rec.get("strategies"), dict) and isinstance(rec.get("operators"), dict)


def auto_parallel_context(plan: Plan) -> dict:
    """Keyword arguments of mindspore.set_auto_parallel_context for the plan."""
    s = plan.strategy
    searcher = (plan.search or {}).get("searcher")
    # a D-Rec plan without operator layouts lets MindSpore's own recursive programming search; a plan with them
    # (drec or ilp) is semi-automatic with advisor's layouts loaded from the strategy file: never both
    search = searcher == "drec" and not has_layouts(plan)
    ctx: dict = {
        "parallel_mode": "auto_parallel" if search else "semi_auto_parallel",
        "search_mode": "recursive_programming" if search else "sharding_propagation",
        "device_num": plan.cluster.devices,
        "gradients_mean": True,
        # each rank reads its data-parallel shard unless the plan was priced reading the whole batch
        # (advisor.cost.dataset; MindFormers' performance guide recommends the shards at scale)
        "full_batch": s.full_batch,
        **({} if s.full_batch else {"dataset_strategy": [[s.dp, 1] for _ in INPUT_COLUMNS]}),
        "enable_parallel_optimizer": s.zero_stage >= 1,
        "pipeline_stages": s.pp,
    }
    if s.zero_stage >= 1:
        ctx["parallel_optimizer_config"] = {"optimizer_level": f"level{s.zero_stage}",
                                            "optimizer_weight_shard_size": s.dp}
        # gradient_accumulation_shard (the older spelling of level2's sharded gradients) is not written:
        # MindSpore 2.x refuses the key, whatever its value, next to optimizer_level level1 or level3
        # (mindspore/parallel/_auto_parallel_context.py, set_parallel_optimizer_config); see MERGE_NOTE
    if s.pp > 1:
        ctx["pipeline_config"] = {"pipeline_interleave": s.virtual_pipeline_stages > 1,
                                  "pipeline_scheduler": SCHEDULERS[s.pipeline_schedule]}
    if s.ep > 1:
        ctx["enable_alltoall"] = True
    if has_layouts(plan):
        from advisor.export.mindspore_strategy import STRATEGY_FILE

        ctx["strategy_ckpt_config"] = {"load_file": f"./{STRATEGY_FILE}", "only_trainable_params": True}
    fusion = _comm_knobs.mindspore_comm_fusion(plan)      # the plan's gradient bucket size
    if fusion is not None:
        ctx["comm_fusion"] = fusion
    return ctx


def _offset(plan: Plan):
    """MindFormers' offset: per (mini) stage, layers beyond num_layers // (pp x vpp)."""
    s, n = plan.strategy, plan.model.num_layers
    v = s.virtual_pipeline_stages
    avg = n // (s.pp * v)
    rows = [[c - avg for c in row] for row in chunk_layers(plan)]
    if all(x == 0 for row in rows for x in row):
        return 0
    return rows[0] if v == 1 else rows


def _layer_counts(plan: Plan):
    """recompute_layers as MindFormers' per-stage list (per (chunk, stage) when interleaved), or True."""
    s = plan.strategy
    counts = s.recompute_counts()
    if counts is None:
        return True
    v = s.virtual_pipeline_stages
    layers = stage_layers(plan)
    if v == 1:
        return [min(c, n) for c, n in zip(counts, layers)]
    # split each stage's recomputed layers over its chunks, the first chunks taking the remainder
    out = []
    for vi in range(v):
        row = []
        for c, n in zip(counts, layers):
            base, extra = divmod(min(c, n), v)
            row.append(min(base + (1 if vi < extra else 0), n // v))
        out.append(row)
    return out


def _recompute(plan: Plan, unsupported: list[str]) -> tuple:
    """(recompute, select_recompute) for the priced policy (advisor.export._recompute)."""
    priced = priced_recompute(plan)
    if priced.kind == NONE:
        return False, False
    if priced.kind == FULL:
        return _layer_counts(plan), False
    if priced.kind == MINDSPORE_SELECT:
        return False, _layer_counts(plan)
    unsupported.append(cannot_express("MindFormers", priced, "select_recompute (SwiGLU SiLU and Mul; priced with "
                                      "--framework mindspore)"))
    return False, False


def mindformers_config(plan: Plan, unsupported: list[str], notes: list[str]) -> dict:
    s, m, j = plan.strategy, plan.model, plan.training
    parallel_config = {
        "data_parallel": s.dp,
        "model_parallel": s.tp,
        "context_parallel": s.cp,
        "expert_parallel": s.ep,
        "pipeline_stage": s.pp,
        "micro_batch_num": s.num_micro_batches if s.pp > 1 else 1,
        "use_seq_parallel": s.sequence_parallel,
        "vocab_emb_dp": s.tp == 1,
        "gradient_aggregation_group": 4,
    }
    if s.cp > 1:
        # TransformerOpParallelConfig's context_parallel_algo (mindformers/modules/transformer/transformer.py,
        # v1.7.0): colossalai_cp is the ring exchange, ulysses_cp the all-to-all
        parallel_config["context_parallel_algo"] = "ulysses_cp" if s.cp_comm == "a2a" else "colossalai_cp"
    full, select = _recompute(plan, unsupported)
    unsupported.extend(x for x in [_comm_knobs.priority_unsupported(plan, "MindSpore"),
                                   _comm_knobs.cuda_graphs_unsupported(plan, "MindSpore")] if x)
    recompute_config = {
        "recompute": full,
        "select_recompute": select,
        "parallel_optimizer_comm_recompute": False,
        "mp_comm_recompute": True,
        "recompute_slice_activation": False,
    }
    runner_config = {
        # per copy under multi-copy parallelism (global batch = batch_size x dp x micro_batch_num x
        # micro_batch_interleave_num: mindformers/trainer/base_trainer.py)
        "batch_size": s.micro_batch_size // s.micro_batch_copies,
        "gradient_accumulation_steps": 1 if s.pp > 1 else s.num_micro_batches,
    }
    model_config = {
        "seq_length": j.seq_length,
        "num_layers": m.num_layers,
        "hidden_size": m.hidden_size,
        "num_heads": m.num_attention_heads,
        "n_kv_heads": m.num_kv_heads,
        "intermediate_size": m.ffn_hidden_size,
        "vocab_size": m.vocab_size,
        "compute_dtype": COMPUTE_DTYPE[j.dtype],
        "param_init_type": "float32",
        "offset": _offset(plan),
    }
    if s.virtual_pipeline_stages > 1:
        model_config["pp_interleave_num"] = s.virtual_pipeline_stages
    if s.pp > 1 and s.pipeline_schedule == "gpipe":
        unsupported.append("parallel.pipeline_schedule = gpipe: MindSpore accepts pipeline_scheduler 'gpipe' only with "
                           "pipeline_interleave on (set_pipeline_config); exported as 1f1b (same bubble, less memory)")
    if j.dtype == "fp8":
        unsupported.append("training.dtype = fp8: MindFormers' compute_dtype has no FP8; exported as bfloat16")
    if s.offload_optimizer and j.optimizer not in ("adam", "adamw"):
        unsupported.append(f"parallel.offload_optimizer = true with training.optimizer = {j.optimizer}: MindFormers "
                           "swaps the optimizer states to the host for AdamW only (optimizer.swap)")
    if non_default_mesh(plan):
        unsupported.append(f"parallel.mesh_order = {mesh_text(plan)}: MindSpore places pipeline stages outermost and "
                           "the model-parallel dimension innermost; exported with that order")
    if s.zero_stage in (1, 3):
        notes.append(MERGE_NOTE)
    if not s.full_batch:
        notes.append(f"parallel.dataset_strategy has one [dp, 1] per train_dataset.input_columns, written for "
                     f"{list(INPUT_COLUMNS)}: add one per further column your dataset returns")
    mcore = mcore_model_config(plan, COMPUTE_DTYPE[j.dtype], model_config["offset"]) if needs_mcore(plan) else None
    if mcore is not None:                 # a model the legacy Llama cannot express (advisor.export.mindformers_mcore)
        model_config = mcore
        unsupported.extend(mcore_refusals(plan))
    out = {
        "use_legacy": mcore is None,
        "train_dataset": {"input_columns": list(INPUT_COLUMNS)},
        "parallel": auto_parallel_context(plan),
        "parallel_config": parallel_config,
        "recompute_config": recompute_config,
        "runner_config": runner_config,
        "model": {"model_config": model_config},
    }
    if s.swap_layers is not None:
        out["swap_config"] = swap_config(plan)
    if m.moe is not None and mcore is None:     # the mcore path reads the experts from model_config
        out["moe_config"] = moe_config(plan, unsupported)
    if s.micro_batch_copies > 1:
        out["micro_batch_interleave_num"] = s.micro_batch_copies   # multi-copy parallelism
    if j.optimizer in ("adam", "adamw"):
        # the optimizer step priced (advisor.cost.optimizer_step): MindFormers' AdamW picks FusedAdamW with
        # use_fused True, its per-operation AdamW otherwise (mindformers/core/optim/__init__.py, 1.7.0 and 2.1.0)
        out["optimizer"] = {"type": "AdamW", "use_fused": j.optimizer_impl == "fused"}
        if s.offload_optimizer:
            # optimizer offload: AdamW's and FusedAdamW's swap keeps the states on the host
            # (mindformers/core/optim/adamw.py, fused_adamw.py, v1.7.0)
            out["optimizer"]["swap"] = True
    return _settings.merge(out, _settings.keys(plan, "mindspore", unsupported))   # the settings whose records spell them


def swap_config(plan: Plan) -> dict:
    """Activation swapping (advisor.cost.swap) as MindFormers' swap_config: the first swap_layers[i]
    layers of each stage i by global layer index, prefetched one layer ahead of their backward
    (docs/mindformers/docs/source_en/feature/memory_optimization.md, "Fine-Grained Activations SWAP")."""
    s = plan.strategy
    layers, start, swapped = s.resolved_stage_layers(plan.model.num_layers), 0, []
    for n, k in zip(layers, s.swap_layers):
        swapped += list(range(start, start + k))
        start += n
    return {"swap": True, "default_prefetch": 1, "layer_swap": [{"backward_prefetch": 1, "layers": swapped}]}


def moe_config(plan: Plan, unsupported: list[str]) -> dict:
    """MindFormers' MoEConfig keys for the plan's experts (legacy path; see the module docstring)."""
    m, s, j = plan.model, plan.strategy, plan.training
    moe = m.moe
    # MoEConfig's capacity per expert is ceil(k x tokens x capacity_factor / expert_num)
    # (calculate_expert_capacity in moe.py): no token is dropped when it reaches all tokens, i.e.
    # capacity_factor >= expert_num / k. A plan priced without dropless routing uses factor 1.0, as the
    # Megatron export's --moe-expert-capacity-factor.
    factor = moe.num_experts / moe.top_k if j.moe_dropless else 1.0
    if moe.layer_frequency != 1:
        unsupported.append(f"model.moe.layer_frequency = {moe.layer_frequency}: MindFormers' legacy Llama puts "
                           "the experts of moe_config in every layer; set the dense layers in the model code")
    return {
        "expert_num": moe.num_experts,
        "num_experts_chosen": moe.top_k,
        "moe_intermediate_size": moe.expert_ffn_hidden_size,
        "capacity_factor": float(factor),
        "expert_model_parallel": s.ep,
    }


def _py_value(value) -> str:
    if isinstance(value, list) and value and all(isinstance(x, list) for x in value):
        return repr(tuple(tuple(x) for x in value))       # dataset_strategy: MindSpore takes tuples
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {_py_value(v)}" for k, v in value.items()) + "}"
    return repr(value)


# Parameter offload (parallel.offload_params): MindSpore's memory offload with the parameters in host
# memory (docs/sample_code/memory_offload/train.py of the MindSpore docs: set_context(memory_offload=
# "ON") and set_offload_context's offload_param, auto_offload and enable_pinned_mem keys).
OFFLOAD_PARAMS = ("\n# parameter offload: the weights live in host memory and are fetched as layers run\n"
                  "ms.set_context(memory_offload=\"ON\")\n"
                  "ms.set_offload_context(offload_config={\"offload_param\": \"cpu\", \"auto_offload\": False, "
                  "\"enable_pinned_mem\": True})\n")


def context_script(plan: Plan, ctx: dict) -> str:
    args = ",\n".join(f"    {k}={_py_value(v)}" for k, v in ctx.items())
    return (
        comment_block(header_lines(plan, "MindSpore set_auto_parallel_context"))
        + "# Call before building the network; run one process per device (msrun / mpirun).\n"
        + "import mindspore as ms\n\n"
        + "ms.set_auto_parallel_context(\n" + args + ",\n)\n"
        + (OFFLOAD_PARAMS if plan.strategy.offload_params else "")
    )


def needs_mcore(plan: Plan) -> bool:
    """Whether the model needs MindFormers' mcore path: the legacy Llama leaves part of it unwritten and a family
    registered for mcore builds it (advisor.export.mindformers_mcore)."""
    return bool(unwritten_model_features(plan, "MindFormers")) and mcore_model_config(plan, "", 0) is not None


def export(plan: Plan, target_version: str | None = None, launch=None) -> ExportResult:
    """``launch``: advisor.export.mindspore_launch.LaunchOptions (hosts, master port) for the launchers."""
    version = pick_version("mindspore", target_version, VERSIONS, DEFAULT_VERSION)
    unsupported: list[str] = []
    notes: list[str] = []
    mcore = needs_mcore(plan)
    if not mcore:
        unsupported += unwritten_model_features(plan, "MindFormers")
    cfg = mindformers_config(plan, unsupported, notes)
    path = "mcore model path, use_legacy: False" if mcore else "legacy model path, use_legacy: True"
    yaml_text = (comment_block(header_lines(plan, f"MindFormers {version} parallel settings ({path})"))
                 + "# Merge into your MindFormers training YAML (run_mode: train).\n"
                 + yaml.safe_dump(cfg, sort_keys=False, default_flow_style=None))
    files = {
        "parallel_context.py": context_script(plan, cfg["parallel"]),
        "mindformers_parallel.yaml": yaml_text,
    }
    from advisor.export.mindspore_launch import launch_files  # msrun, dynamic cluster, mpirun, rank table
    files.update(launch_files(plan, notes, unsupported, launch))
    from advisor.export.mindspore_strategy import strategy_files  # shard() calls, strategy file (drec/ilp plans)
    files.update(strategy_files(plan, notes, unsupported))
    from advisor.export.mindspore_host import host_embedding_files  # the word embedding on the host
    files.update(host_embedding_files(plan, notes))
    return ExportResult(target="mindspore", files=files, unsupported=tuple(unsupported), notes=tuple(notes))
