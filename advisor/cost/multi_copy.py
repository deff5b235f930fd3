"""Multi-copy parallelism: a micro-batch split into k copies whose tensor-parallel collectives run
under each other's compute.

MindSpore's multi-copy parallel (docs mirror tutorials/source_en/parallel/multiple_copy.md;
mindspore.parallel.nn.MicroBatchInterleaved(cell, interleave_num); MindFormers'
micro_batch_interleave_num) slices the micro-batch along its batch dimension into k copies and runs
them interleaved: while one copy waits for a tensor-parallel collective, which depends on its own
previous GEMM and cannot overlap it, the next copy computes. The price: each GEMM is k times
smaller, so it runs lower on the profile's matmul_efficiency curve, every copy launches its own
kernels, and every collective pays its start-up k times.

Per layer and pass (forward, or backward with the backward's compute), with c the compute and t the
TP collective time of one copy between two collectives: the compute stream runs the k copies' c in
turn, the communication stream their t in turn, and a copy's next compute waits for its own
collective. The steady-state period is max(k c, k t, c + t), so beyond the k copies' compute
(F = k c, what the layer computes) the collectives leave exposed
    max(T - F, (T - (k - 1) F) / k, 0)      with T = k t (all copies' collectives).
k = 1 gives T: nothing hides, as without multi-copy. The formula averages c and t over the layer's
collectives (two per pass, or two reduce-scatter/all-gather pairs with sequence parallelism:
advisor.cost.layer_comm); the first copy's first GEMM and the last copy's last collective of a
micro-batch overlap the neighbouring layers and are not charged. Expert- and context-parallel
collectives are priced as without copies. Activation memory is unchanged: both copies' activations
stay for the backward, as the whole micro-batch's would.
"""

from __future__ import annotations

from dataclasses import fields, replace

import numpy as np

from advisor.cost.compute import LayerCompute, head_compute_s, layer_compute
from advisor.space.strategy import StrategyBatch
from advisor.specs.hardware import HardwareProfile
from advisor.specs.job import TrainingJob
from advisor.specs.model import ModelSpec

# Copies the search tries where tp > 1 (MindFormers' examples use micro_batch_interleave_num 2;
# the MindSpore tutorial's interleave_num default is 2).
COPY_CHOICES = (2, 4)


def active(b: StrategyBatch) -> bool:
    """Whether any candidate splits its micro-batches."""
    return bool(np.any(b.micro_batch_copies > 1))


def copies(b: StrategyBatch) -> np.ndarray:
    return np.maximum(b.micro_batch_copies, 1).astype(float)


def per_copy_batch(b: StrategyBatch) -> StrategyBatch:
    """The candidates with one copy as their micro-batch (the rules make the copies divide it)."""
    k = np.maximum(b.micro_batch_copies, 1)
    return replace(b, micro_batch_size=np.maximum(b.micro_batch_size // k, 1))


def with_copies(model: ModelSpec, hw: HardwareProfile, job: TrainingJob, b: StrategyBatch, moe_layer: bool,
                whole: LayerCompute) -> LayerCompute:
    """A layer's compute per micro-batch when it runs as k copies: k times one copy's (smaller GEMMs,
    at their own efficiency); `whole` where k = 1."""
    if not active(b):
        return whole
    part = layer_compute(model, hw, job, per_copy_batch(b), moe_layer)
    k = copies(b)
    split = k > 1
    return LayerCompute(**{f.name: np.where(split, k * getattr(part, f.name), getattr(whole, f.name))
                           for f in fields(LayerCompute)})


def head_with_copies(model: ModelSpec, hw: HardwareProfile, job: TrainingJob, b: StrategyBatch, whole_s, whole_flops):
    """The LM head's (seconds, FLOPs) per micro-batch run as k copies."""
    if not active(b):
        return whole_s, whole_flops
    part_s, part_flops = head_compute_s(model, hw, job, per_copy_batch(b))
    k = copies(b)
    return np.where(k > 1, k * part_s, whole_s), np.where(k > 1, k * part_flops, whole_flops)


def exposed(all_copies_s, compute_s, k) -> np.ndarray:
    """Exposed seconds of T = all_copies_s of collectives among F = compute_s of compute, k copies
    interleaved (the module docstring's period)."""
    t = np.asarray(all_copies_s, dtype=float)
    f = np.asarray(compute_s, dtype=float)
    return np.maximum.reduce([t - f, (t - (k - 1.0) * f) / k, np.zeros(np.broadcast(t, f).shape)])


def tp_exposed(hw: HardwareProfile, job: TrainingJob, b: StrategyBatch, one_copy_s, legacy_forward, legacy_backward,
               layer_forward_s, layer_backward_s):
    """(forward, backward) exposed TP seconds per layer and micro-batch. one_copy_s: one copy's
    forward collectives (the backward repeats them); `legacy_*`: the figures without copies, kept
    where k = 1 and, with the framework's own TP overlap on, wherever that hides more. A device that
    runs collectives in turn with compute (CPU ranks) hides nothing: all copies' collectives count."""
    k = copies(b)
    total = k * np.asarray(one_copy_s, dtype=float)
    if hw.device.overlaps_communication:
        fwd, bwd = exposed(total, layer_forward_s, k), exposed(total, layer_backward_s, k)
        if job.tp_comm_overlap:
            fwd, bwd = np.minimum(fwd, legacy_forward), np.minimum(bwd, legacy_backward)
    else:
        fwd = bwd = total
    split = k > 1
    return np.where(split, fwd, legacy_forward), np.where(split, bwd, legacy_backward)


def launch_scale(b: StrategyBatch):
    """Kernel launches per layer relative to one copy (each copy launches its own); 1.0 where none."""
    return copies(b) if active(b) else 1.0
