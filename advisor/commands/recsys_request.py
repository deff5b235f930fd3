"""`advisor estimate` for recommendation models: the best plan under the pinned --ps-* choices, or the
configuration a plan file records, priced with its full breakdown."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from advisor.cost.recsys import RecEstimate, RecsysConfig
from advisor.cost.recsys_estimate import estimate_recsys
from advisor.errors import AdvisorError
from advisor.commands.inputs import resolve_inputs
from advisor.plan import Plan, load_plan
from advisor.search.parameter_server import PsPins, recommend_recsys
from advisor.search import check_top_k


@dataclass(frozen=True)
class RecsysEstimateResult:
    title: str
    estimate: RecEstimate
    model: str = ""
    hardware: str = ""
    devices: int = 0

    def to_dict(self) -> dict[str, Any]:
        """As every estimate --json (title, model, hardware, devices, feasible, step_time_s, ...)."""
        return {"title": self.title, "model": self.model, "hardware": self.hardware, "devices": self.devices,
                **self.estimate.to_dict()}


def config_of(plan: Plan) -> RecsysConfig:
    ps = plan.parameter_server
    if ps is None:
        placement = plan.embedding_placement
        if placement == "host":
            return RecsysConfig("host", host_tables=plan.host_tables or ())
        return RecsysConfig("sharded" if placement == "sharded" else "replicated")
    sharding = tuple((name, tuple(ids)) for name, ids in sorted((ps.get("sharding") or {}).items()))
    return RecsysConfig(ps["mode"], ps["servers"], ps["server_placement"], ps["synchronous"], tuple(ps["tensors"]),
                        sharding, replicas=ps.get("replicas", 0))


def recsys_estimate_request(*, model: str | None, hardware: str | None, nodes: int | None, devices: int | None,
                            job: dict[str, Any], plan: str | None, ps_pins: PsPins) -> RecsysEstimateResult:
    """A recommendation model's best configuration under the pinned --ps-* choices, or a plan's."""
    if plan is not None:
        p = load_plan(plan)
        e = estimate_recsys(p.model, p.hardware, p.cluster, p.training, config_of(p))
        return RecsysEstimateResult(f"{p.model.name} on {p.cluster.devices} x {p.hardware.device.name}, plan {plan}", e,
                                    p.model.name, p.hardware.name, p.cluster.devices)
    if model is None or hardware is None:
        raise AdvisorError("advisor estimate needs --model and --hardware (or --plan PLAN.json)")
    i = resolve_inputs(model, hardware, nodes=nodes, devices=devices, **job)
    result = recommend_recsys(i.model, i.hardware, i.cluster, i.job, ps_pins, top_k=1)
    return RecsysEstimateResult(f"{i.model.name} on {i.cluster.devices} x {i.hardware.device.name} ({i.hardware.name}), "
                                f"batch {i.job.global_batch_size}", result.estimates[0], i.model.name,
                                i.hardware.name, i.cluster.devices)


def ps_pins_of(request) -> PsPins:
    return PsPins(request.get("ps_mode"), request.get("ps_servers"), not request.get("ps_async"),
                  request.get("ps_replicas") or 0)


def estimate_cmd(request) -> None:
    """advisor estimate for a recommendation model or a PS plan (advisor.families): the table or JSON."""
    from advisor.commands.cli_options import console, print_json
    from advisor.errors import InfeasibleError
    from advisor.render.report_recsys import render_recsys_estimate
    from advisor.specs.job import TrainingJob

    r = request
    result = recsys_estimate_request(model=r.get("model"), hardware=r.get("hardware"), nodes=r.get("nodes"),
                                     devices=r.get("devices"), job=r.values_of(TrainingJob), plan=r.get("plan"),
                                     ps_pins=ps_pins_of(r))
    if r.get("json"):
        print_json(result.to_dict())
    else:
        render_recsys_estimate(console, result.title, result.estimate)
    if not result.estimate.feasible:
        raise InfeasibleError(f"the plan does not fit: {result.estimate.reasons[0]}")


def recommend_cmd(request) -> None:
    """advisor recommend for a recommendation model (advisor.families): the parameter-server search."""
    from advisor.commands.cli_options import print_warnings
    from advisor.commands.transformer_cmd import show
    from advisor.search import Pins
    from advisor.space.strategy import Strategy
    from advisor.specs.input_notes import input_warnings
    from advisor.specs.job import TrainingJob

    r = request
    if r.get("objective") != "throughput":
        raise AdvisorError(f"--objective {r.get('objective')} ranks transformer plans; parameter-server and "
                           f"recommendation plans are ranked by throughput")
    i = resolve_inputs(r.get("model"), r.get("hardware"), nodes=r.get("nodes"), devices=r.get("devices"),
                       **r.values_of(TrainingJob))
    warnings = input_warnings(i.hardware, i.cluster)
    if not r.get("json"):
        print_warnings(warnings)
    check_top_k(r.get("top"))
    result = recommend_recsys(i.model, i.hardware, i.cluster, i.job, ps_pins_of(r), r.get("top"), r.get("searcher"),
                              Pins.from_values(r.values_of(Strategy)))
    show(r, result, warnings)
