"""Recommendation models (advisor.specs.recommendation) on a cluster: what every mode shares, and the
two collective-only modes.

Modes (``RecsysConfig.mode``):

* ``replicated``: every device holds every table and the towers; gradients are exchanged by
  collectives: dense tensors (and tables with ``sparse: false``) by all-reduce, sparse tables by an
  all-gather of the rows each device touched (how Horovod and MindSpore's data parallelism exchange
  IndexedSlices / sparse gradients: Sergeev and Del Balso 2018, "Horovod", section 4; MindSpore
  nn.EmbeddingLookup data-parallel mode), or by a dense all-reduce of the whole table where that is
  cheaper (Horovod's sparse_as_dense option).
* ``sharded``: the tables are sharded over the devices (model parallel: column-wise, table-wise or
  row-wise as advisor.cost.recsys_kernels.place_tables decides) and looked up where they live; an
  all-to-all sends every sample's pooled embeddings to the device that trains the sample and the
  pooled gradients back (Naumov et al. 2019, DLRM, section 3 "Parallelism" and Fig. 2; TorchRec's
  sharding types; NVIDIA DeepLearningExamples DLRM "hybrid-parallel"). The busiest device's lookups
  set the embedding time. The towers are data parallel (all-reduce, overlapped with backward as
  PyTorch DDP does).
* ``host``: the tables in host memory, looked up and updated by the host CPU (MindSpore's
  Host&Device heterogeneous training; advisor.cost.recsys_host).
* ``ps`` and ``hybrid``: advisor.cost.parameter_server.

Per device and step (b = global batch / devices samples): the towers' GEMMs at the profile's
size-dependent efficiency (advisor.cost.compute.gemm_time_s), the interaction's batched product as
GEMM work, and as memory-bound traffic at the profile's achievable bandwidth the embedding lookups
with their sparse backward, the interaction's and the towers' element-wise kernels and fp16 loss
scaling (advisor.cost.recsys_kernels gives the byte counts and their sources); a host launch floor
per kernel (profile launch_overhead_us; overlapped with device time on asynchronous devices, as
advisor.cost.step does).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from advisor.cost.comm import fanout_time_s, tier_fanouts
from advisor.cost.compute import gemm_time_s, memory_time_s
from advisor.cost.memory import GIB
from advisor.cost.recsys_kernels import (
    TableWork, dense_gradient_scaling_bytes, embedding_bytes, interaction_bytes, local_work, place_tables,
    shard_work, tower_elementwise_bytes,
)
from advisor.specs.hardware import HardwareProfile
from advisor.specs.job import Cluster, TrainingJob
from advisor.specs.recommendation import INDEX_BYTES, PARAM_BYTES, RecModelSpec

MODES = ("replicated", "sharded", "host", "ps", "hybrid")
PLACEMENTS = ("dedicated", "colocated")
# fp32 optimizer traffic per updated element: SGD reads weight and gradient and writes the weight
# (12 bytes); Adam also reads and writes m and v (28 bytes; Kingma and Ba 2015, Algorithm 1);
# Adagrad reads and writes its sum of squared gradients (20 bytes; Duchi et al. 2011, as
# torch.optim.Adagrad keeps one state_sum per element and updates only touched rows of a sparse grad).
OPTIMIZER_BYTES = {"sgd": 12.0, "adam": 28.0, "adamw": 28.0, "adagrad": 20.0}
STATE_BYTES = {"sgd": 0.0, "adam": 8.0, "adamw": 8.0, "adagrad": 4.0}     # m and v, or Adagrad's sum, in fp32
# Kernels per step: per Linear a GEMM, a bias add and a ReLU forward and two GEMMs and two
# element-wise kernels backward; the embeddings as one table-batched kernel per pass (FBGEMM's
# TBE as TorchRec runs it; NVIDIA's DLRM one fused gather over all tables: lookup, backward, update) and the interaction's
# batched GEMM and its gather of the lower triangle, forward and backward.
KERNELS_PER_LINEAR = 7
EMBEDDING_KERNELS = 3
INTERACTION_KERNELS = 4


@dataclass(frozen=True)
class RecsysConfig:
    """One candidate: the mode, and for ps/hybrid the servers and the tensors they hold."""

    mode: str = "sharded"
    servers: int = 0
    server_placement: str = "dedicated"
    synchronous: bool = True
    server_tensors: tuple[str, ...] = ()   # ps/hybrid: the tensors the servers hold
    # a plan's parallel.parameter_server.sharding (tensor -> servers, rows split evenly in list order);
    # empty: the estimate chooses it (parameter_server.server_shards)
    sharding: tuple[tuple[str, tuple[int, ...]], ...] = ()
    # host mode: the tables kept in host memory (empty: every table); the others stay on the devices,
    # replicated (advisor.cost.recsys_host)
    host_tables: tuple[str, ...] = ()
    # ps/hybrid: 1 keeps a backup of each server's shard on the next server (advisor.cost.parameter_server)
    replicas: int = 0


@dataclass(frozen=True)
class WorkerMemory:
    parameters_gib: float
    gradients_gib: float
    optimizer_gib: float
    activations_gib: float
    buffers_gib: float

    @property
    def total_gib(self) -> float:
        return self.parameters_gib + self.gradients_gib + self.optimizer_gib + self.activations_gib + self.buffers_gib


@dataclass(frozen=True)
class ServerMemory:
    """The fullest server's host memory."""

    parameters_gib: float
    optimizer_gib: float
    buffers_gib: float

    @property
    def total_gib(self) -> float:
        return self.parameters_gib + self.optimizer_gib + self.buffers_gib


@dataclass(frozen=True)
class RecEstimate:
    config: RecsysConfig
    feasible: bool
    reasons: tuple[str, ...]
    worker_memory: WorkerMemory
    capacity_gib: float
    time_s: dict[str, float]            # parts of the step (exposed seconds), see step_parts()
    step_time_s: float
    samples_per_s: float
    tflops_per_device: float
    mfu: float
    bottleneck: str
    server_memory: ServerMemory | None = None
    server_capacity_gib: float | None = None
    staleness_steps: float | None = None      # asynchronous PS: updates a gradient misses on average
    traffic_bytes: dict[str, float] = field(default_factory=dict)
    sharding: dict[str, list[int]] = field(default_factory=dict)   # tensor -> servers (ps/hybrid)

    def to_dict(self) -> dict[str, Any]:
        c = self.config
        w = self.worker_memory
        out: dict[str, Any] = {
            "mode": c.mode, "servers": c.servers, "server_placement": c.server_placement if c.servers else None,
            "synchronous": c.synchronous, "replicas": c.replicas, "feasible": self.feasible,
            "reasons": list(self.reasons),
            "step_time_s": self.step_time_s, "samples_per_s": self.samples_per_s, "bottleneck": self.bottleneck,
            "tflops_per_device": self.tflops_per_device, "mfu": self.mfu, "time_s": dict(self.time_s),
            "worker_memory_gib": {"parameters": w.parameters_gib, "gradients": w.gradients_gib,
                                  "optimizer": w.optimizer_gib, "activations": w.activations_gib,
                                  "buffers": w.buffers_gib, "total": w.total_gib},
            "capacity_gib": self.capacity_gib, "traffic_bytes": dict(self.traffic_bytes),
        }
        if self.server_memory is not None:
            s = self.server_memory
            out["server_memory_gib"] = {"parameters": s.parameters_gib, "optimizer": s.optimizer_gib,
                                        "buffers": s.buffers_gib, "total": s.total_gib}
            out["server_capacity_gib"] = self.server_capacity_gib
        if self.staleness_steps is not None:
            out["staleness_steps"] = self.staleness_steps
        return out


# ---- shared pieces -----------------------------------------------------------------------------
def per_device_batch(job: TrainingJob, cluster: Cluster) -> float:
    return job.global_batch_size / cluster.devices


def touched_rows(rows: int, lookups: float, samples: float, unique_fraction: float) -> float:
    """Distinct rows a batch of `samples` touches in one table: the lookups times the unique share,
    at most the table (module docstring of advisor.specs.recommendation)."""
    return min(float(rows), unique_fraction * lookups * samples)


@dataclass(frozen=True)
class WorkerCompute:
    forward_s: float
    backward_s: float
    mlp_flops: float            # per device per step (model FLOPs: forward + backward)

    @property
    def total_s(self) -> float:
        return self.forward_s + self.backward_s


def _unique_rows_of(model: RecModelSpec):
    """rows(table, samples, row_share=1): the distinct rows `samples` samples touch in a table, or in
    a row-wise shard holding `row_share` of its rows (ids spread evenly over the rows)."""
    def rows(table, samples: float, row_share: float = 1.0) -> float:
        return touched_rows(int(table.rows * row_share) or 1, table.lookups_per_sample, samples * row_share,
                            model.unique_row_fraction)
    return rows


def worker_compute(model: RecModelSpec, hw: HardwareProfile, job: TrainingJob, samples: float,
                   embedding_work: list[TableWork] | None = None, extra_device_s: float = 0.0) -> WorkerCompute:
    """Forward and backward of the towers and the interaction for `samples` samples, and of the
    embedding lookups this device does (`embedding_work`; default: every table for its own samples),
    as advisor.cost.recsys_kernels counts their traffic; `extra_device_s`: further device seconds
    (the sharded mode's all-to-all repacking), half forward and half backward."""
    dtype, act = job.gemm_dtype, job.dtype_bytes
    fp16_scaling = job.dtype == "fp16"
    fwd_gemm = np.array([2.0 * samples * a * b for _, a, b in model.mlp_layers()])
    gemm_f = float(np.sum(gemm_time_s(hw, dtype, fwd_gemm)))
    gemm_b = 2.0 * gemm_f        # two GEMMs of the forward's shape per Linear (input and weight gradients)
    inter = model.interaction_forward_flops_per_sample() * samples
    inter_f = float(gemm_time_s(hw, dtype, inter)) if inter else 0.0
    work = embedding_work if embedding_work is not None else local_work(model, samples, _unique_rows_of(model))
    emb_f, emb_b = embedding_bytes(work, act, fp16_scaling)
    int_f, int_b = interaction_bytes(model, samples, act)
    elem_f, elem_b = tower_elementwise_bytes(model, samples, act)
    scale_b = dense_gradient_scaling_bytes(model, fp16_scaling)
    device_f = gemm_f + inter_f + float(memory_time_s(hw, emb_f + int_f + elem_f)) + extra_device_s / 2
    device_b = gemm_b + 2.0 * inter_f + float(memory_time_s(hw, emb_b + int_b + elem_b + scale_b)) + extra_device_s / 2
    kernels = KERNELS_PER_LINEAR * len(model.mlp_layers()) + EMBEDDING_KERNELS + INTERACTION_KERNELS
    host_s = kernels * hw.device.launch_overhead_us * 1e-6
    share_f = 3.0 / KERNELS_PER_LINEAR     # the forward's share of the kernels
    host_f, host_b = host_s * share_f, host_s * (1.0 - share_f)
    if hw.device.asynchronous_launch:
        fwd, bwd = max(device_f, host_f), max(device_b, host_b)
    else:
        fwd, bwd = device_f + host_f, device_b + host_b
    flops = samples * model.training_flops_per_sample()
    return WorkerCompute(forward_s=fwd, backward_s=bwd, mlp_flops=flops)


def collective_s(hw: HardwareProfile, cluster: Cluster, op: str, nbytes: float) -> float:
    """One collective ("all_reduce", "all_gather", "all_to_all") over every device with hierarchical
    rings (advisor.cost.comm); nbytes is the full buffer (gathered for all-gather, one device's whole
    buffer for all-to-all)."""
    if nbytes <= 0 or cluster.devices <= 1:
        return 0.0
    g = tier_fanouts(hw, cluster.devices, 1)
    return float(fanout_time_s(hw, op, nbytes, *g))


def inter_node_allreduce_bytes(cluster: Cluster, hw: HardwareProfile, nbytes: float) -> float:
    """Bytes one device sends over its NIC in a hierarchical all-reduce: the node-level reduce-scatter
    leaves nbytes / devices_per_node per device for the ring across nodes, which sends 2(n-1)/n of
    it (Thakur et al. 2005, as advisor.cost.comm prices it)."""
    nodes = cluster.nodes
    if nodes <= 1:
        return 0.0
    per_node = min(hw.node.devices_per_node, cluster.devices)
    return 2.0 * (nodes - 1) / nodes * nbytes / per_node


def dense_exchange(model: RecModelSpec, hw: HardwareProfile, cluster: Cluster, job: TrainingJob,
                   tables: tuple, samples: float, towers: bool = True) -> tuple[float, float]:
    """(seconds, bytes over one device's NIC) to exchange the towers' gradients (unless towers=False)
    and those of the replicated `tables` among all devices: all-reduce of dense gradients, all-gather
    of sparse rows."""
    dense = (model.dense_params * PARAM_BYTES if towers else 0) + sum(t.params * PARAM_BYTES for t in tables if not t.sparse)
    seconds = collective_s(hw, cluster, "all_reduce", dense)
    nic = inter_node_allreduce_bytes(cluster, hw, dense)
    for t in tables:
        if t.sparse:
            rows = touched_rows(t.rows, t.lookups_per_sample, samples, model.unique_row_fraction)
            gathered = rows * (t.dim * PARAM_BYTES + INDEX_BYTES) * cluster.devices
            as_rows = collective_s(hw, cluster, "all_gather", gathered)
            as_dense = collective_s(hw, cluster, "all_reduce", t.params * PARAM_BYTES)
            if as_rows <= as_dense:
                seconds += as_rows
                nic += gathered * (cluster.nodes - 1) / max(cluster.nodes, 1) / min(hw.node.devices_per_node, cluster.devices)
            else:      # Horovod's sparse_as_dense: the whole table's gradient all-reduced instead
                seconds += as_dense
                nic += inter_node_allreduce_bytes(cluster, hw, t.params * PARAM_BYTES)
    return seconds, nic


def exposed_after_backward(comm_s: float, backward_s: float, hw: HardwareProfile) -> float:
    """Gradient collectives run beside backward on asynchronous devices (PyTorch DDP buckets, MindSpore's
    fused AllReduce): only what outlasts backward is exposed; a CPU rank runs them in turn."""
    return max(0.0, comm_s - backward_s) if hw.device.overlaps_communication else comm_s


def activation_gib(model: RecModelSpec, job: TrainingJob, samples: float) -> float:
    return (model.activation_bytes_per_sample(job.dtype_bytes) * samples + model.activation_bytes_per_batch()) / GIB


def step_parts(**parts: float) -> dict[str, float]:
    return {k: float(v) for k, v in parts.items()}


def finish(model: RecModelSpec, hw: HardwareProfile, cluster: Cluster, job: TrainingJob, config: RecsysConfig,
           compute: WorkerCompute, parts: dict[str, float], memory: WorkerMemory, step_s: float, bottleneck: str,
           reasons: list[str], **extra: Any) -> RecEstimate:
    """The estimate from its parts: throughput, TFLOP/s, MFU against the dtype's peak, feasibility."""
    capacity = hw.device.memory_gib
    if memory.total_gib > capacity:
        reasons.insert(0, f"worker memory {memory.total_gib:.1f} GiB exceeds the {capacity:g} GiB of a {hw.device.name}")
    samples_per_s = job.global_batch_size / step_s if step_s > 0 else 0.0
    tflops = compute.mlp_flops / step_s / 1e12 if step_s > 0 else 0.0
    mfu = tflops * 1e12 / hw.device.peak_flops(job.gemm_dtype)
    if memory.total_gib > 0.95 * capacity and not reasons:
        bottleneck = "memory headroom"
    return RecEstimate(config=config, feasible=not reasons, reasons=tuple(reasons), worker_memory=memory,
                       capacity_gib=capacity, time_s=parts, step_time_s=step_s, samples_per_s=samples_per_s,
                       tflops_per_device=tflops, mfu=mfu, bottleneck=bottleneck, **extra)


def largest_part(parts: dict[str, float], names: dict[str, str]) -> str:
    key = max(parts, key=lambda k: parts[k])
    return names.get(key, key)


BOTTLENECK_NAMES = {
    "compute_s": "compute", "alltoall_s": "embedding all-to-all", "allreduce_s": "dense all-reduce",
    "optimizer_s": "optimizer", "server_nic_s": "server bandwidth", "server_update_s": "server optimizer",
    "worker_nic_s": "worker bandwidth", "latency_s": "latency", "handling_s": "tensor handling",
}


# ---- collective-only modes -----------------------------------------------------------------------
def estimate_replicated(model: RecModelSpec, hw: HardwareProfile, cluster: Cluster, job: TrainingJob,
                        config: RecsysConfig) -> RecEstimate:
    b = per_device_batch(job, cluster)
    compute = worker_compute(model, hw, job, b)
    comm_s, _ = dense_exchange(model, hw, cluster, job, model.tables, b)
    exposed = exposed_after_backward(comm_s, compute.backward_s, hw)
    opt = OPTIMIZER_BYTES[job.optimizer]
    touched = sum(touched_rows(t.rows, t.lookups_per_sample, job.global_batch_size, model.unique_row_fraction) * t.dim
                  if t.sparse else t.params for t in model.tables)
    optimizer_s = float(memory_time_s(hw, (model.dense_params + touched) * opt))
    parts = step_parts(compute_s=compute.total_s, allreduce_s=exposed, optimizer_s=optimizer_s)
    params = model.num_params * PARAM_BYTES / GIB
    grads = (model.dense_params + sum(t.params if not t.sparse else
                                      touched_rows(t.rows, t.lookups_per_sample, job.global_batch_size,
                                                   model.unique_row_fraction) * t.dim for t in model.tables)) * PARAM_BYTES / GIB
    memory = WorkerMemory(parameters_gib=params, gradients_gib=grads,
                          optimizer_gib=model.num_params * STATE_BYTES[job.optimizer] / GIB,
                          activations_gib=activation_gib(model, job, b), buffers_gib=0.0)
    step = sum(parts.values())
    return finish(model, hw, cluster, job, config, compute, parts, memory, step,
                  largest_part(parts, BOTTLENECK_NAMES), [])


def estimate_sharded(model: RecModelSpec, hw: HardwareProfile, cluster: Cluster, job: TrainingJob,
                     config: RecsysConfig) -> RecEstimate:
    n, B = cluster.devices, job.global_batch_size
    b = per_device_batch(job, cluster)
    act = job.dtype_bytes
    state = STATE_BYTES[job.optimizer]
    rows_of = _unique_rows_of(model)
    # What a device holds besides its tables (towers with gradients and state, activations, the
    # all-to-all buffers of an even placement) leaves the budget for tables and their state.
    even_buffer = 2.0 * b * model.pooled_width() * act if n > 1 else 0.0
    other = (model.dense_params * (2 * PARAM_BYTES + state) + activation_gib(model, job, b) * GIB
             + 2.0 * even_buffer)
    budget = max(0.0, hw.device.memory_gib * GIB - other) / (PARAM_BYTES + state)
    placed = place_tables(model, n, budget)
    works = [shard_work(pieces, B, rows_of) for pieces in placed]
    emb = [sum(embedding_bytes(w, act, job.dtype == "fp16")) for w in works]
    busiest = int(np.argmax(emb))
    # Per device: the pooled outputs it computes for the whole batch and the pooled inputs of its own
    # samples; the larger is its all-to-all buffer (forward; backward the same), plus the ids it receives.
    received = b * model.pooled_width() * act
    sent = [sum(B * p.output * act for p in pieces) for pieces in placed]
    # The received pieces are concatenated into each sample's vectors forward and the gradient split
    # into contiguous per-peer pieces backward: one read and one write of the buffer each way
    # (DeepLearningExamples dlrm/model/distributed.py: torch.cat of the all_to_all outputs, split of
    # the gradients; TorchRec's PooledEmbeddingsAllToAll recat).
    repack_s = float(memory_time_s(hw, 2.0 * 2.0 * max(received, sent[busiest]))) if n > 1 else 0.0
    compute = worker_compute(model, hw, job, b, embedding_work=works[busiest], extra_device_s=repack_s)
    ids = [sum(w.lookups * INDEX_BYTES for w in work) for work in works]
    buffer = max(max(s_, received) + i for s_, i in zip(sent, ids))
    a2a = 2.0 * collective_s(hw, cluster, "all_to_all", buffer) if n > 1 else 0.0
    dense_s = collective_s(hw, cluster, "all_reduce", model.dense_params * PARAM_BYTES)
    exposed = exposed_after_backward(dense_s, compute.backward_s, hw)
    opt = OPTIMIZER_BYTES[job.optimizer]
    rows_held = [sum(p.params for p in pieces) for pieces in placed]
    touched = [sum(w.unique_rows * w.dim for w in work) for work in works]
    optimizer_s = float(memory_time_s(hw, (model.dense_params + max(touched)) * opt))
    parts = step_parts(compute_s=compute.total_s, alltoall_s=a2a, allreduce_s=exposed, optimizer_s=optimizer_s)
    worst = int(np.argmax(rows_held))
    memory = WorkerMemory(
        parameters_gib=(model.dense_params + rows_held[worst]) * PARAM_BYTES / GIB,
        gradients_gib=(model.dense_params + touched[worst]) * PARAM_BYTES / GIB,
        optimizer_gib=(model.dense_params + rows_held[worst]) * state / GIB,
        activations_gib=activation_gib(model, job, b),
        buffers_gib=2.0 * buffer / GIB if n > 1 else 0.0,     # send and receive buffers of the all-to-all
    )
    step = sum(parts.values())
    return finish(model, hw, cluster, job, config, compute, parts, memory, step,
                  largest_part(parts, BOTTLENECK_NAMES), [], traffic_bytes={"alltoall_buffer": buffer})
