"""--from a Megatron-Bridge ConfigContainer YAML (its run_config.yaml): priced as the Megatron-LM launch it stands for,
every key of a whole dump read, neutral or at its dataclass default, and any other value refused naming the file,
the key and the value."""

from __future__ import annotations

import copy

import pytest
import yaml

from advisor.commands.estimate_request import estimate_request
from advisor.errors import AdvisorError
from advisor.importers import read_launch_config
from advisor.importers._bridge_defaults import DEFAULTS, UNKNOWN

# what a dump serialises for the fields whose default is computed (yaml_utils.py @v0.2.0: a callable or dtype as
# {_target_, _call_: false}, an enum as {_target_, _call_: true, _args_: [value]})
SERIALISED = {
    "model.activation_func": {"_target_": "torch.nn.functional.silu", "_call_": False},
    "model.attention_backend": {"_target_": "megatron.core.transformer.enums.AttnBackend", "_call_": True,
                                "_args_": [5]},
    "model.gradient_accumulation_fusion": True,
    "model.params_dtype": {"_target_": "torch.bfloat16", "_call_": False},
    "model.transformer_layer_spec": {"_target_": "megatron.bridge.models.gpt_provider.default_layer_spec",
                                     "_call_": False},
    "optimizer.params_dtype": {"_target_": "torch.bfloat16", "_call_": False},
    "optimizer.main_grads_dtype": {"_target_": "torch.float32", "_call_": False},
    "optimizer.main_params_dtype": {"_target_": "torch.float32", "_call_": False},
    "optimizer.exp_avg_dtype": {"_target_": "torch.float32", "_call_": False},
    "optimizer.exp_avg_sq_dtype": {"_target_": "torch.float32", "_call_": False},
    "optimizer.initial_loss_scale": 4294967296,
    "train.exit_signal": 15, "train.iterations_to_skip": [], "dist.local_rank": 0,
    "comm_overlap.tp_comm_overlap": True,
}
# llama3_70b_pretrain_config (recipes/llama/llama3.py @v0.2.0) on Llama3ModelProvider70B (models/llama/
# llama_provider.py), bf16_mixed, distributed_fused_adam_with_cosine_annealing, the recipe's DDP config
RECIPE = {
    "model": {"_target_": "megatron.bridge.models.llama.llama_provider.Llama3ModelProvider70B",
              "num_layers": 80, "hidden_size": 8192, "ffn_hidden_size": 28672, "num_attention_heads": 64,
              "num_query_groups": 8, "vocab_size": 128256, "seq_length": 8192, "rotary_base": 500000,
              "normalization": "RMSNorm", "gated_linear_unit": True, "position_embedding_type": "rope",
              "add_bias_linear": False, "attention_dropout": 0.0, "hidden_dropout": 0.0,
              "share_embeddings_and_output_weights": False, "init_method_std": 0.01, "layernorm_epsilon": 1e-5,
              "bias_activation_fusion": True, "masked_softmax_fusion": True, "persist_layer_norm": True,
              "bias_dropout_fusion": True, "apply_rope_fusion": True, "cross_entropy_fusion_impl": "te",
              "tensor_model_parallel_size": 4, "pipeline_model_parallel_size": 4,
              "virtual_pipeline_model_parallel_size": 5, "context_parallel_size": 2, "sequence_parallel": True,
              "pipeline_dtype": {"_target_": "torch.bfloat16", "_call_": False}, "bf16": True, "tp_comm_overlap": True,
              "hf_model_id": "meta-llama/Meta-Llama-3-70B"},
    "train": {"train_iters": 1168251, "eval_interval": 2000, "eval_iters": 32, "global_batch_size": 512,
              "micro_batch_size": 1, "manual_gc": True, "manual_gc_interval": 100, "manual_gc_eval": 100},
    "optimizer": {"optimizer": "adam", "lr": 3e-4, "min_lr": 3e-5, "adam_eps": 1e-5, "adam_beta2": 0.95,
                  "weight_decay": 0.1, "bf16": True, "use_distributed_optimizer": True},
    "ddp": {"check_for_nan_in_grad": True, "grad_reduce_in_fp32": True, "overlap_grad_reduce": True,
            "overlap_param_gather": True, "average_in_collective": True, "use_distributed_optimizer": True},
    "mixed_precision": {"bf16": True, "params_dtype": {"_target_": "torch.bfloat16", "_call_": False},
                        "pipeline_dtype": {"_target_": "torch.bfloat16", "_call_": False},
                        "autocast_enabled": False, "grad_reduce_in_fp32": True},
    "comm_overlap": {"tp_comm_overlap_cfg": {"qkv_dgrad": {"method": "bulk", "num_sm": 4}}},
    "dataset": {"_target_": "megatron.bridge.training.config.GPTDatasetConfig", "seq_length": 8192,
                "random_seed": 1234, "split": "9999,8,2", "num_workers": 8},
    "scheduler": {"lr_warmup_iters": 2000, "lr_decay_style": "cosine"},
    "logger": {"log_interval": 10, "tensorboard_dir": "/results/tb_logs"},
    "checkpoint": {"save_interval": 500, "save": "/results/checkpoints", "ckpt_format": "torch_dist"},
    "tokenizer": {"tokenizer_type": "NullTokenizer", "vocab_size": 128256},
    "rng": {"seed": 1234}, "peft": None,
}
# the same run as a Megatron-LM launch (pretrain_gpt.py flags)
MEGATRON = """torchrun --nnodes 16 --nproc-per-node 8 pretrain_gpt.py \\
  --num-layers 80 --hidden-size 8192 --ffn-hidden-size 28672 --num-attention-heads 64 \\
  --group-query-attention --num-query-groups 8 --vocab-size 128256 --swiglu --normalization RMSNorm \\
  --position-embedding-type rope --disable-bias-linear --untie-embeddings-and-output-weights \\
  --attention-dropout 0.0 --hidden-dropout 0.0 \\
  --tensor-model-parallel-size 4 --pipeline-model-parallel-size 4 --num-virtual-stages-per-pipeline-rank 5 \\
  --context-parallel-size 2 --sequence-parallel --tp-comm-overlap --bf16 --attention-backend auto \\
  --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather --optimizer adam \\
  --micro-batch-size 1 --global-batch-size 512 --seq-length 8192
"""


def run_config() -> dict:
    """A whole run_config.yaml: every field of the serialised sections at its dataclass default, the recipe's over
    them (as ConfigContainer.to_yaml() writes it)."""
    doc: dict = {}
    for section, fields in DEFAULTS.items():
        doc[section] = {"_target_": f"megatron.bridge.{section}"}
        for name, value in fields.items():
            key = f"{section}.{name}"
            doc[section][name] = SERIALISED.get(key) if value == UNKNOWN else value
    for section, body in RECIPE.items():
        if isinstance(body, dict):
            doc.setdefault(section, {}).update(copy.deepcopy(body))
        else:
            doc[section] = body
    for section in ("model", "optimizer", "ddp"):     # MixedPrecisionConfig.setup writes its fields over these
        for name, value in doc["mixed_precision"].items():
            if name in doc[section] and name != "_target_":
                doc[section][name] = copy.deepcopy(value)
    return doc


def _write(tmp_path, doc, name="run_config.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return str(path)


def test_a_whole_run_config_is_priced_as_its_megatron_launch(tmp_path):
    bridge = estimate_request("llama3-70b", "dgx-h100", None, 128, job={}, strategy={},
                              launch=_write(tmp_path, run_config()))
    (tmp_path / "launch.sh").write_text(MEGATRON)
    mlm = estimate_request("llama3-70b", "dgx-h100", None, 128, job={}, strategy={}, launch=str(tmp_path / "launch.sh"))
    s, j = bridge.strategy, bridge.inputs.job
    assert (s.tp, s.pp, s.cp, s.dp, s.virtual_pipeline_stages, s.micro_batch_size) == (4, 4, 2, 4, 5, 1)
    assert s.sequence_parallel and s.zero_stage == 1 and s.num_micro_batches == 128
    assert (j.framework, j.dtype, j.tp_comm_overlap, j.overlap_grad_reduce, j.dropout, j.global_batch_size,
            j.seq_length) == ("megatron", "bf16", True, True, False, 512, 8192)
    assert bridge.strategy == mlm.strategy and bridge.inputs.job == mlm.inputs.job
    assert bridge.estimate.tokens_per_s == pytest.approx(mlm.estimate.tokens_per_s, rel=1e-12)
    assert bridge.estimate.memory_gib.total == pytest.approx(mlm.estimate.memory_gib.total, rel=1e-12)


def test_an_override_file_and_named_precision(tmp_path):
    doc = {"model": {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 1, "context_parallel_size": 1,
                     "sequence_parallel": True, "recompute_granularity": "selective",
                     "recompute_modules": ["core_attn", "mlp"], "attention_dropout": 0.0, "hidden_dropout": 0.0},
           "train": {"micro_batch_size": 2, "global_batch_size": 256},
           "ddp": {"use_distributed_optimizer": True, "grad_reduce_in_fp32": False, "overlap_grad_reduce": True},
           "mixed_precision": "bf16_with_fp8_current_scaling_mixed"}
    r = estimate_request("llama3-8b", "dgx-h100", None, 16, job={}, strategy={}, launch=_write(tmp_path, doc, "o.yaml"))
    s, j = r.strategy, r.inputs.job
    assert (s.tp, s.dp, s.micro_batch_size, s.recompute, s.zero_stage) == (2, 8, 2, "selective", 1)
    # the named recipe's grad_reduce_in_fp32 = True is written over ddp's (MixedPrecisionConfig.setup)
    assert (j.dtype, j.fp8_recipe, j.fp8_param_gather, j.grad_reduce_dtype, j.recompute_modules) == \
        ("fp8", "tensorwise", True, None, ("core_attn", "mlp"))
    doc["mixed_precision"] = {"bf16": True, "grad_reduce_in_fp32": False}
    r = estimate_request("llama3-8b", "dgx-h100", None, 16, job={}, strategy={}, launch=_write(tmp_path, doc, "o.yaml"))
    assert (r.inputs.job.dtype, r.inputs.job.grad_reduce_dtype) == ("bf16", "bf16")


def test_the_nvfp4_named_precision_reads_as_the_nvfp4_recipe(tmp_path):
    """Megatron-Bridge's bf16_with_nvfp4_mixed (fp4 e2m1, no FP8): the linear layers' GEMMs in NVFP4, priced so."""
    doc = {"model": {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 1, "context_parallel_size": 1,
                     "sequence_parallel": True, "attention_dropout": 0.0, "hidden_dropout": 0.0},
           "train": {"micro_batch_size": 1, "global_batch_size": 256},
           "ddp": {"use_distributed_optimizer": True}, "mixed_precision": "bf16_with_nvfp4_mixed"}
    r = estimate_request("llama3-8b", "dgx-b200", None, 16, job={}, strategy={}, launch=_write(tmp_path, doc, "o.yaml"))
    j = r.inputs.job
    assert (j.dtype, j.recipe, j.fp8_param_gather) == ("fp8", "nvfp4", False)
    doc["mixed_precision"] = {"bf16": True, "fp4": "e3m0"}
    with pytest.raises(AdvisorError, match="fp4"):
        estimate_request("llama3-8b", "dgx-b200", None, 16, job={}, strategy={}, launch=_write(tmp_path, doc, "o.yaml"))


def test_experts_and_folding(tmp_path):
    doc = {"model": {"num_layers": 48, "hidden_size": 2048, "num_attention_heads": 32, "num_query_groups": 4,
                     "kv_channels": 128, "normalization": "RMSNorm", "gated_linear_unit": True,
                     "activation_func": {"_target_": "torch.nn.functional.silu", "_call_": False},
                     "position_embedding_type": "rope", "add_bias_linear": False, "qk_layernorm": True,
                     "share_embeddings_and_output_weights": False, "num_moe_experts": 128, "moe_router_topk": 8, "moe_ffn_hidden_size": 768,
                     "tensor_model_parallel_size": 2, "expert_model_parallel_size": 8,
                     "expert_tensor_parallel_size": 1, "sequence_parallel": True,
                     "overlap_moe_expert_parallel_comm": True, "moe_token_dispatcher_type": "alltoall",
                     "moe_router_load_balancing_type": "aux_loss", "moe_aux_loss_coeff": 1e-3},
           "train": {"micro_batch_size": 1, "global_batch_size": 512},
           "ddp": {"use_distributed_optimizer": True}, "mixed_precision": "bf16_mixed"}
    r = estimate_request("qwen3-30b-a3b", "dgx-h100", None, 16, job={}, strategy={},
                         launch=_write(tmp_path, doc, "moe.yaml"))
    assert (r.strategy.tp, r.strategy.ep, r.strategy.fold_experts) == (2, 8, True)
    assert r.inputs.job.ep_comm_overlap and r.inputs.job.moe_dropless


@pytest.mark.parametrize("section,key,value,words", [
    ("model", "deterministic_mode", True, "model.deterministic_mode = 'True': a setting advisor does not price at "
                                          "this value (Megatron-Core's default: False)"),
    ("model", "cpu_offloading", True, "model.cpu_offloading = 'True'"),
    ("ddp", "num_distributed_optimizer_instances", 2, "ddp.num_distributed_optimizer_instances = '2'"),
    ("model", "activation_func", {"_target_": "torch.nn.functional.relu", "_call_": False}, "relu"),
    ("model", "recompute_granularity", "sometimes", "model.recompute_granularity (--recompute-granularity)"),
    ("model", "sequence_parallel", "yes", "model.sequence_parallel = 'yes': takes true or false"),
    ("model", "cuda_graph_impl", "transformer_engine", "model.cuda_graph_impl = 'transformer_engine'"),
    ("train", "rampup_batch_size", [32, 32, 1000], "train.rampup_batch_size"),
    ("optimizer", "exp_avg_dtype", {"_target_": "torch.bfloat16", "_call_": False}, "optimizer.exp_avg_dtype"),
])
def test_a_key_advisor_cannot_price_is_refused(tmp_path, section, key, value, words):
    doc = run_config()
    doc[section][key] = value
    path = _write(tmp_path, doc)
    with pytest.raises(AdvisorError) as err:
        estimate_request("llama3-70b", "dgx-h100", None, 128, job={}, strategy={}, launch=path)
    assert words in str(err.value) and "run_config.yaml" in str(err.value)


def test_refusals_of_whole_sections_and_disagreements(tmp_path):
    doc = run_config()
    doc["peft"] = {"_target_": "megatron.bridge.peft.lora.LoRA", "dim": 16}
    with pytest.raises(AdvisorError, match="peft = 'LoRA': parameter-efficient"):
        read_launch_config(_write(tmp_path, doc))
    doc = run_config()
    doc["dataset"]["seq_length"] = 4096
    with pytest.raises(AdvisorError, match="dataset.seq_length = '4096' disagrees with model.seq_length = '8192'"):
        read_launch_config(_write(tmp_path, doc))
    doc = run_config()
    doc["optimizer"]["bf16"] = False                 # mixed_precision's is the one that runs
    assert read_launch_config(_write(tmp_path, doc)).job["dtype"] == "bf16"
    del doc["mixed_precision"]
    with pytest.raises(AdvisorError, match="optimizer.bf16 = 'False': disagrees with model.bf16 = True"):
        read_launch_config(_write(tmp_path, doc))
    doc = run_config()
    doc["mystery"] = {"x": 1}
    with pytest.raises(AdvisorError, match="mystery"):
        read_launch_config(_write(tmp_path, doc))
    with pytest.raises(AdvisorError, match="train = '8': a ConfigContainer section is a mapping"):
        read_launch_config(_write(tmp_path, {"model": {"num_layers": 2}, "train": 8}))
    with pytest.raises(AdvisorError, match="mixed_precision = 'bf17': not a recipe"):
        read_launch_config(_write(tmp_path, {"model": {"num_layers": 2}, "mixed_precision": "bf17"}))


def test_a_mindformers_yaml_is_still_read_as_mindformers(tmp_path):
    from advisor.importers.megatron_bridge import is_bridge_config

    assert not is_bridge_config({"parallel_config": {"data_parallel": 8}, "model": {"model_config": {}}})
    assert is_bridge_config(run_config())
