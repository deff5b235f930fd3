"""Activation swapping (vPipe: Zhao et al., TPDS 2022, sec. 4; MindFormers' swap_config layer_swap): a
stage's first ``swap_layers`` layers copy their saved activations to host memory once their forward is
done and fetch them back ahead of their backward.

* Memory: a swapped layer's activations leave the device for every micro-batch in flight; the
  device keeps STAGING_LAYERS layers' worth of one micro-batch for the copy in progress and the one
  prefetched ahead (MindFormers prefetches one layer ahead by default: backward_prefetch 1).
* Time: each swapped layer's activations cross PCIe twice per micro-batch (out after its forward,
  in before its backward). The copies run on their own stream under the stage's other work, so a
  micro-batch pays only what its forward and its backward cannot hide:
  max(0, bytes / bandwidth - forward) + max(0, bytes / bandwidth - backward). The bandwidth is the
  device's PCIe link, or its share of the host's memory bandwidth where that is lower (every device
  of a node swaps at once).
"""

from __future__ import annotations

import numpy as np

from advisor.space.strategy import StrategyBatch
from advisor.specs.hardware import HardwareProfile

STAGING_LAYERS = 2


def layer_bytes(dense_n, moe_n, dense_full, moe_full):
    """(N, P): one average layer's saved activations per micro-batch on each stage."""
    n = np.maximum(dense_n + moe_n, 1)
    return (dense_n * dense_full + moe_n * moe_full) / n


def saved_bytes(b: StrategyBatch, per_layer, in_flight):
    """(N, P): activation bytes swapping takes off each stage's device."""
    k = b.swap_layers.astype(float)
    return np.where(k > 0, per_layer * (k * in_flight - np.minimum(k, STAGING_LAYERS)), 0.0)


def bandwidth_bytes_per_s(hw: HardwareProfile) -> float:
    pcie = hw.host.pcie_bandwidth_gbps * 1e9
    if hw.host.memory_bandwidth_gbps:
        return min(pcie, hw.host.memory_bandwidth_gbps * 1e9 / hw.node.devices_per_node)
    return pcie


def exposed_s(hw: HardwareProfile, b: StrategyBatch, per_layer, forward_s, backward_s):
    """(N, P): seconds per micro-batch the copies add to each stage."""
    copy = b.swap_layers * per_layer / bandwidth_bytes_per_s(hw)
    return np.where(b.swap_layers > 0, np.maximum(copy - forward_s, 0.0) + np.maximum(copy - backward_s, 0.0), 0.0)
