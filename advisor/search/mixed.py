"""The mixed-cluster searcher: every strategy the enumerator generates for the whole cluster, in
each layout that can place it on the parts (advisor.cost.mixed), with work sized to each type.

* pipeline: a strategy whose stage (dp x cp x tp devices) divides every part's devices, with pp > 1
  and one model chunk per stage; every order of the types along the pipeline; layers per stage
  sized to each type's speed and memory (advisor.search.mixed_split).
* data: a strategy whose replica (tp x pp x cp devices) divides every part's devices, dp > 1; the
  global batch split between replicas by speed.

Candidates are priced exactly on the mixed cluster and ranked by throughput with advisor.search.rank's
simplicity tie-break. A layout the cost model cannot place (a stage straddling two types) is not
generated: MixedStats counts what was left out and why.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from dataclasses import dataclass, replace

import numpy as np

from advisor.cost.memory import stage_masks
from advisor.cost.mixed import DATA, DATA_MESH, PIPELINE, PIPELINE_MESH, price_data, price_pipeline, type_views, views
from advisor.search import Pins
from advisor.search.enumerate_rows import MESH_ORDERS, Rows, _count, _take, chunks_by_pp, to_batch
from advisor.search.enumerate_space import cp_kind_variants, skeleton_rows, zero_offload_options, zero_variants
from advisor.search.mixed_split import micro_batches_by_speed, stage_layers_by_speed
from advisor.search.rank import rank, simplicity_key
from advisor.space.strategy import Strategy, StrategyBatch
from advisor.specs.job import TrainingJob
from advisor.specs.mixed import MixedHardware, MixedLayout
from advisor.specs.model import ModelSpec


@dataclass(frozen=True)
class MixedCandidate:
    strategy: Strategy
    layout: MixedLayout
    tokens_per_s: float


@dataclass(frozen=True)
class MixedStats:
    candidates: int           # priced: strategies x layouts x type orders
    feasible: int
    left_out: dict[str, int]  # strategies no layout can place, by reason
    seconds: float

    def to_dict(self) -> dict:
        return {"searcher": "mixed", "candidates": self.candidates, "feasible": self.feasible,
                "left_out": dict(self.left_out), "seconds": self.seconds}


def _rows(model: ModelSpec, mixed: MixedHardware, job: TrainingJob, pins: Pins) -> Rows:
    rows = skeleton_rows(model, mixed.parts[0].profile, mixed.cluster, job, pins, Counter(), Counter())
    rows = zero_variants(rows, zero_offload_options(pins, job.framework_record), job.framework_record)
    return cp_kind_variants(rows, model, pins, job.framework_record)     # ring and Ulysses price differently


def _part_devices(mixed: MixedHardware) -> np.ndarray:
    return np.array([p.devices for p in mixed.parts], dtype=np.int64)


def _stage_parts(order: tuple[int, ...], stages_per_part: np.ndarray, width: int) -> np.ndarray:
    """(N, width) part index of every stage: the parts' runs of stages in ``order``."""
    ends = np.cumsum(stages_per_part[:, list(order)], axis=1)                        # (N, T)
    pos = (np.arange(width)[None, None, :] >= ends[:, :, None]).sum(axis=1)         # run of each stage
    return np.asarray(order)[np.minimum(pos, len(order) - 1)]


def _sized_layers(model: ModelSpec, mixed: MixedHardware, job: TrainingJob, b: StrategyBatch,
                  stage_part: np.ndarray) -> np.ndarray:
    """Layers per stage by the stage's type: time and memory are affine in a stage's layers, read
    off two pricings one layer apart."""
    active = stage_masks(b)[0]
    even = b.stage_layers
    more = replace(b, stage_layers=np.where(active, even + 1, 0))
    v0, v1 = views(model, mixed, job, b), views(model, mixed, job, more)
    per_layer = np.choose(stage_part, [b1.stage_micro_batch_s - b0.stage_micro_batch_s for b0, b1 in zip(v0, v1)])
    fixed = np.choose(stage_part, [b0.stage_micro_batch_s for b0 in v0]) - per_layer * even
    mem_per_layer = np.maximum(v1[0].memory.stage_total - v0[0].memory.stage_total, 1.0)
    mem_fixed = v0[0].memory.stage_total - mem_per_layer * even
    caps = np.array([p.profile.device.memory_gib * 2.0 ** 30 for p in mixed.parts])[stage_part]
    max_layers = np.floor((caps - mem_fixed) / mem_per_layer).astype(np.int64)
    layers = stage_layers_by_speed(fixed, per_layer, max_layers, active, model.num_layers)
    sized = layers.sum(axis=1) == model.num_layers
    return np.where(sized[:, None], layers, even)


def _pipeline(model, mixed, job, rows: Rows, pool: list, left_out: Counter) -> None:
    devices = _part_devices(mixed)
    stage = rows["dp"] * rows["tp"] * rows["cp"]
    placeable = np.all(devices[None, :] % stage[:, None] == 0, axis=1)
    deep = (rows["pp"] > 1) & (rows["vpp"] == 1)
    left_out["pipeline: a stage would straddle two device types"] += int((deep & ~placeable).sum())
    rows = _take(rows, deep & placeable)
    rows["mesh"] = np.full(_count(rows), MESH_ORDERS.index(PIPELINE_MESH), dtype=np.int64)
    for idx in chunks_by_pp(rows):
        chunk = _take(rows, idx)
        b = to_batch(model, job, chunk)
        per_part = devices[None, :] // (chunk["dp"] * chunk["tp"] * chunk["cp"])[:, None]
        for order in itertools.permutations(range(len(mixed.parts))):
            stage_part = _stage_parts(order, per_part, b.stage_layers.shape[1])
            sized = replace(b, stage_layers=_sized_layers(model, mixed, job, b, stage_part))
            pool.append((PIPELINE, sized, stage_part, price_pipeline(model, mixed, job, sized, stage_part)))


def _data(model, mixed, job, rows: Rows, pool: list, left_out: Counter) -> None:
    devices = _part_devices(mixed)
    replica = rows["tp"] * rows["pp"] * rows["cp"]
    placeable = np.all(devices[None, :] % replica[:, None] == 0, axis=1)
    left_out["data: a replica would straddle two device types"] += int((~placeable).sum())
    rows = _take(rows, placeable)
    rows["mesh"] = np.full(_count(rows), MESH_ORDERS.index(DATA_MESH), dtype=np.int64)
    for idx in chunks_by_pp(rows):
        chunk = _take(rows, idx)
        b = to_batch(model, job, chunk)
        replicas = devices[None, :] // (chunk["tp"] * chunk["pp"] * chunk["cp"])[:, None]
        m0 = np.repeat(b.num_micro_batches[:, None], len(devices), axis=1)
        _, own0 = type_views(model, mixed, job, b, m0)
        _, own1 = type_views(model, mixed, job, b, m0 + 1)
        per_micro = np.maximum(own1 - own0, 1e-12)
        q, full = micro_batches_by_speed(own0 - per_micro * m0, per_micro, replicas, b.dp * b.num_micro_batches)
        pool.append((DATA, b, np.stack([q, full, replicas], axis=2), price_data(model, mixed, job, b, q)))


def _layout(kind: str, mixed: MixedHardware, b: StrategyBatch, arrays: np.ndarray, i: int) -> MixedLayout:
    names = mixed.names
    if kind == PIPELINE:
        return MixedLayout(PIPELINE, stage_devices=tuple(names[int(t)] for t in arrays[i, :int(b.pp[i])]))
    devices, counts = [], []
    for t, (q, full, replicas) in enumerate(arrays[i]):
        devices += [names[t]] * int(replicas)
        counts += [int(q)] * int(full) + [int(q) - 1] * int(replicas - full)
    return MixedLayout(DATA, replica_devices=tuple(devices), replica_micro_batches=tuple(counts))


def search_mixed(model: ModelSpec, mixed: MixedHardware, job: TrainingJob, pins: Pins = Pins(),
                 top_k: int = 5) -> tuple[list[MixedCandidate], MixedStats]:
    """The top_k feasible candidates (best first) over both layouts, and the search's counts."""
    start = time.perf_counter()
    rows = _rows(model, mixed, job, pins)
    pool, left_out = [], Counter()
    _pipeline(model, mixed, job, rows, pool, left_out)
    _data(model, mixed, job, rows, pool, left_out)
    out: list[MixedCandidate] = []
    if pool:
        tps = np.concatenate([c[3].tokens_per_s for c in pool])
        fits = np.concatenate([c[3].fits for c in pool])
        mem = np.concatenate([c[3].memory_bytes for c in pool])
        hw0 = mixed.parts[0].profile
        key = np.concatenate([simplicity_key(c[1], hw0) for c in pool])
        where = [(j, i) for j, c in enumerate(pool) for i in range(len(c[1]))]
        for pick in rank(tps, key, top_k, fits, mem):
            j, i = where[int(pick)]
            kind, b, arrays, _ = pool[j]
            mesh = PIPELINE_MESH if kind == PIPELINE else DATA_MESH
            out.append(MixedCandidate(replace(b.strategy(i), mesh_order=mesh), _layout(kind, mixed, b, arrays, i),
                                      float(tps[pick])))
    total = sum(len(c[1]) for c in pool)
    feasible = int(sum(int(c[3].fits.sum()) for c in pool))
    return out, MixedStats(total, feasible, {k: v for k, v in left_out.items() if v}, time.perf_counter() - start)

