"""MindFormers' mcore model path (``use_legacy: False``) for the models its legacy Llama cannot express.

The legacy path's LlamaConfig has no head_dim, latent attention, shared experts, dense first layers or
sliding windows (mindformers/models/llama/llama_config.py, 1.7.0 and 2.1.0). The mcore path builds the models
registered for it by model_type from Hugging Face-style keys in ``model.model_config`` (configs/qwen3/
pretrain_qwen3_32b_4k.yaml, configs/qwen3_moe/pretrain_qwen3_30b_a3b_4k.yaml of MindFormers: model_type,
architectures, hidden_size, num_hidden_layers, num_key_value_heads, head_dim, num_experts,
moe_intermediate_size, ...) and converts them, with parallel_config, into Megatron-style TransformerConfig
fields (mindformers/parallel_core/transformer_config_utils.py COMMON_CONFIG_MAPPING: pp_interleave_num ->
virtual_pipeline_model_parallel_size, capacity_factor -> moe_expert_capacity_factor, offset, recompute keys).
So a model whose Hugging Face family (advisor.export.hf_model) MindFormers registers for mcore is written there;
MoE settings go in model_config (the template skips moe_config on this path: tools/register/template.py
_apply_template), and multi-copy parallelism is refused (trainer/base_trainer.py: "micro_batch_interleave_num >
1, is not supported when use_legacy=False").
"""

from __future__ import annotations

from advisor.export.hf_model import hf_model
from advisor.plan import Plan

# Hugging Face model types MindFormers builds on its mcore path (mindformers/models/<name>/configuration_*.py
# model_type, 2.1.0) -> the architecture name its YAMLs give
MCORE_TYPES = {"qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM", "deepseek_v3": "DeepseekV3ForCausalLM"}
# the keys MindFormers adds to the Hugging Face ones in model.model_config (read back by advisor's importer)
OWN_KEYS = ("seq_length", "compute_dtype", "params_dtype", "offset", "pp_interleave_num", "use_flash_attention",
            "capacity_factor", "num_nextn_predict_layers", "moe_grouped_gemm")


def mcore_model_config(plan: Plan, compute_dtype: str, offset) -> dict | None:
    """The model.model_config of the mcore path (None: no registered family builds the model)."""
    hf = hf_model(plan.model)
    if hf.config is None or hf.model_type not in MCORE_TYPES:
        return None
    s, j, m = plan.strategy, plan.training, plan.model
    config = {"model_type": hf.model_type, "architectures": MCORE_TYPES[hf.model_type]}
    config.update({k: v for k, v in hf.config.items() if k not in ("architectures", "model_type") and v is not None})
    config.update({"seq_length": j.seq_length, "compute_dtype": compute_dtype, "params_dtype": "float32",
                   "offset": offset, "use_flash_attention": j.attention == "flash"})
    if s.virtual_pipeline_stages > 1:
        config["pp_interleave_num"] = s.virtual_pipeline_stages
    if m.moe is not None:
        config["moe_grouped_gemm"] = True
        if not j.moe_dropless:            # a capacity of one even share per expert, as the Megatron export's
            config["capacity_factor"] = 1.0
    if hf.model_type == "deepseek_v3":    # MindFormers' DeepseekV3Config builds one MTP module by default: not priced
        config["num_nextn_predict_layers"] = 0
    return config


def mcore_refusals(plan: Plan) -> list[str]:
    """What the mcore path does not run of a plan (the unsupported sentences)."""
    out = []
    if plan.strategy.micro_batch_copies > 1:
        out.append(f"parallel.micro_batch_copies = {plan.strategy.micro_batch_copies}: MindFormers' mcore path (needed "
                   "for this model) refuses micro_batch_interleave_num > 1 (trainer/base_trainer.py)")
    return out
