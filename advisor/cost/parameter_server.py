"""Parameter-server training of recommendation models: ``ps`` (every tensor on servers) and ``hybrid``
(the server tensors, usually the embedding tables, on servers; the rest data parallel with all-reduce).

Per step (Li et al. 2014, "Scaling Distributed Machine Learning with the Parameter Server", OSDI,
sections 3-4: workers push gradients as key-value pairs and pull the weights they need; servers
aggregate the pushes of all workers, apply the optimizer and answer the pulls):

* each worker pushes the gradients of the server tensors: a dense tensor whole (P x 4 bytes), a
  table only the rows its b samples touched (touched = min(rows, unique_row_fraction x lookups x b))
  with their 8-byte keys; it pulls the updated dense tensors whole and the rows of its next batch
  (sending their keys). A server receives the pushes of all N workers for its shard and sends N
  pulls back, so its NIC carries N times a worker's share: the many-to-one bottleneck that BytePS
  (Jiang et al. 2020, OSDI, section 3.1) shows makes PS need about as much server bandwidth as the
  workers have in total, where all-reduce needs none.
* a server aggregates N pushes (reading each once), applies the optimizer to the rows touched by the
  whole batch (fp32 optimizer traffic, advisor.cost.recsys.OPTIMIZER_BYTES) and gathers the rows of
  N pulls: memory-bound work on the host at its memory bandwidth.
* synchronous PS: the next forward needs the pulled weights, so the step is compute plus the PS
  phase, whose messages pipeline through worker NICs, server NICs and server memory: the slowest of
  the three sets its length, plus the messages' own time: where calibrate measured a per-message
  host time, a server handles the pull request, the answer and the push of each of the N workers one
  after another (ps-lite's server thread; the executor's); otherwise a push and a pull round trip of
  network latency.
  Hybrid: the dense all-reduce runs beside backward (MindSpore's fused AllReduce) and shares the
  workers' NICs with the PS traffic; its exposed part and the PS phase overlap (max).
* asynchronous PS (Li et al. 2014 section 3.4, bounded delay): a worker computes its next batch while
  the last one's push and pull are in flight, and nobody waits for the slowest worker: throughput is
  set by the slower of a worker's iteration and a server's round; a gradient then lands on weights
  its own previous update and the N - 1 other workers' concurrent updates have changed since it was
  pulled: staleness N updates, reported.

Replication (``replicas`` 1; Li et al. 2014 section 4.3): server s keeps a copy of server s - 1's shard
(the next server in the ring is each shard's backup), and after applying a step forwards the aggregated
update it applied (a dense tensor whole, a table's rows touched by the whole batch with their keys) to its
backup, which applies it to the copy. Each server thus sends and receives one aggregated update more per
step, does the optimizer's memory work twice (its own shard and the copy) and holds two shards' weights
and optimizer state. A failed server's backup takes its shard over at the step it was in.

Sharding over S servers: by size (parameters and optimizer state) and by traffic: a table whose
size or per-step traffic exceeds an even share of either is split by rows over as many servers as
that takes (Li et al. 2014 section 4.2 partition keys into ranges; MindSpore's PS slices large
embeddings by rows), and each tensor or piece goes to the server with the least traffic so far
(a small table is as hot as a large one: its traffic is the rows a batch touches); tower layers
stay whole. Dedicated servers are extra hosts of the profile's node type, each
with one NIC at the fabric's per-device rate; co-located servers (one per worker node, on its first
S nodes) share the node's NICs and host memory with its workers, and talk to local workers over PCIe.
"""

from __future__ import annotations

import math

from advisor.cost import ps_handling
from advisor.cost.recsys import (
    GIB, OPTIMIZER_BYTES, STATE_BYTES, BOTTLENECK_NAMES, RecEstimate, RecsysConfig, ServerMemory,
    WorkerMemory, activation_gib, dense_exchange, exposed_after_backward, finish, per_device_batch,
    step_parts, touched_rows, worker_compute,
)
from advisor.specs.hardware import HardwareProfile
from advisor.specs.job import Cluster, TrainingJob
from advisor.specs.recommendation import INDEX_BYTES, PARAM_BYTES, RecModelSpec

# Host memory bandwidth when a profile gives none: one socket with 8 channels of DDR4-3200 (25.6 GB/s
# each, JEDEC JESD79-4): 204.8 GB/s, as an AMD EPYC 7742 of the DGX A100 (AMD EPYC 7002 datasheet).
DEFAULT_HOST_MEMORY_GBPS = 204.8
# STREAM triad on such sockets reaches about three quarters of the DDR peak (McCalpin's STREAM results
# for 2nd-generation EPYC, ~150 GB/s per socket).
HOST_MEMORY_EFFICIENCY = 0.75
# Messages per step between a worker and a server: the pull request, its answer, the push (Li et al.
# 2014 section 3: push and pull are the interface; a pull is a request and a response).
MESSAGES_PER_STEP = 3
ROUND_TRIPS = 2          # push (request + acknowledgement) and pull (request + response) per step


def host_memory_bytes_per_s(hw: HardwareProfile) -> float:
    """A host's achievable memory bandwidth: the profile's (or the default socket's) at STREAM efficiency."""
    return (hw.host.memory_bandwidth_gbps or DEFAULT_HOST_MEMORY_GBPS) * 1e9 * HOST_MEMORY_EFFICIENCY


def server_shards(model: RecModelSpec, tensors: tuple[str, ...], servers: int, optimizer: str,
                  samples: float = 1.0) -> dict[str, list[tuple[int, float]]]:
    """tensor -> [(server, share of its rows)]: a table is split by rows over as many servers as its
    size or its traffic needs to stay within an even share of either, and every tensor or piece goes
    to the servers with the least traffic so far (then the least memory), as the module docstring
    describes; `samples` is a worker's batch (traffic per table is per touched row, not per row held)."""
    sizes = model.tensor_params()
    tables = {t.name for t in model.tables}
    per_param = PARAM_BYTES + STATE_BYTES[optimizer]
    traffic = {name: sum(_worker_bytes(model, name, samples)[:2]) for name in tensors}
    cap_bytes = sum(sizes[t] for t in tensors) * per_param / servers
    cap_traffic = sum(traffic.values()) / servers
    held, sent = [0.0] * servers, [0.0] * servers
    out: dict[str, list[tuple[int, float]]] = {}
    for name in sorted(tensors, key=lambda n: (-traffic[n], -sizes[n], n)):
        nbytes = sizes[name] * per_param
        k = 1
        if name in tables:
            k = min(servers, max(1, math.ceil(nbytes / cap_bytes - 1e-9), math.ceil(traffic[name] / cap_traffic - 1e-9)))
        chosen = sorted(sorted(range(servers), key=lambda s: (sent[s], held[s], s))[:k])
        out[name] = [(s, 1.0 / k) for s in chosen]
        for s in chosen:
            held[s] += nbytes / k
            sent[s] += traffic[name] / k
    return out


def given_shards(config: RecsysConfig) -> dict[str, list[tuple[int, float]]] | None:
    """A plan's own sharding, as the executor places it (a tensor on k servers: k even row ranges), when
    it names every server tensor and only servers that exist; otherwise None (the estimate chooses)."""
    given = dict(config.sharding)
    if not given or set(given) != set(config.server_tensors):
        return None
    if any(not ids or any(not 0 <= s < config.servers for s in ids) for ids in given.values()):
        return None
    return {name: [(s, 1.0 / len(ids)) for s in ids] for name, ids in given.items()}


def _worker_bytes(model: RecModelSpec, name: str, samples: float) -> tuple[float, float, float]:
    """(bytes a worker sends, bytes it receives, rows it touches) for one server tensor per step."""
    table = next((t for t in model.tables if t.name == name), None)
    if table is None:
        p = model.tensor_params()[name] * PARAM_BYTES
        return p, p, 0.0
    rows = touched_rows(table.rows, table.lookups_per_sample, samples, model.unique_row_fraction)
    # push: values and keys; pull: the keys asked for, the values returned
    return rows * (table.dim * PARAM_BYTES + 2 * INDEX_BYTES), rows * table.dim * PARAM_BYTES, rows


def _server_update_bytes(model: RecModelSpec, name: str, workers: int, samples: float, batch: int,
                         optimizer: str) -> float:
    """Host memory traffic of one tensor per step: read N pushes, update, gather N pulls."""
    table = next((t for t in model.tables if t.name == name), None)
    update = _optimizer_update_bytes(model, name, batch, optimizer)
    if table is None:
        return update + 2.0 * workers * model.tensor_params()[name] * PARAM_BYTES
    rows_w = touched_rows(table.rows, table.lookups_per_sample, samples, model.unique_row_fraction)
    return update + 2.0 * workers * rows_w * table.dim * PARAM_BYTES


def _aggregate_bytes(model: RecModelSpec, name: str, batch: int) -> float:
    """One tensor's aggregated update of a step, as a primary forwards it to its backup: a dense tensor
    whole, a table's rows touched by the whole batch with their keys."""
    table = next((t for t in model.tables if t.name == name), None)
    if table is None:
        return model.tensor_params()[name] * PARAM_BYTES
    rows = touched_rows(table.rows, table.lookups_per_sample, batch, model.unique_row_fraction)
    return rows * (table.dim * PARAM_BYTES + INDEX_BYTES)


def _optimizer_update_bytes(model: RecModelSpec, name: str, batch: int, optimizer: str) -> float:
    """The optimizer's share of a tensor's host-memory work per step (what a backup repeats on its copy)."""
    table = next((t for t in model.tables if t.name == name), None)
    if table is None:
        return model.tensor_params()[name] * OPTIMIZER_BYTES[optimizer]
    rows = touched_rows(table.rows, table.lookups_per_sample, batch, model.unique_row_fraction)
    return rows * table.dim * OPTIMIZER_BYTES[optimizer]


def message_times(hw: HardwareProfile, workers: int, servers: int) -> tuple[float, float]:
    """(a server's, a worker's) seconds of message handling per step. With a per-message host time
    measured by `advisor calibrate` (inter_node.message_overhead_us): a server handles the pull request,
    the answer and the push of each worker in turn, a worker the same three with each server. Without
    one, only the network's latency: a push and a pull round trip, whose latencies overlap across peers."""
    if hw.inter.message_overhead_us is None:
        latency = ROUND_TRIPS * 2 * hw.inter.latency_s
        return latency, latency
    return MESSAGES_PER_STEP * workers * hw.inter.message_s, MESSAGES_PER_STEP * servers * hw.inter.message_s


def estimate_parameter_server(model: RecModelSpec, hw: HardwareProfile, cluster: Cluster, job: TrainingJob,
                              config: RecsysConfig) -> RecEstimate:
    n, S = cluster.devices, config.servers
    b = per_device_batch(job, cluster)
    compute = worker_compute(model, hw, job, b)
    on_servers = set(config.server_tensors)
    shards = given_shards(config) or server_shards(model, config.server_tensors, S, job.optimizer, b)

    # worker side: PS traffic, and (hybrid) the collective exchange of what the servers do not hold
    w_out = w_in = rows_pulled = 0.0
    for name in config.server_tensors:
        out_b, in_b, rows = _worker_bytes(model, name, b)
        w_out, w_in = w_out + out_b, w_in + in_b
        table = next((t for t in model.tables if t.name == name), None)
        rows_pulled += rows * (table.dim if table is not None else 0)
    local_tables = tuple(t for t in model.tables if t.name not in on_servers)
    dense_local = not any(name.startswith(("bottom_mlp_", "top_mlp_")) for name in on_servers)
    ar_s = ar_nic = 0.0
    if dense_local or local_tables:
        ar_s, ar_nic = dense_exchange(model, hw, cluster, job, local_tables, b, towers=dense_local)

    # server side: traffic and host-memory work of the fullest server
    s_in, s_out, s_work, s_params = [0.0] * S, [0.0] * S, [0.0] * S, [0.0] * S
    sizes = model.tensor_params()
    for name, placed in shards.items():
        out_b, in_b, _ = _worker_bytes(model, name, b)
        work = _server_update_bytes(model, name, n, b, job.global_batch_size, job.optimizer)
        for s, share in placed:
            s_in[s] += n * out_b * share
            s_out[s] += n * in_b * share
            s_work[s] += work * share
            s_params[s] += sizes[name] * share
            if config.replicas:       # forwarded to the backup, applied there to the copy
                backup = (s + 1) % S
                forwarded = _aggregate_bytes(model, name, job.global_batch_size) * share
                s_out[s] += forwarded
                s_in[backup] += forwarded
                s_work[backup] += _optimizer_update_bytes(model, name, job.global_batch_size, job.optimizer) * share
    # with replicas, each server also holds the copy of the shard before it
    s_held = [s_params[s] + (s_params[(s - 1) % S] if config.replicas else 0.0) for s in range(S)]
    host_bw = host_memory_bytes_per_s(hw)
    nic = hw.inter.effective_bandwidth_bytes_per_s
    per_node = min(hw.node.devices_per_node, n)
    if config.server_placement == "colocated":
        local = per_node / n                    # a server's traffic with the workers of its own node
        remote_w = 1.0 - 1.0 / S                # a worker's traffic with servers on other nodes (one is beside it)
        # the slowest worker: with fewer servers than nodes, some workers have none beside them and send
        # everything over the network
        remote_worst = remote_w if S >= cluster.nodes else 1.0
        # the server's NIC is also the NIC of the worker beside it
        server_nic_s = max(max(so * (1 - local) + w_out * remote_w + ar_nic,
                               si * (1 - local) + w_in * remote_w + ar_nic)
                           for si, so in zip(s_in, s_out)) / nic
        worker_nic_s = max((max(w_out, w_in) * remote_worst + ar_nic) / nic,
                           max(w_out, w_in) / S / (hw.host.pcie_bandwidth_gbps * 1e9))
    else:
        server_nic_s = max(max(si, so) for si, so in zip(s_in, s_out)) / nic
        worker_nic_s = (max(w_out, w_in) + ar_nic) / nic
    server_update_s = max(s_work) / host_bw
    server_msgs_s, worker_msgs_s = message_times(hw, n, S)
    latency_s = max(server_msgs_s, worker_msgs_s)
    worker_handling_s, server_handling_s = ps_handling.handling_s(model, hw, shards, S, n)
    ar_exposed = exposed_after_backward(ar_s, compute.backward_s, hw)
    ps_phase = max(worker_nic_s, server_nic_s, server_update_s)
    staleness = None
    if config.synchronous:
        handling_s = worker_handling_s + server_handling_s
        step = compute.total_s + max(ps_phase + latency_s + handling_s, ar_exposed)
    else:
        # the worker handles its pieces in its own process; the servers theirs while it computes
        worker_iter = max(compute.total_s + ar_exposed + worker_handling_s, worker_nic_s + worker_msgs_s)
        step = max(worker_iter, server_nic_s, server_update_s, server_msgs_s + server_handling_s)
        handling_s = max(worker_handling_s, server_handling_s)       # the busier side's handling
        staleness = float(n)
    parts = step_parts(compute_s=compute.total_s, worker_nic_s=worker_nic_s, server_nic_s=server_nic_s,
                       server_update_s=server_update_s, allreduce_s=ar_exposed, latency_s=latency_s,
                       handling_s=handling_s)
    limit = max(parts, key=lambda k: parts[k])

    state = STATE_BYTES[job.optimizer]
    local_params = (0 if not dense_local else model.dense_params) + sum(t.params for t in local_tables)
    pulled_dense = 0 if dense_local else model.dense_params
    memory = WorkerMemory(
        parameters_gib=(local_params + pulled_dense + rows_pulled) * PARAM_BYTES / GIB,
        gradients_gib=(local_params + pulled_dense + rows_pulled) * PARAM_BYTES / GIB,
        optimizer_gib=local_params * state / GIB,
        activations_gib=activation_gib(model, job, b),
        buffers_gib=(w_out + w_in) / GIB,
    )
    fullest = max(range(S), key=lambda s: s_held[s])
    server = ServerMemory(
        parameters_gib=s_held[fullest] * PARAM_BYTES / GIB,
        optimizer_gib=s_held[fullest] * state / GIB,
        # the merged gradient plus the N pushes held until the barrier releases them (synchronous)
        buffers_gib=(n + 1) * s_in[fullest] / max(n, 1) / GIB,
    )
    capacity = hw.host.memory_gib
    reasons = []
    if server.total_gib > capacity:
        reasons.append(f"server memory {server.total_gib:.1f} GiB exceeds the {capacity:g} GiB of a {hw.name} host; "
                       f"use more servers")
    traffic = {"push_bytes_per_worker": w_out, "pull_bytes_per_worker": w_in,
               "server_in_bytes": max(s_in), "server_out_bytes": max(s_out)}
    sharding = {name: [s for s, _ in placed] for name, placed in shards.items()}
    return finish(model, hw, cluster, job, config, compute, parts, memory, step, BOTTLENECK_NAMES[limit], reasons,
                  server_memory=server, server_capacity_gib=capacity, staleness_steps=staleness,
                  traffic_bytes=traffic, sharding=sharding)

