"""A transformer's word-embedding table and its lookup on the host CPU (Strategy.host_embedding).

MindSpore's Host&Device heterogeneous training (tutorials/source_en/parallel/host_device_training.md:
operators "with a huge amount of parameters" that take "very little computation", such as the
embedding lookup, run on the host with ``Primitive.set_device("CPU")``, and an optimizer whose
``target`` is "CPU" updates their parameters there) applied to the input embedding of a language
model: the table leaves the first pipeline stage's device memory (weights, gradients and optimizer
states) and the lookups cross PCIe instead. The output head keeps its own weights on the device, so
the table must not be tied to it (rule "host embedding"). Per device (one training process):

* host memory: its tensor-parallel slice of the table (vocab / tp rows, as the device table was
  vocabulary-parallel) in fp32 with Adam's two moments (HOST_STATE_BYTES, ZeRO section 3.1's fp32
  states) and a dense fp32 gradient of the slice; where the replicas exchange gradient rows instead
  of the whole gradient, the gathered rows too. Every process keeps its own copy (data parallelism
  replicates it, as MindSpore's data-parallel host tables are).
* per micro-batch, on the first stage: the host gathers the rows its slice holds (fp32 read, 16-bit
  write of the whole lookup output, zero for the rows of other slices as Megatron's
  VocabParallelEmbedding masks them) and copies the output to the device; in the backward the output
  gradient comes back and is scatter-added into the host gradient (16-bit read, fp32 row read and
  written). These run in line with the device work that needs them (a graph's CPU kernel), so they
  add to the first stage's micro-batch time.
* per step: the data-parallel (dp x cp) replicas of a slice combine their gradients with the cheaper
  of an all-reduce of the dense fp32 gradient and an all-gather of the rows each replica touched (at
  most its tokens; MindSpore's grad reducer gathers sparse gradients), run by the devices' collective
  library, so the data crosses PCIe to the device and back; then Adam passes over the whole slice on
  the host (ADAM_HOST_BYTES: exact Adam decays every row's moments, so no row is skipped) and the
  gradient is zeroed. Nothing of this is claimed to overlap the device's work.

Host work runs at the host's achievable memory bandwidth (the profile's, or a parameter server's
default socket; STREAM efficiency) shared by every process of the node, PCIe at the profile's rate.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from advisor.cost import comm
from advisor.cost.parameter_server import DEFAULT_HOST_MEMORY_GBPS, HOST_MEMORY_EFFICIENCY
from advisor.cost.placement import GroupPlacement
from advisor.space.strategy import StrategyBatch
from advisor.specs.hardware import HardwareProfile
from advisor.specs.job import TrainingJob
from advisor.specs.model import ModelSpec

HOST_STATE_BYTES = 12.0       # fp32 weight, Adam's momentum and variance
HOST_GRAD_BYTES = 4.0         # fp32 gradient of the slice (and of each exchanged row element)
INDEX_BYTES = 4.0             # a row index beside each exchanged row
GATHER_BYTES = 6.0            # per looked-up element: fp32 row read, 16-bit output written
SCATTER_BYTES = 10.0          # per gradient element: 16-bit read, fp32 gradient row read and written
ADAM_HOST_BYTES = 28.0        # per parameter: gradient read 4, weight, momentum and variance read and written 24
ZERO_BYTES = 4.0              # per parameter: the gradient cleared for the next step


@dataclass(frozen=True)
class HostEmbedding:
    """Per device, each an (N,) array: seconds added to the first stage's micro-batch, seconds added
    once per step, and host bytes."""

    micro_batch_s: np.ndarray
    step_s: np.ndarray
    host_bytes: np.ndarray


def slice_params(model: ModelSpec, b: StrategyBatch) -> np.ndarray:
    """Parameters of the table slice one process keeps on its host (vocab / tp rows), (N,)."""
    return model.vocab_size * model.hidden_size / b.tp.astype(float)


def host_bandwidth_bytes_per_s(hw: HardwareProfile) -> float:
    """One process's share of its host's achievable memory bandwidth (every device's process uses it)."""
    total = (hw.host.memory_bandwidth_gbps or DEFAULT_HOST_MEMORY_GBPS) * 1e9 * HOST_MEMORY_EFFICIENCY
    return total / hw.node.devices_per_node


def host_embedding(model: ModelSpec, hw: HardwareProfile, job: TrainingJob, b: StrategyBatch,
                   dp_group: GroupPlacement) -> HostEmbedding:
    """What placing the word embedding on the host costs each candidate (zero where it is not)."""
    on = b.host_embedding
    h = float(model.hidden_size)
    t = b.tp.astype(float)
    host_bw = host_bandwidth_bytes_per_s(hw)
    pcie = hw.host.pcie_bandwidth_gbps * 1e9
    act_bytes = job.dtype_bytes

    tokens_mb = b.micro_batch_size * job.seq_length / b.cp            # looked up per micro-batch on this rank
    own_mb = tokens_mb / t                                             # of those, rows of this slice
    forward = (own_mb * h * 4.0 + tokens_mb * h * act_bytes) / host_bw + tokens_mb * h * act_bytes / pcie
    backward = tokens_mb * h * act_bytes / pcie + own_mb * h * SCATTER_BYTES / host_bw
    micro_batch_s = forward + backward

    params = slice_params(model, b)
    n = dp_group.n.astype(float)
    rows_elems = own_mb * b.num_micro_batches * h                      # gradient elements this replica touched
    row_bytes = rows_elems * (HOST_GRAD_BYTES + INDEX_BYTES / h)
    dense_bytes = params * HOST_GRAD_BYTES
    dense_s = comm.group_time_s(hw, "all_reduce", dense_bytes, dp_group) + 2.0 * dense_bytes / pcie
    sparse_s = (comm.group_time_s(hw, "all_gather", n * row_bytes, dp_group) + (1.0 + n) * row_bytes / pcie
                + (n - 1.0) * rows_elems * SCATTER_BYTES / host_bw)
    many = n > 1
    sparse = many & (sparse_s < dense_s)
    exchange_s = np.where(many, np.minimum(dense_s, sparse_s), 0.0)
    update_s = params * (ADAM_HOST_BYTES + ZERO_BYTES) / host_bw
    step_s = exchange_s + update_s

    host_bytes = params * (HOST_STATE_BYTES + HOST_GRAD_BYTES) + np.where(sparse, n * row_bytes, 0.0)
    zero = np.zeros(len(b))
    return HostEmbedding(np.where(on, micro_batch_s, zero), np.where(on, step_s, zero), np.where(on, host_bytes, zero))
