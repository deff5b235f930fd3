"""`advisor estimate` as a library call: flags (or a plan file) -> one scored strategy."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from advisor.cost.estimate import Estimate, estimate
from advisor.errors import AdvisorError
from advisor.render.formatting import step_time
from advisor.commands.inputs import Inputs, given_settings, job_from_values, resolve_inputs
from advisor.plan import load_plan, strategy_to_dict
from advisor.search.neighbours import closest_fit
from advisor.space.rules import violations
from advisor.space.strategy import Strategy
from advisor.specs.job import TrainingJob
from advisor.specs.operator_strategies import load_operator_strategies
from advisor.specs.setting import as_given


@dataclass(frozen=True)
class EstimateResult:
    title: str
    inputs: Inputs
    strategy: Strategy
    estimate: Estimate
    alternative: str | None
    operator_strategies: dict | None = None     # the priced operator layout (drec/ilp plans, --operator-strategies)

    def to_dict(self) -> dict[str, Any]:
        out = {"title": self.title, **self.estimate.to_dict()}
        out["model"] = self.inputs.model.name
        out["hardware"] = self.inputs.hardware.name
        out["devices"] = self.inputs.cluster.devices
        out["global_batch_size"] = self.inputs.job.global_batch_size
        out["seq_length"] = self.inputs.job.seq_length
        out["dtype"] = self.inputs.job.dtype
        out["strategy"] = strategy_to_dict(self.strategy, self.inputs.model.num_layers)   # the plan's parallel block
        out["closest_fit"] = self.alternative
        if self.operator_strategies is not None:
            out["operator_strategies"] = self.operator_strategies
        return out


def strategy_from_values(inputs: Inputs, values: dict[str, Any], gbs_given: bool = True) -> Strategy:
    """The strategy from given Strategy settings (each checked, naming its flag): dp from the devices where
    not given, the micro-batch count from the global batch, the schedule from the virtual stages."""
    v = given_settings(Strategy, values)
    tp, pp, cp, mbs = v.get("tp", 1), v.get("pp", 1), v.get("cp", 1), v.get("micro_batch_size", 1)
    devices = inputs.cluster.devices
    dp = v.get("dp")
    if dp is None:
        if devices % (tp * pp * cp):
            raise AdvisorError(f"--tp {tp} x --pp {pp} x --cp {cp} = {tp * pp * cp} does not divide the {devices} devices")
        dp = devices // (tp * pp * cp)
    if dp * tp * pp * cp != devices:
        raise AdvisorError(f"illegal strategy: dp x tp x pp x cp must equal the number of devices "
                           f"({dp} x {tp} x {pp} x {cp} = {dp * tp * pp * cp}, devices = {devices}; flags --dp --tp --pp --cp)")
    gbs = inputs.job.global_batch_size
    if gbs % (dp * mbs):
        fits = [m for m in range(1, min(gbs // dp, 64) + 1) if (gbs // dp) % m == 0] if gbs % dp == 0 else []
        if "micro_batch_size" in v:        # the flag the user gave is the one named
            given = f"--mbs {mbs} with --gbs {gbs}" if gbs_given else f"--mbs {mbs}"
            raise AdvisorError(f"{given}: dp x micro-batch = {dp} x {mbs} = {dp * mbs} does not divide the global "
                               f"batch {gbs}" + ("" if gbs_given else " (the default; --gbs sets it)")
                               + (f"; --mbs {', '.join(map(str, fits[-6:]))} would" if fits else "")
                               + f", or a global batch that is a multiple of {dp * mbs}")
        raise AdvisorError(f"--gbs {gbs} is not divisible by dp x micro-batch = {dp} x {mbs}; "
                           f"choose a global batch that is a multiple of {dp * mbs}")
    vpp = v.get("virtual_pipeline_stages", 1)
    schedule = v.get("pipeline_schedule", "interleaved-1f1b" if vpp > 1 else "1f1b")
    return Strategy(**{**v, "dp": dp, "num_micro_batches": gbs // (dp * mbs), "pipeline_schedule": schedule})


def estimate_request(model: str | None, hardware: str | None, nodes: int | None, devices: int | None,
                     job: dict[str, Any], strategy: dict[str, Any], plan: str | None = None,
                     operator_strategies: str | None = None, launch: str | None = None) -> EstimateResult:
    """One strategy scored: given by its settings (``strategy``, by field name, as the command line gives
    them) or by a plan file, whose training and parallel settings the given ones override (the result is
    checked like any strategy). ``job``: the TrainingJob settings given."""
    layout = None
    if plan is not None:
        p = load_plan(plan)
        layout = p.operator_strategies if isinstance(p.operator_strategies, dict) else None
        inputs = Inputs(p.model, p.hardware, p.cluster, job_from_values(p.model, p.hardware, p.cluster, job, base=p.training))
        chosen = replace(p.strategy, **given_settings(Strategy, strategy))
        title = f"{p.model.name} on {p.cluster.devices} x {p.hardware.device.name} ({p.hardware.name}), plan {plan}"
    else:
        if model is None or hardware is None:
            raise AdvisorError("advisor estimate needs --model and --hardware (or --plan PLAN.json)")
        imported = None
        if launch is not None:       # a launch configuration's settings, under the flags given
            from advisor.importers import read_launch_config

            if plan is not None:
                raise AdvisorError("--from and --plan cannot go together")
            imported = read_launch_config(launch)
            job = {**as_given(TrainingJob, imported.job), **job}
            if nodes is None and devices is None:
                nodes, devices = (None, imported.devices) if imported.devices else (imported.nodes, None)
        inputs = resolve_inputs(model, hardware, nodes=nodes, devices=devices, **job)
        if imported is not None:
            from advisor.importers import check_model, strategy_settings

            check_model(imported, inputs.model)
            strategy = {**strategy_settings(imported, inputs.model.num_layers, inputs.job.grad_reduce_bytes),
                        **strategy}
        chosen = strategy_from_values(inputs, strategy, gbs_given="global_batch_size" in job)
        title = f"{inputs.model.name} on {inputs.cluster.devices} x {inputs.hardware.device.name} ({inputs.hardware.name})"
    broken = violations(inputs.model, inputs.cluster, inputs.job, chosen)
    if broken:
        raise AdvisorError(f"illegal strategy: {broken[0]}")
    if operator_strategies is not None or layout is not None:
        # imported here: the layout searchers bring OR-Tools, which plain estimates do not need
        from advisor.search.operator_plan import estimate_with_layout, layout_of
    if operator_strategies is not None:   # the user's strategies kept, the other operators searched around them
        fixed = load_operator_strategies(operator_strategies)
        layout = layout_of(inputs.model, inputs.hardware, inputs.cluster, inputs.job, chosen, fixed)
    if layout is not None and isinstance(layout.get("pricing"), dict):   # a searched layout priced in
        e = estimate_with_layout(inputs.model, inputs.hardware, inputs.cluster, inputs.job, chosen, layout)
    else:
        e = estimate(inputs.model, inputs.hardware, inputs.cluster, inputs.job, chosen)
    alternative = None
    if not e.feasible:
        found = closest_fit(inputs.model, inputs.hardware, inputs.cluster, inputs.job, chosen)
        if found is not None:
            alternative = f"{found[0]} ({found[1].memory_gib.total:.1f} GiB, step {step_time(found[1].step_time_s)} s)"
    return EstimateResult(title=title, inputs=inputs, strategy=chosen, estimate=e, alternative=alternative,
                          operator_strategies=layout)
