"""`advisor estimate` for recommendation models: the best plan under the pinned --ps-* choices, or the
configuration a plan file records, priced with its full breakdown."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from advisor.cost.recsys import RecEstimate, RecsysConfig
from advisor.cost.recsys_estimate import estimate_recsys
from advisor.errors import AdvisorError
from advisor.commands.inputs import resolve_inputs
from advisor.plan import Plan, load_plan, read_plan_dict
from advisor.search.parameter_server import PsPins, recommend_recsys
from advisor.specs.model import load_model
from advisor.specs.recommendation import RecModelSpec, is_recommendation


@dataclass(frozen=True)
class RecsysEstimateResult:
    title: str
    estimate: RecEstimate

    def to_dict(self) -> dict[str, Any]:
        return {"title": self.title, **self.estimate.to_dict()}


def wants_recsys(model: str | None, plan: str | None) -> bool:
    """Whether an estimate request is about a recommendation model (by its model file or plan)."""
    if plan is not None:
        data = read_plan_dict(plan)
        return is_recommendation(data.get("model"))
    return model is not None and isinstance(load_model(model), RecModelSpec)


def config_of(plan: Plan) -> RecsysConfig:
    ps = plan.parameter_server
    if ps is None:
        placement = plan.embedding_placement
        if placement == "host":
            return RecsysConfig("host", host_tables=plan.host_tables or ())
        return RecsysConfig("sharded" if placement == "sharded" else "replicated")
    sharding = tuple((name, tuple(ids)) for name, ids in sorted((ps.get("sharding") or {}).items()))
    return RecsysConfig(ps["mode"], ps["servers"], ps["server_placement"], ps["synchronous"], tuple(ps["tensors"]),
                        sharding)


def recsys_estimate_request(*, model: str | None, hardware: str | None, nodes: int | None, devices: int | None,
                            gbs: int | None, dtype: str | None, plan: str | None, ps_pins: PsPins) -> RecsysEstimateResult:
    if plan is not None:
        p = load_plan(plan)
        e = estimate_recsys(p.model, p.hardware, p.cluster, p.training, config_of(p))
        return RecsysEstimateResult(f"{p.model.name} on {p.cluster.devices} x {p.hardware.device.name}, plan {plan}", e)
    if hardware is None:
        raise AdvisorError("advisor estimate needs --model and --hardware (or --plan PLAN.json)")
    i = resolve_inputs(model, hardware, nodes=nodes, devices=devices, global_batch=gbs, dtype=dtype)
    result = recommend_recsys(i.model, i.hardware, i.cluster, i.job, ps_pins, top_k=1)
    return RecsysEstimateResult(f"{i.model.name} on {i.cluster.devices} x {i.hardware.device.name} ({i.hardware.name}), "
                                f"batch {i.job.global_batch_size}", result.estimates[0])


def estimate_recsys_cmd(model, hardware, nodes, devices, gbs, dtype, plan, ps_mode, ps_servers, ps_async, as_json) -> None:
    """advisor estimate for a recommendation model or a PS plan (advisor.cli): the table or JSON."""
    from advisor.commands.cli_options import console, print_json
    from advisor.errors import InfeasibleError
    from advisor.render.report_recsys import render_recsys_estimate
    from advisor.search.parameter_server import PsPins

    result = recsys_estimate_request(model=model, hardware=hardware, nodes=nodes, devices=devices, gbs=gbs, dtype=dtype,
                                     plan=plan, ps_pins=PsPins(ps_mode, ps_servers, not ps_async))
    if as_json:
        print_json(result.to_dict())
    else:
        render_recsys_estimate(console, result.title, result.estimate)
    if not result.estimate.feasible:
        raise InfeasibleError(f"the plan does not fit: {result.estimate.reasons[0]}")
