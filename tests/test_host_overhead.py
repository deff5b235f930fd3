"""Host-side costs: kernel launches (hidden on accelerators, added on CPUs) and per-tensor optimizer work."""

from __future__ import annotations

from dataclasses import replace

import pytest

from advisor.cost.estimate import KERNELS_BACKWARD, KERNELS_FORWARD, estimate
from advisor.space.strategy import Strategy
from advisor.specs.hardware import load_hardware
from advisor.specs.job import Cluster, TrainingJob
from advisor.specs.model import load_model

MODEL = load_model("gpt3-1.3b")
JOB = TrainingJob(global_batch_size=8, seq_length=2048)
S = Strategy(dp=8, tp=1, pp=1, micro_batch_size=1, num_micro_batches=1)


def _hw(**device):
    hw = load_hardware("dgx-a100-80g")
    return replace(hw, device=replace(hw.device, **device))


def test_synchronous_launch_adds_every_kernel():
    hw = _hw(launch_overhead_us=10.0, asynchronous_launch=False)
    e = estimate(MODEL, hw, Cluster.of(hw, nodes=1), JOB, S)
    expected = MODEL.num_layers * (KERNELS_FORWARD + KERNELS_BACKWARD) * 10e-6
    assert e.time_s["host_overhead"] == pytest.approx(expected)


def test_asynchronous_launch_hides_behind_device_time():
    hw = _hw(launch_overhead_us=10.0, asynchronous_launch=True)
    assert estimate(MODEL, hw, Cluster.of(hw, nodes=1), JOB, S).time_s["host_overhead"] == 0.0


def test_unfused_optimizer_pays_per_parameter_tensor():
    base = _hw()
    slow = _hw(optimizer_overhead_us_per_tensor=20.0)
    c = Cluster.of(base, nodes=1)
    extra = estimate(MODEL, slow, c, JOB, S).time_s["optimizer"] - estimate(MODEL, base, c, JOB, S).time_s["optimizer"]
    # Megatron layout: fused QKV; biases and LayerNorm: 2 norms x 2 + (2 + 2) x 2 = 12 per layer;
    # ends: token + position embedding (2), final norm (2), tied head (0)
    tensors = MODEL.num_layers * 12 + 4
    assert MODEL.parameter_tensors_per_layer(fused_qkv=True) == 12
    assert extra == pytest.approx(tensors * 20e-6)
