"""``recommend --objective cost``: the cheapest way to train on at most the given cluster.

On a fixed cluster the dollars per token follow the throughput (every device is paid for the whole
run), so the cost objective is about the cluster's size: a smaller cluster communicates less and
often trains each token for less, only more slowly. This orchestrator runs ``recommend`` on the
given node count and on each halving of it (down to one node, or to the smallest size where a plan
fits) and prices each size's best plan per token: devices x the profile's price_per_device_hour_usd /
tokens per second. Sizes within COST_TIE_BAND of the cheapest count as tied and the fastest of them
is chosen: costs that close are inside the cost model's own error (benchmarks/accuracy.py: 5-6% mean
on A100/H100 FSDP runs, more elsewhere), and the faster size finishes sooner for the same money. Every
size tried is reported (``SizeTrial``), with the time and cost to train the token budget when
``--tokens`` is given.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from advisor.commands.recommend import RecommendResult, recommend
from advisor.errors import AdvisorError, InfeasibleError
from advisor.families import family_of_model
from advisor.search import Pins
from advisor.specs.hardware import HardwareProfile
from advisor.specs.job import Cluster, TrainingJob
from advisor.specs.model import ModelSpec

MILLION = 1e6
COST_TIE_BAND = 0.05


@dataclass(frozen=True)
class SizeTrial:
    nodes: int
    devices: int
    tokens_per_s: float | None
    usd_per_million_tokens: float | None
    time_to_train_s: float | None = None
    cost_to_train_usd: float | None = None
    why_not: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def cluster_sizes(hardware: HardwareProfile, cluster: Cluster) -> list[Cluster]:
    """The cluster and its halvings: whole nodes while there are several, then devices within one."""
    out, nodes, devices = [cluster], cluster.nodes, cluster.devices
    while devices > 1 and devices % 2 == 0:
        devices //= 2
        nodes = max(1, -(-devices // hardware.node.devices_per_node))
        out.append(Cluster(nodes=nodes, devices=devices))
    return out


def cheapest(model: ModelSpec, hardware: HardwareProfile, cluster: Cluster, job: TrainingJob, pins: Pins = Pins(),
             top_k: int = 5, searcher: str = "enumerate") -> tuple[RecommendResult, tuple[SizeTrial, ...]]:
    """The plans on the size that trains a token for the least money, and every size tried."""
    from advisor.commands.recommend import check_top_k, find_searcher

    price = hardware.price_per_device_hour_usd
    if not price:
        raise AdvisorError(f"--objective cost needs the profile's price_per_device_hour_usd ({hardware.name} has none)")
    fam = family_of_model(model)
    if "cost" not in fam.objectives:
        raise AdvisorError(f"--objective cost ranks transformer plans; {model.name} is a {fam.name} model")
    find_searcher(searcher)
    check_top_k(top_k)
    trials, priced = [], []
    for size in cluster_sizes(hardware, cluster):
        pinned = [v for v in (pins.dp, pins.tp, pins.pp, pins.cp) if v is not None]
        if any(size.devices % v for v in pinned):
            continue
        try:
            result = recommend(model, hardware, size, job, pins, top_k, searcher, suggest=False)
        except (InfeasibleError, AdvisorError) as exc:
            trials.append(SizeTrial(size.nodes, size.devices, None, None, why_not=str(exc)))
            if priced:        # smaller clusters only get tighter on memory
                break
            continue
        e = result.estimates[0]
        usd = size.devices * price / 3600.0 / e.tokens_per_s * MILLION
        trials.append(SizeTrial(size.nodes, size.devices, e.tokens_per_s, usd, e.time_to_train_s, e.cost_to_train_usd))
        priced.append((usd, e.tokens_per_s, result))
    if not trials:
        raise AdvisorError(f"the pinned degrees divide none of the cluster sizes tried ({cluster.devices} devices and "
                           "its halvings)")
    if not priced:
        raise InfeasibleError(f"no plan for {model.name} fits on {cluster.devices} devices or any halving of them: "
                              f"{trials[0].why_not}")
    lowest = min(usd for usd, _, _ in priced)
    tied = [p for p in priced if p[0] <= lowest * (1.0 + COST_TIE_BAND)]
    return max(tied, key=lambda p: p[1])[2], tuple(trials)
