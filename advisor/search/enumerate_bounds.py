"""The enumerator's bounds (advisor.search.enumerate): lower limits on step time and memory fit.

Modified hardware profiles on which no candidate runs slower (free_hardware, fastest_link_hardware),
the ZeRO/offload pairs needing the least memory, and the per-skeleton and per-family bounds priced
with them. The properties these rest on are checked by tests/test_enumerate.py.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from advisor.cost.estimate import EstimateBatch, estimate_batch
from advisor.cost.memory import GIB, memory
from advisor.search.enumerate_rows import HOST_EMBEDDING, Rows, _concat, _count, _take, chunks_by_pp, to_batch
from advisor.search import Pins
from advisor.search.enumerate_space import _lone_options, cp_comm_options
from advisor.specs.hardware import HardwareProfile
from advisor.specs.job import Cluster, TrainingJob
from advisor.specs.model import ModelSpec

UNBOUNDED_GBPS = 1e12


def bound_step_s(e) -> np.ndarray:
    """A bound's step time: its estimate without contention (advisor.cost.contention), which is never
    negative on the real profile and not monotone in where a profile puts its tiers (the bound profiles
    put the whole cluster in one node, so traffic that the real tiers keep apart would meet)."""
    return e.step_time_s - e.time_s["contention"]


def _free_host(hw: HardwareProfile) -> dict:
    host = replace(hw.host, pcie_bandwidth_gbps=UNBOUNDED_GBPS, memory_bandwidth_gbps=UNBOUNDED_GBPS,
                   cpu_adam_params_per_s=())
    return {"host": host, "device": replace(hw.device, launch_overhead_us=0.0)}


def free_hardware(hw: HardwareProfile) -> HardwareProfile:
    """The profile with free communication (unbounded bandwidth, zero latency), host transfers and
    kernel launches; memory sizes unchanged. Every ZeRO stage, offload choice and mesh order of a
    candidate runs at least this long on `hw`."""
    def free(link):
        return None if link is None else replace(link, bandwidth_gbps=UNBOUNDED_GBPS, latency_us=0.0, efficiency=1.0)

    node = replace(hw.node, intra=free(hw.node.intra), cross=free(hw.node.cross))
    return replace(hw, node=node, inter=free(hw.inter), **_free_host(hw))


def fastest_link_hardware(hw: HardwareProfile, devices: int, moe: bool) -> HardwareProfile:
    """A profile on which no candidate runs slower than on `hw` under any mesh order (its ZeRO stage
    and offload choice kept).

    Every tier becomes one link at the fastest tier's effective bandwidth with zero latency, and one
    "node" holds the whole cluster, so a collective's bandwidth term telescopes to the flat ring's
    (1 - 1/n) S / B for every placement (the hierarchical and flat forms in advisor.cost.comm both
    cost at least that on the real tiers). An all-to-all's tiers run concurrently in the cost model,
    so its time is at least the largest of its per-tier shares, which sum to (n - 1)/n: MoE models
    get the tier count times the bandwidth to keep the bound. Host transfers and kernel launches are
    free; memory sizes are unchanged (host-memory fit must be judged with the real node size)."""
    tiers = [hw.node.intra, hw.inter] + ([hw.node.cross] if hw.node.cross is not None else [])
    fastest = max(t.effective_bandwidth_bytes_per_s for t in tiers) / 1e9
    link = replace(hw.node.intra, bandwidth_gbps=fastest * (len(tiers) if moe else 1), latency_us=0.0, efficiency=1.0)
    node = replace(hw.node, devices_per_node=devices, group_size=devices, intra=link, cross=link)
    return replace(hw, node=node, inter=link, **_free_host(hw))


# offload code -> the codes it never needs more device memory than (advisor.search.enumerate_rows):
# the optimizer offloaded removes its states, parameter offload also the weights and gradients,
# the host embedding the table's weights, gradients and states
LEANER = {1: {0}, 2: {0, 1}, 3: {0}, 4: {0, 1, 3}}


def leanest_options(options: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The ZeRO/offload pairs that can need the least device memory: memory does not grow with the
    stage up to 2 and offload only removes what it moves to the host (LEANER; parameter offload and
    the host embedding with the optimizer offloaded are both kept, neither dominating the other);
    stage 3 trades sharded weights for a gather buffer, so stages 2 and 3 are both kept. The first
    also has the least optimizer time (free_hardware makes every host transfer free)."""
    codes: dict[int, set[int]] = {}
    for z, o in options:
        codes.setdefault(z, set()).add(o)
    stages = sorted(codes, reverse=True)
    chosen = [z for z in stages if z >= 2] or stages[:1]
    return [(z, o) for z in chosen for o in sorted(codes[z], reverse=True)
            if not any(o in LEANER.get(other, ()) for other in codes[z])]


def _with_lean_memory(rows: Rows, options: list[tuple[int, int]], pair: tuple[int, int]) -> Rows:
    """The rows with a ZeRO/offload pair (rows without data parallelism get their own lone pair)."""
    lone = _lone_options(options)[-1]
    solo = rows["dp"] * rows["cp"] == 1
    return {**rows, "zero": np.where(solo, lone[0], pair[0]), "offload": np.where(solo, lone[1], pair[1])}


# the step's parts that depend on a candidate's ZeRO stage and offload choice (advisor.cost.step.TIME_PARTS):
# everything else (stage compute and communication, bubble, pipeline transfers, FP8 casts) is the same for
# every pair of a skeleton, except where the word embedding goes to the host (its lookups move)
PAIR_PARTS = ("dp_comm", "overlap_slowdown", "optimizer", "offload", "contention")


def bound_step_s_without_pairs(e) -> np.ndarray:
    """A bound's step time without the parts any ZeRO/offload pair changes (PAIR_PARTS): on the
    pair bound's profile (fastest_link_hardware), a lower limit for every pair of the skeleton whose word
    embedding stays on the device (its input copies are free there, so nothing else depends on the step)."""
    return e.step_time_s - sum(e.time_s[part] for part in PAIR_PARTS)


def bound_estimate(model: ModelSpec, bound_hw: HardwareProfile, cluster: Cluster, job: TrainingJob, rows: Rows,
                   pins: Pins, step_of=bound_step_s) -> tuple[EstimateBatch, np.ndarray]:
    """The rows priced on a bound's profile in one cost-model call, with a bound's step time over both
    context-parallel kinds: rows that can use Ulysses (under the pins) are priced with it too and keep
    the faster (a ring runs its attention as s/cp-long kernels, advisor.cost.attention). The estimate
    covers the rows first, then their Ulysses copies: its first _count(rows) entries are the rows'."""
    n = _count(rows)
    a2a = cp_comm_options(model, rows, pins)[:, 1]
    both = rows
    if a2a.any():
        ulysses = {**_take(rows, a2a), "cp_comm": np.ones(int(a2a.sum()), dtype=np.int64)}
        ring = rows if "cp_comm" in rows else {**rows, "cp_comm": np.zeros(n, dtype=np.int64)}
        both = _concat([ring, ulysses], ring)
    e = estimate_batch(model, bound_hw, cluster, job, to_batch(model, job, both), every_stage=False)
    priced = step_of(e)
    step = priced[:n].copy()
    step[a2a] = np.minimum(step[a2a], priced[n:])
    return e, step


def bound_skeletons(model: ModelSpec, hw: HardwareProfile, cluster: Cluster, job: TrainingJob, rows: Rows,
                    options: list[tuple[int, int]], pins: Pins = Pins()) -> tuple[np.ndarray, np.ndarray]:
    """(lower bound on step time, may fit) per skeleton, over all its ZeRO/offload/mesh and
    context-parallel variants, with the faster context-parallel kind: priced on fastest_link_hardware
    without the parts a ZeRO/offload pair changes (bound_step_s_without_pairs), or, where a pair puts the
    word embedding on the host (its lookups move), on free_hardware with the leanest pair. "May fit" is
    false only when no pair can fit in device memory. Memory is judged first (advisor.cost.memory alone):
    a skeleton none of whose pairs can fit is not priced, its bound left infinite."""
    free = free_hardware(hw)
    fast = fastest_link_hardware(hw, cluster.devices, model.moe is not None)
    # without a host embedding among the pairs: priced on the fastest links without the pairs' parts
    # (bound_step_s_without_pairs), else on free links with the leanest pair
    hosted = any(o >= HOST_EMBEDDING for _, o in options)
    n = _count(rows)
    lower = np.full(n, np.inf)
    may_fit = np.zeros(n, dtype=bool)
    capacity = job.usable_memory_gib(hw.device.memory_gib) * GIB
    lean = leanest_options(options)
    for idx in chunks_by_pp(rows):
        part = _take(rows, idx)
        leanest = _with_lean_memory(part, options, lean[0])
        fits = memory(model, job, to_batch(model, job, leanest), every_stage=False).total <= capacity
        for pair in lean[1:]:
            todo = ~fits & (part["dp"] * part["cp"] > 1)
            if todo.any():
                other = _take(_with_lean_memory(part, options, pair), todo)
                fits[todo] = memory(model, job, to_batch(model, job, other), every_stage=False).total <= capacity
        # one replica: parameter offload's fetched layers can outweigh a small stage's own weights,
        # so the other lone pairs are tried too
        for z, o in _lone_options(options)[:-1]:
            todo = ~fits & (part["dp"] * part["cp"] == 1)
            if todo.any():
                other = {**_take(part, todo)}
                other["zero"] = np.full(int(todo.sum()), z, dtype=np.int64)
                other["offload"] = np.full(int(todo.sum()), o, dtype=np.int64)
                fits[todo] = memory(model, job, to_batch(model, job, other), every_stage=False).total <= capacity
        # the time bound only where some pair may fit (the others are dropped for memory)
        if fits.any():
            if hosted:
                lower[idx[fits]] = bound_estimate(model, free, cluster, job, _take(leanest, fits), pins)[1]
            else:
                timed = {**_take(part, fits), "zero": np.zeros(int(fits.sum()), dtype=np.int64),
                         "offload": np.zeros(int(fits.sum()), dtype=np.int64)}
                lower[idx[fits]] = bound_estimate(model, fast, cluster, job, timed, pins, bound_step_s_without_pairs)[1]
        may_fit[idx] = fits
    return lower, may_fit


def family_bounds(model: ModelSpec, hw: HardwareProfile, cluster: Cluster, job: TrainingJob, rows: Rows,
                  options: list[tuple[int, int]], pins: Pins = Pins()) -> tuple[np.ndarray, np.ndarray]:
    """(first row, lower bound on step time) per family of skeletons (rows that differ only in
    sequence parallelism and recomputation), over all its members and their variants. On
    free_hardware a family's fastest member is the one with sequence parallelism (it only shrinks
    the memory-bound kernels' traffic once communication is free) and the least recomputation
    (recomputation only adds work): that member is priced with the leanest ZeRO/offload pair."""
    family = rows["family"]
    n = _count(rows)
    starts = np.flatnonzero(np.r_[True, family[1:] != family[:-1]]) if n else np.zeros(0, dtype=np.int64)
    # Within a family, the fastest member first: least recomputation, then sequence parallelism on.
    order = np.lexsort((-rows["sp"], rows["recompute"], family))
    fastest = order[np.flatnonzero(np.r_[True, family[order][1:] != family[order][:-1]])] if n else starts
    lower = np.zeros(len(starts))
    reps = _with_lean_memory(_take(rows, fastest), options, leanest_options(options)[0])
    free = free_hardware(hw)
    for idx in chunks_by_pp(reps):
        lower[idx] = bound_estimate(model, free, cluster, job, _take(reps, idx), pins)[1]
    return starts, lower
