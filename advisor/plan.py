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
from advisor.families import family_of_model, registered
from advisor.errors import AdvisorError
from advisor.plan_codec import strategy_from_dict, strategy_to_dict, training_from_dict, training_to_dict
from advisor.space.strategy import Strategy
from advisor.specs import _fields as f
from advisor.specs import limits
from advisor.specs.untrusted import check_tree, load_tree, prefix
from advisor.specs.hardware import HardwareProfile, hardware_from_dict
from advisor.specs.job import Cluster, TrainingJob
from advisor.specs.model import ModelSpec, model_from_dict, model_to_dict
from advisor.specs.mixed import MixedHardware, MixedLayout, mixed_from_list
from advisor.plan_mixed import check_cluster
from advisor.specs.supernet import SupernetRun

SCHEMA_VERSION = 1
_TOP_REQUIRED = ("schema_version", "model", "hardware", "cluster", "training", "parallel")
_TOP_OPTIONAL = ("advisor_version", "operator_strategies", "prediction", "search")
# keys of the parallel block that the model families add beside the strategy's own (advisor.plan_ps,
# advisor.plan_mixed, advisor.plan_supernet)
_PARALLEL_EXTRA = ("parameter_server", "embedding_placement", "host_tables", "stage_devices", "replica_devices",
                   "dp_batch_split", "supernet")


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


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    training = training_to_dict(plan.training)
    if plan.target is not None:
        training["target"] = dict(plan.target)
    parallel = strategy_to_dict(plan.strategy, plan.model.num_layers)
    for fam in registered():             # the keys each family adds (advisor.families)
        if fam.plan_parallel_writer is not None:
            parallel.update(fam.hook("plan_parallel_writer")(plan))
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
    fam = family_of_model(model)
    if mixed is not None:
        check_cluster(mixed, cluster, co)
        if fam.name != "transformer":
            raise AdvisorError(f"{origin}: a mixed cluster (hardware list) runs transformer plans; {model.name} is a "
                               f"{fam.name} model")
    elif cluster.devices > cluster.nodes * hardware.node.devices_per_node:
        raise AdvisorError(
            f"{co}: key 'devices' = {cluster.devices} exceeds nodes x devices per node = "
            f"{cluster.nodes} x {hardware.node.devices_per_node}"
        )
    training = training_from_dict(data["training"], origin, extra_keys=("target",))
    if fam.optimizers is not None and training.optimizer not in fam.optimizers:
        raise AdvisorError(f"{origin}: training: optimizer {training.optimizer!r} is priced for recommendation models "
                           f"only; {fam.name} plans train with {', '.join(fam.optimizers)}")
    strategy = strategy_from_dict(data["parallel"], origin, extra_keys=_PARALLEL_EXTRA)
    extras: dict[str, Any] = {}
    for kind in registered():            # each family reads (or refuses) its own keys (advisor.families)
        if kind.plan_parallel is not None:
            extras.update(kind.hook("plan_parallel")(data["parallel"], origin, model, cluster, strategy, training, mixed))
    # what the plan's framework runs is checked where the plan is used (estimate, export, execute), so that
    # a plan can be re-priced for another framework (advisor estimate --plan P --framework F)
    broken = fam.hook("violations")(model, cluster, training, strategy, framework_rules=False)
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
        model_raw=data["model"], target=_target_from_dict(data["training"].get("target"), f"{origin}: training: target"),
        mixed=mixed, **extras,
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
BAND_PAIRS = ("tokens_per_s", "step_time_s", "memory_gib", "error")     # prediction.band's [low, high] figures
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
    band = pred.get("band")
    if band is not None:
        if not isinstance(band, dict):
            raise AdvisorError(f"{origin}: key 'band' must be a mapping, got {prefix(band)}")
        for key in BAND_PAIRS:
            pair = band.get(key)
            if pair is None:
                continue
            if not isinstance(pair, list) or len(pair) != 2:
                raise AdvisorError(f"{origin}: key 'band.{key}' must be [low, high], got {prefix(pair)}")
            for value in pair:
                _number_or_fail(value, f"{origin}: key 'band.{key}'")
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
