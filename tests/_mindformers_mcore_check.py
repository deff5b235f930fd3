"""Run by an interpreter with MindSpore and MindFormers (tests/test_export_mindformers_mcore.py): MindFormers' own
reading of an exported mcore-path YAML (MindFormerConfig, build_parallel_config, the model type's config class and
its convert_to_transformer_config), printed as one JSON line of TransformerConfig fields.

    python -E tests/_mindformers_mcore_check.py A.yaml [B.yaml ...]     # one RESULT line per file, in order
"""

import json
import sys

import yaml
from mindformers.core.parallel_config import build_parallel_config
from mindformers.tools.register.config import MindFormerConfig

KEYS = ("num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "kv_channels", "ffn_hidden_size",
        "num_moe_experts", "moe_router_topk", "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size",
        "first_k_dense_replace", "moe_expert_capacity_factor", "tensor_model_parallel_size",
        "pipeline_model_parallel_size", "expert_model_parallel_size", "data_parallel_size", "context_parallel_size",
        "virtual_pipeline_model_parallel_size", "sequence_parallel", "mtp_num_layers", "multi_latent_attention",
        "kv_lora_rank", "q_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim", "seq_length")


def config_class(kind: str):
    if kind == "qwen3_moe":
        from mindformers.models.qwen3_moe.configuration_qwen3_moe import Qwen3MoeConfig
        return Qwen3MoeConfig
    if kind == "qwen3":
        from mindformers.models.qwen3.configuration_qwen3 import Qwen3Config
        return Qwen3Config
    from mindformers.models.deepseek3.configuration_deepseek_v3 import DeepseekV3Config
    return DeepseekV3Config


for path in sys.argv[1:]:
    doc = yaml.safe_load(open(path))
    doc["run_mode"] = "train"
    full = path + ".train.yaml"
    yaml.safe_dump(doc, open(full, "w"))
    cfg = MindFormerConfig(full)
    build_parallel_config(cfg)
    mc = dict(cfg.model.model_config)
    mc["parallel_config"] = cfg.parallel_config        # as the trainer hands it to the model config
    tc = config_class(mc["model_type"])(**mc).convert_to_transformer_config()
    print("RESULT" + json.dumps({k: getattr(tc, k, None) for k in KEYS}, default=str))
