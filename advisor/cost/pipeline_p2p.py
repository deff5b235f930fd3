"""Pipeline point-to-point: activations sent forward and gradients backward between neighbouring stages.

Megatron's scatter/gather optimization sends 1/t of the activation per tensor-parallel rank (Narayanan
et al. SC'21, section 4.1); the slowest pair of neighbouring stages sets the pace, and interleaving adds
the last -> first hop. Megatron's interleaved schedule overlaps each chunk's sends and receives with the
next chunk's compute (--overlap-p2p-communication, on by default; schedules.py; the framework record's
overlaps_interleaved_p2p): only the fill and drain transfers and what a chunk's compute cannot hide stay
exposed. Otherwise every transfer waits.
"""

from __future__ import annotations

import numpy as np

from advisor.cost import comm
from advisor.cost.placement import pipeline_neighbour_tier
from advisor.space.strategy import INTERLEAVED, StrategyBatch
from advisor.specs.hardware import HardwareProfile
from advisor.specs.job import TrainingJob
from advisor.specs.model import ModelSpec


def exposed_s(model: ModelSpec, hw: HardwareProfile, job: TrainingJob, b: StrategyBatch, slowest_micro_batch_s):
    """(exposed pipeline transfer seconds per step, the neighbouring stages' tier), (N,) arrays;
    ``slowest_micro_batch_s``: the slowest stage's micro-batch time."""
    m = b.num_micro_batches.astype(float)
    p2p_bytes = b.micro_batch_size * job.seq_length / b.cp * model.hidden_size * job.dtype_bytes / b.tp
    neighbour = pipeline_neighbour_tier(hw, b, wrap=b.pipeline_schedule == INTERLEAVED)
    p2p = comm.tier_p2p_time_s(hw, p2p_bytes, neighbour)
    steady = 2.0 * m * b.virtual_pipeline_stages
    chunk_s = slowest_micro_batch_s / b.virtual_pipeline_stages / 2.0      # a chunk's forward or backward
    overlapped = ((b.pipeline_schedule == INTERLEAVED) & job.framework_record.overlaps_interleaved_p2p
                  & hw.device.overlaps_communication)
    exposed_steady = np.where(overlapped, np.maximum(p2p - chunk_s, 0.0), p2p)
    return np.where(b.pp > 1, steady * exposed_steady + 2.0 * p2p * (b.pp - 1), 0.0), neighbour
