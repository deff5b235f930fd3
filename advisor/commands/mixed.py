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
from advisor.plan import Plan
from advisor.search import Pins
from advisor.search.mixed import MixedStats, search_mixed
from advisor.specs.mixed import MixedHardware, parse_mixed

# what the mixed searcher does not take (it runs the collective strategies of the enumerator)
UNSUPPORTED = {"searcher": "--searcher (the mixed searcher is exhaustive over the enumerator's strategies)",
               "operator_strategies": "--operator-strategies", "ps_mode": "--ps-mode",
               "objective": "--objective other than throughput", "plot": "--plot"}


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
        return {"hardware": self.mixed.label,
                "plans": [{"rank": i + 1, "parallel": _parallel(p), **e.to_dict()}
                          for i, (p, e) in enumerate(zip(self.plans, self.estimates))],
                "search": self.stats.to_dict()}


def _parallel(plan: Plan) -> dict[str, Any]:
    from advisor.plan import strategy_to_dict

    return strategy_to_dict(plan.strategy, plan.model.num_layers)


def refuse_unsupported(**given: Any) -> None:
    """One sentence naming the first option a mixed cluster does not take."""
    for key, flag in UNSUPPORTED.items():
        value = given.get(key)
        if value not in (None, False, "enumerate", "throughput", "none"):
            raise AdvisorError(f"{flag} is not available on a mixed cluster (--hardware PROFILE:NODES,...)")


def mixed_inputs(model: str, hardware: str, nodes: int | None, devices: int | None, **job: Any) -> tuple[MixedHardware, Inputs]:
    """The parts and the job (the cluster is the parts' nodes: --nodes/--devices are refused)."""
    if nodes is not None or devices is not None:
        raise AdvisorError("--nodes/--devices: a mixed cluster's size is given per part (--hardware PROFILE:NODES,...)")
    mixed = parse_mixed(hardware)
    inputs = resolve_inputs(model, mixed.parts[0].profile, devices=mixed.devices, **job)
    if getattr(inputs.model, "family", None) == "recommendation":
        raise AdvisorError(f"{inputs.model.name} is a recommendation model; mixed clusters run transformer plans")
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
