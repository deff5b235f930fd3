"""One strategy and layout on a mixed cluster (advisor.cost.mixed): its checks, figures and totals.

A layout that does not match the strategy or the cluster is a result with reasons (as
advisor.cost.estimate does for illegal strategies), never an exception.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import groupby
from typing import Any

import numpy as np

from advisor.cost.estimate import bottleneck_name
from advisor.cost.memory import GIB
from advisor.cost.step import TIME_PARTS
from advisor.cost.mixed import DATA_MESH, LAYOUTS, PIPELINE, PIPELINE_MESH, price_data, price_pipeline
from advisor.space.rules import violations
from advisor.space.strategy import StrategyBatch, Strategy
from advisor.specs.job import TrainingJob
from advisor.specs.mixed import MixedHardware, MixedLayout
from advisor.specs.model import ModelSpec


@dataclass(frozen=True)
class MixedEstimate:
    feasible: bool
    reasons: tuple[str, ...]
    layout: MixedLayout
    step_time_s: float
    tokens_per_s: float
    mfu: float
    time_s: dict[str, float]
    memory_gib: float               # the fullest device's
    capacity_gib: float             # that device's capacity
    fullest_device: str             # profile name of the fullest device
    slowest_device: str             # profile name of the type that paces the step
    bottleneck: str
    devices: int
    time_to_train_s: float | None = None
    cost_to_train_usd: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "feasible": self.feasible, "reasons": list(self.reasons), "layout": self.layout.kind,
            **self.layout.to_parallel(), "step_time_s": self.step_time_s, "tokens_per_s": self.tokens_per_s,
            "mfu": self.mfu, "time_s": dict(self.time_s), "memory_gib": self.memory_gib,
            "capacity_gib": self.capacity_gib, "fullest_device": self.fullest_device,
            "slowest_device": self.slowest_device, "bottleneck": self.bottleneck, "devices": self.devices,
            "time_to_train_s": self.time_to_train_s, "cost_to_train_usd": self.cost_to_train_usd,
        }


def placement_reasons(mixed: MixedHardware, s: Strategy, layout: MixedLayout,
                       global_batch: int) -> tuple[list[str], bool]:
    """Why the layout cannot place the strategy on the parts ([] when it can), and whether the
    layout can still be priced (every stage or replica names a part of the cluster)."""
    if layout.kind not in LAYOUTS:
        return [f"layout must be one of {', '.join(LAYOUTS)}, got {layout.kind!r}"], False
    if s.swap_layers is not None:
        return ["activation swapping (swap_layers) is not priced on a mixed cluster"], False
    pipeline = layout.kind == PIPELINE
    names = layout.stage_devices if pipeline else layout.replica_devices
    count, unit, what = (s.pp, s.dp * s.cp * s.tp, "stage") if pipeline else (s.dp, s.tp * s.pp * s.cp, "replica")
    mesh = PIPELINE_MESH if pipeline else DATA_MESH
    reasons = []
    if tuple(s.mesh_order) != mesh:
        reasons.append(f"a {layout.kind} layout needs mesh order {list(mesh)} (each {what} a block of ranks on "
                       f"one device type), got {list(s.mesh_order)}")
    if len(names) != count:
        return reasons + [f"{len(names)} {what} device types given for {count} {what}s"], False
    unknown = sorted(set(names) - set(mixed.names))
    if unknown:
        return reasons + [f"{what} device type {unknown[0]!r} is not a part of the cluster ({mixed.label})"], False
    if len(list(groupby(names))) != len(set(names)):
        reasons.append(f"each device type must hold one contiguous run of {what}s, got {list(names)}")
    for part in mixed.parts:
        held = names.count(part.profile.name) * unit
        if held != part.devices:
            reasons.append(f"the {what}s on {part.profile.name} use {held} devices, the part has {part.devices}")
    if not pipeline:
        m = layout.replica_micro_batches
        if len(m) != s.dp or min(m, default=0) < 1 or sum(m) * s.micro_batch_size != global_batch:
            reasons.append(f"the replicas' micro-batches {list(m)} x micro-batch size {s.micro_batch_size} must "
                           f"give each replica at least one and sum to the global batch {global_batch}")
    elif s.virtual_pipeline_stages != 1:
        reasons.append("a pipeline cut between device types runs one model chunk per stage (virtual stages 1)")
    if not pipeline and len(layout.replica_micro_batches) != s.dp:
        return reasons, False
    return reasons, True


def estimate_mixed(model: ModelSpec, mixed: MixedHardware, job: TrainingJob, strategy: Strategy,
                   layout: MixedLayout) -> MixedEstimate:
    placement, priceable = placement_reasons(mixed, strategy, layout, job.global_batch_size)
    reasons = violations(model, mixed.cluster, job, strategy) + placement
    if not priceable:
        return MixedEstimate(False, tuple(reasons), layout, 0.0, 0.0, 0.0, {k: 0.0 for k in TIME_PARTS}, 0.0, 0.0,
                             "", "", "illegal", mixed.devices)
    b = StrategyBatch.from_strategies([strategy], model.num_layers)
    index = {name: i for i, name in enumerate(mixed.names)}
    if layout.kind == PIPELINE:
        stage_part = np.zeros(b.stage_layers.shape, dtype=np.int64)
        stage_part[0, :strategy.pp] = [index[n] for n in layout.stage_devices]
        e = price_pipeline(model, mixed, job, b, stage_part)
    else:
        e = price_data(model, mixed, job, b, np.array([layout.part_micro_batches(mixed)], dtype=np.int64))
    fullest = mixed.parts[int(e.fullest_part[0])]
    mem = float(e.memory_bytes[0]) / GIB
    if not bool(e.fits[0]):
        reasons.append(f"needs {mem:.1f} GiB per device on {fullest.profile.name}, which has "
                       f"{fullest.profile.device.memory_gib:g} GiB (or its host cannot hold what is offloaded)")
    times = {k: float(v[0]) for k, v in e.time_s.items()}
    tps = float(e.tokens_per_s[0])
    train_s = cost = None
    if job.train_tokens is not None:
        train_s = job.train_tokens / tps
        prices = [p.profile.price_per_device_hour_usd for p in mixed.parts]
        if all(prices):
            cost = train_s / 3600.0 * sum(p.devices * price for p, price in zip(mixed.parts, prices))
    return MixedEstimate(
        feasible=not reasons, reasons=tuple(reasons), layout=layout, step_time_s=float(e.step_time_s[0]),
        tokens_per_s=tps, mfu=float(e.mfu[0]), time_s=times, memory_gib=mem,
        capacity_gib=fullest.profile.device.memory_gib, fullest_device=fullest.profile.name,
        slowest_device=mixed.parts[int(e.slowest_part[0])].profile.name,
        bottleneck=bottleneck_name(times, float(e.memory_fraction[0])), devices=mixed.devices,
        time_to_train_s=train_s, cost_to_train_usd=cost,
    )
