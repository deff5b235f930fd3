"""Tied embeddings under pipelining: the first and last stages share the word embedding and all-reduce
its gradient every step (Megatron-LM's embedding group, _allreduce_embedding_grads in
megatron/core/distributed/finalize_model_grads.py)."""

from __future__ import annotations

import numpy as np

from advisor.cost import comm
from advisor.cost.placement import pipeline_neighbour_tier
from advisor.space.strategy import StrategyBatch
from advisor.specs.hardware import HardwareProfile
from advisor.specs.job import TrainingJob
from advisor.specs.model import ModelSpec


def _pair_group(tier):
    """Fan-outs of a two-member group whose members sit `tier` apart."""
    one = np.ones_like(tier, dtype=float)
    return (np.where(tier == 0, 2.0, 1.0), np.where(tier == 1, 2.0, one), np.where(tier == 2, 2.0, one))


def gradient_s(model: ModelSpec, hw: HardwareProfile, job: TrainingJob, b: StrategyBatch) -> np.ndarray:
    """Seconds per step of the first and last stages' all-reduce of the embedding gradient ((N,) arrays; 0
    without pipelining)."""
    emb_bytes = model.vocab_size * model.hidden_size / b.tp * job.grad_reduce_bytes
    ends = pipeline_neighbour_tier(hw, b, wrap=True)
    emb_s = comm.fanout_time_s(hw, "all_reduce", emb_bytes, *_pair_group(ends))
    return np.where(b.pp > 1, emb_s, 0.0)
