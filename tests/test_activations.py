"""Activation memory per layer, checked exactly against Korthikanti et al. 2022, Table 2.

Table 2 (bytes per layer per micro-batch, 16-bit activations, 1-byte dropout masks, math attention):
  no parallelism                      sbh (34 + 5as/h)
  tensor parallel (baseline)          sbh (10 + 24/t + 5as/(ht))
  tensor + sequence parallel          sbh (34/t + 5as/(ht))
  tensor parallel + selective         sbh (10 + 24/t)
  tensor + sequence + selective       sbh (34/t)
  full recomputation                  2sbh            (2sbh/t with sequence parallelism)
"""

from __future__ import annotations

import numpy as np
import pytest

from advisor.cost.memory import in_flight, layer_activation_terms
from advisor.space.strategy import Strategy, StrategyBatch
from advisor.specs.job import TrainingJob
from advisor.specs.model import ModelSpec

S, B, H, A = 2048, 2, 1024, 16


def gpt(num_kv_heads: int = A, ffn: int = 4 * H, act: str = "gelu") -> ModelSpec:
    return ModelSpec(name="t", source="test", num_layers=8, hidden_size=H, num_attention_heads=A,
                     num_kv_heads=num_kv_heads, ffn_hidden_size=ffn, ffn_activation=act, vocab_size=1000,
                     seq_length=S)


def per_layer(model, t, sp, recompute, dtype="fp16", attention="math", cp=1, dropout=True, framework="megatron"):
    job = TrainingJob(global_batch_size=B, seq_length=S, dtype=dtype, attention=attention, dropout=dropout,
                      framework=framework)
    s = Strategy(dp=1, tp=t, pp=1, cp=cp, sequence_parallel=sp, micro_batch_size=B, recompute=recompute)
    batch = StrategyBatch.from_strategies([s], model.num_layers)
    terms = layer_activation_terms(model, job, batch, moe_layer=False)
    return float(terms.total(batch.recompute)[0])


sbh = S * B * H


@pytest.mark.parametrize("t", [1, 2, 4, 8])
def test_table2_tensor_parallel(t):
    expected = sbh * (10 + 24 / t + 5 * A * S / (H * t))
    assert per_layer(gpt(), t, False, "none") == pytest.approx(expected, rel=1e-12)


def test_table2_no_parallelism():
    assert per_layer(gpt(), 1, False, "none") == pytest.approx(sbh * (34 + 5 * A * S / H), rel=1e-12)


@pytest.mark.parametrize("t", [2, 4, 8])
def test_table2_sequence_parallel(t):
    assert per_layer(gpt(), t, True, "none") == pytest.approx(sbh * (34 / t + 5 * A * S / (H * t)), rel=1e-12)


@pytest.mark.parametrize("t", [1, 2, 8])
def test_table2_selective(t):
    assert per_layer(gpt(), t, False, "selective") == pytest.approx(sbh * (10 + 24 / t), rel=1e-12)


@pytest.mark.parametrize("t", [2, 8])
def test_table2_sequence_parallel_selective(t):
    assert per_layer(gpt(), t, True, "selective") == pytest.approx(sbh * 34 / t, rel=1e-12)


@pytest.mark.parametrize("t,sp,expected", [(1, False, 2 * sbh), (8, False, 2 * sbh), (8, True, 2 * sbh / 8)])
def test_table2_full_recompute(t, sp, expected):
    assert per_layer(gpt(), t, sp, "full") == pytest.approx(expected, rel=1e-12)


def test_dtype_scales_activations():
    assert per_layer(gpt(), 2, False, "none", dtype="fp32") == pytest.approx(2 * per_layer(gpt(), 2, False, "none"))


def test_gqa_shrinks_key_and_value_only():
    # K and V hold 2sb*kv each instead of 2sbh: with kv = h/4 the layer saves 4sbh * 3/4 less.
    saved = per_layer(gpt(), 1, False, "none") - per_layer(gpt(num_kv_heads=A // 4), 1, False, "none")
    assert saved == pytest.approx(4 * sbh * (1 - 1 / 4))


def test_swiglu_keeps_gate_up_and_down_input():
    # GELU keeps 4sbf inside the MLP; Megatron's fused SwiGLU keeps 6sbf (gate/up 4sbf + down input 2sbf).
    f = 2 * H
    diff = per_layer(gpt(ffn=f, act="swiglu"), 1, False, "none") - per_layer(gpt(ffn=f), 1, False, "none")
    assert diff == pytest.approx(2 * S * B * f)


def test_flash_attention_keeps_no_scores():
    math = per_layer(gpt(), 1, False, "none")
    flash = per_layer(gpt(), 1, False, "none", attention="flash")
    # flash keeps the fp32 log-sum-exp (4 bytes per head and query) instead of 5as^2b
    assert math - flash == pytest.approx(5 * A * S * S * B - 4 * A * S * B)


def test_without_dropout():
    # No masks (2 x sbh) and no dropout output (2as^2b) or mask (as^2b): sbh(32 + 2as/h).
    assert per_layer(gpt(), 1, False, "none", dropout=False) == pytest.approx(sbh * (32 + 2 * A * S / H))


def test_context_parallel_splits_the_sequence():
    whole = per_layer(gpt(), 1, False, "selective")
    assert per_layer(gpt(), 1, False, "selective", cp=2) == pytest.approx(whole / 2)


def test_micro_batches_in_flight():
    def flight(pp, m, schedule, vpp=1):
        s = Strategy(dp=1, tp=1, pp=pp, num_micro_batches=m, pipeline_schedule=schedule, virtual_pipeline_stages=vpp)
        return in_flight(StrategyBatch.from_strategies([s], 24))[0, :pp]

    assert list(flight(4, 8, "1f1b")) == [4, 3, 2, 1]            # 1F1B: p - i on stage i
    assert list(flight(4, 2, "1f1b")) == [2, 2, 2, 1]            # never more than m
    assert list(flight(4, 8, "gpipe")) == [8, 8, 8, 8]           # GPipe keeps all m
    # interleaved: the first stage holds p * (1 + (p-1)/(p v)) micro-batches' worth (Korthikanti 4.2.3)
    p, v = 4, 2
    assert flight(p, 8, "interleaved-1f1b", v)[0] == pytest.approx(p * (1 + (p - 1) / (p * v)))
    assert np.all(np.diff(flight(p, 8, "interleaved-1f1b", v)) < 0)


@pytest.mark.parametrize("t", [2, 4])
def test_pytorch_sequence_parallel_keeps_gathered_inputs(t):
    # torch.distributed.tensor.parallel saves the all-gathered QKV and FC1 inputs: 2 x 2sbh(1 - 1/t) more.
    extra = per_layer(gpt(), t, True, "none", framework="pytorch") - per_layer(gpt(), t, True, "none")
    assert extra == pytest.approx(2 * 2 * sbh * (1 - 1 / t))
    assert per_layer(gpt(), t, False, "none", framework="pytorch") == per_layer(gpt(), t, False, "none")
