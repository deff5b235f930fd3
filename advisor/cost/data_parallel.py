"""Data-parallel gradient reduction and ZeRO/FSDP parameter gathers, per step on one device.

Groups: dense parameters are reduced over the dp x cp group, expert parameters over the expert
data-parallel group (advisor.cost.placement), each priced where its members actually sit.

* ZeRO-0 (PyTorch DDP, Megatron without the distributed optimizer): one all-reduce of the gradients,
  bucketed and overlapped with the last micro-batch's backward (DDP buckets; Megatron-Core
  --overlap-grad-reduce).
* ZeRO-1 (Megatron's distributed optimizer, MindSpore's optimizer parallel): a reduce-scatter
  overlapped the same way, then an all-gather of the updated weights. Megatron overlaps that gather
  with the next step's first forward (--overlap-param-gather); so does MindSpore, whose optimizer
  parallel inserts each weight's AllGather before its use in the forward and runs the fused groups
  interleaved with the next iteration's forward ("communication cross-iteration execution",
  MindSpore docs, features/parallel/optimizer_parallel.md). Other frameworks wait for it.
* ZeRO-2 (DeepSpeed stage 2, FSDP SHARD_GRAD_OP, MindSpore optimizer_level level2): every
  micro-batch's backward reduce-scatters its gradients unit by unit, hidden behind that backward
  where collectives overlap; the updated weights are gathered once per step (under the next
  forward in MindSpore, as above).
* ZeRO-3 (FSDP FULL_SHARD, FSDP2 fully_shard, Megatron-FSDP optim_grads_params, DeepSpeed stage 3):
  one unit (a layer) at a time. Forward: each unit's all-gather is prefetched during the previous
  unit's compute (FSDP2 and FSDP1 prefetch one unit ahead; PyTorch fully_shard docs), so a unit
  exposes only what its compute cannot hide, and the first unit's gather is never hidden. Backward:
  with reshard-after-forward (the default for every unit but the root) the weights are gathered
  again; each unit's reduce-scatter overlaps the next unit's backward; the last one is exposed.
  With FSDP1's BACKWARD_POST prefetch the next unit's gather is issued only after the current
  unit's gradients are computed, so every backward gather is exposed (PyTorch FSDP docs,
  BackwardPrefetch).
  Under pipeline parallelism torchtitan keeps the weights unsharded after the forward (its
  reshard_after_forward policy "default" = not pp_enabled) and reduces once per step: one gather
  and one reduce-scatter per step instead of per micro-batch (advisor.cost.memory holds the
  unsharded weights). Each collective pays its start-up latency once per unit: time is affine in
  bytes, hence n x t(bytes / n) = the bandwidth term plus n latencies.
* Communication fusion (a candidate's own gradient bucket size, advisor.cost.fusion): ZeRO-0/1's
  reduction and ZeRO-1's gather run in ceil(bytes / bucket) bucketed collectives, each paying its
  start-up, pipelined with the backward (or Megatron's next forward); the calibrated time above
  stands for the framework's default buckets and a candidate's own size adds the bucket model's
  difference between the two (so the default size gives the same figure). ZeRO-2/3 reduce per
  wrapped unit (above) and take no bucket size.
"""

from __future__ import annotations

import numpy as np

from advisor.cost import comm, fusion
from advisor.cost.memory import resharding
from advisor.cost.placement import GroupPlacement
from advisor.space.strategy import StrategyBatch
from advisor.specs.hardware import HardwareProfile
from advisor.specs.job import TrainingJob


def gathers_under_next_forward(job: TrainingJob, zero_stage: int) -> bool:
    """Whether the framework gathers a ZeRO stage's updated weights under the next step's first forward
    (module docstring; the record's gathers_under_next_forward: Megatron's --overlap-param-gather and
    MindSpore's optimizer parallel for ZeRO-1, only MindSpore's level2 for ZeRO-2: DeepSpeed stage 2 and
    FSDP SHARD_GRAD_OP wait)."""
    return zero_stage in job.framework_record.gathers_under_next_forward


def dp_time_s(hw: HardwareProfile, job: TrainingJob, b: StrategyBatch, dense_params, expert_params,
              dp_group: GroupPlacement, edp_group: GroupPlacement, units, mb_forward_s, mb_backward_s,
              weight_bytes: float, hidden: bool = True) -> np.ndarray:
    """Exposed data-parallel communication per step (seconds, (N,) arrays). dense/expert_params: the
    largest stage's per-device parameters; units: its layers (FSDP wrapping units); mb_forward_s /
    mb_backward_s: that stage's compute per micro-batch. ``hidden=False``: the same collectives with
    nothing overlapped, i.e. all the data-parallel traffic of a step (what overlap hides is the
    difference)."""
    grad_bytes = job.grad_reduce_bytes
    units = np.maximum(units, 1).astype(float)
    m = b.num_micro_batches.astype(float)
    overlap = hw.device.overlaps_communication and hidden

    def coll(op, per_param_bytes, share=1.0):
        return (comm.group_time_s(hw, op, dense_params * per_param_bytes * share, dp_group)
                + comm.group_time_s(hw, op, expert_params * per_param_bytes * share, edp_group))

    def per_unit(op, per_param_bytes):
        return coll(op, per_param_bytes, 1.0 / units)

    hide_last = mb_backward_s if (job.overlap_grad_reduce and overlap) else 0.0
    z = b.zero_stage
    zero0 = np.maximum(coll("all_reduce", grad_bytes) - hide_last, 0.0)
    gather = coll("all_gather", weight_bytes)

    def exposed_gather(zero_stage):
        under_forward = overlap and gathers_under_next_forward(job, zero_stage)
        return np.maximum(gather - mb_forward_s, 0.0) if under_forward else gather

    zero1_reduce, zero1_gather = np.maximum(coll("reduce_scatter", grad_bytes) - hide_last, 0.0), exposed_gather(1)
    zero1 = zero1_reduce + zero1_gather
    rs_unit = per_unit("reduce_scatter", grad_bytes)
    ag_unit = per_unit("all_gather", weight_bytes)
    fwd_unit, bwd_unit = mb_forward_s / units, mb_backward_s / units
    reshard = resharding(job, b)
    if overlap:
        zero2 = m * (np.maximum(rs_unit - bwd_unit, 0.0) * units) + exposed_gather(2)
        forward = ag_unit + np.maximum(ag_unit - fwd_unit, 0.0) * (units - 1.0)
        if job.fsdp_backward_prefetch == "post":
            # the next unit's gather is issued after this unit's gradients: it waits for it
            backward = (np.where(reshard, ag_unit, 0.0) + np.maximum(rs_unit - bwd_unit, 0.0)) * (units - 1.0) + rs_unit
        else:
            backward_comm = np.where(reshard, ag_unit + rs_unit, rs_unit)
            backward = np.maximum(backward_comm - bwd_unit, 0.0) * (units - 1.0) + rs_unit
        per_mb = forward + backward
        # without resharding, one gather and one reduce-scatter per step (the weights stay gathered)
        once = ag_unit * units + rs_unit * units
        hidden_once = np.maximum(once - m * (mb_forward_s + mb_backward_s), 0.0) + ag_unit + rs_unit
        zero3 = np.where(reshard, m * per_mb, hidden_once)
    else:
        zero2 = m * rs_unit * units + gather
        zero3 = np.where(reshard, m * (2.0 * ag_unit + rs_unit) * units, (ag_unit + rs_unit) * units)
    if hidden and np.any(fusion.explicit(b)):
        legacy = {"all_reduce": zero0, "reduce_scatter": zero1_reduce, "all_gather": zero1_gather}
        zero0, zero1 = _bucketed(job, b, coll, dense_params + expert_params, grad_bytes, weight_bytes, mb_forward_s,
                                 mb_backward_s, dp_group.n, legacy, (zero0, zero1), overlap)
    return np.select([z == 0, z == 1, z == 2], [zero0, zero1, zero2], zero3)


def _bucketed(job, b, coll, params, grad_bytes, weight_bytes, mb_forward_s, mb_backward_s, dp_members, legacy,
              zero01, overlap):
    """ZeRO-0/1 exposed time with the candidates' own bucket sizes; the others keep ``zero01``.
    Each collective's calibrated time (``legacy``: one collective overlapped with the whole window,
    which prices the framework's default buckets) moves by the bucket model's difference between the
    candidate's size and the default (advisor.cost.fusion), but not below what the last bucket alone
    leaves exposed, which no overlap hides (unless the calibrated time is lower still)."""
    default_mb = fusion.default_bucket_bytes(job, dp_members) / fusion.MIB
    overlaps = {"all_reduce": bool(job.overlap_grad_reduce and overlap),
                "reduce_scatter": bool(job.overlap_grad_reduce and overlap),
                # the updated weights come back in buckets of the same size; Megatron and MindSpore
                # overlap them with the next step's first forward, others wait for them
                "all_gather": bool(gathers_under_next_forward(job, 1) and overlap)}
    window = {"all_reduce": mb_backward_s, "reduce_scatter": mb_backward_s, "all_gather": mb_forward_s}
    per_param = {"all_reduce": grad_bytes, "reduce_scatter": grad_bytes, "all_gather": weight_bytes}

    def priced(op):
        def exposed(size_mb):
            n = fusion.bucket_count(params * per_param[op], size_mb)
            bucket_s = coll(op, per_param[op], 1.0 / n)
            tail = bucket_s if overlaps[op] else n * bucket_s
            return fusion.exposed_s(bucket_s, n, window[op], overlaps[op]), tail
        own, tail = exposed(b.grad_bucket_mb)
        default, _ = exposed(default_mb)
        return np.maximum(legacy[op] + own - default, np.minimum(tail, legacy[op]))

    zero0, zero1 = zero01
    on = fusion.explicit(b)
    return (np.where(on, priced("all_reduce"), zero0),
            np.where(on, priced("reduce_scatter") + priced("all_gather"), zero1))
