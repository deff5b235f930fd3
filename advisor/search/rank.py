"""Ranking: by throughput, and among plans within TIE_BAND of each other, the simpler one first; recommend's
listing takes distinct layouts (layout_key), each the best of its knob variants.

TIE_BAND is the error of the model's comparison of two plans for one job: the median |e_a - e_b| of the
leave-one-source-out residuals of pairs of measured runs with the same model and cluster size
(advisor/cost/error_bands.json ``pair``, written by benchmarks/error_bands.py; 7.0% on the bundled runs).
Two plans closer than that are ones the measured runs cannot tell apart, so the simpler is offered
(1% without a table).

Simplicity, most important first (the order an engineer would weigh them): no parameter offload, no host
embedding, no optimizer offload (each a host dependence the measured runs rarely cover); fewer active parallel
dimensions; the TP group inside one node; shallower interleaving; a smaller ZeRO stage; fewer micro-batches; then
less recomputation, the default mesh order, 1F1B over GPipe, no sequence parallelism.
"""

from __future__ import annotations

import numpy as np

from advisor.cost.band import table as band_table
from advisor.cost.placement import TIER_ACROSS_NODES, group_placement
from advisor.space.strategy import DEFAULT_MESH_ORDER, ONE_F_ONE_B, StrategyBatch
from advisor.specs.hardware import HardwareProfile


def tie_band() -> float:
    """Plans within this share of the best remaining count as tied (the band table's pair figure, else 1%)."""
    return float(band_table().get("pair", 0.01))


TIE_BAND = tie_band()


def _default_strides(b: StrategyBatch) -> dict[str, np.ndarray]:
    degree = {"pp": b.pp, "dp": b.dp, "cp": b.cp, "tp": b.tp}
    out = {}
    for i, dim in enumerate(DEFAULT_MESH_ORDER):
        inner = DEFAULT_MESH_ORDER[i + 1:]
        out[dim] = np.prod([degree[d] for d in inner], axis=0) if inner else np.ones(len(b), dtype=np.int64)
    return out


def simplicity_key(b: StrategyBatch, hw: HardwareProfile) -> np.ndarray:
    """(N, 12) integer matrix; lexicographically smaller rows are simpler."""
    active = sum((x > 1).astype(np.int64) for x in (b.dp, b.tp, b.pp, b.cp, b.ep))
    tp_across_nodes = group_placement(hw, b, "tp").slowest_tier == TIER_ACROSS_NODES
    default = _default_strides(b)
    moved = ((b.tp_stride != default["tp"]) | (b.dp_stride != default["dp"])
             | (b.cp_stride != default["cp"]) | (b.pp_stride != default["pp"]))
    columns = (
        b.offload_params, b.host_embedding, b.offload_optimizer, active, tp_across_nodes,
        b.virtual_pipeline_stages, b.zero_stage, b.num_micro_batches,
        b.recompute, moved, b.pipeline_schedule != ONE_F_ONE_B, b.sequence_parallel,
    )
    return np.stack([np.asarray(c, dtype=np.int64) for c in columns], axis=1)


LAYOUT_FIELDS = ("dp", "tp", "pp", "cp", "ep", "pipeline_schedule")


def layout_key(b: StrategyBatch) -> np.ndarray:
    """(N,) integer id of each candidate's layout: its parallel degrees and pipeline schedule; candidates that
    differ only in knobs (ZeRO stage, offload, recomputation, micro-batch, interleaving depth, ring or Ulysses, mesh
    order, sequence parallelism, buckets) share it."""
    columns = np.stack([np.asarray(getattr(b, f)).astype(str) for f in LAYOUT_FIELDS], axis=1)
    _, ids = np.unique(columns, axis=0, return_inverse=True)
    return np.asarray(ids).reshape(-1)


def rank(tokens_per_s: np.ndarray, key: np.ndarray, top_k: int, feasible: np.ndarray | None = None,
         memory_bytes: np.ndarray | None = None, layouts: np.ndarray | None = None) -> np.ndarray:
    """Indices of the top_k candidates, best first. Each pick takes the simplest candidate within
    TIE_BAND of the best remaining throughput (ties in simplicity: the faster one). Candidates that
    the cost model cannot tell from a pick (the same throughput and memory, e.g. selective
    recomputation with a fused attention that stores no scores) are dropped as duplicates of it.
    With ``layouts`` (layout_key), a pick folds the other candidates of its layout: the picks are distinct
    layouts, and only when fewer layouts than top_k remain do the folded variants follow, ranked the same way."""
    if layouts is None:
        return _greedy(tokens_per_s, key, top_k, feasible, memory_bytes, None)
    first = _greedy(tokens_per_s, key, top_k, feasible, memory_bytes, np.asarray(layouts))
    if len(first) >= top_k:
        return first
    tps = np.asarray(tokens_per_s, dtype=float)
    mem = np.zeros(len(tps)) if memory_bytes is None else np.asarray(memory_bytes, dtype=float)
    alive = np.ones(len(tps), dtype=bool) if feasible is None else np.asarray(feasible, dtype=bool).copy()
    for i in first:             # the picks and what the cost model cannot tell from them
        alive &= ~(np.isclose(tps, tps[i], rtol=1e-9, atol=0.0) & np.isclose(mem, mem[i], rtol=1e-9, atol=0.0))
    rest = _greedy(tps, key, top_k - len(first), alive, mem, None)
    return np.concatenate([first, rest]).astype(np.int64)


def _greedy(tokens_per_s, key, top_k, feasible, memory_bytes, fold) -> np.ndarray:
    """rank's picks; ``fold``: each pick drops the candidates of its layout."""
    tps = np.asarray(tokens_per_s, dtype=float)
    alive = np.ones(len(tps), dtype=bool) if feasible is None else np.asarray(feasible, dtype=bool).copy()
    mem = np.zeros(len(tps)) if memory_bytes is None else np.asarray(memory_bytes, dtype=float)
    picks: list[int] = []
    while len(picks) < top_k and alive.any():
        best = tps[alive].max()
        band = np.flatnonzero(alive & (tps >= best * (1.0 - TIE_BAND)))
        # np.lexsort sorts by its last key first: simplicity columns, then higher throughput.
        order = np.lexsort((-tps[band], *key[band].T[::-1]))
        choice = int(band[order[0]])
        picks.append(choice)
        alive &= ~(np.isclose(tps, tps[choice], rtol=1e-9, atol=0.0) & np.isclose(mem, mem[choice], rtol=1e-9, atol=0.0))
        if fold is not None:
            alive &= fold != fold[choice]
        alive[choice] = False
    return np.array(picks, dtype=np.int64)
