"""One micro-batch on each pipeline stage, by part (vectorized over candidates and stages).

A stage's micro-batch time adds, per layer, forward and backward compute (advisor.cost.compute),
recomputation (advisor.cost.recompute), the exposed tensor-, expert- and context-parallel
collectives (advisor.cost.layer_comm) and the host's kernel launches (advisor.cost.host_launch), plus
the LM head on the last stage, the activations swapped to the host (advisor.cost.swap) and a host
word embedding's lookups on the first stage (advisor.cost.host_embedding). Every collective is priced
where its group's members sit (advisor.cost.placement).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from advisor.cost import compute, host_launch, multi_copy, recompute, swap
from advisor.cost.compute import LayerCompute
from advisor.cost.host_embedding import host_embedding
from advisor.cost.layer_comm import layer_comm
from advisor.cost.memory import col, stage_layer_counts, swapped_layer_bytes
from advisor.cost.placement import cp_ring_tier, placements
from advisor.space.strategy import StrategyBatch
from advisor.specs.hardware import HardwareProfile
from advisor.specs.job import TrainingJob
from advisor.specs.model import ModelSpec

# the parts of a stage's micro-batch time, as the step reports them (times the micro-batches)
STAGE_PARTS = ("compute", "recompute", "tp_comm", "cp_comm", "ep_comm", "host_overhead")


@dataclass(frozen=True)
class StageTime:
    """Seconds of one micro-batch per stage, (N, P) arrays (or arrays that broadcast to them)."""

    forward_s: np.ndarray
    backward_s: np.ndarray
    swap_s: np.ndarray               # activation swapping and a host embedding's lookups
    total_s: np.ndarray              # every part, 0 on inactive stages
    parts: dict[str, np.ndarray]     # STAGE_PARTS
    dense_layers: np.ndarray         # layer counts per stage
    moe_layers: np.ndarray
    recompute_share: np.ndarray      # the share of a stage's layers that is recomputed
    dense: LayerCompute              # one dense and one MoE layer (for the replayed FLOPs)
    moe: LayerCompute
    ring: Any                        # the context-parallel ring's tier (advisor.cost.placement)
    host_embedding: Any | None       # advisor.cost.host_embedding.HostEmbedding, where a candidate uses it


def micro_batch(model: ModelSpec, hw: HardwareProfile, job: TrainingJob, b: StrategyBatch, groups: dict,
                active: np.ndarray, first: np.ndarray, last: np.ndarray) -> StageTime:
    """Each stage's micro-batch time by part; ``groups``: the placements of the step's collectives."""
    dense_n, moe_n = stage_layer_counts(model, b)
    n_layers = dense_n + moe_n

    # ---- per layer, per micro-batch, one device ----------------------------------------------
    dense = multi_copy.with_copies(model, hw, job, b, False, compute.layer_compute(model, hw, job, b, moe_layer=False))
    moe = (multi_copy.with_copies(model, hw, job, b, True, compute.layer_compute(model, hw, job, b, moe_layer=True))
           if model.moe is not None else dense)
    ring = cp_ring_tier(hw, b)
    dense_c = layer_comm(model, hw, job, b, groups, ring, dense.linear_forward_s, dense.forward_s,
                         dense.core_forward_s, dense.core_backward_s)
    moe_c = layer_comm(model, hw, job, b, groups, ring, moe.linear_forward_s, moe.forward_s,
                       moe.core_forward_s, moe.core_backward_s, moe_layer=True) if model.moe is not None else dense_c
    head_s, head_flops = multi_copy.head_with_copies(model, hw, job, b, *compute.head_compute_s(model, hw, job, b))

    def layers(d, m):
        return dense_n * col(d) + moe_n * col(m)

    fwd = layers(dense.forward_s, moe.forward_s) + np.where(last, col(head_s), 0.0)
    bwd = layers(dense.backward_s, moe.backward_s) + np.where(last, col(2.0 * head_s), 0.0)
    comp = fwd + bwd
    # recomputation replays forward work of the recomputed layers (their TP/CP/EP collectives too
    # when a whole layer is replayed)
    rl = b.recompute_layers
    recomputed = np.where(rl < 0, n_layers, np.minimum(rl, n_layers))
    share = np.where(n_layers > 0, recomputed / np.maximum(n_layers, 1), 0.0)
    rc = b.recompute

    recompute_s = share * layers(recompute.replay_s(rc, job, dense),
                                 recompute.replay_s(rc, job, moe, moe_layer=model.moe is not None))
    full_share = np.where(col(rc) == recompute.FULL, share, 0.0)
    tp_s = dense_n * col(dense_c.tp_forward + dense_c.tp_backward) + moe_n * col(moe_c.tp_forward + moe_c.tp_backward)
    tp_s = tp_s + full_share * layers(dense_c.tp_forward, moe_c.tp_forward)
    ep_s = moe_n * col(moe_c.ep_forward + moe_c.ep_backward) + full_share * moe_n * col(moe_c.ep_forward)
    cp_s = layers(dense_c.cp_forward + dense_c.cp_backward, moe_c.cp_forward + moe_c.cp_backward)
    cp_s = cp_s + full_share * layers(dense_c.cp_forward, moe_c.cp_forward)
    moe_launches = host_launch.eager_moe_launches(model, job, b) if model.moe is not None else None
    host_s = host_launch.host_s(model, hw, job, b, dense, dense_c, moe, moe_c, dense_n, moe_n, full_share, moe_launches)
    if model.moe is not None and job.moe_dropless and hw.device.asynchronous_launch:
        host_s = host_s + moe_n * col(host_launch.dropless_sync_s(hw, moe, moe_c, moe_launches)) * (
            1.0 + full_share * host_launch.REPLAYED_LAUNCHES)
    # activations swapped to the host: what the copies add beyond the stage's forward and backward
    swap_s = (swap.exposed_s(hw, b, swapped_layer_bytes(model, job, b), fwd, bwd) if b.swap_layers.any()
              else np.zeros_like(comp))
    # the word embedding on the host: its lookups and their gradients cross PCIe on the first stage
    host_embed = None
    if b.host_embedding.any():
        host_embed = host_embedding(model, hw, job, b, groups["dp_cp"], placements(hw, b, ("pp",))["pp"])
        swap_s = swap_s + np.where(first, col(host_embed.micro_batch_s), 0.0)
    total = np.where(active, comp + recompute_s + tp_s + ep_s + cp_s + host_s + swap_s, 0.0)
    return StageTime(forward_s=fwd, backward_s=bwd, swap_s=swap_s, total_s=total,
                     parts=dict(zip(STAGE_PARTS, (comp, recompute_s, tp_s, cp_s, ep_s, host_s))),
                     dense_layers=dense_n, moe_layers=moe_n, recompute_share=share, dense=dense, moe=moe, ring=ring,
                     host_embedding=host_embed)


def replayed_flops(model: ModelSpec, job: TrainingJob, b: StrategyBatch, st: StageTime, active: np.ndarray):
    """FLOPs one micro-batch replays on one device's stages (recomputation), summed over the stages: the
    replayed GEMM and attention FLOPs of each recomputed layer."""
    rc = b.recompute
    replayed = (st.dense_layers * col(recompute.replay_flops(rc, job, st.dense))
                + st.moe_layers * col(recompute.replay_flops(rc, job, st.moe, moe_layer=model.moe is not None)))
    return np.sum(np.where(active, st.recompute_share * replayed, 0.0), axis=1)
