"""Recommendation models with embedding tables in host memory: MindSpore's Host&Device heterogeneous
training (mode ``host``).

MindSpore's tutorial (tutorials/source_en/parallel/host_device_training.md, "Host&Device
Heterogeneous") keeps Wide & Deep's embedding tables -- huge in parameters, light in computation --
with their EmbeddingLookup on the host CPU (``Primitive.set_device("CPU")``, an optimizer with
``target="CPU"`` for their update) and runs the rest on the device, data parallel, the gradients
aggregated over all cards (``nn.DistributedGradReducer``). ``RecsysConfig.host_tables`` names the
tables on the host (all of them when empty); the other tables stay on the devices, replicated as in
the ``replicated`` mode. As priced here, per device and step (b = global batch / devices samples):

* host memory: every training process keeps its host tables and their optimizer states (data
  parallelism replicates them) and the gradient rows of the batch; a node holds one copy per process;
* the host tables' lookups and sparse backward (advisor.cost.recsys_kernels.embedding_bytes, the
  traffic the device modes count) and the update of the rows the global batch touched run on the
  host CPU, at the host's achievable memory bandwidth shared by the node's processes (as a
  parameter server's host: advisor.cost.parameter_server.DEFAULT_HOST_MEMORY_GBPS where the profile
  gives none, times HOST_MEMORY_EFFICIENCY);
* their pooled embeddings cross the device's PCIe link in the forward pass and their gradients in
  the backward pass, before and after the device work that needs them (no overlap within a step);
* with more than one process, the touched rows' gradients are exchanged among them as the
  replicated mode exchanges them (advisor.cost.recsys.dense_exchange: an all-gather of rows, or an
  all-reduce of the whole table where cheaper), crossing PCIe to the device and back around the
  collective; the towers' and device tables' gradients are exchanged under the backward pass.
"""

from __future__ import annotations

from advisor.cost.compute import memory_time_s
from advisor.cost.memory import GIB
from advisor.cost.parameter_server import host_memory_bytes_per_s
from advisor.cost.recsys import (
    BOTTLENECK_NAMES, OPTIMIZER_BYTES, STATE_BYTES, RecEstimate, RecsysConfig, WorkerMemory, _unique_rows_of,
    activation_gib, dense_exchange, exposed_after_backward, finish, largest_part, per_device_batch, step_parts,
    touched_rows, worker_compute,
)
from advisor.cost.recsys_kernels import embedding_bytes, local_work
from advisor.specs.hardware import HardwareProfile
from advisor.specs.job import Cluster, TrainingJob
from advisor.specs.recommendation import PARAM_BYTES, RecModelSpec

HOST_NAMES = {**BOTTLENECK_NAMES, "host_embedding_s": "host embedding", "pcie_s": "host-device copies"}


def processes_per_node(hw: HardwareProfile, cluster: Cluster) -> int:
    return min(hw.node.devices_per_node, cluster.devices)


def host_bandwidth_bytes_per_s(hw: HardwareProfile, cluster: Cluster) -> float:
    """One process's share of its host's achievable memory bandwidth (as a parameter server's:
    advisor.cost.parameter_server's default socket and STREAM efficiency where the profile has none)."""
    return host_memory_bytes_per_s(hw) / processes_per_node(hw, cluster)


def _split(model: RecModelSpec, config: RecsysConfig):
    names = set(config.host_tables) or {t.name for t in model.tables}
    host = [t for t in model.tables if t.name in names]
    device = [t for t in model.tables if t.name not in names]
    return host, device


def embedding_traffic(model: RecModelSpec, tables, samples: float, act: int, fp16: bool) -> tuple[float, float]:
    """(forward, backward) bytes of `tables`' lookups for `samples` samples, as the device modes count them."""
    work = [w for w, t in zip(local_work(model, samples, _unique_rows_of(model)), model.tables) if t in tables]
    return embedding_bytes(work, act, fp16)


def estimate_host(model: RecModelSpec, hw: HardwareProfile, cluster: Cluster, job: TrainingJob,
                  config: RecsysConfig) -> RecEstimate:
    b, B = per_device_batch(job, cluster), job.global_batch_size
    act, fp16 = job.dtype_bytes, job.dtype == "fp16"
    host_bw = host_bandwidth_bytes_per_s(hw, cluster)
    pcie = hw.host.pcie_bandwidth_gbps * 1e9
    host, device = _split(model, config)
    rows_of = _unique_rows_of(model)
    device_work = [w for w, t in zip(local_work(model, b, rows_of), model.tables) if t in device]
    compute = worker_compute(model, hw, job, b, embedding_work=device_work)
    emb_f, emb_b = embedding_traffic(model, host, b, act, fp16)
    pooled = b * sum(t.output_width for t in host) * act
    touched = {t.name: touched_rows(t.rows, t.lookups_per_sample, B, model.unique_row_fraction) for t in model.tables}

    def updated(tables):      # elements the optimizer updates: touched rows of sparse tables, dense ones whole
        return sum(touched[t.name] * t.dim if t.sparse else t.params for t in tables)

    rows_bytes = sum(touched[t.name] * t.dim * PARAM_BYTES for t in host)
    host_embedding_s = (emb_f + emb_b) / host_bw
    # the pooled values and their gradients; with other processes to exchange with, the rows both ways
    crossing = 2.0 * pooled + (2.0 * rows_bytes if cluster.devices > 1 else 0.0)
    pcie_s = crossing / pcie
    rows_s, _ = dense_exchange(model, hw, cluster, job, tuple(host), b, towers=False)
    under_backward, _ = dense_exchange(model, hw, cluster, job, tuple(device), b)
    exchange = rows_s + exposed_after_backward(under_backward, compute.backward_s, hw)
    opt, state = OPTIMIZER_BYTES[job.optimizer], STATE_BYTES[job.optimizer]
    optimizer_s = updated(host) * opt / host_bw + float(memory_time_s(hw, (model.dense_params + updated(device)) * opt))
    parts = step_parts(compute_s=compute.total_s, host_embedding_s=host_embedding_s, pcie_s=pcie_s,
                       allreduce_s=exchange, optimizer_s=optimizer_s)
    on_device = model.dense_params + sum(t.params for t in device)
    memory = WorkerMemory(
        parameters_gib=on_device * PARAM_BYTES / GIB,
        gradients_gib=(model.dense_params + updated(device)) * PARAM_BYTES / GIB,
        optimizer_gib=on_device * state / GIB,
        activations_gib=activation_gib(model, job, b),
        buffers_gib=2.0 * pooled / GIB,           # the host tables' pooled values and their gradient, device side
    )
    per_process = sum(t.params for t in host) * (PARAM_BYTES + state) + rows_bytes
    per_node = processes_per_node(hw, cluster)
    host_gib = per_node * per_process / GIB
    reasons = []
    if host_gib > hw.host.memory_gib:
        reasons.append(f"the host tables' copies need {host_gib:,.0f} GiB per node ({per_node} processes x "
                       f"{per_process / GIB:,.1f} GiB), the host has {hw.host.memory_gib:g} GiB")
    step = sum(parts.values())
    return finish(model, hw, cluster, job, config, compute, parts, memory, step, largest_part(parts, HOST_NAMES),
                  reasons, traffic_bytes={"host_memory_per_node": per_node * per_process,
                                          "pcie_per_step": crossing})
