"""Step time of N candidates at once (vectorized): the cost model's orchestrator, a sum of named terms.

Step time = m x (slowest stage's micro-batch time, advisor.cost.stage_time) + pipeline fill and drain
(advisor.cost.bubble) + exposed pipeline transfers (advisor.cost.pipeline_p2p) + exposed data-parallel
communication (advisor.cost.data_parallel), with the tied embedding's all-reduce
(advisor.cost.tied_embedding), + what overlapped traffic loses to contention, on the links and in the compute it
hides under (advisor.cost.contention)
+ the optimizer step (advisor.cost.optimizer) + offload to the host (advisor.cost.offload,
advisor.cost.host_embedding) + the FP8 weight casts (advisor.cost.compute.weight_cast_s) + the input
copies where they outlast the step (advisor.cost.dataset). docs/formulas.md lists every term with its
module, function and source.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from advisor.cost import bubble, compute, contention, dataset, offload, optimizer, pipeline_p2p, stage_time, tied_embedding
from advisor.cost.data_parallel import dp_time_s
from advisor.cost.host_embedding import node_host_bytes
from advisor.cost.host_launch import KERNELS_BACKWARD, KERNELS_FORWARD  # noqa: F401 (re-exported)
from advisor.cost.memory import GIB, MemoryArrays, linear_params, memory, stage_masks, stage_params, state_bytes_per_param
from advisor.cost.placement import placements
from advisor.cost.overlap_slowdown import compute_slowdown_s
from advisor.cost.stage_time import STAGE_PARTS
from advisor.space.strategy import StrategyBatch
from advisor.specs.hardware import HardwareProfile
from advisor.specs.job import Cluster, TrainingJob
from advisor.specs.model import ModelSpec

TIME_PARTS = (*STAGE_PARTS, "pp_comm", "dp_comm", "contention", "overlap_slowdown", "bubble", "optimizer", "offload")


@dataclass(frozen=True)
class EstimateBatch:
    """Figures for N candidates; every field an (N,) array. Memory in bytes, times in seconds."""

    fits: np.ndarray
    host_fits: np.ndarray
    memory: MemoryArrays
    time_s: dict[str, np.ndarray]
    step_time_s: np.ndarray
    tokens_per_s: np.ndarray
    tflops_per_device: np.ndarray
    hfu_tflops_per_device: np.ndarray
    mfu: np.ndarray
    hfu: np.ndarray
    slowest_stage: np.ndarray
    # per-stage micro-batch seconds, for mixed clusters (advisor.cost.mixed), whose stages run on
    # different devices: the (N, P) total, and its parts (STAGE_PARTS) as arrays that broadcast to
    # (N, P), meaningful on active stages only
    stage_micro_batch_s: np.ndarray | None = None
    stage_parts_s: dict[str, np.ndarray] | None = None
    # host memory of the fullest node (advisor.cost.host_embedding.node_host_bytes); None: host_total
    # times the node's devices
    host_node_bytes: np.ndarray | None = None
    # all the data-parallel traffic of a step, overlapped or not, over the slowest stage's compute: how much
    # of the step the overlap model is asked to hide (advisor.cost.confidence checks it against the runs')
    dp_traffic_share: np.ndarray | None = None

    @property
    def feasible(self) -> np.ndarray:
        return self.fits & self.host_fits


def estimate_batch(model: ModelSpec, hw: HardwareProfile, cluster: Cluster, job: TrainingJob, b: StrategyBatch,
                   every_stage: bool = True) -> EstimateBatch:
    """Score N candidates at once. Legality is not checked here (see advisor.space.rules). ``every_stage``
    False: the memory figures of the worst stage only (advisor.cost.memory.memory; the search's)."""
    mem = memory(model, job, b, every_stage)
    active, first, last = stage_masks(b)
    groups = placements(hw, b, ("tp", "cp", "dp_cp", "ep", "edp"))    # the groups the step's collectives use
    st = stage_time.micro_batch(model, hw, job, b, groups, active, first, last)
    if st.host_embedding is not None:
        mem = replace(mem, host_embedding=st.host_embedding.host_bytes)
    pipe_s, bubble_s, slowest = bubble.pipeline_time_s(st.total_s, active, b.num_micro_batches, b.virtual_pipeline_stages)
    rows, m = np.arange(len(b)), b.num_micro_batches.astype(float)

    def at_slowest(x):
        return np.broadcast_to(x, st.total_s.shape)[rows, slowest]

    pp_s, neighbour = pipeline_p2p.exposed_s(model, hw, job, b, at_slowest(st.total_s))
    dense_p, expert_p = stage_params(model, b)
    dense_max, expert_max = np.max(dense_p, axis=1), np.max(expert_p, axis=1)
    gather_bytes = 1.0 if job.fp8_param_gather else state_bytes_per_param(job)[0]   # FP8 primary weights: FP8
    units = np.max(np.where(active, st.dense_layers + st.moe_layers, 0), axis=1)
    fwd, bwd = at_slowest(st.forward_s), at_slowest(st.backward_s)
    dp_s = dp_time_s(hw, job, b, dense_max, expert_max, groups["dp_cp"], groups["edp"], units, fwd, bwd, gather_bytes)
    traffic = dp_time_s(hw, job, b, dense_max, expert_max, groups["dp_cp"], groups["edp"], units, fwd, bwd, gather_bytes,
                        hidden=False)
    dp_share = traffic / np.maximum(m * (fwd + bwd), 1e-12)
    critical = contention.critical_busy_s(model, hw, job, b, groups, st.ring, neighbour,
                                          at_slowest(st.dense_layers), at_slowest(st.moe_layers))
    contention_s = contention.contention_s(hw, job, b, critical, dense_max, expert_max, groups["dp_cp"], groups["edp"],
                                           fwd, bwd, gather_bytes)
    # the compute the data-parallel traffic hides under runs slower while it does (advisor.cost.contention)
    slowed = compute_slowdown_s(hw, traffic, dp_s, m * (fwd + bwd))
    if model.tie_embeddings:
        dp_s = dp_s + tied_embedding.gradient_s(model, hw, job, b)
    local = optimizer.local_params(b, groups, dense_max, expert_max)
    opt_s = optimizer.step_s(model, hw, job, b, local, dense_max, expert_max, units)
    offload_s = offload.exposed_s(hw, job, b, local, opt_s, bwd, at_slowest(st.parts["compute"]))
    # FP8: the linear layers' weights are quantized once per step (cached across micro-batches)
    weight_cast = compute.weight_cast_s(hw, job, np.max(np.where(active, sum(linear_params(model, b)), 0.0), axis=1))
    # the word embedding on the host: its gradient exchange and update, once per step
    offload_s = offload_s + (st.host_embedding.step_s if st.host_embedding is not None else 0.0)
    step = pipe_s + pp_s + dp_s + contention_s + opt_s + offload_s + weight_cast + slowed
    # the input pipeline's host-to-device copies, where they outlast the step they run under
    input_s = dataset.exposed_s(hw, job, b, step)
    time_s = {part: at_slowest(value) * m for part, value in st.parts.items()}
    time_s["compute"] = time_s["compute"] + weight_cast
    time_s["host_overhead"] = time_s["host_overhead"] + input_s
    time_s.update(pp_comm=pp_s, dp_comm=dp_s, contention=contention_s, overlap_slowdown=slowed, bubble=bubble_s,
                  optimizer=opt_s,
                  # optimizer offload, activation swapping and a host embedding's copies and update
                  offload=offload_s + at_slowest(st.swap_s) * m)
    return _figures(model, hw, cluster, job, b, mem, st, active, slowest, time_s, step + input_s, dp_share)


def _figures(model, hw, cluster, job, b, mem, st, active, slowest, time_s, step, dp_share) -> EstimateBatch:
    """Throughput, model and hardware FLOPs utilization, and whether it fits on the device and the host.
    MFU counts the model's FLOPs per step over the devices' peak (Chowdhery et al. 2022, PaLM, appendix B);
    HFU adds the FLOPs recomputation replays (Korthikanti et al. 2022, section 6: hardware FLOPs)."""
    tokens = job.tokens_per_step
    model_flops = model.training_flops_per_token(job.seq_length) * tokens
    # Hardware FLOPs add the recomputed forward work, counted over the whole model: one micro-batch on one
    # tp x cp slice of one dp replica's stages, scaled to the cluster
    recompute_flops = stage_time.replayed_flops(model, job, b, st, active) * b.tp * b.cp * b.dp * b.num_micro_batches
    devices = float(cluster.devices)
    peak = hw.device.peak_flops(job.dtype)
    tflops = model_flops / step / devices / 1e12
    hfu_tflops = (model_flops + recompute_flops) / step / devices / 1e12
    capacity = job.usable_memory_gib(hw.device.memory_gib) * GIB
    first_per_node = st.host_embedding.first_per_node if st.host_embedding is not None else None
    host_node = node_host_bytes(mem.host_total, mem.host_embedding, hw.node.devices_per_node, first_per_node)
    return EstimateBatch(
        fits=mem.total <= capacity, host_fits=host_node <= hw.host.memory_gib * GIB, host_node_bytes=host_node,
        memory=mem, time_s=time_s, step_time_s=step, tokens_per_s=tokens / step, tflops_per_device=tflops,
        hfu_tflops_per_device=hfu_tflops, mfu=tflops * 1e12 / peak, hfu=hfu_tflops * 1e12 / peak, slowest_stage=slowest,
        stage_micro_batch_s=st.total_s,
        stage_parts_s=st.parts,      # the arrays as computed (no copies on the search's path)
        dp_traffic_share=dp_share,
    )
