"""Plan JSON (schema_version 1): the Plan dataclass, its writer, loader and validator.

A plan keeps the model and hardware mappings it was made from verbatim, so load -> save gives the
same JSON. Validation refuses a malformed or inconsistent plan with the field named.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from advisor import __version__
from advisor.errors import AdvisorError
from advisor.space.rules import violations
from advisor.space.strategy import CP_COMM, MESH_DIMS, RECOMPUTE, SCHEDULES, Strategy
from advisor.specs import _fields as f
from advisor.specs.hardware import HardwareProfile, hardware_from_dict
from advisor.specs.job import FP8_RECIPES, FRAMEWORKS, Cluster, TrainingJob
from advisor.specs.model import ModelSpec, model_from_dict, model_to_dict

SCHEMA_VERSION = 1
_TOP_REQUIRED = ("schema_version", "model", "hardware", "cluster", "training", "parallel")
_TOP_OPTIONAL = ("advisor_version", "operator_strategies", "prediction", "search")
_PARALLEL_REQUIRED = ("dp", "tp", "pp")
_PARALLEL_OPTIONAL = (
    "cp", "ep", "sequence_parallel", "virtual_pipeline_stages", "micro_batch_size", "num_micro_batches",
    "zero_stage", "recompute", "recompute_layers", "pipeline_schedule", "stage_layers", "mesh_order",
    "offload_optimizer", "cp_comm",
)


@dataclass(frozen=True)
class Plan:
    model: ModelSpec
    hardware: HardwareProfile
    cluster: Cluster
    training: TrainingJob
    strategy: Strategy
    operator_strategies: Any = None
    prediction: dict[str, Any] | None = None
    search: dict[str, Any] | None = None
    advisor_version: str = __version__
    model_raw: dict[str, Any] | None = field(default=None, compare=False, repr=False)


def strategy_to_dict(s: Strategy, num_layers: int) -> dict[str, Any]:
    return {
        "dp": s.dp, "tp": s.tp, "pp": s.pp, "cp": s.cp, "ep": s.ep,
        "sequence_parallel": s.sequence_parallel,
        "virtual_pipeline_stages": s.virtual_pipeline_stages,
        "micro_batch_size": s.micro_batch_size, "num_micro_batches": s.num_micro_batches,
        "zero_stage": s.zero_stage, "recompute": s.recompute,
        "recompute_layers": list(s.recompute_layers) if isinstance(s.recompute_layers, tuple) else s.recompute_layers,
        "pipeline_schedule": s.pipeline_schedule,
        "stage_layers": list(s.resolved_stage_layers(num_layers)),
        "mesh_order": list(s.mesh_order),
        "offload_optimizer": s.offload_optimizer,
        "cp_comm": s.cp_comm,
    }


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    training = {
        "global_batch_size": plan.training.global_batch_size, "seq_length": plan.training.seq_length,
        "dtype": plan.training.dtype, "optimizer": plan.training.optimizer, "attention": plan.training.attention,
        "dropout": plan.training.dropout,
        "framework": plan.training.framework,
        "overlap_grad_reduce": plan.training.overlap_grad_reduce,
    }
    if plan.training.train_tokens is not None:
        training["train_tokens"] = plan.training.train_tokens
    if plan.training.fp8_recipe is not None:
        training["fp8_recipe"] = plan.training.fp8_recipe
    if plan.training.recompute_modules is not None:
        training["recompute_modules"] = list(plan.training.recompute_modules)
    return {
        "schema_version": SCHEMA_VERSION,
        "advisor_version": plan.advisor_version,
        "model": plan.model_raw if plan.model_raw is not None else model_to_dict(plan.model),
        "hardware": plan.hardware.raw,
        "cluster": {"nodes": plan.cluster.nodes, "devices": plan.cluster.devices},
        "training": training,
        "parallel": strategy_to_dict(plan.strategy, plan.model.num_layers),
        "operator_strategies": plan.operator_strategies,
        "prediction": plan.prediction,
        "search": plan.search,
    }


def _strategy_from_dict(data: dict[str, Any], origin: str) -> Strategy:
    o = f"{origin}: parallel"
    f.check_keys(data, o, _PARALLEL_REQUIRED, _PARALLEL_OPTIONAL)
    stage_layers = data.get("stage_layers")
    if stage_layers is not None:
        if not isinstance(stage_layers, list) or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in stage_layers):
            raise AdvisorError(f"{o}: key 'stage_layers' must be a list of positive integers, got {stage_layers!r}")
        stage_layers = tuple(stage_layers)
    mesh = data.get("mesh_order", list(MESH_DIMS))
    if not isinstance(mesh, list) or sorted(mesh) != sorted(MESH_DIMS):
        raise AdvisorError(f"{o}: key 'mesh_order' must list each of {', '.join(MESH_DIMS)} once, got {mesh!r}")
    rl = data.get("recompute_layers")
    if isinstance(rl, list):
        if not rl or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in rl):
            raise AdvisorError(f"{o}: key 'recompute_layers' must be a positive integer or a list of non-negative "
                               f"integers (one per pipeline stage), got {rl!r}")
        rl = tuple(rl)
    elif rl is not None:
        rl = f.positive_int(data, "recompute_layers", o)
    return Strategy(
        dp=f.positive_int(data, "dp", o), tp=f.positive_int(data, "tp", o), pp=f.positive_int(data, "pp", o),
        cp=f.positive_int(data, "cp", o, default=1), ep=f.positive_int(data, "ep", o, default=1),
        sequence_parallel=f.boolean(data, "sequence_parallel", o, default=False),
        virtual_pipeline_stages=f.positive_int(data, "virtual_pipeline_stages", o, default=1),
        micro_batch_size=f.positive_int(data, "micro_batch_size", o, default=1),
        num_micro_batches=f.positive_int(data, "num_micro_batches", o, default=1),
        zero_stage=f.non_negative_int(data, "zero_stage", o, default=0),
        recompute=f.choice(data, "recompute", o, RECOMPUTE, default="none"),
        recompute_layers=rl,
        pipeline_schedule=f.choice(data, "pipeline_schedule", o, SCHEDULES, default="1f1b"),
        stage_layers=stage_layers,
        offload_optimizer=f.boolean(data, "offload_optimizer", o, default=False),
        mesh_order=tuple(mesh),
        cp_comm=f.choice(data, "cp_comm", o, CP_COMM, default="p2p"),
    )


def _training_from_dict(data: dict[str, Any], origin: str) -> TrainingJob:
    o = f"{origin}: training"
    f.check_keys(data, o, ("global_batch_size", "seq_length"), ("dtype", "optimizer", "train_tokens", "attention", "dropout", "framework",
                                                                "overlap_grad_reduce", "fp8_recipe", "recompute_modules"))
    tokens = data.get("train_tokens")
    modules = data.get("recompute_modules")
    if modules is not None and (not isinstance(modules, list) or not all(isinstance(m, str) for m in modules)):
        raise AdvisorError(f"{o}: key 'recompute_modules' must be a list of names, got {str(modules)[:80]!r}")
    recipe = data.get("fp8_recipe")
    dtype = f.choice(data, "dtype", o, ("fp32", "tf32", "fp16", "bf16", "fp8"), default="bf16")
    if recipe is not None and dtype != "fp8":
        raise AdvisorError(f"{o}: key 'fp8_recipe' = {recipe!r} needs dtype fp8, got dtype {dtype!r}")
    return TrainingJob(
        global_batch_size=f.positive_int(data, "global_batch_size", o),
        seq_length=f.positive_int(data, "seq_length", o),
        dtype=dtype,
        optimizer=f.choice(data, "optimizer", o, ("adamw", "adam", "sgd"), default="adamw"),
        train_tokens=None if tokens is None else f.positive_float(data, "train_tokens", o),
        attention=f.choice(data, "attention", o, ("flash", "math"), default="flash"),
        dropout=f.boolean(data, "dropout", o, default=False),
        framework=f.choice(data, "framework", o, FRAMEWORKS, default="megatron"),
        overlap_grad_reduce=f.boolean(data, "overlap_grad_reduce", o, default=True),
        fp8_recipe=None if recipe is None else f.choice(data, "fp8_recipe", o, FP8_RECIPES),
        recompute_modules=None if modules is None else tuple(modules),
    )


def plan_from_dict(data: dict[str, Any], origin: str = "plan") -> Plan:
    f.check_keys(data, origin, _TOP_REQUIRED, _TOP_OPTIONAL)
    if data["schema_version"] != SCHEMA_VERSION:
        raise AdvisorError(f"{origin}: key 'schema_version' must be {SCHEMA_VERSION}, got {data['schema_version']!r}")
    if not isinstance(data["model"], dict):
        raise AdvisorError(f"{origin}: key 'model' must be a mapping (the model description)")
    if not isinstance(data["hardware"], dict):
        raise AdvisorError(f"{origin}: key 'hardware' must be a mapping (the hardware profile)")
    model = model_from_dict(data["model"], f"{origin}: model")
    hardware = hardware_from_dict(data["hardware"], f"{origin}: hardware")
    co = f"{origin}: cluster"
    f.check_keys(data["cluster"], co, ("nodes", "devices"))
    cluster = Cluster(nodes=f.positive_int(data["cluster"], "nodes", co), devices=f.positive_int(data["cluster"], "devices", co))
    if cluster.devices > cluster.nodes * hardware.node.devices_per_node:
        raise AdvisorError(
            f"{co}: key 'devices' = {cluster.devices} exceeds nodes x devices per node = "
            f"{cluster.nodes} x {hardware.node.devices_per_node}"
        )
    training = _training_from_dict(data["training"], origin)
    strategy = _strategy_from_dict(data["parallel"], origin)
    broken = violations(model, cluster, training, strategy)
    if broken:
        raise AdvisorError(f"{origin}: parallel: {broken[0]}")
    for key in ("prediction", "search"):
        if data.get(key) is not None and not isinstance(data[key], dict):
            raise AdvisorError(f"{origin}: key '{key}' must be a mapping or null, got {data[key]!r}")
    return Plan(
        model=model, hardware=hardware, cluster=cluster, training=training, strategy=strategy,
        operator_strategies=data.get("operator_strategies"), prediction=data.get("prediction"),
        search=data.get("search"), advisor_version=str(data.get("advisor_version", __version__)),
        model_raw=data["model"],
    )


def dumps_plan(plan: Plan) -> str:
    return json.dumps(plan_to_dict(plan), indent=2) + "\n"


def save_plan(plan: Plan, path: str | Path) -> None:
    try:
        Path(path).write_text(dumps_plan(plan))
    except OSError as exc:
        raise AdvisorError(f"cannot write plan to {path}: {exc.strerror}") from None


def read_plan_dict(path: str | Path) -> dict[str, Any]:
    """The plan file's JSON object, unvalidated (the executor reads plans as plain mappings)."""
    p = Path(path)
    if not p.is_file():
        raise AdvisorError(f"plan file not found: {path}")
    try:
        data = json.loads(p.read_text())
    except json.JSONDecodeError as exc:
        raise AdvisorError(f"{path}: malformed JSON: {exc}") from None
    if not isinstance(data, dict):
        raise AdvisorError(f"{path}: a plan must be a JSON object")
    return data


def load_plan(path: str | Path) -> Plan:
    return plan_from_dict(read_plan_dict(path), str(path))
