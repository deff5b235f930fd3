"""What-if sweeps: the best plan at every point of a grid of hardware and cluster variations.

Axes (every combination is a point): hardware profiles, cluster sizes (nodes or devices), inter-node
bandwidth, intra-node bandwidth, device memory (overrides on top of a profile, via
HardwareProfile.with_overrides), global batch and sequence length. At each point advisor.commands.recommend
runs the search (top 1) and the point reports the best plan's tokens/s, MFU, step time, time, cost
and energy to train the token budget, or why nothing fits.

Scaling efficiency compares throughput per device with the smallest fitting point of the same series
(same hardware variant, global batch and sequence length): (T / N) / (T0 / N0); 1.0 is linear scaling.
Points are solved in parallel worker processes (fork) on machines with more than one core.
"""

from __future__ import annotations

import itertools
import math
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from advisor.cost.band import memory_headroom
from advisor.errors import AdvisorError, InfeasibleError
from advisor.families import family_of_model
from advisor.commands.inputs import DEFAULT_BATCH_TOKENS, check_dtype, default_dtype, site_values
from advisor.plan import Plan, strategy_to_dict
from advisor.specs.hardware import HardwareProfile, load_hardware
from advisor.specs.job import Cluster, TrainingJob
from advisor.specs.model import ModelSpec, load_model

MAX_POINTS = 2000


@dataclass(frozen=True)
class WhatIfPoint:
    """One grid point and the best plan there (None when nothing fits)."""

    hardware: str                 # profile name as given (bundled name or file stem)
    variant: str                  # profile name with its overrides, e.g. "dgx-h100[inter50]"
    nodes: int
    devices: int
    inter_node_gbps: float        # per device, per direction (as in the profile, before oversubscription)
    intra_node_gbps: float
    memory_gib: float
    global_batch_size: int
    seq_length: int
    fits: bool
    reason: str | None = None
    plan: Plan | None = field(default=None, compare=False, repr=False)
    tokens_per_s: float | None = None
    mfu: float | None = None
    step_time_s: float | None = None
    memory_used_gib: float | None = None
    bottleneck: str | None = None
    time_to_train_s: float | None = None
    cost_usd: float | None = None
    energy_kwh: float | None = None
    emissions_tco2e: float | None = None
    scaling_efficiency: float | None = None
    # with a target (time-to-target): the global batch chosen at this point, and reaching the target there
    target_batch_size: int | None = None
    time_to_target_s: float | None = None
    tokens_to_target: float | None = None

    @property
    def series(self) -> tuple[str, int, int]:
        return (self.variant, self.global_batch_size, self.seq_length)

    def to_dict(self) -> dict[str, Any]:
        out = {
            "hardware": self.hardware, "variant": self.variant, "nodes": self.nodes, "devices": self.devices,
            "inter_node_gbps": self.inter_node_gbps, "intra_node_gbps": self.intra_node_gbps,
            "memory_gib": self.memory_gib, "global_batch_size": self.global_batch_size, "seq_length": self.seq_length,
            "fits": self.fits, "reason": self.reason,
            "tokens_per_s": self.tokens_per_s,
            "tokens_per_s_per_device": None if self.tokens_per_s is None else self.tokens_per_s / self.devices,
            "mfu": self.mfu, "step_time_s": self.step_time_s, "memory_used_gib": self.memory_used_gib,
            "bottleneck": self.bottleneck, "time_to_train_s": self.time_to_train_s,
            "time_to_train_days": None if self.time_to_train_s is None else self.time_to_train_s / 86400.0,
            "cost_usd": self.cost_usd, "energy_kwh": self.energy_kwh, "emissions_tco2e": self.emissions_tco2e,
            "scaling_efficiency": self.scaling_efficiency,
            "target_batch_size": self.target_batch_size, "time_to_target_s": self.time_to_target_s,
            "tokens_to_target": self.tokens_to_target,
            "parallel": None if self.plan is None else strategy_to_dict(self.plan.strategy, self.plan.model.num_layers),
        }
        return out


@dataclass(frozen=True)
class WhatIfResult:
    model: str
    train_tokens: float | None
    dtype: str
    searcher: str
    points: tuple[WhatIfPoint, ...]
    seconds: float
    axes: dict[str, list[Any]]

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "train_tokens": self.train_tokens, "dtype": self.dtype,
                "searcher": self.searcher, "seconds": round(self.seconds, 3), "axes": self.axes,
                "points": [p.to_dict() for p in self.points]}


# ---- parsing the command-line lists --------------------------------------------------------------
def parse_list(flag: str, text: str | None, kind: type = int) -> list:
    """'8,16,32' -> [8, 16, 32]; every item a positive number, named with the flag when it is not."""
    if text is None:
        return []
    items = [t.strip() for t in str(text).split(",")]
    if not items or any(not t for t in items):
        raise AdvisorError(f"{flag}: expected a comma-separated list, got {text!r}")
    out = []
    for t in items:
        try:
            value = kind(t) if kind is int else float(t)
        except ValueError:
            what = "a positive integer" if kind is int else "a positive number"
            raise AdvisorError(f"{flag}: {t!r} is not {what} (in {text!r})") from None
        if not value > 0 or (kind is float and not math.isfinite(value)):
            raise AdvisorError(f"{flag}: {t!r} must be positive (in {text!r})")
        out.append(value)
    if len(set(out)) != len(out):
        raise AdvisorError(f"{flag}: {text!r} lists a value twice")
    return out


def parse_names(flag: str, text: str) -> list[str]:
    names = [t.strip() for t in str(text).split(",")]
    if not names or any(not n for n in names):
        raise AdvisorError(f"{flag}: expected a comma-separated list of names, got {text!r}")
    if len(set(names)) != len(names):
        raise AdvisorError(f"{flag}: {text!r} lists a name twice")
    return names


# ---- the sweep ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Task:
    hardware: str
    profile: HardwareProfile
    cluster: Cluster
    job: TrainingJob


_TASKS: list[_Task] = []          # read by worker processes (inherited through fork)
_MODEL: ModelSpec | None = None
_SEARCHER = "enumerate"
_OBJECTIVE = "throughput"   # or "carbon": the ranking of each point (advisor.commands.recommend)
_TARGET = None     # advisor.cost.convergence.Target: each point chooses its global batch (time-to-target)


def _raw_link(profile: HardwareProfile) -> tuple[float, float]:
    raw = profile.raw or {}
    try:
        inter = float(raw["inter_node"]["bandwidth_gbps"])
        intra = float(raw["node"]["intra_node"]["bandwidth_gbps"])
    except (KeyError, TypeError):
        inter = profile.inter.bandwidth_gbps * profile.oversubscription
        intra = profile.node.intra.bandwidth_gbps
    return inter, intra


def _solve(index: int) -> dict[str, Any]:
    """Best plan at one point (run in a worker process or in-line)."""
    from advisor.commands.recommend import recommend

    task = _TASKS[index]
    target = {}
    try:
        if _TARGET is None:
            result = recommend(_MODEL, task.profile, task.cluster, task.job, top_k=1, searcher=_SEARCHER,
                               objective=_OBJECTIVE)
        else:   # the global batch chosen with the parallelism (advisor.commands.objective)
            from advisor.commands.objective import time_to_target

            result, _ = time_to_target(_MODEL, task.profile, task.cluster, task.job, _TARGET, top_k=1, searcher=_SEARCHER)
            ttt = result.best.prediction["time_to_target"]
            target = {"target_batch_size": result.best.training.global_batch_size, "time_to_target_s": ttt["seconds"],
                      "tokens_to_target": ttt["tokens_to_target"]}
    except InfeasibleError as exc:
        return {"fits": False, "reason": str(exc)}
    e = result.estimates[0]
    return {"fits": True, "plan": result.best, "tokens_per_s": e.tokens_per_s, "mfu": e.mfu,
            "step_time_s": e.step_time_s, "memory_used_gib": e.memory_gib.total, "bottleneck": e.bottleneck,
            "time_to_train_s": e.time_to_train_s, "cost_usd": e.cost_to_train_usd, "energy_kwh": e.energy_to_train_kwh,
            "emissions_tco2e": e.emissions_to_train_tco2e,
            **target}


def _workers(requested: int | None, n: int) -> int:
    if requested is not None:
        if requested < 1:
            raise AdvisorError(f"--workers must be at least 1, got {requested}")
        return min(requested, n)
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, n if n >= 4 else 1))


def _run(n: int, workers: int, progress: Callable[[int, int], None] | None = None) -> list[dict[str, Any]]:
    import multiprocessing as mp

    from advisor.runtime.signals import deferred, ignore_in_child

    tick = progress or (lambda done, total: None)
    if workers <= 1 or "fork" not in mp.get_all_start_methods():
        out = []
        for i in range(n):
            out.append(_solve(i))
            tick(i + 1, n)
        return out
    # Largest clusters first: they take longest, and dynamic hand-out keeps both workers busy.
    order = sorted(range(n), key=lambda i: -_TASKS[i].cluster.devices)
    out: list[dict[str, Any] | None] = [None] * n
    # Ctrl-C reaches the workers too (one process group): they leave it to this process, which
    # ends the pool on the way out. Forked with the signals held back until each worker has set
    # its own handlers (and the pool's threads never take them: they stay with the main thread).
    pool = None
    try:
        with deferred():
            pool = mp.get_context("fork").Pool(workers, initializer=ignore_in_child)
        for done, (i, res) in enumerate(zip(order, pool.imap(_solve, order, chunksize=1)), start=1):
            out[i] = res
            tick(done, n)
    finally:
        if pool is not None:
            pool.terminate()
    return out  # type: ignore[return-value]


def whatif(
    model: str | ModelSpec,
    hardware: Sequence[str],
    nodes: Sequence[int] = (),
    devices: Sequence[int] = (),
    inter_node_gbps: Sequence[float] = (),
    intra_node_gbps: Sequence[float] = (),
    memory_gib: Sequence[float] = (),
    global_batch: Sequence[int] = (),
    seq_len: Sequence[int] = (),
    tokens: str | float | None = None,
    dtype: str | None = None,
    searcher: str = "enumerate",
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    target: Any = None,
    grid_intensity: str | None = None,
    pue: float | None = None,
    objective: str = "throughput",
    replace_half: str | None = None,
) -> WhatIfResult:
    """Sweep the grid and return the best plan at every point (in grid order: hardware, overrides,
    batch, sequence length, then cluster size); ``progress(done, total)`` after each point. With a
    ``target`` (advisor.cost.convergence.Target) each point chooses its global batch for the least
    time to the target, starting from the point's batch. ``replace_half`` (a profile) adds, after each
    point with an even node count, the same job with half its nodes of that profile
    (advisor.whatif_mixed)."""
    import time

    global _MODEL, _SEARCHER, _TARGET, _OBJECTIVE
    start = time.perf_counter()
    spec = model if isinstance(model, ModelSpec) else load_model(model)
    refusal = family_of_model(spec).whatif_refusal
    if refusal is not None:
        raise AdvisorError(refusal.format(model=spec.name))
    if not hardware:
        raise AdvisorError("--hardware: give at least one hardware profile")
    if bool(nodes) == bool(devices):
        raise AdvisorError("give the cluster sizes with exactly one of --nodes or --devices (a comma-separated list)")
    from advisor.commands.recommend import find_searcher

    find_searcher(searcher)
    from advisor.commands.objective import check_objective

    if (check_objective(objective) == "time-to-target") != (target is not None):
        raise AdvisorError("whatif: --objective time-to-target goes with a target (--target-loss or --target-tokens), "
                           "and a target with that objective")
    site = site_values(tokens, pue, grid_intensity)
    train_tokens = site.pop("train_tokens", None)
    profiles = {name: load_hardware(name) for name in hardware}
    if dtype is not None:
        for prof in profiles.values():
            check_dtype(prof, dtype)
    other = None
    if replace_half is not None:
        from advisor.whatif_mixed import replacement

        if not nodes or target is not None or objective != "throughput":
            raise AdvisorError("--replace-half goes with --nodes (half of each count) and the throughput objective")
        other = replacement(replace_half, profiles, {dtype or default_dtype(p) for p in profiles.values()})
    seqs = list(seq_len) or [spec.seq_length]
    sizes = list(nodes) or list(devices)
    overrides = list(itertools.product(list(inter_node_gbps) or [None], list(intra_node_gbps) or [None],
                                       list(memory_gib) or [None]))
    n_points = len(profiles) * len(overrides) * len(seqs) * max(len(global_batch), 1) * len(sizes)
    if n_points > MAX_POINTS:
        raise AdvisorError(f"the grid has {n_points} points; at most {MAX_POINTS} (narrow one of the lists)")

    tasks: list[_Task] = []
    for name, base in profiles.items():
        for inter, intra, mem in overrides:
            prof = base.with_overrides(inter_node_gbps=inter, intra_node_gbps=intra, memory_gib=mem)
            dt = dtype or default_dtype(prof)
            for seq in seqs:
                batches = list(global_batch) or [max(DEFAULT_BATCH_TOKENS // seq, 1)]
                for gbs in batches:
                    # plans fit at the upper end of the memory band, as recommend's (advisor.cost.band)
                    job = TrainingJob(global_batch_size=gbs, seq_length=seq, dtype=dt, train_tokens=train_tokens,
                                      memory_margin=memory_headroom(), **site)
                    for size in sizes:
                        cluster = Cluster.of(prof, nodes=size) if nodes else Cluster.of(prof, devices=size)
                        tasks.append(_Task(name, prof, cluster, job))

    _TASKS[:] = tasks
    _MODEL = spec
    _SEARCHER = searcher
    _TARGET = target
    _OBJECTIVE = "carbon" if objective == "carbon" else "throughput"
    try:
        solved = _run(len(tasks), _workers(workers, len(tasks)), progress)
    finally:
        _TASKS[:] = []
        _TARGET, _OBJECTIVE = None, "throughput"

    points = []
    for task, res in zip(tasks, solved):
        inter, intra = _raw_link(task.profile)
        points.append(WhatIfPoint(
            hardware=task.hardware, variant=task.profile.name, nodes=task.cluster.nodes, devices=task.cluster.devices,
            inter_node_gbps=inter, intra_node_gbps=intra, memory_gib=task.profile.device.memory_gib,
            global_batch_size=task.job.global_batch_size, seq_length=task.job.seq_length, **res))
    if other is not None:
        from advisor.whatif_mixed import with_mixed_points

        points = with_mixed_points(points, tasks, spec, other, WhatIfPoint)
    points = _with_scaling(points)
    axes = {"hardware": list(hardware), "nodes" if nodes else "devices": sizes,
            "inter_node_gbps": list(inter_node_gbps), "intra_node_gbps": list(intra_node_gbps),
            "memory_gib": list(memory_gib), "global_batch": list(global_batch), "seq_len": list(seq_len)}
    dtypes = sorted({t.job.dtype for t in tasks})
    return WhatIfResult(model=spec.name, train_tokens=train_tokens, dtype=",".join(dtypes), searcher=searcher,
                        points=tuple(points), seconds=time.perf_counter() - start, axes=axes)


def _with_scaling(points: list[WhatIfPoint]) -> list[WhatIfPoint]:
    """Scaling efficiency against the smallest fitting point of each series."""
    from dataclasses import replace

    base: dict[tuple, WhatIfPoint] = {}
    for p in sorted((p for p in points if p.fits), key=lambda p: p.devices):
        base.setdefault(p.series, p)
    out = []
    for p in points:
        b = base.get(p.series)
        if p.fits and b is not None and p.devices >= b.devices:
            eff = (p.tokens_per_s / p.devices) / (b.tokens_per_s / b.devices)
            out.append(replace(p, scaling_efficiency=eff))
        else:
            out.append(p)
    return out
