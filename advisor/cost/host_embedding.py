"""A transformer's word-embedding table and its lookup on the host CPU (Strategy.host_embedding).

MindSpore's Host&Device heterogeneous training (tutorials/source_en/parallel/host_device_training.md:
operators "with a huge amount of parameters" that take "very little computation", such as the
embedding lookup, run on the host with ``Primitive.set_device("CPU")``, and an optimizer whose
``target`` is "CPU" updates their parameters there) applied to the input embedding of a language
model: the table leaves the first pipeline stage's device memory (weights, gradients and optimizer
states) and the lookups cross PCIe instead. The output head keeps its own weights on the device, so
the table must not be tied to it (rule "host embedding"). Per device (one training process):

* host memory: its tensor-parallel slice of the table (vocab / tp rows, as the device table was
  vocabulary-parallel) in fp32 with the optimizer's states (Adam's two moments; ZeRO section 3.1's
  fp32 states; one for Adagrad, none for SGD) and a dense fp32 gradient of the slice, into which
  rows gathered from the other replicas are added as they come back. Every first-stage process
  keeps its own copy (data parallelism replicates it, as MindSpore's data-parallel host tables are);
  a node holds as many as it runs first-stage processes (first_stage_per_node).
* per micro-batch, on the first stage: the host gathers the rows its slice holds (fp32 read,
  activation-dtype write of the whole lookup output, zero for the rows of other slices as Megatron's
  VocabParallelEmbedding masks them) and copies the output to the device; in the backward the output
  gradient comes back and is scatter-added into the host gradient (activation-dtype read, fp32 row
  read and written). These run in line with the device work that needs them (a graph's CPU kernel), so they
  add to the first stage's micro-batch time.
* per step: the data-parallel (dp x cp) replicas of a slice combine their gradients with the cheaper
  of an all-reduce of the dense fp32 gradient and an all-gather of the rows each replica touched (at
  most its tokens; MindSpore's grad reducer gathers sparse gradients), run by the devices' collective
  library, so the data crosses PCIe to the device and back; then Adam passes over the whole slice on
  the host (the gradient read and the weight and each state read and written: exact Adam decays
  every row's moments, so no row is skipped) and the gradient is zeroed. Nothing of this is claimed
  to overlap the device's work.

Host work runs at the host's achievable memory bandwidth (the profile's, or a parameter server's
default socket; STREAM efficiency, as advisor.cost.recsys_host prices MindSpore's host tables)
shared by the node's first-stage processes, PCIe at the profile's rate.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from advisor.cost import comm
from advisor.cost.parameter_server import host_memory_bytes_per_s
from advisor.cost.placement import GroupPlacement
from advisor.cost.recsys import OPTIMIZER_BYTES, STATE_BYTES
from advisor.space.strategy import StrategyBatch
from advisor.specs.hardware import HardwareProfile
from advisor.specs.job import TrainingJob
from advisor.specs.model import ModelSpec
from advisor.specs.recommendation import INDEX_BYTES, PARAM_BYTES

# The host keeps the table, its states and its gradient in fp32 (PARAM_BYTES, as the recommendation
# models' host tables), with the recommendation models' optimizer figures (advisor.cost.recsys:
# STATE_BYTES per parameter, OPTIMIZER_BYTES of traffic per update) and row ids (INDEX_BYTES).
HOST_GRAD_BYTES = PARAM_BYTES        # fp32 gradient of the slice (and of each exchanged row element)
ROW_UPDATE_BYTES = 2 * PARAM_BYTES   # per gradient element added in: the fp32 gradient row read and written
ZERO_BYTES = PARAM_BYTES             # per parameter: the gradient cleared for the next step


def state_bytes(job: TrainingJob) -> float:
    """Host bytes per table parameter besides its gradient: the fp32 weight and the optimizer's states."""
    return PARAM_BYTES + STATE_BYTES[job.optimizer]


def update_bytes(job: TrainingJob) -> float:
    """Host traffic of the optimizer per parameter: the gradient read, the weight and each state read
    and written (advisor.cost.recsys.OPTIMIZER_BYTES)."""
    return OPTIMIZER_BYTES[job.optimizer]


@dataclass(frozen=True)
class HostEmbedding:
    """Per device, each an (N,) array: seconds added to the first stage's micro-batch, seconds added
    once per step, and host bytes."""

    micro_batch_s: np.ndarray
    step_s: np.ndarray
    host_bytes: np.ndarray
    first_per_node: np.ndarray      # processes of the fullest node that hold a table


def first_stage_per_node(hw: HardwareProfile, b: StrategyBatch, pp_group: GroupPlacement | None) -> np.ndarray:
    """First-stage processes on the node that runs most of them: the node's devices over the members
    one pipeline has there (each pipeline has one first stage). pp_group None: the fewest any mesh
    order gives (a pipeline packed into one node as far as it goes), for bounds."""
    node = np.minimum(hw.node.devices_per_node, b.dp * b.tp * b.pp * b.cp).astype(float)
    members = np.minimum(b.pp, node) if pp_group is None else pp_group.per_node
    return np.maximum(node / members, 1.0)


def node_host_bytes(host_total: np.ndarray, hosted: np.ndarray | None, devices_per_node: int,
                    first_per_node: np.ndarray | None) -> np.ndarray:
    """Host bytes of the fullest node: every process's offloaded parts, and the tables of its
    first-stage processes."""
    if hosted is None or first_per_node is None:
        return host_total * devices_per_node
    return (host_total - hosted) * devices_per_node + hosted * first_per_node


def slice_params(model: ModelSpec, b: StrategyBatch) -> np.ndarray:
    """Parameters of the table slice one process keeps on its host (vocab / tp rows), (N,)."""
    return model.vocab_size * model.hidden_size / b.tp.astype(float)


def table_host_bytes(model: ModelSpec, job: TrainingJob, b: StrategyBatch) -> np.ndarray:
    """(N,): host bytes of one process's table slice: the fp32 weights, the optimizer's states and the fp32
    gradient."""
    return slice_params(model, b) * (state_bytes(job) + HOST_GRAD_BYTES)


def host_embedding(model: ModelSpec, hw: HardwareProfile, job: TrainingJob, b: StrategyBatch,
                   dp_group: GroupPlacement, pp_group: GroupPlacement) -> HostEmbedding:
    """What placing the word embedding on the host costs each candidate (zero where it is not)."""
    on = b.host_embedding
    h = float(model.hidden_size)
    t = b.tp.astype(float)
    first = first_stage_per_node(hw, b, pp_group)
    host_bw = host_memory_bytes_per_s(hw) / first         # one first-stage process's share
    pcie = hw.host.pcie_bandwidth_gbps * 1e9
    act_bytes = job.dtype_bytes

    tokens_mb = b.micro_batch_size * job.seq_length / b.cp            # looked up per micro-batch on this rank
    own_mb = tokens_mb / t                                             # of those, rows of this slice
    forward = (own_mb * h * PARAM_BYTES + tokens_mb * h * act_bytes) / host_bw + tokens_mb * h * act_bytes / pcie
    backward = tokens_mb * h * act_bytes / pcie + own_mb * h * (act_bytes + ROW_UPDATE_BYTES) / host_bw
    micro_batch_s = forward + backward

    params = slice_params(model, b)
    n = dp_group.n.astype(float)
    # gradient rows this replica touched: at most its lookups, and at most the slice's rows
    rows_elems = np.minimum(own_mb * b.num_micro_batches, model.vocab_size / t) * h
    row_bytes = rows_elems * (HOST_GRAD_BYTES + INDEX_BYTES / h)
    dense_bytes = params * HOST_GRAD_BYTES
    dense_s = comm.group_time_s(hw, "all_reduce", dense_bytes, dp_group) + 2.0 * dense_bytes / pcie
    sparse_s = (comm.group_time_s(hw, "all_gather", n * row_bytes, dp_group) + (1.0 + n) * row_bytes / pcie
                + (n - 1.0) * rows_elems * (HOST_GRAD_BYTES + ROW_UPDATE_BYTES) / host_bw)
    exchange_s = np.where(n > 1, np.minimum(dense_s, sparse_s), 0.0)
    update_s = params * (update_bytes(job) + ZERO_BYTES) / host_bw
    step_s = exchange_s + update_s

    host_bytes = table_host_bytes(model, job, b)
    zero = np.zeros(len(b))
    return HostEmbedding(np.where(on, micro_batch_s, zero), np.where(on, step_s, zero), np.where(on, host_bytes, zero),
                         first)
