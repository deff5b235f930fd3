"""The optimizer step's time on the device: the update of the device's (ZeRO-sharded) parameters, a
host cost per parameter tensor where the profile measured one (unfused optimizers on CPU ranks; 0 on
accelerators), and MindSpore's per-micro-batch gradient accumulation. The bytes each framework's
kernels move per parameter are advisor.cost.optimizer_step's; a share offloaded to the host is stepped
there (advisor.cost.offload)."""

from __future__ import annotations

import numpy as np

from advisor.cost import compute, optimizer_step
from advisor.space.strategy import StrategyBatch
from advisor.specs.hardware import HardwareProfile
from advisor.specs.job import TrainingJob
from advisor.specs.model import ModelSpec


def local_params(b: StrategyBatch, groups: dict, dense_max, expert_max) -> np.ndarray:
    """Parameters one device updates: its largest stage's, sharded over the data-parallel groups by ZeRO."""
    z = b.zero_stage
    n_dp, n_edp = groups["dp_cp"].n.astype(float), groups["edp"].n.astype(float)
    return dense_max / np.where(z >= 1, n_dp, 1) + expert_max / np.where(z >= 1, n_edp, 1)


def step_s(model: ModelSpec, hw: HardwareProfile, job: TrainingJob, b: StrategyBatch, local, dense_max, expert_max,
           units) -> np.ndarray:
    """Seconds of the device's optimizer step per training step, (N,) arrays; ``units``: the largest stage's
    layers (its parameter tensors)."""
    m = b.num_micro_batches.astype(float)
    # Unfused optimizers pay a host cost per parameter tensor (profile constant; 0 on accelerators).
    # (the word embedding on the host is stepped there: advisor.cost.host_embedding)
    embed_tensors = 1 + (model.position_embedding == "learned") - b.host_embedding.astype(np.int64)
    head_tensors = (2 if model.norm == "layernorm" else 1) + (not model.tie_embeddings)
    ends_t = np.where(b.pp == 1, embed_tensors + head_tensors, np.maximum(embed_tensors, head_tensors))
    tensors = units * model.parameter_tensors_per_layer(job.framework_record.one_qkv_weight) + ends_t
    opt_host = tensors * hw.device.optimizer_overhead_us_per_tensor * 1e-6
    host_share = np.where(b.offload_optimizer, b.offload_fraction, 0.0)
    opt_s = np.where(host_share < 1.0, (1.0 - host_share) * compute.optimizer_step_s(hw, local, job) + opt_host, 0.0)
    # MindSpore's per-micro-batch gradient accumulation (advisor.cost.optimizer_step), priced with the step
    accumulate_bytes = optimizer_step.accumulation_bytes_per_param(job)
    if accumulate_bytes:
        accumulated = np.where(b.zero_stage >= 2, local, dense_max + expert_max)
        opt_s = opt_s + np.where((m > 1) | (b.pp > 1), m * compute.memory_time_s(hw, accumulate_bytes * accumulated), 0.0)
    return opt_s
