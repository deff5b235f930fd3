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
from advisor.specs import limits
from advisor.specs.untrusted import check_tree, load_tree, prefix
from advisor.specs.hardware import HardwareProfile, hardware_from_dict
from advisor.specs.job import (DEFAULT_PUE, FP8_RECIPES, FRAMEWORKS, OPTIMIZER_IMPLS, OPTIMIZERS, TRANSFORMER_OPTIMIZERS,
                               Cluster, TrainingJob)
from advisor.specs.model import ModelSpec, model_from_dict, model_to_dict
from advisor.specs.recommendation import RecModelSpec
from advisor.specs.mixed import MixedHardware, MixedLayout, mixed_from_list
from advisor.plan_mixed import check_cluster, layout_from_dict
from advisor.plan_supernet import check_strategy, run_from_dict
from advisor.cost.supernet import SupernetRun
from advisor.specs.supernet import SupernetSpec
from advisor.plan_ps import (
    embedding_placement_from_dict, host_tables_from_dict, parameter_server_from_dict, rec_violations,
)

SCHEMA_VERSION = 1
_TOP_REQUIRED = ("schema_version", "model", "hardware", "cluster", "training", "parallel")
_TOP_OPTIONAL = ("advisor_version", "operator_strategies", "prediction", "search")
_PARALLEL_REQUIRED = ("dp", "tp", "pp")
_PARALLEL_OPTIONAL = (
    "cp", "ep", "sequence_parallel", "virtual_pipeline_stages", "micro_batch_size", "num_micro_batches",
    "zero_stage", "recompute", "recompute_layers", "pipeline_schedule", "stage_layers", "mesh_order",
    "offload_optimizer", "cp_comm", "parameter_server", "embedding_placement", "host_tables",
    "grad_bucket_mb", "micro_batch_copies", "stage_devices", "replica_devices", "dp_batch_split", "supernet",
    "swap_layers", "full_batch", "offload_params", "offload_fraction", "host_embedding",
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
    # recommendation models (advisor.plan_ps): the servers, and where the embedding tables live
    parameter_server: dict[str, Any] | None = None
    embedding_placement: str | None = None
    host_tables: tuple[str, ...] | None = None      # placement "host": the tables on the host (None: all)
    # what --objective time-to-target aimed at (advisor.cost.convergence.Target.to_dict), in training.target
    target: dict[str, Any] | None = None
    # a mixed cluster (advisor.plan_mixed): its parts (``hardware`` is then the first part's profile)
    # and which device type runs which stages or replicas
    mixed: MixedHardware | None = None
    layout: MixedLayout | None = None
    # a supernet's sampling (advisor.plan_supernet; None for other models)
    supernet: SupernetRun | None = None


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
        # written only when set, so that plans without them save as they were read
        **({"grad_bucket_mb": s.grad_bucket_mb} if s.grad_bucket_mb is not None else {}),
        **({"micro_batch_copies": s.micro_batch_copies} if s.micro_batch_copies != 1 else {}),
        **({"swap_layers": list(s.swap_layers)} if s.swap_layers is not None else {}),
        **({"full_batch": True} if s.full_batch else {}),
        **({"offload_params": True} if s.offload_params else {}),
        **({"offload_fraction": s.offload_fraction} if s.offload_fraction != 1.0 else {}),
        **({"host_embedding": True} if s.host_embedding else {}),
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
    if plan.training.comm_priority:
        training["comm_priority"] = True
    if plan.training.recompute_modules is not None:
        training["recompute_modules"] = list(plan.training.recompute_modules)
    if plan.training.cuda_graphs:
        training["cuda_graphs"] = list(plan.training.cuda_graphs)
    if not plan.training.moe_dropless:
        training["moe_dropless"] = False
    if plan.training.optimizer_impl != "fused":
        training["optimizer_impl"] = plan.training.optimizer_impl
    if plan.target is not None:
        training["target"] = dict(plan.target)
    if plan.training.grid_gco2e_per_kwh is not None or plan.training.pue != DEFAULT_PUE:
        training["pue"] = plan.training.pue
        training["grid_gco2e_per_kwh"] = plan.training.grid_gco2e_per_kwh
    parallel = strategy_to_dict(plan.strategy, plan.model.num_layers)
    if plan.parameter_server is not None or isinstance(plan.model, RecModelSpec):
        parallel["parameter_server"] = plan.parameter_server
    if plan.embedding_placement is not None:
        parallel["embedding_placement"] = plan.embedding_placement
    if plan.host_tables is not None:
        parallel["host_tables"] = list(plan.host_tables)
    if plan.layout is not None:
        parallel.update(plan.layout.to_parallel())
    if plan.supernet is not None:
        parallel["supernet"] = plan.supernet.to_dict()
    return {
        "schema_version": SCHEMA_VERSION,
        "advisor_version": plan.advisor_version,
        "model": plan.model_raw if plan.model_raw is not None else model_to_dict(plan.model),
        "hardware": plan.mixed.to_list() if plan.mixed is not None else plan.hardware.raw,
        "cluster": {"nodes": plan.cluster.nodes, "devices": plan.cluster.devices},
        "training": training,
        "parallel": parallel,
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
            raise AdvisorError(f"{o}: key 'stage_layers' must be a list of positive integers, got {prefix(stage_layers)}")
        stage_layers = tuple(stage_layers)
    mesh = data.get("mesh_order", list(MESH_DIMS))
    if not isinstance(mesh, list) or not all(isinstance(x, str) for x in mesh) or sorted(mesh) != sorted(MESH_DIMS):
        raise AdvisorError(f"{o}: key 'mesh_order' must list each of {', '.join(MESH_DIMS)} once, got {prefix(mesh)}")
    rl = data.get("recompute_layers")
    if isinstance(rl, list):
        if not rl or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in rl):
            raise AdvisorError(f"{o}: key 'recompute_layers' must be a positive integer or a list of non-negative "
                               f"integers (one per pipeline stage), got {prefix(rl)}")
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
        grad_bucket_mb=f.positive_float(data, "grad_bucket_mb", o) if data.get("grad_bucket_mb") is not None else None,
        micro_batch_copies=f.positive_int(data, "micro_batch_copies", o, default=1),
        swap_layers=_swap_layers(data, o, f.positive_int(data, "pp", o)),
        full_batch=f.boolean(data, "full_batch", o, default=False),
        offload_params=f.boolean(data, "offload_params", o, default=False),
        offload_fraction=f.fraction(data, "offload_fraction", o, default=1.0),
        host_embedding=f.boolean(data, "host_embedding", o, default=False),
    )


def _swap_layers(data: dict[str, Any], o: str, pp: int) -> tuple[int, ...] | None:
    value = data.get("swap_layers")
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != pp or not all(
            isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= limits.MAX_LAYERS for x in value):
        raise AdvisorError(f"{o}: key 'swap_layers' must be a list of non-negative layer counts, one per pipeline "
                           f"stage ({pp}), got {prefix(value)}")
    return tuple(value)


def _training_from_dict(data: dict[str, Any], origin: str) -> TrainingJob:
    o = f"{origin}: training"
    f.check_keys(data, o, ("global_batch_size", "seq_length"), ("dtype", "optimizer", "train_tokens", "attention", "dropout", "framework",
                                                                "overlap_grad_reduce", "fp8_recipe", "recompute_modules", "target",
                                                                "pue", "grid_gco2e_per_kwh", "comm_priority", "cuda_graphs",
                                                                "moe_dropless", "optimizer_impl"))
    tokens = data.get("train_tokens")
    modules = data.get("recompute_modules")
    if modules is not None and (not isinstance(modules, list) or not all(isinstance(m, str) for m in modules)):
        raise AdvisorError(f"{o}: key 'recompute_modules' must be a list of names, got {prefix(modules)}")
    graphs = data.get("cuda_graphs", [])
    if not isinstance(graphs, list) or not all(isinstance(m, str) for m in graphs):
        raise AdvisorError(f"{o}: key 'cuda_graphs' must be a list of module names, got {prefix(graphs)}")
    recipe = data.get("fp8_recipe")
    dtype = f.choice(data, "dtype", o, ("fp32", "tf32", "fp16", "bf16", "fp8"), default="bf16")
    if recipe is not None and dtype != "fp8":
        raise AdvisorError(f"{o}: key 'fp8_recipe' = {prefix(recipe)} needs dtype fp8, got dtype {dtype!r}")
    return TrainingJob(
        global_batch_size=f.positive_int(data, "global_batch_size", o),
        seq_length=f.positive_int(data, "seq_length", o),
        dtype=dtype,
        optimizer=f.choice(data, "optimizer", o, OPTIMIZERS, default="adamw"),
        train_tokens=None if tokens is None else f.positive_float(data, "train_tokens", o),
        attention=f.choice(data, "attention", o, ("flash", "math"), default="flash"),
        dropout=f.boolean(data, "dropout", o, default=False),
        framework=f.choice(data, "framework", o, FRAMEWORKS, default="megatron"),
        overlap_grad_reduce=f.boolean(data, "overlap_grad_reduce", o, default=True),
        fp8_recipe=None if recipe is None else f.choice(data, "fp8_recipe", o, FP8_RECIPES),
        recompute_modules=None if modules is None else tuple(modules),
        comm_priority=f.boolean(data, "comm_priority", o, default=False),
        cuda_graphs=tuple(graphs),
        moe_dropless=f.boolean(data, "moe_dropless", o, default=True),
        optimizer_impl=f.choice(data, "optimizer_impl", o, OPTIMIZER_IMPLS, default="fused"),
        pue=f.positive_float(data, "pue", o, default=DEFAULT_PUE),
        grid_gco2e_per_kwh=(None if data.get("grid_gco2e_per_kwh") is None
                            else f.non_negative_float(data, "grid_gco2e_per_kwh", o)),
    )


def plan_from_dict(data: dict[str, Any], origin: str = "plan") -> Plan:
    check_tree(data, origin)
    f.check_keys(data, origin, _TOP_REQUIRED, _TOP_OPTIONAL)
    if data["schema_version"] != SCHEMA_VERSION:
        raise AdvisorError(f"{origin}: key 'schema_version' must be {SCHEMA_VERSION}, got {prefix(data['schema_version'])}")
    if not isinstance(data["model"], dict):
        raise AdvisorError(f"{origin}: key 'model' must be a mapping (the model description)")
    mixed = None
    if isinstance(data["hardware"], list):
        mixed = mixed_from_list(data["hardware"], origin)
    elif not isinstance(data["hardware"], dict):
        raise AdvisorError(f"{origin}: key 'hardware' must be a mapping (the hardware profile) or a list of "
                           "{'profile': ..., 'nodes': N} (a mixed cluster)")
    model = model_from_dict(data["model"], f"{origin}: model")
    hardware = mixed.parts[0].profile if mixed else hardware_from_dict(data["hardware"], f"{origin}: hardware")
    co = f"{origin}: cluster"
    f.check_keys(data["cluster"], co, ("nodes", "devices"))
    cluster = Cluster(nodes=f.positive_int(data["cluster"], "nodes", co, maximum=limits.MAX_DEVICES),
                      devices=f.positive_int(data["cluster"], "devices", co, maximum=limits.MAX_DEVICES))
    if mixed is not None:
        check_cluster(mixed, cluster, co)
        if not isinstance(model, ModelSpec):
            raise AdvisorError(f"{origin}: a mixed cluster (hardware list) runs transformer plans; {model.name} is a "
                               f"{getattr(model, 'family', 'different')} model")
    elif cluster.devices > cluster.nodes * hardware.node.devices_per_node:
        raise AdvisorError(
            f"{co}: key 'devices' = {cluster.devices} exceeds nodes x devices per node = "
            f"{cluster.nodes} x {hardware.node.devices_per_node}"
        )
    training = _training_from_dict(data["training"], origin)
    if not isinstance(model, RecModelSpec) and training.optimizer not in TRANSFORMER_OPTIMIZERS:
        raise AdvisorError(f"{origin}: training: optimizer {training.optimizer!r} is priced for recommendation models "
                           f"only; transformer plans train with {', '.join(TRANSFORMER_OPTIMIZERS)}")
    strategy = _strategy_from_dict(data["parallel"], origin)
    if isinstance(model, SupernetSpec):
        check_strategy(model, data["parallel"], origin)
    rules_model = model.base if isinstance(model, SupernetSpec) else model
    broken = (rec_violations if isinstance(model, RecModelSpec) else violations)(rules_model, cluster, training, strategy)
    if broken:
        raise AdvisorError(f"{origin}: parallel: {broken[0]}")
    for key in ("prediction", "search"):
        if data.get(key) is not None and not isinstance(data[key], dict):
            raise AdvisorError(f"{origin}: key '{key}' must be a mapping or null, got {prefix(data[key])}")
    check_prediction(data.get("prediction"), f"{origin}: prediction")
    check_search(data.get("search"), f"{origin}: search")
    return Plan(
        model=model, hardware=hardware, cluster=cluster, training=training, strategy=strategy,
        operator_strategies=data.get("operator_strategies"), prediction=data.get("prediction"),
        search=data.get("search"), advisor_version=str(data.get("advisor_version", __version__)),
        model_raw=data["model"],
        parameter_server=(ps := parameter_server_from_dict(data["parallel"].get("parameter_server"), origin, model, cluster)),
        embedding_placement=(placement := embedding_placement_from_dict(data["parallel"], origin, model, ps)),
        host_tables=host_tables_from_dict(data["parallel"], origin, model, placement),
        target=_target_from_dict(data["training"].get("target"), f"{origin}: training: target"),
        mixed=mixed, layout=layout_from_dict(data["parallel"], origin, mixed, strategy, training),
        supernet=run_from_dict(data["parallel"], origin, model),
    )


def _target_from_dict(data: Any, origin: str) -> dict[str, Any] | None:
    from advisor.cost.convergence import Target

    if data is None:
        return None
    if not isinstance(data, dict):
        raise AdvisorError(f"{origin}: expected a mapping, got {prefix(data)}")
    f.check_keys(data, origin, (), ("tokens", "loss", "critical_batch_tokens"))
    values = {k: f.positive_float(data, k, origin) for k in data}
    try:
        return Target(**values).to_dict()
    except AdvisorError as exc:
        raise AdvisorError(f"{origin}: {exc}") from None


# The prediction block (advisor.commands.recommend.prediction_of): the keys known to it must have their types;
# keys added by later versions pass (checked only as JSON values by check_tree).
_PREDICTION_NUMBERS = ("step_time_s", "tokens_per_s", "mfu", "hfu", "tflops_per_device", "energy_kwh",
                       "emissions_tco2e")
_PREDICTION_PARTS = ("memory_gib", "time_s")
_SEARCH_COUNTS = ("candidates", "scored", "feasible", "rank")


def _number_or_fail(value: Any, where: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise AdvisorError(f"{where} must be a number, got {prefix(value)}")


def check_prediction(pred: dict[str, Any] | None, origin: str) -> None:
    """Refuse a prediction whose known keys have the wrong types (a string step time, a list of memory)."""
    if pred is None:
        return
    for key in _PREDICTION_NUMBERS:
        if key in pred and pred[key] is not None:
            _number_or_fail(pred[key], f"{origin}: key '{key}'")
    for key in _PREDICTION_PARTS:
        parts = pred.get(key)
        if parts is None:
            continue
        if not isinstance(parts, dict):
            raise AdvisorError(f"{origin}: key '{key}' must be a mapping of part to number, got {prefix(parts)}")
        for part, value in parts.items():
            _number_or_fail(value, f"{origin}: key '{key}.{part}'")
    if pred.get("bottleneck") is not None and not isinstance(pred["bottleneck"], str):
        raise AdvisorError(f"{origin}: key 'bottleneck' must be a string, got {prefix(pred['bottleneck'])}")
    conf = pred.get("confidence")
    if conf is not None:
        if (not isinstance(conf, dict) or not isinstance(conf.get("calibrated"), bool)
                or not isinstance(conf.get("extrapolated", []), list)
                or not all(isinstance(x, str) for x in conf.get("extrapolated", []))):
            raise AdvisorError(f"{origin}: key 'confidence' must be {{calibrated: true|false, extrapolated: [names]}}, "
                               f"got {prefix(conf)}")


def check_search(search: dict[str, Any] | None, origin: str) -> None:
    if search is None:
        return
    if search.get("searcher") is not None and not isinstance(search["searcher"], str):
        raise AdvisorError(f"{origin}: key 'searcher' must be a string, got {prefix(search['searcher'])}")
    for key in _SEARCH_COUNTS:
        value = search.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise AdvisorError(f"{origin}: key '{key}' must be a non-negative integer, got {prefix(value)}")
    if search.get("seconds") is not None:
        _number_or_fail(search["seconds"], f"{origin}: key 'seconds'")


def dumps_plan(plan: Plan) -> str:
    """The plan as JSON text; never NaN or Infinity (RFC 8259 has neither; Python's json would write them)."""
    try:
        return json.dumps(plan_to_dict(plan), indent=2, allow_nan=False) + "\n"
    except ValueError:
        raise AdvisorError(f"the plan of {plan.model.name} holds an infinite or undefined number; not written") from None


def save_plan(plan: Plan, path: str | Path) -> None:
    """Written atomically: a failed write leaves the previous file as it was (advisor.runtime.files)."""
    from advisor.runtime.files import write_atomic

    write_atomic(path, dumps_plan(plan), what="the plan")


def read_plan_dict(path: str | Path) -> dict[str, Any]:
    """The plan file's JSON object, unvalidated (the executor reads plans as plain mappings)."""
    p = Path(path)
    if not p.is_file():
        raise AdvisorError(f"plan file not found: {path}")
    data = load_tree(p, "plan", fmt="json")
    if not isinstance(data, dict):
        raise AdvisorError(f"{path}: a plan must be a JSON object")
    return data


def load_plan(path: str | Path) -> Plan:
    return plan_from_dict(read_plan_dict(path), str(path))
