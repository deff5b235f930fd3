"""torchtitan 0.2.x: the [parallelism], [training] and [activation_checkpoint] sections of a job TOML.

Target releases (--target-version): 0.2.0, 0.2.1 and 0.2.2, the releases that read job TOML files
(--job.config_file); every field written is in torchtitan/config/job_config.py at each of those tags.
torchtitan after 0.2.2 (its main branch) configures a run with a Python function returning
Trainer.Config, chosen with --module/--config (torchtitan/config/README.md), and no longer reads job
TOML files: this export does not serve it.

Field names and allowed values follow torchtitan 0.2's torchtitan/config/job_config.py (dataclasses
Parallelism, Training, ActivationCheckpoint; ConfigManager refuses unknown fields) and
torchtitan/distributed/parallel_dims.py (world = dp_replicate x dp_shard x cp x tp x pp; the device
mesh is ordered pp > dp_replicate > dp_shard > cp > tp; expert parallelism borrows from dp_shard x cp
when expert_tensor_parallel_degree = tp). Pipeline parts are given explicitly with
module_fqns_per_model_part (torchtitan's Transformer FQNs: tok_embeddings, layers.N, norm, output);
part i runs on pipeline rank i mod pp, as torchtitan's looped schedules place them. Schedule names
are those of torch.distributed.pipelining (get_schedule_class): GPipe, 1F1B, Interleaved1F1B.
Data parallelism is FSDP2: ZeRO-3 = reshard after forward ("always"), ZeRO-2 = keep the gathered
parameters until backward ("never"), ZeRO-0 = replicate (DDP).
"""

from __future__ import annotations

from math import gcd

from advisor.export import ExportResult
from advisor.export import _comm_knobs, _settings
from advisor.export._common import (
    MODEL_FEATURES, chunk_layers, comment_block, header_lines, mesh_text, non_default_mesh, pick_version, stage_layers,
    train_steps, unwritten_model_features,
)
from advisor.export.torchtitan_flavors import flavor_of
from advisor.export._recompute import CORE_ATTENTION, FULL, NONE, OP_LEVEL, cannot_express, priced_recompute
from advisor.plan import Plan

FRAMEWORK = "torchtitan"   # the framework record this export launches (the TOML runs torchtitan)
VERSIONS = ("0.2.0", "0.2.1", "0.2.2")
DEFAULT_VERSION = "0.2.2"
SCHEDULE_NAMES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved-1f1b": "Interleaved1F1B"}


def model_parts(plan: Plan) -> list[list[str]]:
    """Module FQNs of each pipeline part, in part order (virtual stage v, pipeline rank p -> part v*pp + p)."""
    chunks = chunk_layers(plan)
    pp = plan.strategy.pp
    parts: list[list[str]] = []
    layer = 0
    for v, row in enumerate(chunks):
        for p in range(pp):
            names = ["tok_embeddings"] if (v == 0 and p == 0) else []
            names += [f"layers.{layer + i}" for i in range(row[p])]
            layer += row[p]
            if v == len(chunks) - 1 and p == pp - 1:
                names += ["norm", "output"]
            parts.append(names)
    return parts


def sections(plan: Plan, unsupported: list[str], notes: list[str]) -> dict[str, dict]:
    s, m, j = plan.strategy, plan.model, plan.training
    par: dict = {}
    unsupported.extend(x for x in [_comm_knobs.torchtitan_bucket_unsupported(plan),
                                   _comm_knobs.copies_unsupported(plan, "torchtitan", "async tensor parallelism"),
                                   _comm_knobs.priority_unsupported(plan, "torchtitan"),
                                   _comm_knobs.full_batch_unsupported(plan, "torchtitan"),
                                   _comm_knobs.host_embedding_unsupported(plan, "torchtitan"),
                                   _comm_knobs.cuda_graphs_unsupported(plan, "torchtitan"),
                                   _comm_knobs.token_drop_unsupported(plan, "torchtitan")] if x)
    # ---- data parallelism: FSDP2 ---------------------------------------------------------------------
    if s.zero_stage == 0:
        replicate, shard, reshard = s.dp, 1, "default"
    else:
        replicate, shard = 1, s.dp
        # ZeRO-3 as priced (framework record reshards_under_pipeline: False): "default" reshards after the forward
        # without pipelining and keeps the gathered weights under it (models/llama3/infra/parallelize.py, v0.2.0)
        reshard = "default" if s.zero_stage == 3 else "never"
        if s.zero_stage == 1:
            unsupported.append("parallel.zero_stage = 1: torchtitan's data parallelism is FSDP2, which has no "
                               "optimizer-only sharding; exported as FSDP with fsdp_reshard_after_forward = \"never\" "
                               "(ZeRO-2-like: gradients sharded too, parameters gathered once per step)")
    if m.moe is not None and s.ep > 1:
        # etp = tp: ep % cp == 0, (dp_shard * cp) % ep == 0; etp = 1 (the experts folded): ep % (cp * tp) == 0,
        # (dp_shard * cp * tp) % ep == 0 (torchtitan/distributed/parallel_dims.py, v0.2.0)
        inner = s.cp * (s.tp if s.expert_tp == 1 else 1)
        if (shard * inner) % s.ep:
            need = s.ep // gcd(s.ep, inner)
            replicate, shard = s.dp // need, need
            unsupported.append(f"parallel.ep = {s.ep} with zero_stage = 0: torchtitan's expert parallelism borrows from "
                               f"the FSDP shard dimension; exported as HSDP with data_parallel_shard_degree = {shard} "
                               "(parameters sharded, which the plan does not do)")
        if s.ep % inner:
            what = f"cp x tp = {inner}" if s.expert_tp == 1 and s.tp > 1 else f"cp = {s.cp}"
            unsupported.append(f"parallel.ep = {s.ep} with {what}: torchtitan needs ep to be a multiple of it")
    par["data_parallel_replicate_degree"] = replicate
    par["data_parallel_shard_degree"] = shard
    par["fsdp_reshard_after_forward"] = reshard
    # ---- tensor, context, expert ------------------------------------------------------------------------
    par["tensor_parallel_degree"] = s.tp
    if s.tp > 1 and not s.sequence_parallel:
        unsupported.append("parallel.sequence_parallel = false: torchtitan's tensor parallelism always shards the "
                           "norms along the sequence (sequence parallelism), so activations use less memory than planned")
    par["context_parallel_degree"] = s.cp
    if m.moe is not None:
        par["expert_parallel_degree"] = s.ep
        par["expert_tensor_parallel_degree"] = s.expert_tp     # 1 with the experts folded (torchtitan's default)
    # ---- pipeline ---------------------------------------------------------------------------------------
    par["pipeline_parallel_degree"] = s.pp
    if s.pp > 1:
        par["pipeline_parallel_schedule"] = SCHEDULE_NAMES[s.pipeline_schedule]
        par["pipeline_parallel_microbatch_size"] = s.micro_batch_size
        par["module_fqns_per_model_part"] = model_parts(plan)
        notes.append(f"pipeline parts follow the plan's stage layers {list(stage_layers(plan))} "
                     "(module_fqns_per_model_part, torchtitan Transformer module names)")
    if non_default_mesh(plan):
        unsupported.append(f"parallel.mesh_order = {mesh_text(plan)}: torchtitan builds its device mesh as "
                           "pp > dp_replicate > dp_shard > cp > tp; exported with that order")

    # ---- training -------------------------------------------------------------------------------------
    train: dict = {}
    # torchtitan: gradient accumulation = global / (local x dp); with PP the local batch is split into
    # local / pipeline_parallel_microbatch_size micro-batches instead.
    train["local_batch_size"] = s.micro_batch_size * s.num_micro_batches if s.pp > 1 else s.micro_batch_size
    train["global_batch_size"] = j.global_batch_size
    train["seq_len"] = j.seq_length
    steps = train_steps(plan)
    train["steps"] = steps if steps is not None else 1000
    if steps is None:
        notes.append("the plan has no token budget: training.steps = 1000 is a placeholder")
    if j.dtype in ("bf16", "fp8"):
        train["mixed_precision_param"] = "bfloat16"
    elif j.dtype == "fp16":
        train["mixed_precision_param"] = "bfloat16"
        unsupported.append("training.dtype = fp16: torchtitan trains in bfloat16 or float32; exported as bfloat16")
    else:
        train["mixed_precision_param"] = "float32"
    if s.offload_optimizer:
        train["enable_cpu_offload"] = True       # FSDP2's CPUOffloadPolicy: parameters, gradients, optimizer states
        if s.offload_fraction != 1.0:
            unsupported.append(f"parallel.offload_fraction = {s.offload_fraction:g}: FSDP2's CPU offload moves all of "
                               "the optimizer or none; exported with all of it")
        if not s.offload_params:
            unsupported.append("parallel.offload_optimizer = true: torchtitan's enable_cpu_offload offloads parameters "
                               "and gradients as well as optimizer states (FSDP2 CPU offload; the plan priced "
                               "--offload-params off)")

    # ---- activation checkpointing ---------------------------------------------------------------------
    # The priced policy only (advisor.export._recompute): torchtitan's modes are none, full, op-level
    # selective and every n-th layer.
    ac: dict = {}
    priced = priced_recompute(plan)
    if priced.kind == NONE:
        ac["mode"] = "none"
    elif priced.kind == FULL and priced.layers is None:
        ac["mode"] = "full"
    elif priced.kind == OP_LEVEL and priced.layers is None:
        ac["mode"] = "selective"
        ac["selective_ac_option"] = "op"
    else:
        closest = {FULL: 'mode = "selective" with selective_ac_option = "N" (every N-th layer)',
                   CORE_ATTENTION: 'mode = "selective", selective_ac_option = "op" (priced with --framework torchtitan)'}
        unsupported.append(cannot_express("torchtitan", priced, closest.get(priced.kind, "")))
    if j.optimizer_impl == "unfused":
        notes.append('the plan was priced with an unfused optimizer step: set implementation = "foreach" in your '
                     '[optimizer] section (torchtitan\'s default is "fused")')
    if s.cp > 1 and s.cp_comm == "a2a":
        unsupported.append("parallel.cp_comm = a2a: torchtitan's context parallelism is ring attention "
                           "(context_parallel_rotate_method allgather or alltoall), not Ulysses")
    secs = {"parallelism": par, "training": train, "activation_checkpoint": ac, **_fp8_sections(plan)}
    return _settings.merge(secs, _settings.keys(plan, "torchtitan", unsupported), sections=True)


# The FP8 recipe as torchtitan's model converters (config/job_config.py, v0.2.0): tensorwise scaling is the
# float8 converter's recipe, MXFP8 the mx converter's cuBLAS recipe
FP8_CONVERTERS = {"tensorwise": ("quantize.linear.float8", "tensorwise"), "mxfp8": ("quantize.linear.mx", "mxfp8_cublas")}


def _fp8_sections(plan: Plan) -> dict[str, dict]:
    """[model] converters and the converter's recipe for an FP8 plan (the recipes the torchtitan record runs)."""
    recipe = plan.training.recipe
    if recipe not in FP8_CONVERTERS:     # none, or one torchtitan does not run (delayed, blockwise, nvfp4): the
        return {}                        # job's own check names it among what keeps the launch from the price
    converter, name = FP8_CONVERTERS[recipe]
    return {"model": {"converters": [converter]}, converter: {"recipe_name": name}}


def toml_string(text: str) -> str:
    """A TOML basic string (TOML 1.0, "String"): backslash and quote escaped, every control character
    (U+0000-U+001F, U+007F) as \\uXXXX, everything else as UTF-8."""
    out = []
    for ch in text:
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _toml_value(value, indent: str = "") -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, list):
        if value and all(isinstance(v, list) for v in value):
            inner = ",\n".join(f"{indent}    {_toml_value(v)}" for v in value)
            return "[\n" + inner + f",\n{indent}]"
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} as TOML")


def render_toml(plan: Plan, secs: dict[str, dict], version: str = DEFAULT_VERSION) -> str:
    out = [comment_block(header_lines(plan, f"torchtitan {version} job config")),
           "# Merge these sections into your torchtitan job TOML (the [job], [optimizer] ... sections and the\n"
           "# [model] keys not written here are yours: without a name and flavor, register the priced\n"
           "# architecture yourself); run with --job.config_file.\n"]
    for name, body in secs.items():
        out.append(f"\n[{name}]\n")
        for key, value in body.items():
            out.append(f"{key} = {_toml_value(value)}\n")
    return "".join(out)


def export(plan: Plan, target_version: str | None = None) -> ExportResult:
    version = pick_version("torchtitan", target_version, VERSIONS, DEFAULT_VERSION)
    unsupported: list[str] = []
    notes: list[str] = []
    if plan.cluster.devices % plan.cluster.nodes:
        unsupported.append(f"cluster.devices = {plan.cluster.devices} on {plan.cluster.nodes} nodes: torchrun starts "
                           "the same number of processes on every node")
    flavor = flavor_of(plan.model)
    # a flavor torchtitan ships carries the whole architecture (head_dim, experts); without one, [model] is yours
    unsupported += unwritten_model_features(plan, "torchtitan", written=MODEL_FEATURES if flavor else ())
    secs = sections(plan, unsupported, notes)
    if flavor:
        secs["model"] = {"name": flavor[0], "flavor": flavor[1], **secs.get("model", {})}
    return ExportResult(target="torchtitan", files={"torchtitan.toml": render_toml(plan, secs, version)},
                        unsupported=tuple(unsupported), notes=tuple(notes))
