"""The closest feasible change to a strategy that does not fit: one knob, else two.

Used by `advisor estimate` to name an alternative when the given strategy runs out of memory. The
single changes are tried in the order an engineer would (cheapest in throughput first) and the first
that fits is returned. When none fits, every pair of changes to two different knobs is priced and the
pair with the shortest step time among those that fit is returned (e.g. more tp and full recompute).
"""

from __future__ import annotations

from dataclasses import replace

from advisor.cost.estimate import Estimate, estimate
from advisor.space.rules import violations
from advisor.space.strategy import Strategy
from advisor.specs.hardware import HardwareProfile
from advisor.specs.job import Cluster, TrainingJob
from advisor.specs.model import ModelSpec


def knob_changes(s: Strategy) -> list[tuple[str, str, Strategy]]:
    """(knob, flag text, changed strategy) for each single change, cheapest in throughput first."""
    out = []
    if s.tp > 1 and not s.sequence_parallel:
        out.append(("sp", "--sequence-parallel", replace(s, sequence_parallel=True)))
    for z in range(s.zero_stage + 1, 4):
        out.append(("zero", f"--zero {z}", replace(s, zero_stage=z)))
    if s.recompute == "none":
        out.append(("recompute", "--recompute selective", replace(s, recompute="selective")))
    if s.recompute != "full":
        out.append(("recompute", "--recompute full", replace(s, recompute="full", recompute_layers=None)))
    if s.micro_batch_size > 1:
        mbs = s.micro_batch_size // 2
        if s.micro_batch_size % 2 == 0:
            out.append(("mbs", f"--mbs {mbs}", replace(s, micro_batch_size=mbs, num_micro_batches=s.num_micro_batches * 2)))
    if not s.offload_optimizer:
        z = max(s.zero_stage, 1)
        text = "--offload-optimizer" + (f" --zero {z}" if z != s.zero_stage else "")
        knob = "offload" if z == s.zero_stage else "zero"     # it sets the ZeRO stage too: not paired with one
        out.append((knob, text, replace(s, zero_stage=z, offload_optimizer=True)))
    if not s.offload_params and not s.host_embedding:
        text = "--offload-params" + (" --zero 3" if s.zero_stage != 3 else "") + ("" if s.offload_optimizer else
                                                                                  " --offload-optimizer")
        out.append(("offload_params", text, replace(s, zero_stage=3, offload_optimizer=True, offload_params=True,
                                                   offload_fraction=1.0)))
    if not s.host_embedding and not s.offload_params:
        out.append(("host_embedding", "--host-embedding", replace(s, host_embedding=True)))
    # Twice the model-parallel degree over half the data-parallel replicas (same devices, same global
    # batch: twice the micro-batches per replica); illegal layouts are dropped by advisor.space.rules.
    if s.dp % 2 == 0:
        dp = s.dp // 2
        more = s.num_micro_batches * 2
        out.append(("tp", f"--tp {s.tp * 2} --dp {dp}", replace(s, tp=s.tp * 2, dp=dp, num_micro_batches=more)))
        out.append(("pp", f"--pp {s.pp * 2} --dp {dp}", replace(s, pp=s.pp * 2, dp=dp, num_micro_batches=more)))
    return out


def single_knob_changes(s: Strategy) -> list[tuple[str, Strategy]]:
    return [(label, candidate) for _, label, candidate in knob_changes(s)]


def _fits(model: ModelSpec, hw: HardwareProfile, cluster: Cluster, job: TrainingJob, s: Strategy) -> Estimate | None:
    if violations(model, cluster, job, s):
        return None
    e = estimate(model, hw, cluster, job, s)
    return e if e.feasible else None


def closest_fit(model: ModelSpec, hw: HardwareProfile, cluster: Cluster, job: TrainingJob,
                s: Strategy) -> tuple[str, Estimate] | None:
    """(flag change, its estimate): the first single-knob change that fits, else the fastest pair of
    changes to two knobs that fits, else None."""
    firsts = knob_changes(s)
    for _, label, candidate in firsts:
        e = _fits(model, hw, cluster, job, candidate)
        if e is not None:
            return label, e
    best: tuple[str, Estimate] | None = None
    seen: set[tuple[str, str]] = set()
    for knob, label, first in firsts:
        for knob2, label2, both in knob_changes(first):
            key = tuple(sorted((label, label2)))
            if knob2 == knob or key in seen:
                continue
            seen.add(key)
            e = _fits(model, hw, cluster, job, both)
            if e is not None and (best is None or e.step_time_s < best[1].step_time_s):
                best = (f"{label} {label2}", e)
    return best
