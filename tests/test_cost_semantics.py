"""The cost model's semantics for today's stacks: group placement at the estimate level, FP8 as
frameworks run it, attention priced as attention, recomputation per framework (Megatron's recompute
modules included), FSDP under pipelining, the loss's memory per framework, dropless MoE."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from advisor.cost.activations import layer_activation_terms, loss_bytes_per_logit
from advisor.cost.attention import head_width_factor
from advisor.cost.compute import layer_compute
from advisor.cost.estimate import estimate
from advisor.cost.memory import memory
from advisor.cost.recompute import kept_bytes
from advisor.errors import AdvisorError
from advisor.space.strategy import Strategy, StrategyBatch
from advisor.specs.hardware import interpolate_efficiency, load_hardware
from advisor.specs.job import Cluster, TrainingJob
from advisor.specs.model import load_model, model_from_dict

H100 = load_hardware("dgx-h100")
A100 = load_hardware("dgx-a100-80g")


def _batch(model, s: Strategy) -> StrategyBatch:
    return StrategyBatch.from_strategies([s], model.num_layers)


def _run(model, hw, devices, job, s):
    return estimate(model, hw, Cluster.of(hw, devices=devices), job, s)


# ---- exact group placement -------------------------------------------------------------------------
def test_mesh_orders_with_the_same_nodes_cost_the_same():
    """The issue's hole: megatron-1t on 3,072 A100s, dp96 tp4 pp4 cp2, ZeRO-3. [pp, dp, tp, cp] and
    [pp, dp, cp, tp] put the same ranks on the same nodes (tp x cp = one node), so they cost the same."""
    model = load_model("megatron-1t")
    job = TrainingJob(global_batch_size=1536, seq_length=2048, dtype="fp16")
    base = Strategy(dp=96, tp=4, pp=4, cp=2, sequence_parallel=True, micro_batch_size=1, num_micro_batches=16,
                    zero_stage=3, recompute="selective")
    a = _run(model, A100, 3072, job, replace(base, mesh_order=("pp", "dp", "tp", "cp")))
    b = _run(model, A100, 3072, job, replace(base, mesh_order=("pp", "dp", "cp", "tp")))
    assert a.step_time_s == pytest.approx(b.step_time_s, rel=1e-9)
    assert a.time_s == pytest.approx(b.time_s, rel=1e-9)
    # spreading the dp x cp group over more nodes (cp outside dp) must cost more, not less
    c = _run(model, A100, 3072, job, replace(base, mesh_order=("cp", "pp", "dp", "tp")))
    assert c.step_time_s > a.step_time_s


# ---- FP8 ---------------------------------------------------------------------------------------------
def _layer(model, hw, job, s, moe=False):
    return layer_compute(model, hw, job, _batch(model, s), moe)


def test_fp8_runs_only_the_linear_gemms_in_fp8():
    model = load_model("llama3-8b")
    s = Strategy(dp=8, tp=1, pp=1, micro_batch_size=1, num_micro_batches=4)
    bf16 = _layer(model, H100, TrainingJob(global_batch_size=32, seq_length=8192, dtype="bf16"), s)
    fp8 = _layer(model, H100, TrainingJob(global_batch_size=32, seq_length=8192, dtype="fp8"), s)
    # attention core: same kernel, same time; linear GEMMs: faster, but not by more than the peak ratio
    assert fp8.core_forward_s[0] == pytest.approx(bf16.core_forward_s[0])
    assert fp8.core_backward_s[0] == pytest.approx(bf16.core_backward_s[0])
    ratio = bf16.linear_forward_s[0] / fp8.linear_forward_s[0]
    assert 1.2 < ratio <= H100.device.peak_tflops["fp8"] / H100.device.peak_tflops["bf16"]
    assert fp8.forward_flops[0] == pytest.approx(bf16.forward_flops[0])


def test_fp8_scaling_recipes_pay_for_their_casts():
    model = load_model("llama3-8b")
    s = Strategy(dp=8, tp=1, pp=1, micro_batch_size=1, num_micro_batches=4)
    layers = {r: _layer(model, H100, TrainingJob(global_batch_size=32, seq_length=8192, dtype="fp8", fp8_recipe=r), s)
              for r in ("delayed", "tensorwise", "mxfp8")}
    times = {r: lc.forward_s[0] for r, lc in layers.items()}
    # current scaling reads the tensor for its amax before casting: the most traffic, so the most time
    # outside the GEMMs; MXFP8's block-scaled GEMMs are slower (7.161/6.812), which can outweigh it, as
    # in the measured B200 runs where current scaling trains 3-6% faster than MXFP8
    beyond_gemms = {r: lc.forward_s[0] - lc.linear_forward_s[0] for r, lc in layers.items()}
    assert times["tensorwise"] > times["delayed"]
    assert beyond_gemms["tensorwise"] > beyond_gemms["mxfp8"] > beyond_gemms["delayed"]
    assert layers["mxfp8"].linear_forward_s[0] > layers["tensorwise"].linear_forward_s[0]


def test_fp8_casts_follow_transformer_engine_kernels():
    """Cast bytes per recipe and producer (advisor.cost.fp8): Megatron's qkv and dense fc1 inputs are
    cast by their fused norm, every other tensor separately; MXFP8 GEMMs 7.161/6.812 slower."""
    from advisor.cost import fp8
    from advisor.cost.compute import linear_gemm_time_s

    def job(recipe, framework="megatron"):
        return TrainingJob(global_batch_size=32, seq_length=8192, dtype="fp8", fp8_recipe=recipe, framework=framework)

    # 100 elements, 30 of them norm-fused
    assert fp8.cast_bytes(job("delayed"), 100.0, True, 30.0) == pytest.approx(70 * 4 + 30 * 3)
    assert fp8.cast_bytes(job("tensorwise"), 100.0, True, 30.0) == pytest.approx(70 * 6 + 30 * 4)
    assert fp8.cast_bytes(job("mxfp8"), 100.0, True, 30.0) == pytest.approx(100 * (4 + 2 / 32))
    assert fp8.cast_bytes(job("tensorwise"), 100.0, False, 30.0) == pytest.approx(100 * 8)    # eager: all separate
    flops = np.array([1e12])
    ratio = linear_gemm_time_s(H100, job("mxfp8"), "fp8", flops) / linear_gemm_time_s(H100, job("tensorwise"), "fp8", flops)
    assert ratio[0] == pytest.approx(7.161 / 6.812)
    assert linear_gemm_time_s(H100, job("mxfp8"), "bf16", flops)[0] == pytest.approx(
        linear_gemm_time_s(H100, job("delayed"), "bf16", flops)[0])          # only FP8 GEMMs
    # the norm-fused share exists only in Megatron-Core's Transformer Engine layers: a layer's forward
    # pays more cast traffic under eager PyTorch's separate casts with current scaling than with delayed
    model = load_model("llama3-8b")
    s = Strategy(dp=8, tp=1, pp=1, micro_batch_size=1, num_micro_batches=4)
    mg = {r: _layer(model, H100, job(r), s).forward_s[0] for r in ("delayed", "tensorwise")}
    ms = {r: _layer(model, H100, job(r, "pytorch"), s).forward_s[0] for r in ("delayed", "tensorwise")}
    # per element: Megatron saves (4-3) on delayed and (6-4) on tensorwise for its norm-fused inputs
    assert (ms["tensorwise"] - ms["delayed"]) > (mg["tensorwise"] - mg["delayed"])


def test_fp8_memory_as_megatron_and_torchtitan_keep_it():
    model = load_model("llama3-8b")
    s = Strategy(dp=8, tp=1, pp=1, micro_batch_size=1, num_micro_batches=4)
    b = _batch(model, s)

    def acts(dtype, framework):
        job = TrainingJob(global_batch_size=32, seq_length=8192, dtype=dtype, framework=framework)
        return layer_activation_terms(model, job, b, moe_layer=False).parts

    mg_bf16, mg_fp8 = acts("bf16", "megatron"), acts("fp8", "megatron")
    # Transformer Engine keeps the QKV, FC1 and FC2 inputs quantized (1 byte)
    for key in ("qkv_input", "fc1_input", "fc2_input"):
        assert mg_fp8[key][0] == pytest.approx(mg_bf16[key][0] / 2)
    assert mg_fp8["norm_inputs"][0] == pytest.approx(mg_bf16["norm_inputs"][0])
    # torchao's float8 linear keeps high-precision inputs
    tt_bf16, tt_fp8 = acts("bf16", "torchtitan"), acts("fp8", "torchtitan")
    assert tt_fp8["fc1_input"][0] == pytest.approx(tt_bf16["fc1_input"][0])
    # FP8 weight copies cost memory; FP8 primary weights (fp8_param_gather) give part of it back
    job = TrainingJob(global_batch_size=32, seq_length=8192, dtype="fp8")
    plain = memory(model, job, b)
    primary = memory(model, replace(job, fp8_param_gather=True), b)
    bf16 = memory(model, replace(job, dtype="bf16"), b)
    assert plain.total[0] > bf16.total[0] - (bf16.activations[0] - plain.activations[0])
    assert primary.parameters[0] < plain.parameters[0]


# ---- attention ---------------------------------------------------------------------------------------
def test_causal_attention_does_half_the_work():
    raw = {"name": "t", "source": "test", "num_layers": 2, "hidden_size": 2048, "num_attention_heads": 16, "vocab_size": 32000,
           "seq_length": 16384}
    causal, full = model_from_dict(raw, "t"), model_from_dict({**raw, "causal": False}, "t")
    job = TrainingJob(global_batch_size=8, seq_length=16384)
    s = Strategy(dp=8, tp=1, pp=1, micro_batch_size=1, num_micro_batches=1)
    c, f = _layer(causal, H100, job, s), _layer(full, H100, job, s)
    assert c.attention_core_flops[0] == pytest.approx(f.attention_core_flops[0] / 2, rel=0.01)
    assert c.core_forward_s[0] < 0.6 * f.core_forward_s[0]
    # its own efficiency: the attention core does not run at the GEMM curve's efficiency
    achieved = f.attention_core_flops[0] / f.core_forward_s[0] / H100.device.peak_flops("bf16")
    assert achieved <= max(y for _, y in H100.device.attention_curve("te")) * (1 + 1e-12)    # float rounding


def test_attention_share_grows_with_the_sequence():
    model = load_model("llama3-8b")
    s = Strategy(dp=8, tp=1, pp=1, micro_batch_size=1, num_micro_batches=1)
    shares = []
    for seq in (2048, 8192, 32768):
        lc = _layer(model, H100, TrainingJob(global_batch_size=8, seq_length=seq), s)
        shares.append(lc.core_forward_s[0] / lc.forward_s[0])
    assert shares[0] < shares[1] < shares[2]


def test_narrow_heads_run_fused_attention_slower_per_kernel():
    raw = {"name": "t", "source": "test", "num_layers": 2, "hidden_size": 4096, "num_attention_heads": 32,
           "vocab_size": 32000, "seq_length": 8192}
    wide, narrow = model_from_dict(raw, "t"), model_from_dict({**raw, "num_attention_heads": 64}, "t")
    assert (wide.head_dim, narrow.head_dim) == (128, 64)
    s = Strategy(dp=8, tp=1, pp=1, micro_batch_size=1, num_micro_batches=1)
    for framework, kernel, ratio in (("megatron", None, 1 / 0.69), ("torchtitan", None, 1 / 0.875),
                                     ("pytorch", "triton", 1.0)):
        job = TrainingJob(global_batch_size=8, seq_length=8192, framework=framework, attention_kernel=kernel)
        w, n = _layer(wide, H100, job, s), _layer(narrow, H100, job, s)
        # the same FLOPs (heads x width), the narrow heads at the kernel's measured fraction of d = 128
        assert n.attention_core_flops[0] == pytest.approx(w.attention_core_flops[0])
        assert n.core_forward_s[0] / w.core_forward_s[0] == pytest.approx(ratio, rel=1e-9)
    # DeepSeek-V3's MLA (192-wide queries and keys, 128-wide values): the mean, 160, between 128 and 256
    mla = model_from_dict({**raw, "num_attention_heads": 128, "mla": {
        "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128}}, "t")
    assert head_width_factor(mla, "te") == pytest.approx(1 - 0.05 * np.log2(160 / 128))
    assert head_width_factor(narrow, "npu") == 1.0


def test_ring_context_parallel_attention_runs_short_kernels():
    # each ring step is a kernel over s/cp queries and an s/cp block of keys; Ulysses keeps whole
    # sequences (over heads / cp), so the same FLOPs run at the full length's efficiency
    model = load_model("llama3-8b")
    job = TrainingJob(global_batch_size=8, seq_length=8192)
    ring = Strategy(dp=1, tp=1, pp=1, cp=8, micro_batch_size=1, num_micro_batches=8)
    ring_l, a2a_l = _layer(model, A100, job, ring), _layer(model, A100, job, replace(ring, cp_comm="a2a"))
    assert ring_l.attention_core_flops[0] == pytest.approx(a2a_l.attention_core_flops[0])
    curve = A100.device.attention_curve("te")
    expected = interpolate_efficiency(curve, 8192) / interpolate_efficiency(curve, 1024)
    assert ring_l.core_forward_s[0] / a2a_l.core_forward_s[0] == pytest.approx(expected, rel=1e-9)
    assert expected > 1.2


def test_ulysses_and_ring_context_parallelism_are_both_priced():
    model = load_model("llama3-8b")
    job = TrainingJob(global_batch_size=16, seq_length=131072)
    s = Strategy(dp=2, tp=1, pp=1, cp=8, micro_batch_size=1, num_micro_batches=8, zero_stage=1, recompute="full")
    ring = _run(model, H100, 16, job, s)
    a2a = _run(model, H100, 16, job, replace(s, cp_comm="a2a"))
    assert ring.time_s["cp_comm"] > 0 and a2a.time_s["cp_comm"] > 0
    assert ring.time_s["cp_comm"] != pytest.approx(a2a.time_s["cp_comm"])


# ---- recomputation per framework ---------------------------------------------------------------------
def _kept(model, job, s, recompute, moe=False):
    b = _batch(model, replace(s, recompute=recompute))
    terms = layer_activation_terms(model, job, b, moe_layer=moe)
    return kept_bytes(terms, b.recompute, job, model.ffn_activation == "swiglu", moe_layer=moe)[0]


def test_selective_recomputation_means_what_each_framework_does():
    model = load_model("llama3-8b")
    s = Strategy(dp=8, tp=1, pp=1, micro_batch_size=1, num_micro_batches=1)
    kept = {}
    for fw in ("megatron", "torchtitan", "mindspore"):
        job = TrainingJob(global_batch_size=8, seq_length=8192, framework=fw)
        kept[fw] = {rc: _kept(model, job, s, rc) for rc in ("none", "selective", "full")}
    # Megatron's attention core with flash attention keeps no scores: nothing to drop
    assert kept["megatron"]["selective"] == pytest.approx(kept["megatron"]["none"])
    # torchtitan's op-level SAC drops every other matmul output and the memory-bound outputs
    assert kept["torchtitan"]["full"] < kept["torchtitan"]["selective"] < 0.75 * kept["torchtitan"]["none"]
    # MindFormers' select_recompute drops the SwiGLU output (the FC2 input)
    assert kept["mindspore"]["selective"] < kept["mindspore"]["none"]


def test_megatron_recompute_modules():
    model = load_model("mixtral-8x7b")
    s = Strategy(dp=8, tp=1, pp=1, ep=8, micro_batch_size=1, num_micro_batches=1)

    def kept(modules):
        job = TrainingJob(global_batch_size=8, seq_length=4096, recompute_modules=modules)
        return _kept(model, job, s, "selective", moe=True)

    none = _kept(model, TrainingJob(global_batch_size=8, seq_length=4096), s, "none", moe=True)
    assert kept(("core_attn",)) == pytest.approx(none)
    assert kept(("layernorm",)) < none
    assert kept(("moe_act",)) < none
    assert kept(("layernorm", "moe_act")) < min(kept(("layernorm",)), kept(("moe_act",)))
    # replaying the experts' activation costs time; the attention core with flash costs its kernel
    job = TrainingJob(global_batch_size=8, seq_length=4096, recompute_modules=("moe_act",))
    plain = _run(model, H100, 8, replace(job, recompute_modules=None), replace(s, recompute="none"))
    moe_act = _run(model, H100, 8, job, replace(s, recompute="selective"))
    assert moe_act.step_time_s > plain.step_time_s
    assert moe_act.memory_gib.activations < plain.memory_gib.activations


def test_recompute_modules_are_megatrons_setting():
    with pytest.raises(AdvisorError, match="Megatron"):
        TrainingJob(global_batch_size=8, seq_length=4096, framework="torchtitan", recompute_modules=("layernorm",))
    with pytest.raises(AdvisorError, match="recompute_modules"):
        TrainingJob(global_batch_size=8, seq_length=4096, recompute_modules=("mlp_everything",))


# ---- FSDP / ZeRO-3 -------------------------------------------------------------------------------------
def test_torchtitan_keeps_fsdp_weights_gathered_under_pipelining():
    model = load_model("llama3-70b")
    s = Strategy(dp=8, tp=8, pp=4, micro_batch_size=1, num_micro_batches=8, zero_stage=3, sequence_parallel=True)
    mg = TrainingJob(global_batch_size=64, seq_length=8192, framework="megatron")
    tt = replace(mg, framework="torchtitan")
    b = _batch(model, s)
    stage_params = model.num_params / (8 * 4)
    gathered = memory(model, tt, b).buffers[0] - memory(model, mg, b).buffers[0]
    # the stage's bf16 weights and fp32 accumulated gradients, held unsharded for the step
    assert gathered > 0.9 * 6 * stage_params
    # and one gather and reduce-scatter per step instead of per micro-batch
    t_mg = _run(model, H100, 256, mg, s).time_s["dp_comm"]
    t_tt = _run(model, H100, 256, tt, s).time_s["dp_comm"]
    assert t_tt <= t_mg


def test_mindspore_gathers_the_sharded_weights_under_the_next_forward():
    # MindSpore's optimizer parallel runs the weights' AllGathers interleaved with the next iteration's
    # forward, as Megatron's --overlap-param-gather; a framework without it waits for the gather
    model = load_model("llama2-13b")
    s = Strategy(dp=32, tp=1, pp=1, micro_batch_size=1, num_micro_batches=1, zero_stage=1)
    ms = TrainingJob(global_batch_size=32, seq_length=4096, framework="mindspore")
    times = {f: _run(model, A100, 32, replace(ms, framework=f), s).time_s["dp_comm"]
             for f in ("mindspore", "megatron", "pytorch")}
    assert times["mindspore"] == pytest.approx(times["megatron"], rel=1e-9)
    assert times["mindspore"] < times["pytorch"]
    # ZeRO-2 (optimizer_level level2) too; DeepSpeed stage 2 and FSDP SHARD_GRAD_OP wait for the gather
    z2 = replace(s, zero_stage=2)
    times = {f: _run(model, A100, 32, replace(ms, framework=f), z2).time_s["dp_comm"]
             for f in ("mindspore", "megatron", "pytorch")}
    assert times["mindspore"] < times["megatron"] == pytest.approx(times["pytorch"], rel=1e-9)


def test_backward_post_prefetch_exposes_the_gathers():
    model = load_model("llama2-13b")
    s = Strategy(dp=64, tp=1, pp=1, micro_batch_size=2, num_micro_batches=1, zero_stage=3)
    pre = TrainingJob(global_batch_size=128, seq_length=4096, framework="pytorch")
    post = replace(pre, fsdp_backward_prefetch="post")
    assert _run(model, A100, 64, post, s).step_time_s > _run(model, A100, 64, pre, s).step_time_s


def test_loss_memory_per_framework():
    def job(fw):
        return TrainingJob(global_batch_size=8, seq_length=8192, framework=fw)

    kept = {fw: loss_bytes_per_logit(job(fw)) for fw in ("megatron", "pytorch", "torchtitan")}
    assert kept["megatron"] == (4.0, 2.0)        # fp32 softmax, gradient written in place
    assert kept["pytorch"] == (2.0, 2.0)         # flash-attn's fused cross entropy in bf16
    assert kept["torchtitan"] == (4.0, 8.0)      # eager log_softmax + nll_loss on fp32 logits
    model = load_model("llama3-8b")
    s = Strategy(dp=8, tp=1, pp=1, micro_batch_size=2, num_micro_batches=1, zero_stage=3)
    totals = {fw: memory(model, job(fw), _batch(model, s)).activations[0] for fw in kept}
    assert totals["pytorch"] < totals["megatron"] < totals["torchtitan"]


# ---- MoE -------------------------------------------------------------------------------------------------
def test_dropless_moe_pays_its_host_synchronisation():
    model = load_model("mixtral-8x7b")
    s = Strategy(dp=8, tp=1, pp=1, ep=8, micro_batch_size=1, num_micro_batches=4, zero_stage=1)
    dropless = TrainingJob(global_batch_size=32, seq_length=4096)
    capped = replace(dropless, moe_dropless=False)
    assert _run(model, H100, 8, dropless, s).step_time_s > _run(model, H100, 8, capped, s).step_time_s


def test_fp8_moe_keeps_the_dispatched_tokens_quantized():
    model = load_model("mixtral-8x7b")
    b = _batch(model, Strategy(dp=8, tp=1, pp=1, ep=8, micro_batch_size=1, num_micro_batches=1))
    parts = {d: layer_activation_terms(model, TrainingJob(global_batch_size=8, seq_length=4096, dtype=d), b, moe_layer=True).parts
             for d in ("bf16", "fp8")}
    assert parts["fp8"]["dispatched"][0] == pytest.approx(parts["bf16"]["dispatched"][0] / 2)
    assert np.all(parts["fp8"]["router"] == parts["bf16"]["router"])
