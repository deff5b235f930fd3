"""The command line's side of mixed clusters (advisor.cli): ``recommend`` and ``estimate`` with
``--hardware PROFILE:NODES,...``, and ``estimate --plan`` of a mixed plan. advisor.cli hands the
options over as given; what a mixed cluster does not take is refused in one sentence.
"""

from __future__ import annotations

from typing import Any

from advisor.commands.cli_options import console, print_json, wide_console
from advisor.errors import AdvisorError, InfeasibleError
from advisor.search import Pins

# advisor.cli's parameter names -> the names used here
_ALIASES = {"gbs": "global_batch", "grid": "grid_intensity", "priority": "comm_priority", "offload_optimizer": "offload"}
_JOB_KEYS = ("global_batch", "seq_len", "dtype", "tokens", "attention", "framework", "fp8_recipe", "recompute_modules",
             "grid_intensity", "pue", "comm_priority", "cuda_graphs",
             "token_drop")


def _options(given: dict[str, Any]) -> dict[str, Any]:
    return {_ALIASES.get(k, k): v for k, v in given.items()}


def _pins(o: dict[str, Any]) -> Pins:
    return Pins(dp=o.get("dp"), tp=o.get("tp"), pp=o.get("pp"), cp=o.get("cp"), ep=o.get("ep"),
                zero_stage=o.get("zero"), recompute=o.get("recompute"), micro_batch_size=o.get("mbs"),
                virtual_pipeline_stages=o.get("vpp"), pipeline_schedule=o.get("schedule"),
                sequence_parallel=o.get("sequence_parallel"), offload_optimizer=o.get("offload"),
                cp_comm=o.get("cp_comm"), offload_params=o.get("offload_params"))


def _refuse_host_embedding(o: dict[str, Any]) -> None:
    if o.get("host_embedding"):
        raise AdvisorError("--host-embedding is not available on a mixed cluster (--hardware PROFILE:NODES,...)")


def _inputs(o: dict[str, Any]):
    from advisor.commands.mixed import mixed_inputs

    job = {k: o.get(k) for k in _JOB_KEYS if o.get(k) is not None}
    return mixed_inputs(o["model"], o["hardware"], o.get("nodes"), o.get("devices"), **job)


def recommend_mixed_cmd(given: dict[str, Any]) -> None:
    o = _options(given)
    from advisor.commands.mixed import recommend_mixed, refuse_unsupported
    from advisor.plan import save_plan
    from advisor.render.mixed import render_mixed_recommendation

    refuse_unsupported(searcher=o.get("searcher"), operator_strategies=o.get("operator_strategies"),
                       ps_mode=o.get("ps_mode"), objective=o.get("objective"), plot=o.get("plot"))
    _refuse_host_embedding(o)
    mixed, inputs = _inputs(o)
    result = recommend_mixed(inputs, mixed, _pins(o), o.get("top", 5))
    if o.get("out"):
        save_plan(result.best, o["out"])
    if o.get("as_json"):
        print_json(result.to_dict())
    else:
        render_mixed_recommendation(wide_console(), result, saved_to=o.get("out"))


def estimate_mixed_cmd(given: dict[str, Any]) -> None:
    """--plan: the plan's own layout; degrees: the best layout of that strategy on the parts."""
    o = _options(given)
    for key, flag in (("recompute_layers", "--recompute-layers"), ("bucket_mb", "--bucket-mb")):
        if o.get(key) is not None:
            raise AdvisorError(f"{flag} is not available on a mixed cluster (--hardware PROFILE:NODES,...)")
    if o.get("copies", 1) != 1:
        raise AdvisorError("--copies is not available on a mixed cluster (--hardware PROFILE:NODES,...)")
    if o.get("full_batch"):
        raise AdvisorError("--full-batch is not available on a mixed cluster (--hardware PROFILE:NODES,...)")
    _refuse_host_embedding(o)
    if o.get("offload_fraction", 1.0) != 1.0:
        raise AdvisorError("--offload-fraction is not available on a mixed cluster (--hardware PROFILE:NODES,...)")
    from advisor.commands.mixed import estimate_plan, recommend_mixed, refuse_unsupported
    from advisor.plan import load_plan
    from advisor.render.mixed import render_mixed_estimate

    refuse_unsupported(operator_strategies=o.get("operator_strategies"), ps_mode=o.get("ps_mode"))
    if o.get("plan") is not None:
        if o.get("cuda_graphs") is not None or o.get("token_drop"):
            raise AdvisorError("--cuda-graphs/--moe-token-drop with a mixed plan: the plan's training settings are "
                               "priced as saved; give them to recommend or estimate with --hardware PROFILE:NODES,...")
        plan = load_plan(o["plan"])
        e, title = estimate_plan(plan), f"{plan.model.name} on {plan.mixed.label} (plan {o['plan']})"
    else:
        if o.get("pp") is None or o.get("tp") is None:
            raise AdvisorError("estimate on a mixed cluster needs at least --tp and --pp (or --plan)")
        mixed, inputs = _inputs(o)
        try:
            plan = recommend_mixed(inputs, mixed, _pins(o), top_k=1).best
        except InfeasibleError as exc:
            raise InfeasibleError(f"the strategy fits in no layout on {mixed.label} (the knobs not given take "
                                  f"estimate's defaults: ZeRO 0, no recomputation, micro-batch 1): {exc}; give --zero, "
                                  "--recompute or --mbs, or run recommend with these pins") from None
        e, title = estimate_plan(plan), f"{plan.model.name} on {mixed.label}, its best layout"
    if o.get("as_json"):
        from advisor.plan import strategy_to_dict

        print_json({"strategy": strategy_to_dict(plan.strategy, plan.model.num_layers), "estimate": e.to_dict()})
    else:
        render_mixed_estimate(console, title, plan.strategy, e)
    if not e.feasible:
        raise InfeasibleError(f"the strategy does not fit: {e.reasons[0]}")
