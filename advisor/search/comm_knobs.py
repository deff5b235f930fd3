"""Searching communication fusion's bucket size, multi-copy parallelism's copies and the offloaded
optimizer's share, per finalist.

The searchers price every candidate with the framework's default buckets and unsplit micro-batches
(the enumerator's space and its brute-force check, tests/test_enumerate.py, stay as they are).
Crossing the space with the knobs' values would multiply it by (1 + len(COPY_CHOICES)) x
(1 + len(BUCKET_CHOICES_MB)); instead advisor.commands.recommend hands the enumerator's finalists (the
candidates that may still rank; the operator-level searchers' layouts are priced for their own
micro-batch and keep the defaults) to ``refine``, which tries the knobs on each, two in turn, one
estimate_batch call per knob:

1. copies (advisor.cost.multi_copy), where tp > 1 on a device that overlaps communication with
   compute and the job runs MindSpore (the one framework with the feature: MicroBatchInterleaved,
   MindFormers' micro_batch_interleave_num): k in COPY_CHOICES dividing the micro-batch, and, where
   the micro-batch count allows it, the micro-batch grown k-fold (k copies of the old micro-batch;
   same global batch, fewer micro-batches) so that micro-batches of one sample can use it too;
2. the gradient bucket size (advisor.cost.fusion), where ZeRO-0/1 has data-parallel peers: each
   of BUCKET_CHOICES_MB;
3. the share of an offloaded optimizer kept on the host (Megatron's --optimizer-offload-fraction,
   DeepSpeed's offload ratio): each of OFFLOAD_FRACTIONS where the optimizer is offloaded and the
   parameters are not; a smaller share steps more of the update on the device and needs more of
   its memory (advisor.cost.step).

A value is kept when it raises the candidate's predicted throughput by more than ``min_gain``
(default: the ranking's tie band, so a knob is only set where it buys what a simpler plan would be
preferred for; advisor.search.rank), legal (advisor.space.rules) and fitting in memory. The limit of the
shortcut: a candidate outside the finalists that a knob would have lifted into the top K is not
seen (benchmarks/mindspore_optimizations.py measures the cost and the gains).
"""

from __future__ import annotations

from dataclasses import fields, replace

import numpy as np

from advisor.cost.estimate import estimate_batch
from advisor.cost.fusion import BUCKET_CHOICES_MB
from advisor.cost.multi_copy import COPY_CHOICES
from advisor.search.rank import TIE_BAND
from advisor.space.rules import legal_mask
from advisor.space.strategy import StrategyBatch
from advisor.specs.hardware import HardwareProfile
from advisor.specs.job import Cluster, TrainingJob
from advisor.specs.model import ModelSpec


def copy_variants(job: TrainingJob, hw: HardwareProfile, b: StrategyBatch) -> tuple[StrategyBatch, np.ndarray]:
    """(variants, the index of the candidate each comes from) with k copies of the micro-batch."""
    if not job.framework_record.multi_copy or not hw.device.overlaps_communication:
        return b.take(np.zeros(0, dtype=np.int64)), np.zeros(0, dtype=np.int64)
    parts, origins = [], []
    split = (b.tp > 1) & (b.micro_batch_copies == 1)
    for k in COPY_CHOICES:
        same = np.flatnonzero(split & (b.micro_batch_size % k == 0))
        v = b.take(same)
        parts.append(replace(v, micro_batch_copies=np.full(len(same), k, dtype=np.int64)))
        origins.append(same)
        grown = np.flatnonzero(split & (b.micro_batch_size % k != 0) & (b.num_micro_batches % k == 0))
        v = b.take(grown)
        parts.append(replace(v, micro_batch_size=v.micro_batch_size * k, num_micro_batches=v.num_micro_batches // k,
                             micro_batch_copies=np.full(len(grown), k, dtype=np.int64)))
        origins.append(grown)
    return _concat(parts, b), np.concatenate(origins)


def bucket_variants(b: StrategyBatch) -> tuple[StrategyBatch, np.ndarray]:
    """(variants, origins) with each of BUCKET_CHOICES_MB where ZeRO-0/1 reduces over peers."""
    rows = np.flatnonzero((b.zero_stage <= 1) & (b.dp * b.cp > 1) & (b.grad_bucket_mb == 0))
    parts = [replace(b.take(rows), grad_bucket_mb=np.full(len(rows), size)) for size in BUCKET_CHOICES_MB]
    return _concat(parts, b), np.tile(rows, len(BUCKET_CHOICES_MB))


OFFLOAD_FRACTIONS = (0.25, 0.5, 0.75)     # a search grid (method choice), quarters of the states


def fraction_variants(b: StrategyBatch) -> tuple[StrategyBatch, np.ndarray]:
    """(variants, origins) with each of OFFLOAD_FRACTIONS where the whole optimizer is offloaded."""
    rows = np.flatnonzero(b.offload_optimizer & ~b.offload_params & (b.offload_fraction == 1.0))
    parts = [replace(b.take(rows), offload_fraction=np.full(len(rows), f)) for f in OFFLOAD_FRACTIONS]
    return _concat(parts, b), np.tile(rows, len(OFFLOAD_FRACTIONS))


def refine(model: ModelSpec, hw: HardwareProfile, cluster: Cluster, job: TrainingJob, b: StrategyBatch,
           min_gain: float = TIE_BAND) -> StrategyBatch:
    """The candidates with the copies, bucket size and offload fraction that beat their defaults by
    more than min_gain."""
    if len(b) == 0:
        return b
    e = estimate_batch(model, hw, cluster, job, b)
    best = np.where(e.feasible, e.tokens_per_s, 0.0)
    for make in (lambda x: copy_variants(job, hw, x), bucket_variants, fraction_variants):
        variants, origin = make(b)
        if len(variants) == 0:
            continue
        ok = legal_mask(model, cluster, job, variants)
        v = estimate_batch(model, hw, cluster, job, variants)
        tps = np.where(ok & v.feasible, v.tokens_per_s, 0.0)
        chosen = _best_per_origin(tps, origin, best * (1.0 + min_gain))
        if len(chosen):
            b = _merge(b, variants, origin, chosen)
            best[origin[chosen]] = tps[chosen]
    return b


def _best_per_origin(tps: np.ndarray, origin: np.ndarray, needed: np.ndarray) -> np.ndarray:
    """Indices of the fastest variant of each origin, where it beats what that origin needs."""
    order = np.lexsort((-tps, origin))          # by origin, fastest first
    first = np.ones(len(order), dtype=bool)
    first[1:] = origin[order][1:] != origin[order][:-1]
    top = order[first]
    return top[tps[top] > needed[origin[top]]]


def _concat(parts: list[StrategyBatch], like: StrategyBatch) -> StrategyBatch:
    """Batches of the same stage width, one after the other."""
    values = {}
    for f in fields(like):
        if f.name == "mesh_order":
            values[f.name] = tuple(o for p in parts for o in p.mesh_order) if like.mesh_order else ()
        elif getattr(like, f.name) is None:
            values[f.name] = None
        else:
            values[f.name] = np.concatenate([getattr(p, f.name) for p in parts]) if parts else getattr(like, f.name)[:0]
    return StrategyBatch(**values)


def _merge(b: StrategyBatch, variants: StrategyBatch, origin: np.ndarray, chosen: np.ndarray) -> StrategyBatch:
    """b with the chosen variants in place of the candidates they come from."""
    values = {}
    for f in fields(b):
        if f.name == "mesh_order":
            values[f.name] = b.mesh_order
            continue
        if getattr(b, f.name) is None:
            values[f.name] = None
            continue
        merged = getattr(b, f.name).copy()
        merged[origin[chosen]] = getattr(variants, f.name)[chosen]
        values[f.name] = merged
    return StrategyBatch(**values)
