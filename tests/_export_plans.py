"""Hand-written plans (plan JSON schema v1) that together exercise every plan feature an exporter maps.

Each plan goes through plan_from_dict, so it is a valid plan by the project's own rules.
"""

from __future__ import annotations

from advisor.plan import Plan, plan_from_dict
from advisor.specs.hardware import load_hardware
from advisor.specs.model import load_model, model_to_dict


def make_plan(model: str, hardware: str, nodes: int, parallel: dict, *, devices: int | None = None,
              global_batch_size: int, seq_length: int, dtype: str = "bf16", optimizer: str = "adamw",
              train_tokens: float | None = None, searcher: str = "enumerate", attention: str = "flash",
              framework: str = "megatron", recompute_modules: list[str] | None = None,
              cuda_graphs: list[str] | None = None) -> Plan:
    hw = load_hardware(hardware)
    training = {"global_batch_size": global_batch_size, "seq_length": seq_length, "dtype": dtype,
                "optimizer": optimizer, "attention": attention, "framework": framework}
    if train_tokens is not None:
        training["train_tokens"] = train_tokens
    if recompute_modules is not None:
        training["recompute_modules"] = recompute_modules
    if cuda_graphs is not None:
        training["cuda_graphs"] = cuda_graphs
    data = {
        "schema_version": 1, "advisor_version": "0.1.0",
        "model": model_to_dict(load_model(model)), "hardware": hw.raw,
        "cluster": {"nodes": nodes, "devices": devices if devices is not None else nodes * hw.node.devices_per_node},
        "training": training,
        "parallel": parallel,
        "operator_strategies": None,
        "prediction": {"step_time_s": 1.0, "tokens_per_s": 1.0e6, "mfu": 0.45},
        "search": {"searcher": searcher, "candidates": 1, "feasible": 1, "seconds": 0.1},
    }
    return plan_from_dict(data, f"test plan {model}")


def plans() -> dict[str, Plan]:
    """name -> plan; names say what each one exercises."""
    return {
        # dense GQA model, uneven pipeline stages, distributed optimizer, selective recompute, token budget
        "llama70b_uneven_pp": make_plan(
            "llama3-70b", "dgx-a100-80g", 8,
            {"dp": 4, "tp": 8, "pp": 2, "sequence_parallel": True, "micro_batch_size": 1, "num_micro_batches": 128,
             "zero_stage": 1, "recompute": "selective", "stage_layers": [41, 39]},
            global_batch_size=512, seq_length=4096, train_tokens=2.0e12),
        # MoE, expert parallel, interleaved virtual stages, partial full recompute
        "mixtral_ep_vpp": make_plan(
            "mixtral-8x7b", "dgx-h100", 4,
            {"dp": 8, "tp": 2, "pp": 2, "ep": 4, "sequence_parallel": True, "virtual_pipeline_stages": 2,
             "pipeline_schedule": "interleaved-1f1b", "micro_batch_size": 1, "num_micro_batches": 32,
             "zero_stage": 1, "recompute": "full", "recompute_layers": 4},
            global_batch_size=256, seq_length=4096),
        # Megatron's selective recomputation of chosen modules (gpt-oss style: the norms and the experts' activation)
        "mixtral_recompute_modules": make_plan(
            "mixtral-8x7b", "dgx-h100", 8,
            {"dp": 16, "tp": 1, "pp": 4, "ep": 8, "micro_batch_size": 1, "num_micro_batches": 16,
             "zero_stage": 1, "recompute": "selective"},
            global_batch_size=256, seq_length=4096, recompute_modules=["layernorm", "moe_act"]),
        # GPT-3 style (learned positions, biases, LayerNorm, GELU), GPipe, fp16, DDP, Ascend
        "gpt3_gpipe_fp16": make_plan(
            "gpt3-175b", "ascend-910b", 16,
            {"dp": 2, "tp": 8, "pp": 8, "micro_batch_size": 1, "num_micro_batches": 64, "zero_stage": 0,
             "recompute": "full", "pipeline_schedule": "gpipe"},
            global_batch_size=128, seq_length=2048, dtype="fp16"),
        # context parallel, ZeRO-3 with optimizer offload, full recompute, no sequence parallel, odd mesh
        "llama8b_cp_zero3_offload": make_plan(
            "llama3-8b", "dgx-a100-40g", 2,
            {"dp": 2, "tp": 2, "pp": 1, "cp": 4, "micro_batch_size": 1, "num_micro_batches": 8, "zero_stage": 3,
             "offload_optimizer": True, "recompute": "full", "mesh_order": ["pp", "cp", "tp", "dp"]},
            global_batch_size=16, seq_length=8192, attention="math"),
        # ZeRO-2 with pipeline parallelism, fp32, SGD, pipe-then-data mesh (Megatron's tp-pp-dp mapping)
        "llama7b_zero2_pp": make_plan(
            "llama2-7b", "dgx-a100-80g", 2,
            {"dp": 4, "tp": 2, "pp": 2, "micro_batch_size": 2, "num_micro_batches": 4, "zero_stage": 2,
             "recompute": "none", "mesh_order": ["dp", "pp", "cp", "tp"]},
            global_batch_size=32, seq_length=4096, dtype="fp32", optimizer="sgd"),
        # Megatron-Core's per-layer CUDA graphs over the attention half
        "llama8b_cuda_graphs_attn": make_plan(
            "llama3-8b", "dgx-h100", 1,
            {"dp": 8, "tp": 1, "pp": 1, "micro_batch_size": 1, "num_micro_batches": 4, "zero_stage": 1},
            global_batch_size=32, seq_length=8192, cuda_graphs=["attn"]),
        # plain data parallel on one node, found by the D-Rec searcher
        "llama8b_dp_drec": make_plan(
            "llama3-8b", "dgx-h100", 1,
            {"dp": 8, "tp": 1, "pp": 1, "micro_batch_size": 1, "num_micro_batches": 4, "zero_stage": 1},
            global_batch_size=32, seq_length=8192, searcher="drec", train_tokens=1.0e9),
        # priced for torchtitan: op-level selective activation checkpointing, FSDP
        "llama8b_torchtitan_sac": make_plan(
            "llama3-8b", "dgx-h100", 2,
            {"dp": 16, "tp": 1, "pp": 1, "micro_batch_size": 2, "num_micro_batches": 1, "zero_stage": 3,
             "recompute": "selective"},
            global_batch_size=32, seq_length=8192, framework="torchtitan"),
        # devices that do not fill the last node
        "llama8b_partial_node": make_plan(
            "llama3-8b", "dgx-a100-80g", 2,
            {"dp": 9, "tp": 1, "pp": 1, "micro_batch_size": 1, "num_micro_batches": 4, "zero_stage": 1},
            devices=9, global_batch_size=36, seq_length=4096),
    }


# (plan, target) pairs whose target would reject the plan: the export refuses them with this reason
REFUSED = {("llama7b_zero2_pp", "deepspeed"): "zero_stage = 2 with pp = 2: DeepSpeed's pipeline engine refuses ZeRO-2 and ZeRO-3",
           # torchtitan publishes no image: its Kubernetes job needs --image (tests/test_export_k8s.py gives one)
           ("llama8b_torchtitan_sac", "k8s"): "needs --image IMAGE: an image with torchtitan 0.2.2"}
