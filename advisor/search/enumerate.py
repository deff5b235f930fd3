"""The exhaustive searcher: every legal strategy, generated and scored as numpy arrays.

Generation (vectorized; each step crosses the rows so far with one knob's options):

1. parallel degrees dp x tp x pp x cp = devices (products of divisor lists) and ep (MoE);
2. pipeline schedule and virtual stages; 3. micro-batch size (a divisor of global batch / dp;
   the micro-batch count follows); 4. sequence parallelism; 5. recomputation.

The legality rules of advisor.space.rules run on the rows after steps 1 and 5; every removed row is
counted under the first rule that rejects it. On nodes whose fast links join only part of the node
(Ascend's HCCS groups) a searched TP group must stay inside one group (unless --tp is pinned).
Combinations provably equivalent to a kept one are not generated and are counted separately
(``deduplicated``): a schedule when pp = 1, sequence parallelism when tp = 1, a ZeRO stage without
data parallelism, and mesh orders that give every stride that matters the same value. The rows
("skeletons") are then crossed with the ZeRO stage / optimizer offload pairs, the mesh orders and
the context-parallel kind (ring or Ulysses), which change memory and communication, and for the
context-parallel kind also the attention kernels' length (advisor.cost.attention).

Scoring is best-first branch and bound over exact cost-model calls (estimate_batch), with bounds
that are themselves estimate_batch calls on modified hardware profiles:

* family: skeletons differing only in sequence parallelism and recomputation, bounded by their
  fastest member on free_hardware (communication, host and kernel launches free);
* skeleton: each skeleton on free_hardware with the ZeRO/offload pair needing the least memory;
  proves that no variant fits when even that one does not;
* pair: each ZeRO/offload pair on fastest_link_hardware (every placement as fast as the fastest
  link): exact memory, and a bound on every mesh order;
  each of these three is the faster of ring and Ulysses pricing where Ulysses is possible;
* exact: every mesh order of the surviving pairs on the real hardware.

Items are expanded in order of their bound until it cannot reach ``1 - TIE_BAND`` of the K-th best
distinct throughput found (recommend's listing; FINALIST_BAND for the operator searchers' finalists), so the
ranking's tie-break still sees every contender. The bounds rest on properties of the cost model that
tests/test_enumerate.py checks on random candidates: time never falls as links, host or launches get
slower, memory does not depend on links or mesh order, and each bound is below the real step time.

Each estimate_batch call holds candidates of one pipeline depth, since the cost model's stage arrays
are as wide as the largest pp of a batch.
"""

from __future__ import annotations

import time
from collections import Counter

import numpy as np

from advisor.cost.confidence import pessimistic_tokens_per_s
from advisor.cost.estimate import estimate_batch
from advisor.cost.host_embedding import first_stage_per_node, node_host_bytes
from advisor.cost.memory import GIB
from advisor.search.rank import TIE_BAND

FINALIST_BAND = 0.01    # finalists handed to the operator searchers: within 1% of the K-th best
from advisor.space.strategy import ONE_F_ONE_B
from advisor.search import Pins, Progress, SearchOutcome, SearchStats
from advisor.search.enumerate_bounds import (
    PAIR_PARTS, UNBOUNDED_GBPS, bound_estimate, bound_skeletons, bound_step_s, bound_step_s_without_pairs, family_bounds,
    fastest_link_hardware, free_hardware, leanest_options,
)
from advisor.search.enumerate_rows import (
    DEFAULT_ORDER_INDEX, HOST_EMBEDDING, MESH_ORDERS, OFFLOAD_OPTIMIZER, PRICE_CELLS, Rows, _DEFAULTS, _add, _concat,
    _count, _cross, _take, chunks_by_pp, divisors, finalist_batch, mesh_strides, stage_layers_for, to_batch,
)
from advisor.search.enumerate_space import (
    HCCS_REASON, ZERO_STAGES, cp_comm_options, degree_rows, mesh_counts, mesh_variants, option_mask, order_variants,
    skeleton_rows, tp_inside_fast_group, zero_offload_options, zero_variants,
)
from advisor.specs.hardware import HardwareProfile
from advisor.specs.job import Cluster, TrainingJob
from advisor.specs.model import ModelSpec

DEVICE_MEMORY_REASON = "does not fit in device memory"
HOST_MEMORY_REASON = "offloaded states or swapped activations do not fit in host memory"
TIME_BOUND_REASON = "cannot reach the top K (bound)"
# Work per best-first batch, in the next stage's cells: small until a threshold exists, then larger
# (fewer, bigger cost-model calls against a threshold that rises a little less often). Tuned on
# benchmarks/search_speed.py's cases and the published runs' searches.
FIRST_BATCH_CELLS = 20_000
FAMILY_BATCH_CELLS = 400_000
SKELETON_BATCH_CELLS = 800_000
PAIR_BATCH_CELLS = 800_000

# The row tables, the space and the bounds live in advisor.search.enumerate_rows, _space and _bounds;
# their names stay importable from here.
__all__ = [
    "DEFAULT_ORDER_INDEX", "DEVICE_MEMORY_REASON", "HCCS_REASON", "HOST_MEMORY_REASON", "MESH_ORDERS", "PRICE_CELLS",
    "Rows", "SearchStats", "TIME_BOUND_REASON", "UNBOUNDED_GBPS", "ZERO_STAGES", "_concat", "_count", "_cross",
    "_take", "bound_skeletons", "chunks_by_pp", "cp_comm_options", "degree_rows", "divisors", "family_bounds",
    "PAIR_PARTS", "bound_estimate", "bound_step_s", "bound_step_s_without_pairs", "fastest_link_hardware",
    "finalist_batch", "free_hardware", "leanest_options", "mesh_counts", "mesh_strides",
    "mesh_variants", "order_variants", "search", "skeleton_rows", "space_size", "stage_layers_for", "to_batch",
    "top_distinct", "tp_inside_fast_group", "zero_offload_options", "zero_variants",
]


# ---- the search ---------------------------------------------------------------------------------
def _space(model, hw, cluster, job, pins: Pins, pruned: Counter, dedup: Counter):
    """(skeletons with their mesh-order counts, complete candidates per skeleton, ZeRO/offload pairs)."""
    options = zero_offload_options(pins, job.framework_record, model)
    skel = skeleton_rows(model, hw, cluster, job, pins, pruned, dedup)
    skel["meshes"] = mesh_counts(skel, hw, pins, options, pruned, dedup, model, job.framework_record)
    variants = option_mask(skel, options, job.framework_record).sum(axis=1) * skel["meshes"]
    return skel, variants, options


def search(model: ModelSpec, hw: HardwareProfile, cluster: Cluster, job: TrainingJob, pins: Pins = Pins(),
           top_k: int = 5, progress: Progress = None, distinct_layouts: bool = True) -> SearchOutcome:
    """Every legal candidate, scored or bounded; returns the feasible ones that could place in the top K:
    with ``distinct_layouts`` (recommend's listing) the K best layouts' (advisor.search.rank.layout_key), each its
    best variant, ranked by the pessimistic end of their bands (advisor.cost.band), otherwise the K best
    candidates' by predicted throughput (the operator-level searchers' outer configurations).

    Bounds nest: a family of skeletons (family_bounds), then each skeleton (bound_skeletons), then
    each ZeRO/offload pair (_Scoring), then every mesh order exactly. Families are taken in order of
    their bound until it cannot reach the K-th best throughput found."""
    start = time.perf_counter()
    pruned: Counter = Counter()
    dedup: Counter = Counter()
    skel, variants, options = _space(model, hw, cluster, job, pins, pruned, dedup)
    starts, lower = family_bounds(model, hw, cluster, job, skel, options, pins)
    ends = np.r_[starts[1:], _count(skel)].astype(np.int64)
    family_variants = np.add.reduceat(variants, starts) if len(starts) else np.zeros(0, dtype=np.int64)
    family_cells = np.add.reduceat(skel["pp"], starts) if len(starts) else np.zeros(0, dtype=np.int64)
    scoring = _Scoring(model, hw, cluster, job, pins, options, top_k, pruned, distinct_layouts)
    scoring.bounded += len(starts)
    done = [0]

    def expand(families: np.ndarray) -> None:
        members = _ranges(starts[families], ends[families])
        scoring.bounded += len(members)
        scoring.score_skeletons(_take(skel, members), variants[members])
        done[0] += len(families)
        if progress:
            progress(done[0], len(starts))

    scoring.best_first(job.tokens_per_step / lower, family_cells, family_variants, expand, FAMILY_BATCH_CELLS)
    if progress:
        progress(len(starts), len(starts))
    stats = SearchStats(
        searcher="enumerate", candidates=int(variants.sum()), scored=scoring.scored, feasible=scoring.scored,
        seconds=time.perf_counter() - start, pruned=dict(pruned), deduplicated=dict(dedup),
        bound_evaluations=scoring.bounded,
    )
    return SearchOutcome(finalist_batch(model, job, scoring.finalists()), stats)


def space_size(model: ModelSpec, hw: HardwareProfile, cluster: Cluster, job: TrainingJob, pins: Pins = Pins()) -> SearchStats:
    """The legal space's size and the pruning/de-duplication counts, without scoring anything."""
    start = time.perf_counter()
    pruned: Counter = Counter()
    dedup: Counter = Counter()
    _, variants, _ = _space(model, hw, cluster, job, pins, pruned, dedup)
    return SearchStats(searcher="enumerate", candidates=int(variants.sum()), scored=0, feasible=0,
                       seconds=time.perf_counter() - start, pruned=dict(pruned), deduplicated=dict(dedup))


# the Rows columns of a layout (advisor.search.rank.LAYOUT_FIELDS: degrees and pipeline schedule) and their
# values where a row leaves them out
LAYOUT_COLUMNS = ("dp", "tp", "pp", "cp", "ep", "schedule")
LAYOUT_DEFAULTS = {"ep": 1, "schedule": ONE_F_ONE_B}


def top_distinct(values: np.ndarray, k: int) -> np.ndarray:
    """The k largest values, counting values within a relative 1e-9 of each other once."""
    ordered = np.sort(values)[::-1]
    if len(ordered) == 0:
        return ordered
    fresh = np.ones(len(ordered), dtype=bool)
    fresh[1:] = ordered[1:] < ordered[:-1] * (1.0 - 1e-9)
    return ordered[fresh][:k]


def _unique_rows(cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """np.unique(cols, axis=0, return_inverse=True) for non-negative integer columns, through one
    mixed-radix integer per row where it fits in 62 bits (sorting one column, not rows of several)."""
    radix = cols.max(axis=0).astype(np.int64) + 1 if len(cols) else None
    if radix is None or (cols < 0).any() or float(np.prod(radix.astype(float))) >= 2.0 ** 62:
        keys, inverse = np.unique(cols, axis=0, return_inverse=True)
        return keys, np.asarray(inverse).reshape(-1)
    code = np.zeros(len(cols), dtype=np.int64)
    for k in range(cols.shape[1]):
        code = code * radix[k] + cols[:, k]
    _, first, inverse = np.unique(code, return_index=True, return_inverse=True)
    return cols[first], np.asarray(inverse).reshape(-1)


def _ranges(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Concatenated np.arange(start, end) for each pair."""
    lengths = ends - starts
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    shift = np.repeat(starts - np.cumsum(np.r_[0, lengths[:-1]]), lengths)
    return shift + np.arange(total)


def _chunk_end(order: np.ndarray, pos: int, cells_per_row: np.ndarray, budget: int) -> int:
    cells = np.cumsum(cells_per_row[order[pos:]])
    return pos + max(int(np.searchsorted(cells, budget, side="right")), 1)


class _Scoring:
    """Scores chunks of skeletons: each ZeRO/offload pair is first priced on fastest_link_hardware
    (exact memory, a mesh-independent lower bound on time); the pairs that fit and can still reach
    the top K are priced exactly on the real hardware under each of their mesh orders. Keeps the K
    best throughputs (the bound's threshold) and every candidate that may still rank."""

    def __init__(self, model, hw, cluster, job, pins, options, top_k, pruned: Counter, distinct_layouts: bool = True):
        self.banded = distinct_layouts     # recommend's listing ranks by the band's pessimistic end
        # the band in which the ranking's ties are broken toward the simpler (advisor.search.rank): recommend's
        # listing keeps every contender within TIE_BAND; the operator searchers, which refine each finalist,
        # get the finalists within FINALIST_BAND of the K-th best (their ranking ties among those)
        self.tie = TIE_BAND if distinct_layouts else FINALIST_BAND
        self.args = (model, hw, cluster, job)
        self.fast = fastest_link_hardware(hw, cluster.devices, model.moe is not None)
        self.pins, self.options, self.k, self.pruned = pins, options, max(top_k, 1), pruned
        self.best = np.zeros(0)
        self.layout_best: dict[tuple, float] = {}     # layout (advisor.search.rank.LAYOUT_FIELDS) -> its best
        self.distinct_layouts = distinct_layouts
        self.kept: list[tuple[Rows, np.ndarray]] = []
        self.scored = self.bounded = 0

    @property
    def limit(self) -> float:
        """Throughput a candidate needs to matter: within the tie band of the K-th best layout so far (the
        ranking lists distinct layouts, each its best variant; without distinct layouts, the K-th best distinct
        throughput), the ranking dropping candidates that duplicate a pick."""
        return float(self.best[-1]) * (1.0 - self.tie) if len(self.best) >= self.k else 0.0

    def best_first(self, upper: np.ndarray, cells: np.ndarray, variants: np.ndarray, process, budget: int) -> None:
        """Call process(indices) on batches of items in order of their throughput bound `upper`,
        while the bound can still reach the limit (which rises as candidates are scored); the
        first batch is small so that a limit exists early. `cells` sizes each item's work;
        `variants` counts the candidates an item stands for (for the pruning counts)."""
        order = np.argsort(-upper, kind="stable")
        pos, size = 0, FIRST_BATCH_CELLS
        while pos < len(order) and upper[order[pos]] >= self.limit:
            end = _chunk_end(order, pos, cells, size)
            reach = upper[order[pos:end]] >= self.limit
            _add(self.pruned, TIME_BOUND_REASON, int(variants[order[pos:end][~reach]].sum()))
            process(order[pos:end][reach])
            pos, size = end, (budget if self.limit > 0 else FIRST_BATCH_CELLS)
        _add(self.pruned, TIME_BOUND_REASON, int(variants[order[pos:]].sum()))

    def score_skeletons(self, skeletons: Rows, variants: np.ndarray) -> None:
        """Bound each skeleton, then its ZeRO/offload pairs, then price the survivors exactly."""
        if _count(skeletons) == 0:
            return
        model, hw, cluster, job = self.args
        lower, may_fit = bound_skeletons(model, hw, cluster, job, skeletons, self.options, self.pins)
        _add(self.pruned, DEVICE_MEMORY_REASON, int(variants[~may_fit].sum()))
        fits = _take(skeletons, may_fit)
        pairs_each = option_mask(fits, self.options, job.framework_record).sum(axis=1)
        self.best_first(job.tokens_per_step / lower[may_fit], fits["pp"] * pairs_each, variants[may_fit],
                        lambda idx: self.score(_take(fits, idx)), SKELETON_BATCH_CELLS)

    def score(self, skeletons: Rows) -> None:
        """Bound the ZeRO/offload pairs, then price their mesh orders exactly, best bound first."""
        if _count(skeletons) == 0:
            return
        pairs = zero_variants({**skeletons, "skeleton": np.arange(_count(skeletons))}, self.options,
                              self.args[3].framework_record)
        pairs, upper = self._bound_pairs(pairs, pairs.pop("skeleton"))
        self.best_first(upper, pairs["meshes"] * pairs["pp"], pairs["meshes"],
                        lambda idx: self._exact(_take(pairs, idx)), PAIR_BATCH_CELLS)

    def priced(self, pairs: Rows):
        """Each chunk of the pairs' mesh orders priced exactly: (rows, batch, estimate, feasible)."""
        model, hw, cluster, job = self.args
        rows = mesh_variants(pairs, hw, self.pins, model, job.framework_record)
        for idx in chunks_by_pp(rows):
            part = _take(rows, idx)
            batch = to_batch(model, job, part)
            e = estimate_batch(model, hw, cluster, job, batch, every_stage=False)
            self.scored += len(idx)
            ok = e.feasible   # all of them while memory does not depend on links or placement
            _add(self.pruned, DEVICE_MEMORY_REASON, int((~ok).sum()))
            yield part, batch, e, ok

    def _exact(self, pairs: Rows) -> None:
        model, hw, cluster, job = self.args
        for part, batch, e, ok in self.priced(pairs):
            # what recommend ranks by: the pessimistic end of each candidate's band (advisor.cost.band)
            tps = (pessimistic_tokens_per_s(model, hw, job, batch, e) if self.banded else e.tokens_per_s)[ok]
            kept = _take(part, ok)
            if self.distinct_layouts:
                self._layouts(kept, tps)
            else:
                self.best = top_distinct(np.concatenate([self.best, tps]), self.k)
            self.kept.append((kept, tps))

    def _layouts(self, rows: Rows, tps: np.ndarray) -> None:
        """Update each layout's best throughput and the K best layouts' (the limit's)."""
        if len(tps) == 0:
            return
        n = len(tps)
        cols = np.stack([rows[k] if k in rows else np.full(n, LAYOUT_DEFAULTS[k]) for k in LAYOUT_COLUMNS], axis=1)
        keys, inverse = _unique_rows(cols)
        best = np.full(len(keys), -np.inf)
        np.maximum.at(best, inverse, tps)
        for key, value in zip(map(tuple, keys.tolist()), best):
            if value > self.layout_best.get(key, -np.inf):
                self.layout_best[key] = float(value)
        self.best = top_distinct(np.fromiter(self.layout_best.values(), dtype=float), self.k)

    def _bound_pairs(self, pairs: Rows, skeleton: np.ndarray) -> tuple[Rows, np.ndarray]:
        """The ZeRO/offload pairs that fit (device and host) and whose bound reaches the limit, with
        the bound as an upper limit on throughput. ``skeleton``: each pair's skeleton.

        A pair without offload whose skeleton has the same ZeRO stage with the optimizer offloaded is
        bounded only where that one fits on the device and reaches the limit: it needs at least its
        device memory (LEANER), and on the bound's profile, whose host transfers and CPU optimizer are
        free, it runs at least as long (its device optimizer step is the only term the offload changes,
        advisor.cost.optimizer.step_s and advisor.cost.offload.exposed_s)."""
        n = _count(pairs)
        upper = np.zeros(n)
        keep = np.zeros(n, dtype=bool)
        key = skeleton * (max(ZERO_STAGES) + 1) + pairs["zero"]
        offloaded = pairs["offload"] == OFFLOAD_OPTIMIZER
        later = (pairs["offload"] == 0) & np.isin(key, key[offloaded])
        reached = self._bound_some(pairs, np.flatnonzero(~later), upper, keep)
        fits_offloaded, reach_offloaded = reached[0][offloaded[~later]], reached[1][offloaded[~later]]
        partner = key[~later][offloaded[~later]]
        todo = later & np.isin(key, partner[fits_offloaded & reach_offloaded])
        meshes = pairs["meshes"]
        skipped = later & ~todo
        too_big = skipped & np.isin(key, partner[~fits_offloaded])
        _add(self.pruned, DEVICE_MEMORY_REASON, int(meshes[too_big].sum()))
        _add(self.pruned, TIME_BOUND_REASON, int(meshes[skipped & ~too_big].sum()))
        self._bound_some(pairs, np.flatnonzero(todo), upper, keep)
        return _take(pairs, keep), upper[keep]

    def _bound_some(self, pairs: Rows, rows: np.ndarray, upper: np.ndarray, keep: np.ndarray):
        """Bound pairs[rows] (fills upper and keep there); returns (fits on the device, reaches the limit)
        per row bounded."""
        model, hw, cluster, job = self.args
        limit = self.limit
        fits_all = np.zeros(len(rows), dtype=bool)
        reach_all = np.zeros(len(rows), dtype=bool)
        sub = _take(pairs, rows)
        for local in chunks_by_pp(sub):
            part = _take(sub, local)
            idx = rows[local]
            e, step = bound_estimate(model, self.fast, cluster, job, part, self.pins)
            self.bounded += len(idx)
            n = len(idx)
            fits, hosted = e.fits[:n], e.memory.host_embedding
            hosted = None if hosted is None else np.broadcast_to(hosted, e.fits.shape)[:n]
            # host memory: a table per first-stage process, at the fewest per node any mesh order gives
            tables = (part["offload"] >= HOST_EMBEDDING).any()
            fewest = first_stage_per_node(hw, to_batch(model, job, part), None) if tables else None
            host = node_host_bytes(np.broadcast_to(e.memory.host_total, e.fits.shape)[:n], hosted,
                                   hw.node.devices_per_node, fewest) <= hw.host.memory_gib * GIB
            upper[idx] = job.tokens_per_step / step
            reach = upper[idx] >= limit
            meshes = part["meshes"]
            _add(self.pruned, DEVICE_MEMORY_REASON, int(meshes[~fits].sum()))
            _add(self.pruned, HOST_MEMORY_REASON, int(meshes[fits & ~host].sum()))
            _add(self.pruned, TIME_BOUND_REASON, int(meshes[fits & host & ~reach].sum()))
            keep[idx] = fits & host & reach
            fits_all[local], reach_all[local] = fits, reach
        return fits_all, reach_all

    def finalists(self) -> Rows:
        """Scored candidates within the tie band of the K-th best (all, when fewer than K)."""
        if not self.kept:
            return {k: np.zeros(0, dtype=np.int64) for k in ("dp", "tp", "pp", "cp", "m", *_DEFAULTS)}
        rows = _concat([r for r, _ in self.kept], self.kept[0][0])
        tps = np.concatenate([t for _, t in self.kept])
        return _take(rows, tps >= float(self.best[-1]) * (1.0 - self.tie))
