"""The command line's side of mixed clusters (the mixed cluster kind, advisor.families): ``recommend``
and ``estimate`` with ``--hardware PROFILE:NODES,...``, and ``estimate --plan`` of a mixed plan. What a
mixed cluster does not take is refused by its record before these run."""

from __future__ import annotations

from advisor.commands.cli_options import console, print_json, wide_console
from advisor.commands.cli_settings import Request
from advisor.errors import AdvisorError, InfeasibleError
from advisor.search import Pins
from advisor.space.strategy import Strategy
from advisor.specs.job import TrainingJob
from advisor.specs.setting import FIELD_DEFAULT, field_default, settings_of

# the options the mixed searcher runs only at their default (it is exhaustive over the enumerator's strategies)
_DEFAULTS = {"searcher": ("enumerate", "--searcher (the mixed searcher is exhaustive over the enumerator's strategies)"),
             "objective": ("throughput", "--objective other than throughput")}


def _inputs(r: Request):
    from advisor.commands.mixed import mixed_inputs

    return mixed_inputs(r.get("model"), r.get("hardware"), r.get("nodes"), r.get("devices"), **r.values_of(TrainingJob))


def _estimate_pins(r: Request) -> Pins:
    """The given degrees and knobs, and estimate's defaults for the knobs not given (ZeRO 0, no recomputation,
    micro-batch 1, ...): the mixed search then only lays the strategy out on the parts."""
    defaults = {fl.name: field_default(fl) for fl, s in settings_of(Strategy)
                if s.search and s.cli_default is FIELD_DEFAULT}
    return Pins.from_values({**defaults, **r.values_of(Strategy)})


def recommend_mixed_cmd(r: Request) -> None:
    from advisor.commands.mixed import recommend_mixed
    from advisor.plan import save_plan
    from advisor.render.mixed import render_mixed_recommendation

    for name, (default, flag) in _DEFAULTS.items():
        if r.get(name, default) != default:
            raise AdvisorError(f"{flag} is not available on a mixed cluster (--hardware PROFILE:NODES,...)")
    mixed, inputs = _inputs(r)
    result = recommend_mixed(inputs, mixed, Pins.from_values(r.values_of(Strategy)), r.get("top", 5))
    if r.get("out"):
        save_plan(result.best, r.get("out"))
    if r.get("json"):
        print_json(result.to_dict())
    else:
        render_mixed_recommendation(wide_console(), result, saved_to=r.get("out"))


def estimate_mixed_cmd(r: Request) -> None:
    """--plan: the plan's own layout; degrees: the best layout of that strategy on the parts."""
    from advisor.commands.mixed import estimate_plan, recommend_mixed
    from advisor.plan import load_plan, strategy_to_dict
    from advisor.render.mixed import render_mixed_estimate

    if r.get("plan") is not None:
        if r.values_of(TrainingJob) or r.values_of(Strategy):
            raise AdvisorError("training and parallel settings with a mixed plan: the plan is priced as saved; give "
                               "them to recommend or estimate with --hardware PROFILE:NODES,...")
        plan = load_plan(r.get("plan"))
        e, title = estimate_plan(plan), f"{plan.model.name} on {plan.mixed.label} (plan {r.get('plan')})"
    else:
        if r.get("pp") is None or r.get("tp") is None:
            raise AdvisorError("estimate on a mixed cluster needs at least --tp and --pp (or --plan)")
        mixed, inputs = _inputs(r)
        try:
            plan = recommend_mixed(inputs, mixed, _estimate_pins(r), top_k=1).best
        except InfeasibleError as exc:
            raise InfeasibleError(f"the strategy fits in no layout on {mixed.label} (the knobs not given take "
                                  f"estimate's defaults: ZeRO 0, no recomputation, micro-batch 1): {exc}; give --zero, "
                                  "--recompute or --mbs, or run recommend with these pins") from None
        e, title = estimate_plan(plan), f"{plan.model.name} on {mixed.label}, its best layout"
    if r.get("json"):       # as every estimate --json: title, model, hardware, devices, strategy, the figures
        print_json({"title": title, "model": plan.model.name, "hardware": plan.mixed.label,
                    "devices": plan.cluster.devices, "strategy": strategy_to_dict(plan.strategy, plan.model.num_layers),
                    **e.to_dict()})
    else:
        render_mixed_estimate(console, title, plan.strategy, e)
    if not e.feasible:
        raise InfeasibleError(f"the strategy does not fit: {e.reasons[0]}")
