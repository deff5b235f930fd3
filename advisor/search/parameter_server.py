"""`recommend` for recommendation models: collective (replicated or sharded tables), parameter server
or hybrid, with the servers, where they run, which tensors they hold and how those are sharded.

Candidates (every one priced by advisor.cost.recsys_estimate):

* ``replicated``, ``sharded`` and ``host`` (the plans without servers; ``--ps-mode none`` keeps only
  these; ``host`` keeps the tables in each worker's host memory, advisor.cost.recsys_host);
* ``ps``: every tensor on the servers;
* ``hybrid``: the k largest tables on the servers (k = 1 .. all tables), the rest of the tables and
  the towers data parallel;
* server counts: powers of two up to twice the worker nodes, and the node count, on dedicated hosts;
  at most one per worker node when co-located. ``--ps-servers N`` pins the count, ``--ps-mode`` the mode.

Ranking: feasible plans by samples/s per charged device: the cluster's devices plus one for every
dedicated server host, which is hardware the plan takes beyond the cluster (co-located servers run on
the worker nodes and cost nothing more), so a plan does not win on free machines. Plans within
TIE_BAND (advisor.search.rank) of the best rate count as equal (finer than the cost model resolves),
and among equals the one that needs the fewest extra hosts, then the fewest servers, then the simpler
mode wins, so a server is never added for nothing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from advisor.cost.recsys import RecEstimate, RecsysConfig
from advisor.cost.recsys_estimate import estimate_recsys
from advisor.errors import AdvisorError, InfeasibleError
from advisor.plan import Plan, plan_to_dict
from advisor.plan_ps import REPLICAS
from advisor.search import SearchStats
from advisor.space.strategy import Strategy
from advisor.specs.hardware import HardwareProfile
from advisor.specs.job import Cluster, TrainingJob
from advisor.search.rank import TIE_BAND
from advisor.specs.recommendation import RecModelSpec

PS_MODES = ("none", "ps", "hybrid")
MODE_ORDER = {"replicated": 0, "sharded": 1, "host": 2, "hybrid": 3, "ps": 4}


@dataclass(frozen=True)
class PsPins:
    mode: str | None = None          # none | ps | hybrid (None: searched)
    servers: int | None = None
    synchronous: bool = True         # False: asynchronous PS (--ps-async)
    replicas: int = 0                # 1: a backup of each server's shard on the next server (--ps-replicas)

    def __post_init__(self) -> None:
        if self.mode is not None and self.mode not in PS_MODES:
            raise AdvisorError(f"--ps-mode must be one of {', '.join(PS_MODES)}, got {self.mode!r}")
        if self.servers is not None and (isinstance(self.servers, bool) or not isinstance(self.servers, int)
                                         or self.servers < 1):
            raise AdvisorError(f"--ps-servers must be a positive integer, got {self.servers!r}")
        if self.servers is not None and self.mode == "none":
            raise AdvisorError(f"--ps-servers {self.servers} conflicts with --ps-mode none (no servers)")
        if not self.synchronous and self.mode == "none":
            raise AdvisorError("--ps-async conflicts with --ps-mode none (no servers)")
        if self.replicas not in REPLICAS:
            raise AdvisorError(f"--ps-replicas must be 0 or 1, got {self.replicas!r}")
        if self.replicas and self.mode == "none":
            raise AdvisorError("--ps-replicas 1 conflicts with --ps-mode none (no servers)")
        if self.replicas and self.servers == 1:
            raise AdvisorError("--ps-replicas 1 needs at least 2 servers (each server's backup is the next one)")

    def given(self) -> bool:
        """Whether the pins ask for parameter servers at all."""
        return (self.mode not in (None, "none") or self.servers is not None or not self.synchronous
                or self.replicas > 0)


@dataclass(frozen=True)
class RecsysRecommendResult:
    """Ranked plans (best first) with their estimates; the same JSON shape as advisor.commands.recommend's."""

    plans: tuple[Plan, ...]
    estimates: tuple[RecEstimate, ...]
    search: SearchStats
    family = "recommendation"

    @property
    def best(self) -> Plan:
        return self.plans[0]

    def to_dict(self) -> dict[str, Any]:
        return {"plans": [plan_to_dict(p) for p in self.plans], "search": self.search.to_dict()}


def server_counts(cluster: Cluster, placement: str) -> list[int]:
    limit = 2 * cluster.nodes if placement == "dedicated" else cluster.nodes
    counts, s = {cluster.nodes} if cluster.nodes <= limit else set(), 1
    while s <= limit:
        counts.add(s)
        s *= 2
    return sorted(c for c in counts if c <= limit)


def candidates(model: RecModelSpec, cluster: Cluster, pins: PsPins) -> list[RecsysConfig]:
    out: list[RecsysConfig] = []
    if not pins.given():
        out += [RecsysConfig("replicated"), RecsysConfig("sharded")]
    everything = tuple(model.tensor_params())
    by_size = [t.name for t in sorted(model.tables, key=lambda t: (-t.params, t.name))]
    if not pins.given():
        # the k largest tables in host memory
        out += [RecsysConfig("host", host_tables=tuple(by_size[:k])) for k in range(1, len(by_size) + 1)]
    for placement in ("dedicated", "colocated"):
        counts = server_counts(cluster, placement) if pins.servers is None else [pins.servers]
        if placement == "colocated":
            counts = [c for c in counts if c <= cluster.nodes]
        for servers in counts:
            if pins.replicas and servers < 2:
                continue
            if pins.mode in (None, "ps"):
                out.append(RecsysConfig("ps", servers, placement, pins.synchronous, everything, replicas=pins.replicas))
            if pins.mode in (None, "hybrid"):
                out += [RecsysConfig("hybrid", servers, placement, pins.synchronous, tuple(by_size[:k]),
                                     replicas=pins.replicas) for k in range(1, len(by_size) + 1)]
    return out


def _extra_hosts(c: RecsysConfig) -> int:
    return c.servers if c.server_placement == "dedicated" and c.mode in ("ps", "hybrid") else 0


def charged_devices(c: RecsysConfig, devices: int) -> int:
    """The devices a plan is charged for in the ranking: the cluster's and each dedicated server host."""
    return devices + _extra_hosts(c)


def rank_estimates(estimates: list[RecEstimate], devices: int) -> list[RecEstimate]:
    """Feasible estimates, best first (module docstring); ``devices``: the cluster's."""
    feasible = [e for e in estimates if e.feasible]
    if not feasible:
        return []

    def rate(e: RecEstimate) -> float:
        return e.samples_per_s / charged_devices(e.config, devices)

    best = max(rate(e) for e in feasible)

    def key(e: RecEstimate):
        c = e.config
        tier = 0 if rate(e) >= (1.0 - TIE_BAND) * best else 1
        simple = (_extra_hosts(c), c.servers, MODE_ORDER[c.mode], len(c.server_tensors) + len(c.host_tables))
        return (tier, simple if tier == 0 else (), -rate(e), simple)

    return sorted(feasible, key=key)


def build_plan(model: RecModelSpec, hardware: HardwareProfile, cluster: Cluster, job: TrainingJob,
               e: RecEstimate, search: dict[str, Any]) -> Plan:
    c = e.config
    ps = None
    if c.mode in ("ps", "hybrid"):
        ps = {"mode": c.mode, "synchronous": c.synchronous, "servers": c.servers,
              "server_placement": c.server_placement, "tensors": list(c.server_tensors),
              "sharding": {k: list(v) for k, v in e.sharding.items()}, "replicas": c.replicas}
    placement = {"replicated": "replicated", "sharded": "sharded", "host": "host"}.get(c.mode, "servers")
    strategy = Strategy(dp=cluster.devices, tp=1, pp=1, micro_batch_size=job.global_batch_size // cluster.devices,
                        num_micro_batches=1)
    return Plan(model=model, hardware=hardware, cluster=cluster, training=job, strategy=strategy,
                prediction=prediction_of(e), search=search, parameter_server=ps, embedding_placement=placement,
                host_tables=c.host_tables or None)


def prediction_of(e: RecEstimate) -> dict[str, Any]:
    """The plan's prediction block: the transformer keys (tokens are samples) plus the PS figures."""
    w = e.worker_memory
    out: dict[str, Any] = {
        "step_time_s": e.step_time_s, "tokens_per_s": e.samples_per_s, "samples_per_s": e.samples_per_s,
        "mfu": e.mfu, "tflops_per_device": e.tflops_per_device,
        "memory_gib": {"parameters": w.parameters_gib, "gradients": w.gradients_gib, "optimizer": w.optimizer_gib,
                       "activations": w.activations_gib, "buffers": w.buffers_gib, "total": w.total_gib},
        "time_s": dict(e.time_s), "bottleneck": e.bottleneck,
    }
    if e.server_memory is not None:
        s = e.server_memory
        out["server_memory_gib"] = {"parameters": s.parameters_gib, "optimizer": s.optimizer_gib,
                                    "buffers": s.buffers_gib, "total": s.total_gib}
        out["traffic_bytes"] = dict(e.traffic_bytes)
    if e.staleness_steps is not None:
        out["staleness_steps"] = e.staleness_steps
    return out


def check_request(model: RecModelSpec, cluster: Cluster, job: TrainingJob, searcher: str, pins) -> None:
    if searcher != "enumerate":
        raise AdvisorError(f"--searcher {searcher} searches transformer operators; {model.name} is a recommendation "
                           f"model, which only the default searcher (enumerate) plans")
    pinned = {k: v for k, v in (pins.pinned().items() if pins is not None else ())
              if not (k == "dp" and v == cluster.devices) and not (k in ("tp", "pp", "cp", "ep") and v == 1)}
    if pinned:
        name = next(iter(pinned))
        raise AdvisorError(f"--{name.replace('_', '-')} {pinned[name]}: {model.name} is a recommendation model, trained "
                           f"data parallel over all {cluster.devices} devices (use --ps-mode / --ps-servers)")
    if job.global_batch_size % cluster.devices:
        raise AdvisorError(f"--global-batch {job.global_batch_size} is not a multiple of the {cluster.devices} devices")


def recommend_recsys(model: RecModelSpec, hardware: HardwareProfile, cluster: Cluster, job: TrainingJob,
                     ps_pins: PsPins = PsPins(), top_k: int = 5, searcher: str = "enumerate", pins=None) -> RecsysRecommendResult:
    check_request(model, cluster, job, searcher, pins)
    start = time.perf_counter()
    configs = candidates(model, cluster, ps_pins)
    estimates = [estimate_recsys(model, hardware, cluster, job, c) for c in configs]
    ranked = rank_estimates(estimates, cluster.devices)
    seconds = time.perf_counter() - start
    stats = SearchStats(searcher="parameter-server", candidates=len(configs), scored=len(configs),
                        feasible=len(ranked), seconds=seconds)
    if not ranked:
        reason = estimates[0].reasons[0] if estimates and estimates[0].reasons else "no candidate"
        raise InfeasibleError(f"no plan for {model.name} fits {cluster.devices} x {hardware.device.name} with "
                              f"{describe(ps_pins) or 'any mode'}: {reason}")
    summary = {"searcher": stats.searcher, "candidates": stats.candidates, "scored": stats.scored,
               "feasible": stats.feasible, "seconds": round(seconds, 4)}
    top = ranked[:top_k]
    plans = tuple(build_plan(model, hardware, cluster, job, e, {**summary, "rank": i})
                  for i, e in enumerate(top, start=1))
    return RecsysRecommendResult(plans=plans, estimates=tuple(top), search=stats)


def describe(pins: PsPins) -> str:
    parts = []
    if pins.mode is not None:
        parts.append(f"--ps-mode {pins.mode}")
    if pins.servers is not None:
        parts.append(f"--ps-servers {pins.servers}")
    if not pins.synchronous:
        parts.append("--ps-async")
    return " ".join(parts)


def recommend_family(model, hardware: HardwareProfile, cluster: Cluster, job: TrainingJob, pins, top_k: int,
                     searcher: str, ps_pins: PsPins | None, objective: str) -> RecsysRecommendResult:
    """advisor.commands.recommend.recommend for the recommendation family (advisor.families)."""
    from advisor.search import check_top_k

    if objective != "throughput":
        raise AdvisorError(f"--objective {objective} ranks transformer plans; parameter-server and "
                           f"recommendation plans are ranked by throughput")
    check_top_k(top_k)
    return recommend_recsys(model, hardware, cluster, job, ps_pins or PsPins(), top_k, searcher, pins)
