"""Heterogeneous clusters: one job on nodes of several device types, priced by composing each type's
homogeneous cost model (advisor.cost.step), vectorized over candidates.

Two layouts, the two that Metis (Um et al., USENIX ATC 2024, sec. 4) and HexiScale search over:

* ``pipeline``: the pipeline stages are cut between the types (each type holds a contiguous run of
  stages, every stage a dp x cp x tp block of one type; the mesh keeps pp outermost). A stage's
  micro-batch time is its type's (each type's *view*: the whole strategy priced on that type's
  profile, so per-layer compute, collectives and memory are that type's); the schedule follows from
  the stages' times (advisor.cost.bubble: the slowest stage paces it). Where neighbouring stages sit
  on different types the transfer crosses the network between nodes at the slower of the two
  types' NICs (Metis sec. 4.2: the link between heterogeneous nodes runs at the slower one).
* ``data``: data-parallel replicas on different types (each replica a tp x pp x cp block of one
  type; the mesh keeps dp outermost), the global batch split between replicas by speed (Metis's
  uneven data-parallel batch; ``dp_batch_split``): each type's replicas run their own micro-batch
  count, and the gradient reduction spans all replicas, so every type prices it over the whole
  data-parallel group with its own links and the slowest type's time holds (a ring is as fast as
  its slowest link).

Data-parallel reduction, optimizer, offload and FP8 weight casts run on every type at once: the
step pays the slowest type's. Memory is checked per type against that type's device (and host).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from advisor.cost import bubble, comm
from advisor.cost.memory import stage_masks
from advisor.cost.step import STAGE_PARTS, TIME_PARTS, EstimateBatch, estimate_batch
from advisor.space.strategy import StrategyBatch
from advisor.specs.job import TrainingJob
from advisor.specs.mixed import MixedHardware
from advisor.specs.model import ModelSpec

PIPELINE, DATA = "pipeline", "data"
LAYOUTS = (PIPELINE, DATA)
# the mesh each layout needs: a stage (pipeline) or a replica (data) is a contiguous block of ranks
PIPELINE_MESH = ("pp", "dp", "cp", "tp")
DATA_MESH = ("dp", "pp", "cp", "tp")
# the parts of the step every type runs at once: the slowest type's is paid
_TOGETHER = ("dp_comm", "contention", "overlap_slowdown", "optimizer", "offload")


@dataclass(frozen=True)
class MixedBatch:
    """Figures for N candidates on a mixed cluster; every field an (N,) array (times in seconds)."""

    step_time_s: np.ndarray
    tokens_per_s: np.ndarray
    time_s: dict[str, np.ndarray]
    fits: np.ndarray              # every stage or replica fits its type's device and host memory
    memory_bytes: np.ndarray      # the fullest device's bytes
    memory_fraction: np.ndarray   # the fullest device's share of its own capacity
    fullest_part: np.ndarray      # index of the part whose device is fullest (by share)
    slowest_part: np.ndarray      # index of the part that paces the step
    mfu: np.ndarray               # model FLOPs over the cluster's summed peaks


def views(model: ModelSpec, mixed: MixedHardware, job: TrainingJob, b: StrategyBatch) -> list[EstimateBatch]:
    """The candidates priced on each part's profile, as if the whole cluster were of that type."""
    return [estimate_batch(model, p.profile, mixed.cluster, job, b) for p in mixed.parts]


def _peak_flops(mixed: MixedHardware, job: TrainingJob) -> float:
    return sum(p.devices * p.profile.device.peak_flops(job.dtype) for p in mixed.parts)


def _pick(arrays: list[np.ndarray], index: np.ndarray) -> np.ndarray:
    """arrays[index[...]][...] elementwise: each entry from the part ``index`` names."""
    return np.choose(index, np.broadcast_arrays(*arrays))


def _boundary_p2p_s(model: ModelSpec, mixed: MixedHardware, job: TrainingJob, b: StrategyBatch,
                    stage_part: np.ndarray, active: np.ndarray) -> np.ndarray:
    """Per candidate: the pipeline time its cross-type neighbours add, each transfer over the network
    at the slower NIC of the two types (1F1B: 2 m transfers per step and the fill and drain)."""
    p2p_bytes = b.micro_batch_size * job.seq_length / b.cp * model.hidden_size * job.dtype_bytes / b.tp
    per_part = np.stack([comm.tier_p2p_time_s(p.profile, p2p_bytes, 2) for p in mixed.parts], axis=1)   # (N, T)
    here, there = stage_part[:, :-1], stage_part[:, 1:]
    crossing = (here != there) & active[:, 1:]
    rows = np.arange(len(b))[:, None]
    slower = np.maximum(per_part[rows, here], per_part[rows, there])
    p2p = np.max(np.where(crossing, slower, 0.0), axis=1) if stage_part.shape[1] > 1 else np.zeros(len(b))
    m = b.num_micro_batches.astype(float)
    return np.where(p2p > 0, 2.0 * m * b.virtual_pipeline_stages * p2p + 2.0 * p2p * (b.pp - 1), 0.0)


def _memory(mixed: MixedHardware, totals: np.ndarray, part_of: np.ndarray, host_fits: np.ndarray):
    """(fits, bytes, share, part) of the fullest device: totals (N, S) bytes of S stages or types,
    part_of (N, S) the part each one runs on."""
    caps = np.array([p.profile.device.memory_gib * 2.0 ** 30 for p in mixed.parts])[part_of]
    share = np.where(totals >= 0, totals / caps, -1.0)
    fullest = np.argmax(share, axis=1)
    rows = np.arange(len(totals))
    fits = np.all(share <= 1.0, axis=1) & host_fits
    return fits, totals[rows, fullest], share[rows, fullest], part_of[rows, fullest]


def price_pipeline(model: ModelSpec, mixed: MixedHardware, job: TrainingJob, b: StrategyBatch,
                   stage_part: np.ndarray) -> MixedBatch:
    """Stages cut between the types: ``stage_part`` (N, P) is the part index of every stage."""
    vs = views(model, mixed, job, b)
    n = len(b)
    active, _, _ = stage_masks(b)
    stage_part = np.where(active, stage_part, 0)
    stage_mb = _pick([v.stage_micro_batch_s for v in vs], stage_part)
    pipe_s, bubble_s, slowest = bubble.pipeline_time_s(stage_mb, active, b.num_micro_batches, b.virtual_pipeline_stages)
    rows = np.arange(n)
    m = b.num_micro_batches.astype(float)
    time_s = {k: _pick([v.stage_parts_s[k] for v in vs], stage_part)[rows, slowest] * m for k in STAGE_PARTS}
    # FP8 weight casts: the step's compute outside the micro-batches, on every type at once
    cast = np.max([v.time_s["compute"] - v.stage_parts_s["compute"][rows, v.slowest_stage] * m for v in vs], axis=0)
    time_s["compute"] = time_s["compute"] + cast
    crossing = _boundary_p2p_s(model, mixed, job, b, stage_part, active)
    time_s["pp_comm"] = np.maximum(np.max([v.time_s["pp_comm"] for v in vs], axis=0), crossing)
    for k in _TOGETHER:
        time_s[k] = np.max([v.time_s[k] for v in vs], axis=0)
    time_s["bubble"] = bubble_s
    step = pipe_s + cast + time_s["pp_comm"] + sum(time_s[k] for k in _TOGETHER)
    totals = vs[0].memory.stage_total          # memory does not depend on the profile
    fits, mem, share, fullest = _memory(mixed, totals, stage_part, np.all([v.host_fits for v in vs], axis=0))
    return _finish(model, mixed, job, step, time_s, fits, mem, share, fullest, stage_part[rows, slowest])


def type_views(model: ModelSpec, mixed: MixedHardware, job: TrainingJob, b: StrategyBatch,
               part_micro_batches: np.ndarray) -> tuple[list[EstimateBatch], np.ndarray]:
    """Data layout: each part's view at its replicas' largest micro-batch count ((N, T) counts), and
    (N, T) seconds of each part's own pipeline (the step but the parts every type runs together)."""
    vs = [estimate_batch(model, p.profile, mixed.cluster, job, replace(b, num_micro_batches=part_micro_batches[:, t]))
          for t, p in enumerate(mixed.parts)]
    return vs, np.stack([v.step_time_s - sum(v.time_s[k] for k in _TOGETHER) for v in vs], axis=1)


def price_data(model: ModelSpec, mixed: MixedHardware, job: TrainingJob, b: StrategyBatch,
               part_micro_batches: np.ndarray) -> MixedBatch:
    """Replicas on several types: ``part_micro_batches`` (N, T) is the largest micro-batch count of
    any replica of each part (``b.dp`` counts every replica of the cluster)."""
    vs, own = type_views(model, mixed, job, b, part_micro_batches)
    slowest = np.argmax(own, axis=1)
    rows = np.arange(len(b))
    time_s = {k: np.stack([v.time_s[k] for v in vs], axis=1)[rows, slowest] for k in TIME_PARTS if k not in _TOGETHER}
    for k in _TOGETHER:
        time_s[k] = np.max([v.time_s[k] for v in vs], axis=0)
    step = own[rows, slowest] + sum(time_s[k] for k in _TOGETHER)
    totals = np.stack([v.memory.total for v in vs], axis=1)
    part_of = np.broadcast_to(np.arange(len(vs)), totals.shape)
    fits, mem, share, fullest = _memory(mixed, totals, part_of, np.all([v.host_fits for v in vs], axis=0))
    return _finish(model, mixed, job, step, time_s, fits, mem, share, fullest, slowest)


def _finish(model, mixed, job, step, time_s, fits, mem, share, fullest, slowest) -> MixedBatch:
    tokens = job.tokens_per_step
    flops = model.training_flops_per_token(job.seq_length) * tokens
    return MixedBatch(step_time_s=step, tokens_per_s=tokens / step, time_s={k: time_s[k] for k in TIME_PARTS},
                      fits=fits, memory_bytes=mem, memory_fraction=share, fullest_part=fullest, slowest_part=slowest,
                      mfu=flops / step / _peak_flops(mixed, job))
