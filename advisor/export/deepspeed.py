"""DeepSpeed: ds_config.json, the pipeline settings (PipelineModule and its topology) and the launcher line.

Keys follow the DeepSpeed configuration reference (https://www.deepspeed.ai/docs/config-json/: batch
size, fp16/bf16, zero_optimization with offload_optimizer, activation_checkpointing) and the sources
that parse them in deepspeed/runtime/config.py (``pipeline``: stages, partition, seed_layers,
activation_checkpoint_interval, pipe_partitioned, grad_partitioned; ``sequence_parallel_size`` for
DeepSpeed-Ulysses; ``tensor_parallel.autotp_size`` for AutoTP training). The pipeline engine runs
the 1F1B TrainSchedule only and refuses ZeRO-2/3 ("ZeRO-2 and ZeRO-3 are incompatible with pipeline
parallelism", deepspeed/runtime/pipe/engine.py); PipeModelDataParallelTopology orders ranks
pipe > data > model (model innermost).
"""

from __future__ import annotations

import json

from advisor.export import ExportResult
from advisor.export._common import (
    comment_block, header_lines, is_even_split, mesh_text, non_default_mesh, procs_per_node, stage_layers,
    unwritten_model_features,
)
from advisor.export._recompute import CORE_ATTENTION, FULL, NONE, cannot_express, priced_recompute
from advisor.plan import Plan


def _every_layer_recomputed(plan: Plan) -> bool:
    """DeepSpeed's one recomputation switch (every layer in full) is the priced policy."""
    priced = priced_recompute(plan)
    return priced.kind == FULL and priced.layers is None


def ds_config(plan: Plan, unsupported: list[str], notes: list[str]) -> dict:
    s, j = plan.strategy, plan.training
    cfg: dict = {
        "train_batch_size": j.global_batch_size,
        "train_micro_batch_size_per_gpu": s.micro_batch_size,
        "gradient_accumulation_steps": s.num_micro_batches,
        "steps_per_print": 10,
        "gradient_clipping": 1.0,
        "wall_clock_breakdown": False,
    }
    if j.dtype == "bf16":
        cfg["bf16"] = {"enabled": True}
    elif j.dtype == "fp16":
        cfg["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000,
                       "hysteresis": 2, "min_loss_scale": 1}
    elif j.dtype == "fp8":
        cfg["bf16"] = {"enabled": True}
        unsupported.append("training.dtype = fp8: ds_config has no FP8 training switch (use Transformer Engine in the "
                           "model); exported as bf16")
    opt_type = {"adamw": "AdamW", "adam": "Adam", "sgd": "SGD"}[j.optimizer]
    cfg["optimizer"] = {"type": opt_type, "params": {"lr": 3.0e-4}}
    notes.append("optimizer.params.lr is a placeholder: the plan does not choose hyper-parameters")

    zero: dict = {"stage": s.zero_stage}
    if s.zero_stage >= 1:
        zero.update({"overlap_comm": True, "contiguous_gradients": True, "reduce_scatter": True})
    if s.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    cfg["zero_optimization"] = zero
    if s.zero_stage >= 2 and s.pp > 1:
        unsupported.append(f"parallel.zero_stage = {s.zero_stage} with pp = {s.pp}: DeepSpeed's pipeline engine "
                           "supports ZeRO stage 0 or 1 only")

    priced = priced_recompute(plan)
    if _every_layer_recomputed(plan):
        cfg["activation_checkpointing"] = {"partition_activations": False, "contiguous_memory_optimization": False,
                                           "cpu_checkpointing": False, "synchronize_checkpoint_boundary": False,
                                           "profile": False}
    elif priced.kind != NONE:
        closest = {FULL: "activation_checkpoint_interval (every N-th layer)",
                   CORE_ATTENTION: "Megatron-DeepSpeed's --recompute-granularity selective in the model code"}
        unsupported.append(cannot_express("DeepSpeed", priced, closest.get(priced.kind, "")))
    if s.pp > 1:
        cfg["pipeline"] = {"activation_checkpoint_interval": 1 if "activation_checkpointing" in cfg else 0,
                           "pipe_partitioned": True, "grad_partitioned": True}
    if s.tp > 1:
        cfg["tensor_parallel"] = {"autotp_size": s.tp}
        notes.append("tensor_parallel.autotp_size uses DeepSpeed AutoTP training (Hugging Face models); with "
                     "Megatron-DeepSpeed pass --tensor-model-parallel-size to the model instead")
    if s.sequence_parallel:
        unsupported.append("parallel.sequence_parallel = true: ds_config has no Megatron-style sequence parallelism "
                           "(it lives in the model code, e.g. Megatron-DeepSpeed --sequence-parallel)")
    if s.cp > 1:
        cfg["sequence_parallel_size"] = s.cp
        unsupported.append(f"parallel.cp = {s.cp}: DeepSpeed's sequence parallelism is Ulysses (all-to-all over "
                           "attention heads), not the ring exchange of K and V the plan was priced with")
    return cfg


def pipeline_settings(plan: Plan, unsupported: list[str], notes: list[str]) -> str:
    s, m = plan.strategy, plan.model
    layers = list(stage_layers(plan))
    if s.pp > 1 and not is_even_split(plan):
        unsupported.append(f"parallel.stage_layers = {layers}: PipelineModule partitions by 'uniform' or "
                           "'parameters', not by explicit per-stage layer counts; exported as 'parameters'")
    if s.pp > 1 and s.pipeline_schedule == "gpipe":
        unsupported.append("parallel.pipeline_schedule = gpipe: DeepSpeed's pipeline engine runs 1F1B only")
    if s.virtual_pipeline_stages > 1:
        unsupported.append(f"parallel.virtual_pipeline_stages = {s.virtual_pipeline_stages}: DeepSpeed's pipeline "
                           "engine has no interleaved schedule; exported with one stage per rank")
    if s.cp > 1 and s.pp > 1:
        unsupported.append(f"parallel.cp = {s.cp} with pp = {s.pp}: PipeModelDataParallelTopology has no sequence axis")
    if non_default_mesh(plan):
        unsupported.append(f"parallel.mesh_order = {mesh_text(plan)}: DeepSpeed orders ranks pipe > data > model "
                           "(model innermost); exported with that order")
    partition = "uniform" if is_even_split(plan) else "parameters"
    ep_line = ""
    if m.moe is not None:
        ep_line = (f"# Expert parallelism is set where the MoE layers are built:\n"
                   f"#   deepspeed.moe.layer.MoE(hidden_size={m.hidden_size}, num_experts={m.moe.num_experts}, "
                   f"ep_size=EP_SIZE, k={m.moe.top_k})\n")
        notes.append(f"expert parallelism (ep = {s.ep}) is an argument of deepspeed.moe.layer.MoE in the model code; "
                     "pipeline_settings.py names it EP_SIZE")
    return (
        comment_block(header_lines(plan, "DeepSpeed pipeline settings"))
        + "# Pipeline settings for deepspeed.pipe.PipelineModule (DeepSpeed's pipeline engine runs 1F1B).\n"
        + "from deepspeed.pipe import PipelineModule\n"
        + "from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology\n\n"
        + f"NUM_STAGES = {s.pp}\n"
        + f"TENSOR_PARALLEL = {s.tp}\n"
        + f"DATA_PARALLEL = {s.dp * s.cp}\n"
        + f"EP_SIZE = {s.ep}\n"
        + f"STAGE_LAYERS = {layers}\n"
        + f"PARTITION_METHOD = {partition!r}\n"
        + f"ACTIVATION_CHECKPOINT_INTERVAL = {1 if _every_layer_recomputed(plan) else 0}\n\n"
        + ep_line
        + "\ndef build_pipeline(layers, loss_fn):\n"
        + '    """layers: the LayerSpec list (embedding, transformer layers, head)."""\n'
        + "    topology = PipeModelDataParallelTopology(num_pp=NUM_STAGES, num_mp=TENSOR_PARALLEL, num_dp=DATA_PARALLEL)\n"
        + "    return PipelineModule(layers=layers, topology=topology, loss_fn=loss_fn,\n"
        + "                          partition_method=PARTITION_METHOD,\n"
        + "                          activation_checkpoint_interval=ACTIVATION_CHECKPOINT_INTERVAL)\n"
    )


def launch_script(plan: Plan, nproc: int) -> str:
    return (
        "#!/usr/bin/env bash\n"
        + comment_block(header_lines(plan, "DeepSpeed launcher"))
        + "# hostfile: one line per node, e.g. 'node-0 slots=" + str(nproc) + "'; train.py is your training script.\n"
        + "set -euo pipefail\n"
        + f"deepspeed --num_nodes {plan.cluster.nodes} --num_gpus {nproc} --hostfile hostfile "
        + "train.py --deepspeed --deepspeed_config ds_config.json\n"
    )


def export(plan: Plan) -> ExportResult:
    unsupported: list[str] = []
    notes: list[str] = []
    nproc = procs_per_node(plan, "the deepspeed launcher", unsupported)
    unsupported += unwritten_model_features(plan, "DeepSpeed")
    cfg = ds_config(plan, unsupported, notes)
    files = {
        "ds_config.json": json.dumps(cfg, indent=2) + "\n",
        "pipeline_settings.py": pipeline_settings(plan, unsupported, notes),
        "launch_deepspeed.sh": launch_script(plan, nproc),
    }
    return ExportResult(target="deepspeed", files=files, unsupported=tuple(unsupported), notes=tuple(notes))
