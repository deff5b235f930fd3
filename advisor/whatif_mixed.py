"""What-if: "replace half the nodes" (``whatif --replace-half PROFILE``): at every point of a sweep
with an even node count N, the same job on N/2 nodes of the point's profile (with its overrides) and
N/2 nodes of PROFILE, solved by the mixed-cluster searcher (advisor.commands.mixed).

The mixed points form series of their own ("VARIANT+PROFILE halves"), so their scaling efficiency
compares mixed clusters of different sizes; the table puts them beside the homogeneous rows.
"""

from __future__ import annotations

from typing import Any

from advisor.commands.inputs import check_dtype
from advisor.errors import AdvisorError, InfeasibleError
from advisor.specs.hardware import HardwareProfile, load_hardware
from advisor.specs.job import TrainingJob
from advisor.specs.mixed import ClusterPart, MixedHardware
from advisor.specs.model import ModelSpec


def replacement(name: str, profiles: dict[str, HardwareProfile], dtypes: set[str]) -> HardwareProfile:
    """The profile that replaces half the nodes: loaded, with every dtype the sweep uses."""
    other = load_hardware(name)
    if other.name in {p.name for p in profiles.values()}:
        raise AdvisorError(f"--replace-half {other.name}: the sweep already runs that profile; name another one")
    for dt in dtypes:
        check_dtype(other, dt)
    return other


def mixed_point(model: ModelSpec, base: HardwareProfile, other: HardwareProfile, nodes: int, job: TrainingJob,
                hardware: str, point_cls) -> Any:
    """The best plan on nodes/2 of ``base`` and nodes/2 of ``other`` as a what-if point."""
    from advisor.commands.inputs import Inputs
    from advisor.commands.mixed import recommend_mixed

    half = nodes // 2
    mixed = MixedHardware((ClusterPart(base, half), ClusterPart(other, half)))
    common = dict(hardware=f"{hardware}+{other.name}", variant=f"{base.name}+{other.name} halves", nodes=nodes,
                  devices=mixed.devices, inter_node_gbps=min(base.inter.bandwidth_gbps * base.oversubscription,
                                                             other.inter.bandwidth_gbps * other.oversubscription),
                  intra_node_gbps=base.node.intra.bandwidth_gbps, memory_gib=base.device.memory_gib,
                  global_batch_size=job.global_batch_size, seq_length=job.seq_length)
    try:
        result = recommend_mixed(Inputs(model, base, mixed.cluster, job), mixed, top_k=1)
    except InfeasibleError as exc:
        return point_cls(fits=False, reason=str(exc), **common)
    e = result.estimates[0]
    return point_cls(fits=True, plan=result.best, tokens_per_s=e.tokens_per_s, mfu=e.mfu, step_time_s=e.step_time_s,
                     memory_used_gib=e.memory_gib, bottleneck=e.bottleneck, time_to_train_s=e.time_to_train_s,
                     cost_usd=e.cost_to_train_usd, **common)


def with_mixed_points(points: list, tasks: list, model: ModelSpec, other: HardwareProfile, point_cls) -> list:
    """Each homogeneous point followed by its mixed twin (points with an even node count)."""
    out = []
    for point, task in zip(points, tasks):
        out.append(point)
        if task.cluster.nodes % 2 == 0 and task.cluster.devices == task.cluster.nodes * task.profile.node.devices_per_node:
            out.append(mixed_point(model, task.profile, other, task.cluster.nodes, task.job, task.hardware, point_cls))
    return out
