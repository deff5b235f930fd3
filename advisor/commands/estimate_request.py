"""`advisor estimate` as a library call: flags (or a plan file) -> one scored strategy."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from advisor.cost.estimate import Estimate, estimate
from advisor.errors import AdvisorError
from advisor.render.formatting import step_time
from advisor.commands.inputs import Inputs, check_count, graph_settings, resolve_inputs, site_settings
from advisor.plan import load_plan, strategy_to_dict
from advisor.search.neighbours import closest_fit
from advisor.space.rules import violations
from advisor.space.strategy import CP_COMM, RECOMPUTE, SCHEDULES, Strategy
from advisor.specs import limits
from advisor.specs.job import check_optimizer_impl, parse_token_count
from advisor.specs.operator_strategies import load_operator_strategies
from advisor.specs.untrusted import prefix


@dataclass(frozen=True)
class EstimateResult:
    title: str
    inputs: Inputs
    strategy: Strategy
    estimate: Estimate
    alternative: str | None
    operator_strategies: dict | None = None     # the priced operator layout (drec/ilp plans, --operator-strategies)

    def to_dict(self) -> dict[str, Any]:
        out = self.estimate.to_dict()
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


def _check_choice(flag: str, value: str, options: tuple[str, ...]) -> None:
    if value not in options:
        raise AdvisorError(f"{flag} must be one of {', '.join(options)}, got {prefix(value)}")


def strategy_from_flags(inputs: Inputs, *, tp: int, pp: int, dp: int | None, cp: int, ep: int, mbs: int, vpp: int,
                        zero: int, recompute: str, recompute_layers: int | None, sequence_parallel: bool,
                        schedule: str | None, offload_optimizer: bool, cp_comm: str = "p2p",
                        offload_params: bool = False) -> Strategy:
    for flag, value, bound in (("--tp", tp, limits.MAX_DEVICES), ("--pp", pp, limits.MAX_DEVICES),
                               ("--cp", cp, limits.MAX_DEVICES), ("--ep", ep, limits.MAX_DEVICES),
                               ("--mbs", mbs, limits.MAX_GLOBAL_BATCH), ("--vpp", vpp, limits.MAX_LAYERS)):
        check_count(flag, value, bound)
    if dp is not None:
        check_count("--dp", dp, limits.MAX_DEVICES)
    if recompute_layers is not None:
        check_count("--recompute-layers", recompute_layers, limits.MAX_LAYERS)
    if zero not in (0, 1, 2, 3):
        raise AdvisorError(f"--zero must be 0, 1, 2 or 3, got {zero}")
    _check_choice("--recompute", recompute, RECOMPUTE)
    devices = inputs.cluster.devices
    if dp is None:
        if devices % (tp * pp * cp):
            raise AdvisorError(f"--tp {tp} x --pp {pp} x --cp {cp} = {tp * pp * cp} does not divide the {devices} devices")
        dp = devices // (tp * pp * cp)
    if dp < 1:
        raise AdvisorError(f"--dp must be a positive integer, got {dp}")
    if dp * tp * pp * cp != devices:
        raise AdvisorError(f"illegal strategy: dp x tp x pp x cp must equal the number of devices "
                           f"({dp} x {tp} x {pp} x {cp} = {dp * tp * pp * cp}, devices = {devices}; flags --dp --tp --pp --cp)")
    gbs = inputs.job.global_batch_size
    if gbs % (dp * mbs):
        raise AdvisorError(f"--gbs {gbs} is not divisible by dp x micro-batch = {dp} x {mbs}; "
                           f"choose a global batch that is a multiple of {dp * mbs}")
    if schedule is None:
        schedule = "interleaved-1f1b" if vpp > 1 else "1f1b"
    _check_choice("--schedule", schedule, SCHEDULES)
    _check_choice("--cp-comm", cp_comm, CP_COMM)
    return Strategy(
        dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, sequence_parallel=sequence_parallel, virtual_pipeline_stages=vpp,
        micro_batch_size=mbs, num_micro_batches=gbs // (dp * mbs), zero_stage=zero, recompute=recompute,
        recompute_layers=recompute_layers, pipeline_schedule=schedule, offload_optimizer=offload_optimizer,
        offload_params=offload_params,
        cp_comm=cp_comm,
    )


# Largest gradient bucket accepted (MiB): 1 TiB, beyond any device's memory
MAX_BUCKET_MB = 2.0 ** 20


def _bucket_mb(value: float | None) -> float | None:
    """--bucket-mb: a positive number of MiB (None: the framework's default buckets)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_BUCKET_MB:
        raise AdvisorError(f"--bucket-mb must be a positive number of MiB up to {MAX_BUCKET_MB:g}, got {prefix(value)}")
    return float(value)


def _fraction(value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < float(value) <= 1.0:
        raise AdvisorError(f"--offload-fraction must be a number in (0, 1], got {prefix(value)}")
    return float(value)


def estimate_request(*, model: str | None, hardware: str | None, nodes: int | None, devices: int | None,
                     tp: int, pp: int, dp: int | None, cp: int, ep: int, mbs: int, gbs: int | None,
                     seq_len: int | None, vpp: int, zero: int, recompute: str, recompute_layers: int | None,
                     sequence_parallel: bool, schedule: str | None, offload_optimizer: bool, dtype: str | None,
                     tokens: str | None, plan: str | None, attention: str = "flash",
                     dropout: bool = False, framework: str = "megatron", fp8_recipe: str | None = None,
                     cp_comm: str = "p2p", recompute_modules: str | None = None, cuda_graphs: str | None = None,
                     token_drop: bool = False,
                     bucket_mb: float | None = None, copies: int = 1,
                     operator_strategies: str | None = None, grid_intensity: str | None = None,
                     pue: float | None = None, comm_priority: bool = False,
                     full_batch: bool = False, offload_params: bool = False,
                     offload_fraction: float = 1.0, host_embedding: bool = False,
                     optimizer_impl: str | None = None) -> EstimateResult:
    layout = None
    if plan is not None:
        p = load_plan(plan)
        layout = p.operator_strategies if isinstance(p.operator_strategies, dict) else None
        job = p.training if tokens is None else replace(p.training, train_tokens=parse_token_count(tokens))
        if grid_intensity is not None or pue is not None:
            site = site_settings(grid_intensity, pue if pue is not None else p.training.pue, job.train_tokens)
            job = replace(job, **({"pue": site["pue"]} if grid_intensity is None else site))
        job = replace(job, **graph_settings(p.model, job.framework, cuda_graphs, token_drop, job.moe_dropless))
        if optimizer_impl is not None:
            check_optimizer_impl(optimizer_impl, job.framework, "--optimizer-impl")
            job = replace(job, optimizer_impl=optimizer_impl)
        inputs = Inputs(p.model, p.hardware, p.cluster, replace(job, comm_priority=job.comm_priority or comm_priority))
        strategy = replace(p.strategy, full_batch=True) if full_batch else p.strategy
        strategy = replace(strategy, host_embedding=True) if host_embedding else strategy
        if offload_params or offload_fraction != 1.0:       # the plan's strategy with the offload asked for
            strategy = replace(strategy, offload_params=strategy.offload_params or offload_params,
                               offload_fraction=_fraction(offload_fraction) if offload_fraction != 1.0
                               else strategy.offload_fraction)
        title = f"{p.model.name} on {p.cluster.devices} x {p.hardware.device.name} ({p.hardware.name}), plan {plan}"
    else:
        if model is None or hardware is None:
            raise AdvisorError("advisor estimate needs --model and --hardware (or --plan PLAN.json)")
        inputs = resolve_inputs(model, hardware, nodes=nodes, devices=devices, global_batch=gbs,
                                seq_len=seq_len, dtype=dtype, tokens=tokens, attention=attention,
                                dropout=dropout, framework=framework, fp8_recipe=fp8_recipe,
                                recompute_modules=recompute_modules, grid_intensity=grid_intensity, pue=pue,
                                comm_priority=comm_priority, cuda_graphs=cuda_graphs, token_drop=token_drop,
                                optimizer_impl=optimizer_impl or "fused")
        strategy = strategy_from_flags(
            inputs, tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, mbs=mbs, vpp=vpp, zero=zero, recompute=recompute,
            recompute_layers=recompute_layers, sequence_parallel=sequence_parallel, schedule=schedule,
            offload_optimizer=offload_optimizer, cp_comm=cp_comm, offload_params=offload_params,
        )
        strategy = replace(strategy, grad_bucket_mb=_bucket_mb(bucket_mb),
                           micro_batch_copies=check_count("--copies", copies, limits.MAX_GLOBAL_BATCH),
                           full_batch=full_batch, offload_fraction=_fraction(offload_fraction),
                           host_embedding=host_embedding)
        title = f"{inputs.model.name} on {inputs.cluster.devices} x {inputs.hardware.device.name} ({inputs.hardware.name})"
    broken = violations(inputs.model, inputs.cluster, inputs.job, strategy)
    if broken:
        raise AdvisorError(f"illegal strategy: {broken[0]}")
    if operator_strategies is not None or layout is not None:
        # imported here: the layout searchers bring OR-Tools, which plain estimates do not need
        from advisor.search.operator_plan import estimate_with_layout, layout_of
    if operator_strategies is not None:   # the user's strategies kept, the other operators searched around them
        fixed = load_operator_strategies(operator_strategies)
        layout = layout_of(inputs.model, inputs.hardware, inputs.cluster, inputs.job, strategy, fixed)
    if layout is not None and isinstance(layout.get("pricing"), dict):   # a searched layout priced in
        e = estimate_with_layout(inputs.model, inputs.hardware, inputs.cluster, inputs.job, strategy, layout)
    else:
        e = estimate(inputs.model, inputs.hardware, inputs.cluster, inputs.job, strategy)
    alternative = None
    if not e.feasible:
        found = closest_fit(inputs.model, inputs.hardware, inputs.cluster, inputs.job, strategy)
        if found is not None:
            alternative = f"{found[0]} ({found[1].memory_gib.total:.1f} GiB, step {step_time(found[1].step_time_s)} s)"
    return EstimateResult(title=title, inputs=inputs, strategy=strategy, estimate=e, alternative=alternative,
                          operator_strategies=layout)
