"""`recommend` and `estimate` on a heterogeneous cluster (``--hardware A:4,B:4``; advisor.cost.mixed).

The job's settings are read as for one profile (advisor.commands.inputs), checked on every part
(each part's device must have the dtype), and the cluster is the parts' nodes. ``recommend`` runs
the mixed searcher (advisor.search.mixed); ``estimate`` with degrees finds the best layout of that
strategy (the same search with every given knob pinned); ``estimate --plan`` prices a mixed plan's
own layout.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from advisor.commands.inputs import Inputs, check_dtype, resolve_inputs
from advisor.cost.mixed_estimate import MixedEstimate, estimate_mixed
from advisor.errors import AdvisorError, InfeasibleError
from advisor.families import family_of_model
from advisor.plan import Plan
from advisor.search import Pins
from advisor.search.mixed import MixedStats, search_mixed
from advisor.specs.mixed import MixedHardware, parse_mixed

@dataclass(frozen=True)
class MixedResult:
    mixed: MixedHardware
    plans: tuple[Plan, ...]
    estimates: tuple[MixedEstimate, ...]
    stats: MixedStats

    @property
    def best(self) -> Plan:
        return self.plans[0]

    def to_dict(self) -> dict[str, Any]:
        """As every recommend --json: the plans (their prediction holds the figures) and the search."""
        from advisor.plan import plan_to_dict

        return {"plans": [plan_to_dict(p) for p in self.plans], "search": self.stats.to_dict()}


def mixed_inputs(model: str, hardware: str, nodes: int | None, devices: int | None, **job: Any) -> tuple[MixedHardware, Inputs]:
    """The parts and the job (the cluster is the parts' nodes: --nodes/--devices are refused)."""
    if nodes is not None or devices is not None:
        raise AdvisorError("--nodes/--devices: a mixed cluster's size is given per part (--hardware PROFILE:NODES,...)")
    mixed = parse_mixed(hardware)
    inputs = resolve_inputs(model, mixed.parts[0].profile, devices=mixed.devices, **job)
    kind = family_of_model(inputs.model).name
    if kind != "transformer":
        raise AdvisorError(f"{inputs.model.name} is a {kind} model; mixed clusters run transformer plans")
    for part in mixed.parts[1:]:
        check_dtype(part.profile, inputs.job.dtype)
    return mixed, replace(inputs, cluster=mixed.cluster)


def _plan(inputs: Inputs, mixed: MixedHardware, candidate, e: MixedEstimate, stats: MixedStats, rank: int) -> Plan:
    prediction = {"step_time_s": e.step_time_s, "tokens_per_s": e.tokens_per_s, "mfu": e.mfu,
                  "time_s": dict(e.time_s), "bottleneck": e.bottleneck,
                  "memory_gib": {"total": e.memory_gib}}
    return Plan(model=inputs.model, hardware=mixed.parts[0].profile, cluster=mixed.cluster, training=inputs.job,
                strategy=candidate.strategy, prediction=prediction,
                search={**stats.to_dict(), "rank": rank, "seconds": round(stats.seconds, 3)},
                mixed=mixed, layout=candidate.layout)


def recommend_mixed(inputs: Inputs, mixed: MixedHardware, pins: Pins = Pins(), top_k: int = 5) -> MixedResult:
    """The best plans on the mixed cluster; InfeasibleError when nothing fits."""
    from advisor.commands.recommend import check_pins, check_top_k

    check_top_k(top_k)
    check_pins(mixed.cluster, pins)
    candidates, stats = search_mixed(inputs.model, mixed, inputs.job, pins, top_k)
    if not candidates:
        left = "; ".join(f"{n:,} strategies: {why}" for why, n in stats.left_out.items())
        raise InfeasibleError(f"no strategy fits on {mixed.label} ({stats.candidates:,} priced, none fits"
                              + (f"; left out: {left}" if left else "") + "); try a smaller model or more nodes")
    estimates = [estimate_mixed(inputs.model, mixed, inputs.job, c.strategy, c.layout) for c in candidates]
    plans = [_plan(inputs, mixed, c, e, stats, i + 1) for i, (c, e) in enumerate(zip(candidates, estimates))]
    return MixedResult(mixed, tuple(plans), tuple(estimates), stats)


def estimate_plan(plan: Plan) -> MixedEstimate:
    return estimate_mixed(plan.model, plan.mixed, plan.training, plan.strategy, plan.layout)
