"""Plan JSON for heterogeneous clusters (DESIGN.md, "Heterogeneous clusters"): the hardware list and
the layout keys of ``parallel`` (``stage_devices``; ``replica_devices`` with ``dp_batch_split``).
advisor.plan calls these; a homogeneous plan has none of the keys.
"""

from __future__ import annotations

from typing import Any

from advisor.cost.mixed import DATA, PIPELINE
from advisor.cost.mixed_estimate import placement_reasons
from advisor.errors import AdvisorError
from advisor.space.strategy import Strategy
from advisor.specs.job import Cluster, TrainingJob
from advisor.specs.mixed import MixedHardware, MixedLayout
from advisor.specs.untrusted import prefix

LAYOUT_KEYS = ("stage_devices", "replica_devices", "dp_batch_split")


def check_cluster(mixed: MixedHardware, cluster: Cluster, origin: str) -> None:
    if (cluster.nodes, cluster.devices) != (mixed.nodes, mixed.devices):
        raise AdvisorError(f"{origin}: cluster has {cluster.nodes} nodes and {cluster.devices} devices, its hardware "
                           f"parts ({mixed.label}) have {mixed.nodes} and {mixed.devices}")


def _names(value: Any, key: str, origin: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(x, str) for x in value):
        raise AdvisorError(f"{origin}: key '{key}' must be a list of hardware profile names, got {prefix(value)}")
    return tuple(value)


def layout_from_dict(parallel: dict[str, Any], origin: str, mixed: MixedHardware | None, strategy: Strategy,
                     training: TrainingJob) -> MixedLayout | None:
    """The layout of a mixed plan (None for a homogeneous one); refused when it cannot place the
    strategy on the parts."""
    o = f"{origin}: parallel"
    present = [k for k in LAYOUT_KEYS if k in parallel]
    if mixed is None:
        if present:
            raise AdvisorError(f"{o}: key '{present[0]}' describes a mixed cluster; the plan's hardware is one profile")
        return None
    if strategy.full_batch:
        raise AdvisorError(f"{o}: key 'full_batch' = true is not priced on a mixed cluster; remove the key")
    if strategy.host_embedding:
        raise AdvisorError(f"{o}: key 'host_embedding' = true is not priced on a mixed cluster; remove the key")
    if "stage_devices" in parallel:
        if len(present) > 1:
            raise AdvisorError(f"{o}: give 'stage_devices' (pipeline cut between device types) or 'replica_devices' "
                               "with 'dp_batch_split' (replicas on device types), not both")
        layout = MixedLayout(PIPELINE, stage_devices=_names(parallel["stage_devices"], "stage_devices", o))
    elif sorted(present) == ["dp_batch_split", "replica_devices"]:
        split = parallel["dp_batch_split"]
        if (not isinstance(split, list) or not split
                or not all(isinstance(x, (int, float)) and not isinstance(x, bool) and 0 < x <= 1 for x in split)):
            raise AdvisorError(f"{o}: key 'dp_batch_split' must be a list of shares of the global batch (each in "
                               f"(0, 1]), got {prefix(split)}")
        per_micro = training.global_batch_size / strategy.micro_batch_size
        layout = MixedLayout(DATA, replica_devices=_names(parallel["replica_devices"], "replica_devices", o),
                             replica_micro_batches=tuple(int(round(x * per_micro)) for x in split))
    else:
        raise AdvisorError(f"{o}: a plan on a mixed cluster needs 'stage_devices', or 'replica_devices' with "
                           "'dp_batch_split'")
    reasons, _ = placement_reasons(mixed, strategy, layout, training.global_batch_size)
    if reasons:
        raise AdvisorError(f"{o}: {reasons[0]}")
    return layout


def parallel_from_dict(parallel: dict[str, Any], origin: str, model, cluster: Cluster, strategy: Strategy,
                       training: TrainingJob, mixed: MixedHardware | None = None) -> dict[str, Any]:
    """The Plan field of a mixed cluster (advisor.families): which device type runs which stages or replicas."""
    return {"layout": layout_from_dict(parallel, origin, mixed, strategy, training)}


def parallel_to_dict(plan) -> dict[str, Any]:
    return plan.layout.to_parallel() if plan.layout is not None else {}
