"""`advisor recommend` as a library call: specs -> search -> estimate -> rank -> plans.

The one orchestrator. Searchers are looked up by name in SEARCHERS (operator-level searchers add
themselves there); each returns its finalists and a summary, and this module prices the finalists
with the vectorized cost model, ranks them (advisor.search.rank) and turns the top K into Plans with their
prediction filled in. When nothing fits it names the smallest change that would, found by running
more (cheap) searches: a pinned knob relaxed, or a larger cluster.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Callable

from advisor.cost.confidence import pessimistic_tokens_per_s
from advisor.cost.estimate import Estimate, estimate_batch, from_batch
from advisor.errors import AdvisorError, InfeasibleError
from advisor.families import family_of_model
from advisor.plan import Plan, plan_to_dict
from advisor.search.rank import LAYOUT_FIELDS, layout_key, rank, simplicity_key
from advisor.search import MAX_TOP_K, PIN_FLAGS, Pins, Progress, SearchOutcome, SearchStats, check_top_k  # noqa: F401
from advisor.search import comm_knobs
from advisor.search import enumerate as enumerate_searcher
from advisor.search import operator_plan
from advisor.search.intra_op import price_layouts, usable_bytes
from advisor.search.stages import rebalance as balance_stages
from advisor.search.vpipe import repartition
from advisor.space.rules import RULES
from advisor.space.strategy import RECOMPUTE
from advisor.specs.frameworks import FRAMEWORKS
from advisor.specs.hardware import HardwareProfile
from advisor.specs.job import Cluster, TrainingJob
from advisor.specs.model import ModelSpec

Searcher = Callable[[ModelSpec, HardwareProfile, Cluster, TrainingJob, Pins, int, Progress], SearchOutcome]

SEARCHERS: dict[str, Searcher] = {
    "enumerate": enumerate_searcher.search,
    "drec": operator_plan.drec_searcher,
    "ilp": operator_plan.ilp_searcher,
}

BALANCE_LEADERS = 4               # candidates per requested plan whose pipeline stages are balanced
SEARCH_DEPTH = 5                  # plans every search ranks, whatever --top asks (the default --top)
MAX_CLUSTER_GROWTH = 2 ** 12      # the "more devices" suggestion looks up to 4096x the cluster


@dataclass(frozen=True)
class RecommendResult:
    """Ranked plans (best first, prediction filled in), their estimates, and the search summary."""

    plans: tuple[Plan, ...]
    estimates: tuple[Estimate, ...]
    search: SearchStats

    @property
    def best(self) -> Plan:
        return self.plans[0]

    def to_dict(self) -> dict[str, Any]:
        return {"plans": [plan_to_dict(p) for p in self.plans], "search": self.search.to_dict()}


def recommend(model: ModelSpec, hardware: HardwareProfile, cluster: Cluster, job: TrainingJob, pins: Pins = Pins(),
              top_k: int = 5, searcher: str = "enumerate", progress: Progress = None,
              suggest: bool = True, ps_pins=None, operator_strategies=None, objective: str = "throughput") -> RecommendResult:
    """The top_k plans for training `model` on `cluster`, best first.

    Raises AdvisorError (exit 2) for an unknown searcher, a bad top_k or pins that leave no legal
    strategy, and InfeasibleError (exit 1) when no legal strategy fits, naming the smallest change
    that would (found by further searches; suggest=False skips them, for sweeps). Recommendation
    models (family: recommendation) go to advisor.search.parameter_server (ps_pins: --ps-mode etc.).
    ``objective``: "throughput" ranks by tokens/s, "carbon" by tokens per unit of energy
    (advisor.cost.carbon: device power rises with the achieved compute fraction)."""
    fam = family_of_model(model)
    if fam.search is not None:            # a family with its own searcher (advisor.families)
        return fam.hook("search")(model, hardware, cluster, job, pins, top_k, searcher, ps_pins, objective)
    if ps_pins is not None and ps_pins.given():
        from advisor.search.parameter_server import describe

        raise AdvisorError(f"{describe(ps_pins)}: parameter servers serve the embedding tables of "
                           f"recommendation models (family: recommendation); {model.name} is a {fam.name}")
    search = find_searcher(searcher)
    if operator_strategies is not None:     # semi-automatic: user-fixed operator strategies (drec / ilp only)
        if searcher not in ("drec", "ilp"):
            raise AdvisorError(f"--operator-strategies needs --searcher drec or ilp (the {searcher} searcher prices "
                               f"Megatron's uniform layout only)")
        search = partial(_semi_auto, searcher=searcher, fixed=operator_strategies)
    check_top_k(top_k)
    check_pins(cluster, pins)
    if pins.offload_optimizer is not None or pins.offload_params is not None:    # offload pinned: kept as asked
        return _at_depths(model, hardware, cluster, job, top_k, search, progress, suggest, searcher, objective, pins)
    # CPU optimizer offload only where nothing fits without it: no measured run uses it, so its price is the one the
    # model knows least (a host CPU's Adam and PCIe traffic stand for a part no calibration run checks; issue 30).
    # Plans without it rank first; offloaded ones follow where fewer fit. The search without offload runs first, and
    # the one with it only where that leaves fewer than top_k plans (one search, not two, in the common case).
    try:          # (no suggestions: where nothing fits without offload, the offloaded plans stand)
        kept = _at_depths(model, hardware, cluster, job, top_k, search, progress, False, searcher, objective,
                          replace(pins, offload_optimizer=False))
    except AdvisorError:          # nothing fits, or nothing is legal, without offload
        kept = None
    if kept is not None and len(kept.plans) >= top_k:
        return kept
    result = _at_depths(model, hardware, cluster, job, top_k, search, progress, suggest, searcher, objective, pins)
    if kept is None:
        return result
    rows = list(zip(kept.plans, kept.estimates))
    rows += [(p, e) for p, e in zip(result.plans, result.estimates) if p.strategy.offload_optimizer][:top_k - len(rows)]
    plans = tuple(replace(p, search={**p.search, "rank": n}) for n, (p, _) in enumerate(rows, start=1))
    return RecommendResult(plans, tuple(e for _, e in rows), kept.search)


def _at_depths(model, hardware, cluster, job, top_k, search, progress, suggest, searcher, objective,
               pins: Pins) -> RecommendResult:
    """The first SEARCH_DEPTH plans come from a search of that depth whatever --top asks (the finalists refined and
    balanced are then the same): --top 1 is the first row of --top 5 and of --top 200. Deeper rows come from a
    search of the depth asked, after those, without repeating them."""
    first = _ranked(model, hardware, cluster, job, pins, SEARCH_DEPTH, search, progress, suggest,
                    searcher, objective, keep=min(top_k, SEARCH_DEPTH))
    if top_k <= SEARCH_DEPTH:
        return first
    deeper = _ranked(model, hardware, cluster, job, pins, top_k, search, progress, suggest, searcher, objective,
                     keep=top_k)
    def layout(p):
        return tuple(getattr(p.strategy, f) for f in LAYOUT_FIELDS)

    rows = list(zip(first.plans, first.estimates))
    for distinct in (True, False):     # new layouts first; then, if too few, variants of listed ones
        for p, e in zip(deeper.plans, deeper.estimates):
            if p.strategy not in {q.strategy for q, _ in rows} and \
                    (not distinct or layout(p) not in {layout(q) for q, _ in rows}):
                rows.append((p, e))
    rows = rows[:top_k]
    plans = tuple(replace(p, search={**p.search, "rank": n}) for n, (p, _) in enumerate(rows, start=1))
    return RecommendResult(plans, tuple(e for _, e in rows), deeper.search)


def _ranked(model, hardware, cluster, job, pins, depth, search, progress, suggest, searcher, objective,
            keep) -> RecommendResult:
    """The first ``keep`` plans of a search ``depth`` deep: its finalists refined (buckets, copies, offload
    fraction), the leaders' stages balanced, ranked."""
    top_k = depth
    outcome = search(model, hardware, cluster, job, pins, top_k, progress)
    if len(outcome.finalists) == 0:
        if outcome.stats.candidates == 0:
            raise _no_legal_strategy(model, hardware, cluster, job, pins, outcome.stats)
        raise InfeasibleError(nothing_fits_message(model, hardware, cluster, job, pins, searcher, suggest))
    # the finalists try gradient bucket sizes and micro-batch copies (communication fusion, multi-copy);
    # operator-level layouts are priced for their own micro-batch, so those finalists keep theirs
    batch = outcome.finalists if outcome.operator_strategies is not None else \
        comm_knobs.refine(model, hardware, cluster, job, outcome.finalists)
    e = price_layouts(estimate_batch(model, hardware, cluster, job, batch), batch, outcome.operator_strategies,
                      usable_bytes(job, hardware))
    score = partial(_score, objective, model, hardware, cluster, job)
    # Balanced pipeline stages for the leading candidates (the search prices even splits).
    # (distinct layouts first, so that the balanced leaders hold as many layouts as there are)
    lead = rank(score(e, batch), simplicity_key(batch, hardware), min(len(batch), BALANCE_LEADERS * top_k),
                feasible=e.feasible, memory_bytes=e.memory.total, layouts=layout_key(batch))
    if len(lead):
        batch = balance_stages(model, hardware, cluster, job, batch.take(lead))
        # ... and, for those with no or full recomputation, stages sized with per-stage recompute counts (vPipe)
        batch = repartition(model, hardware, cluster, job, batch, pins)
        if outcome.operator_strategies is not None:
            outcome = replace(outcome, operator_strategies=[outcome.operator_strategies[int(i)] for i in lead])
        e = price_layouts(estimate_batch(model, hardware, cluster, job, batch), batch, outcome.operator_strategies,
                          usable_bytes(job, hardware))
    # distinct layouts, each row the best of its knob variants (ZeRO stage, offload, recomputation, ...)
    order = rank(score(e, batch), simplicity_key(batch, hardware), keep, feasible=e.feasible, memory_bytes=e.memory.total,
                 layouts=layout_key(batch))
    if len(order) == 0:   # a searcher proposed only plans that do not fit
        raise InfeasibleError(nothing_fits_message(model, hardware, cluster, job, pins, searcher, suggest))
    summary = {k: v for k, v in outcome.stats.to_dict().items() if k in ("searcher", "candidates", "scored", "feasible", "seconds")}
    plans, estimates = [], []
    for position, i in enumerate(order, start=1):
        est = from_batch(e, int(i), model, hardware, cluster, job, strategy=batch.strategy(int(i)))
        operator = outcome.operator_strategies[int(i)] if outcome.operator_strategies is not None else None
        plans.append(Plan(model=model, hardware=hardware, cluster=cluster, training=job, strategy=batch.strategy(int(i)),
                          operator_strategies=operator, prediction=prediction_of(est),
                          search={**summary, "rank": position}))
        estimates.append(est)
    return RecommendResult(tuple(plans), tuple(estimates), outcome.stats)


def _score(objective: str, model: ModelSpec, hardware: HardwareProfile, cluster: Cluster, job: TrainingJob, e, batch):
    """What the ranking maximizes: tokens/s at the pessimistic end of each plan's band (advisor.cost.band: a plan
    the measured runs do not cover ranks by what the model knows of it), or (carbon) the same tokens per joule of
    the job's IT power, which ranks as emissions do for a fixed grid and PUE."""
    pessimistic = pessimistic_tokens_per_s(model, hardware, job, batch, e)
    if objective in ("throughput", "cost"):     # on one cluster, dollars per token follow 1 / throughput
        return pessimistic
    if objective != "carbon":
        raise AdvisorError(f"recommend ranks by throughput, cost or carbon, got objective {str(objective)[:40]!r}")
    from advisor.cost.carbon import cluster_power_w

    power = cluster_power_w(hardware, job.dtype, cluster.devices, e.hfu)
    if power is None:
        raise AdvisorError(f"--objective carbon needs the device power of profile {hardware.name} (power_watts)")
    return pessimistic / power


def _semi_auto(model, hardware, cluster, job, pins, top_k, progress, *, searcher, fixed) -> SearchOutcome:
    return operator_plan.operator_plan(model, hardware, cluster, job, searcher, pins, top_k, progress, fixed=fixed)


def find_searcher(name: str) -> Searcher:
    """The searcher registered under ``name``; an unknown name is refused listing the others."""
    if name not in SEARCHERS:
        raise AdvisorError(f"--searcher {name}: unknown searcher (available: {', '.join(sorted(SEARCHERS))})")
    return SEARCHERS[name]


def prediction_of(e: Estimate) -> dict[str, Any]:
    """An estimate as the plan JSON's "prediction" block."""
    mem = e.memory_gib
    return {
        "step_time_s": e.step_time_s, "tokens_per_s": e.tokens_per_s, "mfu": e.mfu, "hfu": e.hfu,
        "tflops_per_device": e.tflops_per_device,
        "memory_gib": {"parameters": mem.parameters, "gradients": mem.gradients, "optimizer": mem.optimizer,
                       "activations": mem.activations, "buffers": mem.buffers, "total": mem.total},
        "time_s": dict(e.time_s), "bottleneck": e.bottleneck,
        **({"energy_kwh": e.energy_to_train_kwh} if e.energy_to_train_kwh is not None else {}),
        **({"emissions_tco2e": e.emissions_to_train_tco2e} if e.emissions_to_train_tco2e is not None else {}),
        **({"confidence": e.confidence.to_dict()} if e.confidence is not None else {}),
        **({"band": e.band.to_dict(e.tokens_per_s, e.step_time_s, mem.total)} if e.band is not None else {}),
    }


# ---- pins ---------------------------------------------------------------------------------------
def check_pins(cluster: Cluster, pins: Pins) -> None:
    """Pinned degrees must divide the device count, alone and together."""
    from advisor.commands.inputs import check_count
    from advisor.specs import limits

    for name, bound in (("ep", limits.MAX_DEVICES), ("micro_batch_size", limits.MAX_GLOBAL_BATCH),
                        ("virtual_pipeline_stages", limits.MAX_LAYERS)):
        if getattr(pins, name) is not None:
            check_count(PIN_FLAGS[name], getattr(pins, name), bound)
    product = 1
    given = []
    for name in ("dp", "tp", "pp", "cp"):
        value = getattr(pins, name)
        if value is None:
            continue
        if cluster.devices % value:
            raise AdvisorError(f"{PIN_FLAGS[name]} {value} does not divide the {cluster.devices} devices")
        product *= value
        given.append(f"{PIN_FLAGS[name]} {value}")
    if cluster.devices % product:
        raise AdvisorError(f"{' x '.join(given)} = {product} does not divide the {cluster.devices} devices")
    if pins.dp is not None and None not in (pins.tp, pins.pp, pins.cp) and product != cluster.devices:
        raise AdvisorError(f"{' x '.join(given)} = {product}, but the cluster has {cluster.devices} devices")


def _reason_sentence(stats: SearchStats) -> str:
    if not stats.pruned:
        return "no combination of degrees is possible"
    reason = max(stats.pruned, key=lambda k: stats.pruned[k])
    return RULES[reason][1] if reason in RULES else reason


def _no_legal_strategy(model, hardware, cluster, job, pins: Pins, stats: SearchStats) -> AdvisorError:
    """Which pin leaves no legal strategy (exit 2), or why none exists without pins (exit 1)."""
    where = f"{model.name} on {cluster.devices} devices at global batch {job.global_batch_size}"
    for name, value in pins.pinned().items():
        alone = enumerate_searcher.space_size(model, hardware, cluster, job, Pins(**{name: value}))
        if alone.candidates == 0:
            flag = f"{PIN_FLAGS[name]} {_flag(value)}"
            return AdvisorError(f"{flag} leaves no legal strategy for {where}: {_reason_sentence(alone)}")
    if pins.pinned():
        return AdvisorError(f"the pinned choices {pins.describe()} together leave no legal strategy for {where}: "
                            f"{_reason_sentence(stats)}")
    return InfeasibleError(f"no legal strategy for {where}: {_reason_sentence(stats)}; "
                           f"try a global batch that is a multiple of the device count")


def _flag(value) -> str:
    return ("on" if value else "off") if isinstance(value, bool) else str(value)


# ---- nothing fits -------------------------------------------------------------------------------
def fits_somewhere(model, hardware, cluster, job, pins: Pins, searcher: str = "enumerate") -> bool:
    """Whether any legal strategy fits (a top-1 search)."""
    check = find_searcher(searcher)
    try:
        check_pins(cluster, pins)
    except AdvisorError:
        return False
    return len(check(model, hardware, cluster, job, pins, 1, None).finalists) > 0


def relaxed_pins(pins: Pins, framework: str | None = None) -> list[tuple[str, Pins]]:
    """Single pinned choices changed toward less memory, cheapest first: (flag text, new pins)."""
    out: list[tuple[str, Pins]] = []
    if pins.zero_stage is not None:
        out += [(f"--zero {z}", replace(pins, zero_stage=z)) for z in range(pins.zero_stage + 1, 4)]
    if pins.sequence_parallel is False:
        out.append(("--sequence-parallel", replace(pins, sequence_parallel=True)))
    if pins.recompute is not None:
        later = RECOMPUTE[RECOMPUTE.index(pins.recompute) + 1:]
        out += [(f"--recompute {r}", replace(pins, recompute=r)) for r in later]
    if pins.micro_batch_size is not None and pins.micro_batch_size > 1:
        out.append(("--mbs 1", replace(pins, micro_batch_size=1)))
    if pins.offload_optimizer is False:     # offload needs a sharded optimizer (rule "offload needs zero")
        out.append(("--offload", replace(pins, offload_optimizer=True)) if pins.zero_stage != 0 else
                   ("--offload --zero 1", replace(pins, offload_optimizer=True, zero_stage=1)))
    record = FRAMEWORKS.get(framework)
    if pins.offload_params is False and (record is None or record.parameter_offload):
        out.append(("--offload-params (it sets --zero 3 and the optimizer offloaded)",
                    replace(pins, offload_params=True, offload_optimizer=None, zero_stage=None)))
    if pins.host_embedding is False and record is not None and record.host_embedding:
        out.append(("--host-embedding", replace(pins, host_embedding=True)))
    for name in ("tp", "pp", "cp", "ep", "dp", "virtual_pipeline_stages", "pipeline_schedule"):
        value = getattr(pins, name)
        if value is not None:
            out.append((f"without {PIN_FLAGS[name]} {value}", replace(pins, **{name: None})))
    return out


def smallest_cluster(model, hardware, cluster, job, pins: Pins, searcher: str = "enumerate") -> Cluster | None:
    """The smallest larger cluster (whole nodes once past one node) on which something fits:
    doubling until it fits, then bisecting between the last two sizes."""
    per_node = hardware.node.devices_per_node

    def sized(devices: int) -> Cluster:
        return Cluster.of(hardware, devices=devices) if devices < per_node else Cluster.of(hardware, nodes=-(-devices // per_node))

    def fits(c: Cluster) -> bool:
        return fits_somewhere(model, hardware, c, job, pins, searcher)

    low, high = cluster.devices, None
    size = cluster.devices
    while size < cluster.devices * MAX_CLUSTER_GROWTH:
        size *= 2
        if fits(sized(size)):
            high = sized(size).devices
            break
        low = sized(size).devices
    if high is None:
        return None
    unit = per_node if low >= per_node else 1
    while high - low > unit:
        mid = sized((low + high) // 2 // unit * unit)
        if mid.devices in (low, high):
            break
        if fits(mid):
            high = mid.devices
        else:
            low = mid.devices
    return sized(high)


def closest_changes(model, hardware, cluster, job, pins: Pins, searcher: str = "enumerate") -> list[str]:
    """The smallest changes under which something fits, as flag text: relaxed pins first, then the
    smallest cluster that is enough with the same pins."""
    changes = [text for text, relaxed in relaxed_pins(pins, job.framework)
               if fits_somewhere(model, hardware, cluster, job, relaxed, searcher)]
    changes = _first_per_knob(changes)
    bigger = smallest_cluster(model, hardware, cluster, job, pins, searcher)
    if bigger is not None:
        per_node = hardware.node.devices_per_node
        changes.append(f"--nodes {bigger.nodes} ({bigger.devices} devices)" if bigger.devices >= per_node
                       else f"--devices {bigger.devices}")
    return changes


def _first_per_knob(changes: list[str]) -> list[str]:
    """Keep the least change per flag (e.g. --zero 2 rather than also --zero 3)."""
    seen, out = set(), []
    for text in changes:
        knob = text.split()[0] if not text.startswith("without") else text
        if knob not in seen:
            seen.add(knob)
            out.append(text)
    return out


def nothing_fits_message(model, hardware, cluster, job, pins: Pins, searcher: str = "enumerate",
                         suggest: bool = True) -> str:
    where = (f"no strategy for {model.name} fits {cluster.devices} x {hardware.device.name} "
             f"({hardware.device.memory_gib:g} GiB each, profile {hardware.name}"
             + (f", {job.memory_margin:.0%} of it left free by the memory margin" if job.memory_margin else "")
             + ") at global batch "
             f"{job.global_batch_size} and sequence length {job.seq_length}")
    if pins.pinned():
        where += f" with {pins.describe()}"
    if not suggest:
        return where
    changes = closest_changes(model, hardware, cluster, job, pins, searcher)
    if not changes:
        return where + f"; no change tried fits (up to {MAX_CLUSTER_GROWTH}x the devices)"
    return where + "; smallest change that fits: " + "; or ".join(changes)
