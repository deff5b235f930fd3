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
    # GPT-3 with flash attention: the reference layer's kernels less the unfused attention core's
    from advisor.cost.compute import LAYER_OPS, REFERENCE_LAYER_OPS

    factor = (REFERENCE_LAYER_OPS + LAYER_OPS["fused_attention"]) / REFERENCE_LAYER_OPS
    expected = MODEL.num_layers * (KERNELS_FORWARD + KERNELS_BACKWARD) * factor * 10e-6
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


def test_layers_of_other_designs_issue_proportionally_more_operators():
    """GPT-3's layer (LayerNorm, GELU, learned positions, biases) is the reference; a Llama layer
    adds rotary, RMSNorm and a gated MLP, and flash attention removes the unfused core."""
    from advisor.cost.compute import LAYER_OPS, REFERENCE_LAYER_OPS, layer_ops_factor

    math_job = replace(JOB, attention="math")
    assert layer_ops_factor(MODEL, math_job) == 1.0
    llama = load_model("llama3-8b")
    expected = (LAYER_OPS["base"] + LAYER_OPS["rotary"] + LAYER_OPS["rmsnorm"] + LAYER_OPS["gated_mlp"]
                + LAYER_OPS["fused_attention"]) / REFERENCE_LAYER_OPS
    assert layer_ops_factor(llama, JOB) == pytest.approx(expected)
    assert layer_ops_factor(llama, replace(JOB, attention="math")) > 1.2
    hw = _hw(launch_overhead_us=10.0, asynchronous_launch=False)
    gpt = estimate(MODEL, hw, Cluster.of(hw, nodes=1), math_job, S).time_s["host_overhead"]
    assert gpt == pytest.approx(MODEL.num_layers * (KERNELS_FORWARD + KERNELS_BACKWARD) * 10e-6)


def test_pipeline_actions_cost_per_chunk_and_micro_batch_on_cpu_ranks():
    """Each micro-batch runs a forward and a backward action per chunk on every stage."""
    cpu = _hw(launch_overhead_us=10.0, asynchronous_launch=False)
    slow = replace(cpu, device=replace(cpu.device, pipeline_action_overhead_us=(("1f1b", 300.0),
                                                                                 ("interleaved-1f1b", 500.0))))
    c = Cluster.of(cpu, nodes=1)
    pp = Strategy(dp=2, tp=1, pp=4, micro_batch_size=1, num_micro_batches=8)
    extra = (estimate(MODEL, slow, c, JOB, pp).time_s["host_overhead"]
             - estimate(MODEL, cpu, c, JOB, pp).time_s["host_overhead"])
    assert extra == pytest.approx(8 * 2 * 300e-6)             # host_overhead counts the slowest stage's micro-batches
    vpp = replace(pp, virtual_pipeline_stages=2, pipeline_schedule="interleaved-1f1b")
    extra_v = (estimate(MODEL, slow, c, JOB, vpp).time_s["host_overhead"]
               - estimate(MODEL, cpu, c, JOB, vpp).time_s["host_overhead"])
    assert extra_v == pytest.approx(8 * 2 * 2 * 500e-6)
    flat = Strategy(dp=8, tp=1, pp=1, micro_batch_size=1, num_micro_batches=1)
    assert estimate(MODEL, slow, c, JOB, flat).time_s == estimate(MODEL, cpu, c, JOB, flat).time_s


def test_unfused_optimizer_traffic_comes_from_the_profile():
    from advisor.cost.optimizer_step import ADAM_BYTES_PER_PARAM

    base = _hw()
    heavy = _hw(optimizer_bytes_per_param=2.0 * ADAM_BYTES_PER_PARAM)
    c = Cluster.of(base, nodes=1)
    assert (estimate(MODEL, heavy, c, JOB, S).time_s["optimizer"]
            == pytest.approx(2.0 * estimate(MODEL, base, c, JOB, S).time_s["optimizer"]))


# Gradients reduced in bf16, so that a step's gradient traffic hides behind one micro-batch's backward
# (Megatron-LM reduces a bf16 model's gradients in fp32 unless told otherwise).
JOB_BF16_GRADS = replace(JOB, grad_reduce_dtype="bf16")


def test_tied_embeddings_all_reduce_between_the_end_stages_only_with_pipelining():
    hw = _hw()
    JOB = JOB_BF16_GRADS
    c = Cluster.of(hw, nodes=2)
    untied = replace(MODEL, tie_embeddings=False)
    assert MODEL.tie_embeddings
    pp = Strategy(dp=4, tp=1, pp=4, micro_batch_size=1, num_micro_batches=8)
    gap = (estimate(MODEL, hw, c, JOB, pp).time_s["dp_comm"] - estimate(untied, hw, c, JOB, pp).time_s["dp_comm"])
    # a two-member all-reduce of the fp32 gradient (vocab x hidden): 2 x (1/2) x bytes / B + 2 alpha
    nbytes = MODEL.vocab_size * MODEL.hidden_size * 4
    assert gap > nbytes / (hw.inter.effective_bandwidth_bytes_per_s * 2)
    flat = Strategy(dp=16, tp=1, pp=1, micro_batch_size=1, num_micro_batches=1)
    assert estimate(MODEL, hw, c, JOB, flat).time_s["dp_comm"] == estimate(untied, hw, c, JOB, flat).time_s["dp_comm"]


def test_cpu_ranks_hide_no_communication_behind_compute():
    """overlaps_communication false (a CPU rank's one core runs both): DDP's all-reduce and FSDP's
    gathers are paid in full; on GPUs they hide behind backward and forward."""
    from advisor.cost import comm

    gpu = _hw()
    cpu = _hw(overlaps_communication=False)
    c = Cluster.of(gpu, nodes=2)
    JOB = JOB_BF16_GRADS
    ddp = Strategy(dp=16, tp=1, pp=1, micro_batch_size=1, num_micro_batches=1)
    hidden = estimate(MODEL, gpu, c, JOB, ddp).time_s["dp_comm"]
    paid = estimate(MODEL, cpu, c, JOB, ddp).time_s["dp_comm"]
    from advisor.cost.memory import state_bytes_per_param

    grads = MODEL.num_params * JOB.grad_reduce_bytes
    assert state_bytes_per_param(JOB)[1] == JOB.grad_reduce_bytes
    assert hidden == 0.0
    assert paid == pytest.approx(float(comm.collective_time_s(cpu, "all_reduce", grads, 16, 1)), rel=0.05)
    fsdp = replace(ddp, zero_stage=3)
    assert estimate(MODEL, cpu, c, JOB, fsdp).time_s["dp_comm"] > estimate(MODEL, gpu, c, JOB, fsdp).time_s["dp_comm"]


def test_zero2_reduce_scatters_every_micro_batch_and_gathers_once():
    cpu = _hw(overlaps_communication=False)
    c = Cluster.of(cpu, nodes=2)
    one = Strategy(dp=16, tp=1, pp=1, micro_batch_size=1, num_micro_batches=1, zero_stage=2)
    four = replace(one, num_micro_batches=4)
    job4 = replace(JOB, global_batch_size=64)
    t1 = estimate(MODEL, cpu, c, JOB, one).time_s["dp_comm"]
    t4 = estimate(MODEL, cpu, c, job4, four).time_s["dp_comm"]
    zero1 = estimate(MODEL, cpu, c, job4, replace(four, zero_stage=1)).time_s["dp_comm"]
    # t(m) = m x reduce-scatter + all-gather: four micro-batches add three reduce-scatters
    rs = (t4 - t1) / 3
    assert rs > 0 and t1 > rs                               # the all-gather is the rest of t1
    assert t4 > zero1                                       # ZeRO-1 reduces once per step
