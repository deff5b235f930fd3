"""Legality rules (advisor/space/rules.py): one test per rule, and the vectorized masks agree with
the scalar check on random strategies."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from advisor.space.rules import RULES, illegal_masks, legal_mask, violations
from advisor.space.strategy import RECOMPUTE, SCHEDULES, Strategy, StrategyBatch
from advisor.specs.job import Cluster, TrainingJob
from advisor.specs.model import model_from_dict

DENSE = model_from_dict({
    "name": "rules-dense", "source": "test", "num_layers": 8, "hidden_size": 768, "num_attention_heads": 12,
    "num_kv_heads": 4, "ffn_hidden_size": 3072, "vocab_size": 1000, "seq_length": 1024,
}, "test")
MOE = model_from_dict({
    "name": "rules-moe", "source": "test", "num_layers": 8, "hidden_size": 768, "num_attention_heads": 12,
    "num_kv_heads": 4, "ffn_hidden_size": 3072, "vocab_size": 1000, "seq_length": 1024,
    "moe": {"num_experts": 4, "top_k": 2, "expert_ffn_hidden_size": 1536},
}, "test")
ODD_FFN = model_from_dict({
    "name": "rules-odd-ffn", "source": "test", "num_layers": 8, "hidden_size": 768, "num_attention_heads": 12,
    "num_kv_heads": 4, "ffn_hidden_size": 3071, "vocab_size": 1000, "seq_length": 1024,
}, "test")
CLUSTER = Cluster(nodes=1, devices=8)
JOB = TrainingJob(global_batch_size=16, seq_length=1024)
# dp 2 x tp 2 x pp 2 on 8 devices, 16 = 2 x 2 x 4 sequences per step.
BASE = Strategy(dp=2, tp=2, pp=2, micro_batch_size=2, num_micro_batches=4)

# rule -> (model, a strategy that breaks only that rule)
BROKEN = {
    "positive degrees": (DENSE, replace(BASE, micro_batch_size=0)),
    "device count": (DENSE, replace(BASE, dp=1, num_micro_batches=8)),
    "tp divides heads": (DENSE, replace(BASE, dp=1, tp=8, pp=1, num_micro_batches=8)),    # 12 heads, 4 kv heads
    "tp divides ffn": (ODD_FFN, BASE),                                                   # ffn 3071
    "global batch": (DENSE, replace(BASE, num_micro_batches=3)),
    "sequence parallel needs tp": (DENSE, replace(BASE, dp=4, tp=1, num_micro_batches=2, sequence_parallel=True)),
    "sequence parallel divides seq": (DENSE, replace(BASE, sequence_parallel=True)),     # seq 1021 below
    "cp divides seq": (DENSE, replace(BASE, dp=1, cp=2, num_micro_batches=8)),           # seq 1021 below
    "expert parallel": (MOE, replace(BASE, ep=4)),                                        # dp x cp = 2
    "stage layers": (DENSE, replace(BASE, stage_layers=(3, 4))),
    "interleaving": (DENSE, replace(BASE, virtual_pipeline_stages=2)),                   # schedule still 1f1b
    "zero stage": (DENSE, replace(BASE, zero_stage=4)),
    "offload needs zero": (DENSE, replace(BASE, offload_optimizer=True)),
    "recompute layers": (DENSE, replace(BASE, recompute="selective", recompute_layers=2)),
    "ulysses heads": (DENSE, replace(BASE, cp_comm="a2a")),                              # cp = 1
    "recompute modules": (DENSE, replace(BASE, recompute="selective")),                  # moe_act below, dense model
    "micro-batch copies": (DENSE, replace(BASE, micro_batch_copies=3)),                  # micro-batch of 2
    "gradient bucket": (DENSE, replace(BASE, zero_stage=2, grad_bucket_mb=40.0)),        # ZeRO-2 reduces per unit
    "cuda graphs": (MOE, replace(BASE, ep=2)),                                           # whole layers, dropless
    "swap layers": (DENSE, replace(BASE, swap_layers=(5, 0))),                           # stage 0 has 4 layers
    "full batch": (DENSE, replace(BASE, full_batch=True)),                                # framework megatron
    "host embedding": (DENSE, replace(BASE, host_embedding=True)),                        # framework megatron
    "parameter offload": (DENSE, replace(BASE, zero_stage=2, offload_optimizer=True, offload_params=True)),
    "offload fraction": (DENSE, replace(BASE, zero_stage=1, offload_fraction=0.5)),         # optimizer not offloaded
    # what the job's framework runs (its record, advisor.specs.frameworks); FRAMEWORK below names it
    "framework zero": (DENSE, replace(BASE, zero_stage=2)),                              # megatron, pp = 2
    "framework schedule": (DENSE, replace(BASE, pipeline_schedule="gpipe")),             # megatron
    "framework stage layers": (DENSE, replace(BASE, virtual_pipeline_stages=2, pipeline_schedule="interleaved-1f1b",
                                              stage_layers=(3, 5))),                     # pytorch: chunks 1.5 / 2.5
    "framework context parallel": (DENSE, replace(BASE, dp=1, cp=2, num_micro_batches=8, cp_comm="a2a")),  # pytorch
    "framework sequence parallel": (DENSE, BASE),                                        # torchtitan, tp 2 without sp
    "framework mesh order": (DENSE, replace(BASE, mesh_order=("tp", "pp", "dp", "cp"))),  # megatron
    "framework recompute": (DENSE, replace(BASE, recompute="selective")),                 # deepspeed: full or none
    "framework cp attention": (DENSE, replace(BASE, dp=1, cp=2, num_micro_batches=8)),     # megatron, math attention
    "fold_experts framework": (MOE, replace(BASE, ep=4, fold_experts=True)),              # deepspeed: no folding
}
ODD_SEQ_RULES = {"sequence parallel divides seq", "cp divides seq"}
FRAMEWORK = {"framework stage layers": "pytorch", "framework context parallel": "pytorch",
             "framework sequence parallel": "torchtitan", "gradient bucket": "mindspore",
             "parameter offload": "mindspore", "framework recompute": "deepspeed",
             "fold_experts framework": "deepspeed"}


def _job(rule: str) -> TrainingJob:
    if rule in FRAMEWORK:
        return replace(JOB, framework=FRAMEWORK[rule])
    if rule == "recompute modules":
        return replace(JOB, recompute_modules=("moe_act",))
    if rule == "cuda graphs":
        return replace(JOB, cuda_graphs=("full",))
    if rule == "framework cp attention":
        return replace(JOB, attention="math")
    return TrainingJob(global_batch_size=16, seq_length=1021) if rule in ODD_SEQ_RULES else JOB


def _masks(model, job, s: Strategy) -> dict[str, bool]:
    batch = StrategyBatch.from_strategies([s], model.num_layers)
    return {name: bool(mask[0]) for name, mask in illegal_masks(model, CLUSTER, job, batch).items()}


def test_every_rule_has_a_test():
    assert set(BROKEN) == set(RULES)


def test_base_strategies_are_legal():
    assert violations(DENSE, CLUSTER, JOB, BASE) == []
    assert violations(MOE, CLUSTER, JOB, replace(BASE, ep=2)) == []


@pytest.mark.parametrize("rule", sorted(BROKEN))
def test_each_rule_rejects_its_case_and_only_that_rule_fires(rule):
    model, strategy = BROKEN[rule]
    job = _job(rule)
    fired = [name for name, hit in _masks(model, job, strategy).items() if hit]
    # A zero micro-batch size cannot also keep the global batch: that one rule fires with it.
    assert fired == [rule] or (rule == "positive degrees" and fired == [rule, "global batch"])
    sentences = violations(model, CLUSTER, job, strategy)
    assert any(RULES[rule][1] in s for s in sentences)


@pytest.mark.parametrize("rule, ok", [
    ("tp divides heads", replace(BASE, dp=1, tp=4, pp=2, num_micro_batches=8)),       # 4 divides 12 and 4
    ("interleaving", replace(BASE, virtual_pipeline_stages=2, pipeline_schedule="interleaved-1f1b")),
    ("stage layers", replace(BASE, stage_layers=(3, 5))),                              # uneven but complete
    ("expert parallel", replace(BASE, ep=2)),
    ("expert parallel", replace(BASE, ep=4, fold_experts=True)),                       # over tp x dp = 4 ranks
    ("offload needs zero", replace(BASE, zero_stage=1, offload_optimizer=True)),
    ("recompute layers", replace(BASE, recompute="full", recompute_layers=2)),
    ("cp divides seq", replace(BASE, dp=1, cp=2, num_micro_batches=8)),               # 1024 = 2 x 2 x 256
    ("ulysses heads", replace(BASE, dp=1, cp=2, num_micro_batches=8, cp_comm="a2a")),  # tp x cp = 4 divides 12 and 4
    ("swap layers", replace(BASE, swap_layers=(4, 1))),
    ("parameter offload", replace(BASE, zero_stage=3, offload_optimizer=True, offload_params=True)),
    ("offload fraction", replace(BASE, zero_stage=1, offload_optimizer=True, offload_fraction=0.5)),
])
def test_the_legal_side_of_each_rule(rule, ok):
    model = MOE if rule == "expert parallel" else DENSE
    job = replace(JOB, framework="pytorch") if rule == "parameter offload" else JOB      # not in Megatron-LM
    assert violations(model, CLUSTER, job, ok) == []


def test_full_batch_is_legal_with_mindspore():
    assert violations(DENSE, CLUSTER, replace(JOB, framework="mindspore"), replace(BASE, full_batch=True)) == []


def test_megatron_recompute_modules_must_exist_in_the_model():
    job = replace(JOB, recompute_modules=("layernorm", "moe_act"))
    selective = replace(BASE, recompute="selective")
    assert violations(MOE, CLUSTER, job, replace(selective, ep=2)) == []
    assert _masks(DENSE, job, selective)["recompute modules"]
    assert not _masks(DENSE, job, BASE)["recompute modules"]          # no selective recomputation: nothing to check
    assert _masks(MOE, replace(JOB, recompute_modules=("mla_up_proj",)), replace(selective, ep=2))["recompute modules"]


def test_cuda_graph_scopes_follow_the_model():
    whole = replace(JOB, cuda_graphs=("full",))
    assert violations(DENSE, CLUSTER, whole, BASE) == []
    assert violations(MOE, CLUSTER, replace(whole, moe_dropless=False), replace(BASE, ep=2)) == []
    router = replace(JOB, cuda_graphs=("attn", "moe_router", "moe_preprocess"))
    assert violations(MOE, CLUSTER, router, replace(BASE, ep=2)) == []
    assert _masks(DENSE, router, BASE)["cuda graphs"]


@pytest.mark.parametrize("framework, kernel, legal", [
    ("megatron", "te", True), ("megatron", "npu", True),          # TEDotProductAttention; MindSpeed's on Ascend
    ("pytorch", "sdpa", True), ("pytorch", "triton", False),      # torch's ring replaces the SDPA operators
    ("pytorch", "te", False), ("torchtitan", "sdpa", True),
    ("deepspeed", "triton", True),                                # Ulysses wraps any local attention
])
def test_context_parallelism_runs_on_the_kernels_its_framework_rings(framework, kernel, legal):
    s = replace(BASE, dp=1, cp=2, num_micro_batches=8, cp_comm="a2a" if framework == "deepspeed" else "p2p")
    job = replace(JOB, framework=framework, attention_kernel=kernel)
    assert _masks(DENSE, job, s)["framework cp attention"] == (not legal)
    assert not _masks(DENSE, job, BASE)["framework cp attention"]                     # no cp: any kernel
    if not legal:
        sentence = next(v for v in violations(DENSE, CLUSTER, job, s) if "context parallelism on this attention" in v)
        assert f"attention kernel = {kernel}" in sentence and "fused attention kernels" in sentence


def test_ulysses_needs_whole_heads_per_rank():
    # tp x cp = 8 does not divide the 4 key/value heads (nor the 12 query heads)
    s = Strategy(dp=1, tp=4, pp=1, cp=2, micro_batch_size=2, num_micro_batches=8, cp_comm="a2a")
    assert _masks(DENSE, JOB, s)["ulysses heads"]
    assert not _masks(DENSE, JOB, replace(s, cp_comm="p2p"))["ulysses heads"]


def test_recompute_layer_counts_per_stage():
    """MindFormers recomputes a count of layers per stage, fully or selectively; Megatron's count
    goes with full recomputation only."""
    mindspore = replace(JOB, framework="mindspore")
    per_stage = replace(BASE, recompute="selective", recompute_layers=(2, 1))
    assert violations(DENSE, CLUSTER, mindspore, per_stage) == []
    assert violations(DENSE, CLUSTER, mindspore, replace(per_stage, recompute="full")) == []
    assert _masks(DENSE, JOB, per_stage)["recompute layers"]                      # megatron: full only
    assert _masks(DENSE, mindspore, replace(per_stage, recompute_layers=(0, 0)))["recompute layers"]
    assert _masks(DENSE, mindspore, replace(per_stage, recompute_layers=(5, 1)))["recompute layers"]
    assert "entries but pp = 2" in violations(DENSE, CLUSTER, mindspore, replace(per_stage, recompute_layers=(1, 1, 1)))[0]


def test_interleaving_needs_micro_batches_divisible_by_pp():
    s = Strategy(dp=1, tp=2, pp=4, micro_batch_size=1, num_micro_batches=16, virtual_pipeline_stages=2,
                 pipeline_schedule="interleaved-1f1b")
    job = TrainingJob(global_batch_size=16, seq_length=1024)
    assert violations(DENSE, CLUSTER, job, s) == []
    bad = replace(s, micro_batch_size=16, num_micro_batches=1)
    assert _masks(DENSE, job, bad)["interleaving"]


def test_non_power_of_two_degrees_are_legal_where_they_divide():
    model = model_from_dict({"name": "n", "source": "t", "num_layers": 105, "hidden_size": 1536,
                             "num_attention_heads": 24, "vocab_size": 1000, "seq_length": 2048}, "t")
    cluster = Cluster(nodes=119, devices=9 * 3 * 35)
    job = TrainingJob(global_batch_size=9 * 4, seq_length=2048)
    s = Strategy(dp=9, tp=3, pp=35, micro_batch_size=1, num_micro_batches=4)
    assert violations(model, cluster, job, s) == []


# ---- vectorized vs scalar -----------------------------------------------------------------------
@st.composite
def strategies(draw):
    pp = draw(st.sampled_from([1, 2, 4, 3, 8]))
    return Strategy(
        dp=draw(st.sampled_from([1, 2, 4, 3])), tp=draw(st.sampled_from([1, 2, 4, 3, 8])), pp=pp,
        cp=draw(st.sampled_from([1, 2, 3])), ep=draw(st.sampled_from([1, 2, 4])),
        sequence_parallel=draw(st.booleans()), virtual_pipeline_stages=draw(st.sampled_from([1, 2, 3])),
        micro_batch_size=draw(st.sampled_from([1, 2, 4])), num_micro_batches=draw(st.sampled_from([1, 2, 4, 8])),
        zero_stage=draw(st.integers(0, 3)), recompute=draw(st.sampled_from(RECOMPUTE)),
        recompute_layers=draw(st.sampled_from([None, 1, 2])), pipeline_schedule=draw(st.sampled_from(SCHEDULES)),
        offload_optimizer=draw(st.booleans()),
    )


@settings(max_examples=80, deadline=None)
@given(st.lists(strategies(), min_size=1, max_size=20), st.booleans())
def test_legal_mask_agrees_with_violations(batch_of, moe):
    model = MOE if moe else DENSE
    batch = StrategyBatch.from_strategies(batch_of, model.num_layers)
    mask = legal_mask(model, CLUSTER, JOB, batch)
    expected = np.array([violations(model, CLUSTER, JOB, s) == [] for s in batch_of])
    assert (mask == expected).all()


def test_each_virtual_stage_holds_a_layer():
    """Interleaving needs a layer per model chunk; the first and last stages may give one chunk to the embedding
    or the loss (Megatron-Bridge's Llama 3.1 405B recipe: 126 layers over pp 16 x vpp 8)."""
    from advisor.commands.inputs import resolve_inputs
    from advisor.space.rules import violations

    big = resolve_inputs("llama3-405b", "dgx-h100", devices=256, global_batch_size=1536)
    s = Strategy(dp=4, tp=4, pp=16, virtual_pipeline_stages=8, pipeline_schedule="interleaved-1f1b",
                 micro_batch_size=1, num_micro_batches=384, sequence_parallel=True)
    assert "interleaving" not in " ".join(violations(big.model, big.cluster, big.job, s))
    small = resolve_inputs("llama3-8b", "dgx-h100", devices=64, global_batch_size=512)
    s = Strategy(dp=8, pp=8, virtual_pipeline_stages=8, pipeline_schedule="interleaved-1f1b",
                 micro_batch_size=1, num_micro_batches=64)      # 4 layers a stage, 8 chunks
    assert any("a layer per virtual stage" in v for v in violations(small.model, small.cluster, small.job, s))


@pytest.mark.parametrize("framework, kernel", [("megatron", "triton"), ("megatron", "sdpa"), ("torchtitan", "te"),
                                               ("torchtitan", "triton"), ("mindspore", "te"), ("mindspore", "sdpa")])
def test_an_attention_kernel_the_framework_does_not_call_is_refused(framework, kernel):
    from advisor.errors import AdvisorError

    with pytest.raises(AdvisorError, match=rf"attention_kernel'? = {kernel}: framework {framework} runs the attention "
                                           r"kernels [a-z, ]+ \(advisor/specs/frameworks.py\)"):
        replace(JOB, framework=framework, attention_kernel=kernel)


def test_every_framework_runs_its_own_default_kernel_and_its_context_parallel_kernels():
    from advisor.specs.frameworks import ATTENTION_KERNELS, FRAMEWORKS

    for fw in FRAMEWORKS.values():
        assert fw.attention_kernel in fw.attention_kernels, fw.name
        assert set(fw.attention_kernels) <= set(ATTENTION_KERNELS), fw.name
        assert set(fw.cp_attention_kernels) <= set(ATTENTION_KERNELS), fw.name
    assert FRAMEWORKS["pytorch"].attention_kernels == ATTENTION_KERNELS                  # whatever the model calls
