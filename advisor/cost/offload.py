"""Optimizer and parameter offload to host memory: what the host's copies and its CPU's optimizer step
add to a step beyond what the device does meanwhile.

* Optimizer offload: gradients to the host, updated 16-bit weights back (unless they live there:
  parameter offload), and Adam on the host CPU sharing the host's memory bandwidth with the node's
  other devices (Ren et al., ZeRO-Offload, sec. 4). The host's Adam takes the longer of its memory
  traffic at the host's bandwidth and its arithmetic at the rate the framework's own CPU Adam reaches
  on that host (host.cpu_adam_params_per_s, measured by advisor calibrate with all the host's cores;
  the framework record's cpu_adam names which): all the node's devices' offloaded parameters go
  through the one host per step. With a fraction offloaded (Megatron's
  HybridDeviceOptimizer, DeepSpeed's offload ratio), the device steps its share while the host copies
  and steps the rest (HybridDeviceOptimizer.step: the GPU optimizer's kernels are queued first, the
  CPU optimizers run meanwhile): only what the host part takes beyond the device part shows.
  Megatron's HybridDeviceOptimizer copies the gradients down at the step; DeepSpeed's ZeRO-Offload
  copies each micro-batch's gradients as the backward produces them (Ren et al. sec. 4.2: the
  transfer overlaps the backward), so only what outlasts a backward shows (the framework record's
  offload_grads_at_step). The updated 16-bit weights go back after the host's step in both.
* Parameter offload (ZeRO-Infinity, Rajbhandari et al. SC'21, sec. 5-6; FSDP2's CPUOffloadPolicy):
  every micro-batch each layer's weight shard crosses PCIe before its gather, in the forward and again
  in the backward, and its gradient shard comes back after the reduce-scatter; prefetching hides the
  transfers under the stage's compute, and what outlasts it shows. The node's devices share the host's
  memory bandwidth. FSDP2 under pipelining keeps the gathered weights for the step
  (advisor.cost.memory.resharding): the shards cross once per step there.
"""

from __future__ import annotations

import numpy as np

from advisor.cost import optimizer_step
from advisor.cost.memory import resharding, state_bytes_per_param
from advisor.space.strategy import StrategyBatch
from advisor.specs.hardware import HardwareProfile
from advisor.specs.job import TrainingJob


def exposed_s(hw: HardwareProfile, job: TrainingJob, b: StrategyBatch, local, opt_s, slowest_backward_s,
              slowest_compute_s) -> np.ndarray:
    """Seconds per step the offloaded optimizer and parameters add, (N,) arrays; ``local``: the parameters
    one device updates, ``opt_s``: its own optimizer step, the slowest stage's micro-batch backward and
    compute (what the copies hide behind)."""
    m = b.num_micro_batches.astype(float)
    wb, gb, _ = state_bytes_per_param(job)
    host_share = np.where(b.offload_optimizer, b.offload_fraction, 0.0)
    pcie = hw.host.pcie_bandwidth_gbps * 1e9
    host_bw = (hw.host.memory_bandwidth_gbps or hw.host.pcie_bandwidth_gbps * hw.node.devices_per_node) * 1e9
    down = local * gb / pcie
    grads_s = np.where(job.framework_record.offload_grads_at_step, down, m * np.maximum(down - slowest_backward_s, 0.0))
    on_host = local * hw.node.devices_per_node            # parameters the node's one host steps
    rate = hw.host.cpu_adam_rate(job.framework_record.cpu_adam)
    adam_s = on_host * optimizer_step.ADAM_BYTES_PER_PARAM / host_bw
    if rate is not None:
        adam_s = np.maximum(adam_s, on_host / rate)
    host_part = host_share * (adam_s + np.where(b.offload_params, 0.0, grads_s + local * wb / pcie))
    offload_s = np.maximum(host_part - opt_s, 0.0)
    shard_bytes = local * (2.0 * wb + gb)
    shard_s = np.maximum(shard_bytes / pcie, shard_bytes * hw.node.devices_per_node / host_bw)
    fetches = np.where(resharding(job, b), m, 1.0)
    return offload_s + np.where(b.offload_params, fetches * np.maximum(shard_s - slowest_compute_s, 0.0), 0.0)
