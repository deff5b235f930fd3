"""DeepSpeed: ds_config.json, the pipeline settings (PipelineModule and its topology), the launcher line,
and the model as a Hugging Face config.json (advisor.export.hf_model) where a transformers family builds it
(DeepSpeed takes the model from the user's code; ``AutoModelForCausalLM.from_config`` builds this one), so
MLA, shared experts, dense first layers, head_dim and sliding windows launch as priced.

Keys follow the DeepSpeed configuration reference (https://www.deepspeed.ai/docs/config-json/: batch
size, fp16/bf16, zero_optimization with offload_optimizer, activation_checkpointing) and the sources
that parse them in deepspeed/runtime/config.py (``pipeline``: stages, partition, seed_layers,
activation_checkpoint_interval, pipe_partitioned, grad_partitioned; ``sequence_parallel_size`` for
DeepSpeed-Ulysses; ``tensor_parallel.autotp_size`` for AutoTP training). The pipeline engine runs
the 1F1B TrainSchedule only and refuses ZeRO-2/3 ("ZeRO-2 and ZeRO-3 are incompatible with pipeline
parallelism", deepspeed/runtime/pipe/engine.py); PipeModelDataParallelTopology orders ranks
pipe > data > model (model innermost).

Launch routes and DeepSpeed's batch check. DeepSpeedConfig asserts train_batch_size = micro batch x
gradient accumulation x its world size (_batch_assertion in deepspeed/runtime/config.py), where the
world size is the mpu's data-parallel size when deepspeed.initialize gets an mpu, and otherwise the
whole world divided by sequence_parallel_size. The export names one route per plan:

* pp > 1: train.py builds the PipelineModule of pipeline_settings.py; deepspeed.initialize takes the
  module's own grid as mpu (deepspeed/__init__.py), whose data-parallel size is the topology's data
  axis = dp. The topology has no sequence axis, so a plan with cp > 1 and pp > 1 is refused.
* pp = 1: deepspeed.initialize(model=..., config="ds_config.json") without an mpu, tensor parallelism
  by AutoTP (tensor_parallel.autotp_size, DeepSpeed 0.16.4 or newer: the AutoTP training blog and
  tutorial). DeepSpeed then counts the tensor-parallel ranks as data parallel, so with tp > 1 the
  file leaves train_batch_size out and DeepSpeed derives it; the samples per step stay
  micro x accumulation x dp = the plan's global batch.

Target releases (--target-version): 0.15 (no AutoTP training) to 0.19. From v0.16.4 to v0.19.3 the
engine asserts ZeRO stage <= 2 with AutoTP ("the compatibility between 'autotp' and 'zero_stage = 3'
has not been validated", deepspeed/runtime/engine.py); v0.19.4 lifted it ("AutoTP + ZeRO stage 3 is
supported for both inference and training"), so target 0.19 means 0.19.4 or newer for such plans.
"""

from __future__ import annotations

import json

from advisor.errors import AdvisorError
from advisor.export import ExportResult
from advisor.export import _comm_knobs, _settings
from advisor.export._common import (
    comment_block, header_lines, is_even_split, mesh_text, non_default_mesh, pick_version, procs_per_node,
    stage_layers, unwritten_model_features, ALL_FEATURES,
)
from advisor.export.hf_model import FILE as MODEL_FILE, hf_model
from advisor.export._recompute import CORE_ATTENTION, FULL, NONE, cannot_express, priced_recompute
from advisor.plan import Plan

FRAMEWORK = "deepspeed"   # the framework record this export launches (ds_config runs DeepSpeed)
# release -> whether it trains with AutoTP (tensor_parallel.autotp_size; DeepSpeed >= 0.16.4)
VERSIONS = {"0.15": False, "0.16": True, "0.17": True, "0.18": True, "0.19": True}
# releases whose engine accepts AutoTP with ZeRO-3 (v0.19.4 and newer; see the module docstring)
AUTOTP_ZERO3 = {"0.19"}
DEFAULT_VERSION = "0.19"


def launch_route(plan: Plan) -> str:
    """The deepspeed.initialize call the export's files are written for (see the module docstring)."""
    if plan.strategy.pp > 1:
        return "deepspeed.initialize(model=PipelineModule from pipeline_settings.build_pipeline, ...): mpu = its grid"
    return "deepspeed.initialize(model=..., config='ds_config.json') without an mpu"


def check_route(plan: Plan, version: str) -> None:
    """Refuse, with the reason, the plans DeepSpeed's batch check or engine rejects on the named route."""
    s = plan.strategy
    if s.cp > 1 and s.pp > 1:
        raise AdvisorError(f"parallel.cp = {s.cp} with pp = {s.pp}: DeepSpeed's pipeline topology "
                           "(PipeModelDataParallelTopology) has no sequence axis, so the cp ranks would train as data "
                           "parallel and the batch would no longer be the plan's; re-plan with cp = 1 or pp = 1")
    if s.tp > 1 and s.pp == 1 and not VERSIONS[version]:
        raise AdvisorError(f"parallel.tp = {s.tp}: DeepSpeed {version} has no AutoTP training "
                           "(tensor_parallel.autotp_size, DeepSpeed 0.16.4 or newer); export with --target-version 0.16 "
                           "or newer")
    if s.tp > 1 and s.pp == 1 and s.zero_stage == 3 and version not in AUTOTP_ZERO3:
        raise AdvisorError(f"parallel.zero_stage = 3 with tp = {s.tp}: DeepSpeed {version}'s engine accepts AutoTP "
                           "with ZeRO stage 2 at most (0.19.4 lifted this); export with --target-version 0.19 or "
                           "re-plan with zero_stage <= 2")
    if s.zero_stage >= 2 and s.pp > 1:
        raise AdvisorError(f"parallel.zero_stage = {s.zero_stage} with pp = {s.pp}: DeepSpeed's pipeline engine "
                           "refuses ZeRO-2 and ZeRO-3 (deepspeed/runtime/pipe/engine.py); re-plan with zero_stage <= 1 "
                           "or pp = 1")


def _every_layer_recomputed(plan: Plan) -> bool:
    """DeepSpeed's one recomputation switch (every layer in full) is the priced policy."""
    priced = priced_recompute(plan)
    return priced.kind == FULL and priced.layers is None


def ds_config(plan: Plan, unsupported: list[str], notes: list[str]) -> dict:
    s, j = plan.strategy, plan.training
    cfg: dict = {}
    if s.tp > 1 and s.pp == 1:
        # no mpu: DeepSpeed's world for the batch check is devices / cp = dp x tp (config.py)
        counted = plan.strategy.devices // s.cp
        notes.append(f"ds_config.json leaves train_batch_size out: without an mpu DeepSpeed counts all {counted} "
                     f"ranks (dp x tp) as data parallel and derives {s.micro_batch_size * s.num_micro_batches * counted}; "
                     f"the AutoTP ranks of one group read the same batch, so a step still trains "
                     f"{j.global_batch_size} samples (micro {s.micro_batch_size} x accumulation {s.num_micro_batches} "
                     f"x dp {s.dp})")
    else:
        cfg["train_batch_size"] = j.global_batch_size
    cfg.update({
        "train_micro_batch_size_per_gpu": s.micro_batch_size,
        "gradient_accumulation_steps": s.num_micro_batches,
        "steps_per_print": 10,
        "gradient_clipping": 1.0,
        "wall_clock_breakdown": False,
    })
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
    if j.optimizer in ("adam", "adamw") and j.optimizer_impl == "unfused":
        # DeepSpeedEngine._configure_basic_optimizer: torch_adam builds torch.optim.Adam(W), whose
        # foreach step runs one kernel per operation, instead of DeepSpeed's FusedAdam
        cfg["optimizer"]["params"]["torch_adam"] = True
    notes.append("optimizer.params.lr is a placeholder: the plan does not choose hyper-parameters")

    zero: dict = {"stage": s.zero_stage}
    if s.zero_stage >= 1:
        zero.update({"overlap_comm": j.overlap_grad_reduce, "contiguous_gradients": True, "reduce_scatter": True})
    if s.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        if s.offload_fraction != 1.0 and s.zero_stage == 3:     # DeepSpeedZeroOffloadOptimizerConfig.ratio
            zero["offload_optimizer"]["ratio"] = s.offload_fraction
        elif s.offload_fraction != 1.0:
            unsupported.append(f"parallel.offload_fraction = {s.offload_fraction:g}: DeepSpeed's offload_optimizer.ratio "
                               "is valid with ZeRO stage 3 only; exported with the whole optimizer offloaded")
    if s.offload_params:      # ZeRO-Infinity: DeepSpeedZeroOffloadParamConfig, valid with stage 3
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    zero.update(_comm_knobs.deepspeed_keys(plan, j.dtype_bytes, unsupported))   # communication fusion
    unsupported.extend(x for x in [_comm_knobs.copies_unsupported(plan, "DeepSpeed", "none"),
                                   _comm_knobs.priority_unsupported(plan, "DeepSpeed"),
                                   _comm_knobs.full_batch_unsupported(plan, "DeepSpeed"),
                                   _comm_knobs.host_embedding_unsupported(plan, "DeepSpeed"),
                                   _comm_knobs.cuda_graphs_unsupported(plan, "DeepSpeed")] if x)
    cfg["zero_optimization"] = zero

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
    if s.tp > 1 and s.pp == 1:
        cfg["tensor_parallel"] = {"autotp_size": s.tp}
        notes.append("tensor_parallel.autotp_size uses DeepSpeed AutoTP training (Hugging Face models)")
    elif s.tp > 1:
        notes.append(f"tp = {s.tp} is the model axis of the pipeline topology: the layers in build_pipeline must be "
                     "tensor-parallel themselves (as Megatron-DeepSpeed's are); AutoTP is not used with the pipeline engine")
    if s.sequence_parallel:
        unsupported.append("parallel.sequence_parallel = true: ds_config has no Megatron-style sequence parallelism "
                           "(it lives in the model code, e.g. Megatron-DeepSpeed --sequence-parallel)")
    if s.cp > 1:
        cfg["sequence_parallel_size"] = s.cp
    if s.cp > 1 and s.cp_comm != "a2a":
        unsupported.append(f"parallel.cp = {s.cp}: DeepSpeed's sequence parallelism is Ulysses (all-to-all over "
                           "attention heads), not the ring exchange of K and V the plan was priced with")
    return _settings.merge(cfg, _settings.keys(plan, "deepspeed", unsupported))   # the settings whose records spell them


def pipeline_settings(plan: Plan, unsupported: list[str], notes: list[str]) -> str:
    s, m, j = plan.strategy, plan.model, plan.training
    layers = list(stage_layers(plan))
    if s.pp > 1 and not is_even_split(plan):
        unsupported.append(f"parallel.stage_layers = {layers}: PipelineModule partitions by 'uniform' or "
                           "'parameters', not by explicit per-stage layer counts; exported as 'parameters'")
    if s.pp > 1 and s.pipeline_schedule == "gpipe":
        unsupported.append("parallel.pipeline_schedule = gpipe: DeepSpeed's pipeline engine runs 1F1B only")
    if s.virtual_pipeline_stages > 1:
        unsupported.append(f"parallel.virtual_pipeline_stages = {s.virtual_pipeline_stages}: DeepSpeed's pipeline "
                           "engine has no interleaved schedule; exported with one stage per rank")
    if non_default_mesh(plan):
        unsupported.append(f"parallel.mesh_order = {mesh_text(plan)}: DeepSpeed orders ranks pipe > data > model "
                           "(model innermost); exported with that order")
    partition = "uniform" if is_even_split(plan) else "parameters"
    ep_line = ""
    if m.moe is not None:
        # DeepSpeed's MoE drops tokens beyond capacity_factor 1.0 unless drop_tokens=False (its
        # deepspeed.moe.layer.MoE defaults): the plan's routing, written out
        drop = "True" if not j.moe_dropless else "False"
        ep_line = (f"# Expert parallelism and the routing are set where the MoE layers are built:\n"
                   f"#   deepspeed.moe.layer.MoE(hidden_size={m.hidden_size}, num_experts={m.moe.num_experts}, "
                   f"ep_size=EP_SIZE, k={m.moe.top_k}, capacity_factor=1.0, drop_tokens={drop})\n")
        notes.append(f"expert parallelism (ep = {s.ep}) is an argument of deepspeed.moe.layer.MoE in the model code; "
                     "pipeline_settings.py names it EP_SIZE")
    return (
        comment_block(header_lines(plan, "DeepSpeed pipeline settings"))
        + "# Pipeline settings for deepspeed.pipe.PipelineModule (DeepSpeed's pipeline engine runs 1F1B).\n"
        + "# Launch route: " + launch_route(plan) + "\n"
        + "from deepspeed.pipe import PipelineModule\n"
        + "from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology\n\n"
        + f"NUM_STAGES = {s.pp}\n"
        + f"TENSOR_PARALLEL = {s.tp}\n"
        + f"DATA_PARALLEL = {s.dp * s.cp}\n"   # = dp on the pipeline route (cp > 1 with pp > 1 is refused)
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


def launch_script(plan: Plan, nproc: int, version: str) -> str:
    return (
        "#!/usr/bin/env bash\n"
        + comment_block(header_lines(plan, f"DeepSpeed {version} launcher"))
        + "# train.py calls " + launch_route(plan) + "\n"
        + "# hostfile: one line per node, e.g. 'node-0 slots=" + str(nproc) + "'; train.py is your training script.\n"
        + "set -euo pipefail\n"
        + f"deepspeed --num_nodes {plan.cluster.nodes} --num_gpus {nproc} --hostfile hostfile "
        + "train.py --deepspeed --deepspeed_config ds_config.json\n"
    )


def export(plan: Plan, target_version: str | None = None) -> ExportResult:
    version = pick_version("deepspeed", target_version, tuple(VERSIONS), DEFAULT_VERSION)
    check_route(plan, version)
    unsupported: list[str] = []
    notes: list[str] = []
    nproc = procs_per_node(plan, "the deepspeed launcher", unsupported)
    model = hf_model(plan.model)
    unsupported += unwritten_model_features(plan, "DeepSpeed", written=() if model.config is None else ALL_FEATURES)
    cfg = ds_config(plan, unsupported, notes)
    files = {
        "ds_config.json": json.dumps(cfg, indent=2, allow_nan=False) + "\n",
        "pipeline_settings.py": pipeline_settings(plan, unsupported, notes),
        "launch_deepspeed.sh": launch_script(plan, nproc, version),
    }
    if model.config is not None:
        files[MODEL_FILE] = json.dumps(model.config, indent=2, allow_nan=False) + "\n"
        notes.append(f"{MODEL_FILE} is the priced model as transformers builds it (model_type {model.model_type}): "
                     "train.py builds it with AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder)) "
                     "and loads your weights, or trains it from scratch")
    return ExportResult(target="deepspeed", files=files, unsupported=tuple(unsupported), notes=tuple(notes))
