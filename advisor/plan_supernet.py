"""Plan JSON for supernets (advisor.specs.supernet): ``parallel.supernet`` holds what the NASPipe pricing
and the executor sample and how (advisor.specs.supernet.SupernetRun); advisor.plan calls these."""

from __future__ import annotations

from typing import Any

from advisor.specs.supernet import SupernetRun
from advisor.errors import AdvisorError
from advisor.specs import _fields as f
from advisor.specs.supernet import SupernetSpec

MAX_SUBNETS = 100_000       # a NASPipe run samples one subnet per step; 1e5 steps is far past any schedule worth simulating


def run_from_dict(parallel: dict[str, Any], origin: str, model: Any) -> SupernetRun | None:
    o = f"{origin}: parallel"
    block = parallel.get("supernet")
    if not isinstance(model, SupernetSpec):
        if block is not None:
            raise AdvisorError(f"{o}: key 'supernet' goes with a model of family supernet, {model.name} is not one")
        return None
    if block is None:
        return SupernetRun()
    if not isinstance(block, dict):
        raise AdvisorError(f"{o}: key 'supernet' must be a mapping {{subnets, seed, train_shared}}")
    w = f"{o}.supernet"
    f.check_keys(block, w, (), ("subnets", "seed", "train_shared", "window", "context_switch", "checkpoint"))
    return SupernetRun(subnets=f.positive_int(block, "subnets", w, default=64, maximum=MAX_SUBNETS),
                       seed=f.non_negative_int(block, "seed", w, default=0),
                       train_shared=f.boolean(block, "train_shared", w, default=False),
                       window=None if block.get("window") is None else f.positive_int(block, "window", w, maximum=4096),
                       context_switch=f.boolean(block, "context_switch", w, default=False),
                       checkpoint=f.boolean(block, "checkpoint", w, default=False))


def check_strategy(model: SupernetSpec, parallel: dict[str, Any], origin: str) -> None:
    """A supernet plan is a pipeline (with data-parallel replicas): one batch per subnet, no tp/cp/ep."""
    if parallel.get("full_batch"):
        raise AdvisorError(f"{origin}: parallel: key 'full_batch' = true: a supernet plan reads each subnet's batch "
                           "once per pipeline (NASPipe); remove the key")
    if parallel.get("host_embedding"):
        raise AdvisorError(f"{origin}: parallel: key 'host_embedding' = true: a supernet's candidate blocks are not "
                           "priced with their embedding on the host; remove the key")
    if parallel.get("recompute", "none") != "none":
        raise AdvisorError(f"{origin}: parallel: key 'recompute' = {parallel['recompute']!r}: a supernet plan "
                           "recomputes through parallel.supernet.checkpoint (NASPipe's checkpointed stages)")
    for key in ("tp", "cp", "ep", "num_micro_batches", "virtual_pipeline_stages"):
        if parallel.get(key, 1) != 1:
            raise AdvisorError(f"{origin}: parallel: key '{key}' = {parallel[key]!r}: a supernet plan runs each "
                               "subnet's batch as one pipeline task (NASPipe), so it must be 1")


def parallel_from_dict(parallel: dict[str, Any], origin: str, model, cluster, strategy, training,
                       mixed=None) -> dict[str, Any]:
    """The Plan field of the supernet family (advisor.families): its sampling; a supernet's strategy is checked
    as a NASPipe pipeline."""
    if isinstance(model, SupernetSpec):
        check_strategy(model, parallel, origin)
    return {"supernet": run_from_dict(parallel, origin, model)}


def parallel_to_dict(plan) -> dict[str, Any]:
    return {"supernet": plan.supernet.to_dict()} if plan.supernet is not None else {}


def violations(model: SupernetSpec, cluster, job, strategy, framework_rules: bool = True) -> list[str]:
    """The transformer rules on the supernet's base model."""
    from advisor.space.rules import violations as transformer_violations

    return transformer_violations(model.base, cluster, job, strategy, framework_rules)
