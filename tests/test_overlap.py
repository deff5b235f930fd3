"""Gradient reduction hidden behind the last backward, or not (TrainingJob.overlap_grad_reduce)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from advisor.cost.comm import collective_time_s
from advisor.cost.estimate import estimate
from advisor.space.strategy import Strategy
from advisor.specs.hardware import load_hardware
from advisor.specs.job import Cluster, TrainingJob
from advisor.specs.model import load_model


def test_reduce_after_backward_exposes_the_whole_all_reduce():
    model, hw = load_model("gpt3-1.3b"), load_hardware("dgx-a100-80g")
    cluster = Cluster.of(hw, nodes=4)
    s = Strategy(dp=32, tp=1, pp=1, micro_batch_size=1, num_micro_batches=1)
    job = TrainingJob(global_batch_size=32, seq_length=2048)
    hidden = estimate(model, hw, cluster, job, s).time_s["dp_comm"]
    exposed = estimate(model, hw, cluster, replace(job, overlap_grad_reduce=False), s).time_s["dp_comm"]
    # all gradients all-reduced over 32 ranks, 8 per node, in fp32: Megatron-LM accumulates and
    # reduces a bf16 model's gradients in fp32 (arguments.py: accumulate_allreduce_grads_in_fp32)
    assert job.grad_reduce_bytes == 4.0
    grad_bytes = 4.0 * model.num_params
    assert exposed == pytest.approx(float(collective_time_s(hw, "all_reduce", grad_bytes, 32, 1)), rel=0.01)
    assert hidden < exposed
