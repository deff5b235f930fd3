"""The closest feasible change to a strategy that does not fit: one knob at a time.

Used by `advisor estimate` to name an alternative when the given strategy runs out of memory. The
changes are tried in the order an engineer would (cheapest in throughput first) and the first
that fits is returned.
"""

from __future__ import annotations

from dataclasses import replace

from advisor.cost.estimate import Estimate, estimate
from advisor.space.rules import violations
from advisor.space.strategy import Strategy
from advisor.specs.hardware import HardwareProfile
from advisor.specs.job import Cluster, TrainingJob
from advisor.specs.model import ModelSpec


def single_knob_changes(s: Strategy) -> list[tuple[str, Strategy]]:
    out = []
    if s.tp > 1 and not s.sequence_parallel:
        out.append(("--sequence-parallel", replace(s, sequence_parallel=True)))
    for z in range(s.zero_stage + 1, 4):
        out.append((f"--zero {z}", replace(s, zero_stage=z)))
    if s.recompute == "none":
        out.append(("--recompute selective", replace(s, recompute="selective")))
    if s.recompute != "full":
        out.append(("--recompute full", replace(s, recompute="full", recompute_layers=None)))
    if s.micro_batch_size > 1:
        mbs = s.micro_batch_size // 2
        if s.micro_batch_size % 2 == 0:
            out.append((f"--mbs {mbs}", replace(s, micro_batch_size=mbs, num_micro_batches=s.num_micro_batches * 2)))
    if not s.offload_optimizer:
        z = max(s.zero_stage, 1)
        out.append((f"--zero {z} with optimizer offload", replace(s, zero_stage=z, offload_optimizer=True)))
    return out


def closest_fit(model: ModelSpec, hw: HardwareProfile, cluster: Cluster, job: TrainingJob,
                s: Strategy) -> tuple[str, Estimate] | None:
    """(flag change, its estimate) for the first single-knob change that fits, or None."""
    for label, candidate in single_knob_changes(s):
        if violations(model, cluster, job, candidate):
            continue
        e = estimate(model, hw, cluster, job, candidate)
        if e.feasible:
            return label, e
    return None
