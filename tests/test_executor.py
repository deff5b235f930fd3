"""Executor: plan reading, up-front refusals, --tiny, stage layout, the model's own pieces and the
activation accounting. Single process, fast (the multi-process matrix is test_executor_matrix.py)."""

from __future__ import annotations

import copy
import json
import math
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")

from advisor.errors import AdvisorError, InfeasibleError  # noqa: E402
from advisor.commands.execute import ExecuteOptions, prepare_plan  # noqa: E402
from advisor.executor.config import (refusals, run_config_from_dict, run_config_from_plan,  # noqa: E402
                                     run_config_to_dict, shrink_plan, with_parallel)
from advisor.executor.matrix import MATRIX, llama3_8b_plan, matrix_plans, tiny_plan  # noqa: E402
from advisor.executor.measure import ActivationTracker  # noqa: E402
from advisor.executor.model import GPT, ModelConfig, _RMSNormFn, _SwiGLUFn, cross_entropy  # noqa: E402
from advisor.executor.parallel import chunk_layout  # noqa: E402
from _cli import cli_exit_code as _cli  # noqa: E402


# ---- reading plans and refusing ----------------------------------------------------------------
def test_every_matrix_plan_reads_without_refusal():
    for name, plan in matrix_plans().items():
        cfg = run_config_from_plan(plan)
        assert cfg.parallel.world_size == plan["cluster"]["devices"], name
        assert refusals(cfg) == []


def test_run_config_round_trips_through_json():
    cfg = run_config_from_plan(tiny_plan(dict(pp=2, dp=2, num_micro_batches=4, zero_stage=1)))
    assert run_config_from_dict(json.loads(json.dumps(run_config_to_dict(cfg)))) == cfg


def test_plans_that_differ_only_in_their_layout_share_one_reference():
    """run_prepared computes one single-process reference per reference_key: the layout does not enter it,
    the batch and its micro-batch slicing do (the two runs with equal keys give the same losses to the bit)."""
    from advisor.executor.train import reference_key, run_reference

    a = run_config_from_plan(tiny_plan(dict(dp=2, micro_batch_size=2, num_micro_batches=2, zero_stage=1)), steps=2)
    b = run_config_from_plan(tiny_plan(dict(pp=2, micro_batch_size=2, num_micro_batches=4)), steps=2)
    assert a.global_batch_size == b.global_batch_size == 8 and a.parallel != b.parallel
    assert reference_key(a) == reference_key(b)
    assert run_reference(a) == run_reference(b)
    other_slicing = run_config_from_plan(tiny_plan(dict(pp=2, micro_batch_size=4, num_micro_batches=2)), steps=2)
    assert other_slicing.global_batch_size == 8 and reference_key(other_slicing) != reference_key(a)
    for changed in (replace(a, dtype="fp64"), replace(a, steps=3), replace(a, seed=7), replace(a, optimizer="sgd")):
        assert reference_key(changed) != reference_key(a)
    assert reference_key(replace(a, name="another")) == reference_key(a)


@pytest.mark.parametrize("change, field", [
    (dict(cp=2, dp=1), "parallel.cp"),
    (dict(ep=2), "parallel.ep"),
    (dict(dp=2, zero_stage=1, offload_optimizer=True), "parallel.offload_optimizer"),
    (dict(pp=2, num_micro_batches=1), "parallel.num_micro_batches"),
    (dict(pp=2, stage_layers=[3, 3]), "parallel.stage_layers"),
    (dict(pp=2, virtual_pipeline_stages=2, num_micro_batches=4), "parallel.virtual_pipeline_stages"),
    (dict(tp=3), "parallel.tp"),
    (dict(recompute="selective", recompute_layers=1), "parallel.recompute_layers"),
])
def test_unsupported_or_inconsistent_knobs_are_refused_naming_the_field(change, field):
    plan = tiny_plan(change)
    with pytest.raises(AdvisorError) as err:
        run_config_from_plan(plan)
    assert field in str(err.value)


def test_zero_bubble_with_fsdp_resharding_is_refused():
    for schedule in ("zbv-zero-bubble", "interleaved-zero-bubble", "dualpipev"):
        plan = tiny_plan(dict(pp=2, dp=2, zero_stage=3, num_micro_batches=4, virtual_pipeline_stages=2,
                              pipeline_schedule=schedule))
        with pytest.raises(AdvisorError, match="zero_stage = 3"):
            run_config_from_plan(plan)
        plan["parallel"]["zero_stage"] = 2           # without resharding it runs
        assert run_config_from_plan(plan).parallel.pipeline_schedule == schedule


def test_bf16_runs_in_mixed_precision_and_fp16_and_fp8_are_refused_by_name():
    plan = tiny_plan(dict(dp=2), training=dict(dtype="bf16"))
    cfg = run_config_from_plan(plan)
    assert cfg.dtype == "bf16" and cfg.notes == ()
    cfg = run_config_from_plan(plan, dtype="fp32")
    assert cfg.dtype == "fp32" and "instead of the plan's bf16" in cfg.notes[0]
    for dtype, why in (("fp16", "loss scaler"), ("fp8", "FP8 GEMMs")):
        with pytest.raises(AdvisorError, match=f"training.dtype = {dtype}: .*{why}"):
            run_config_from_plan(tiny_plan(dict(dp=2), training=dict(dtype=dtype)))
    with pytest.raises(AdvisorError, match="--dtype must be one of"):
        run_config_from_plan(plan, dtype="fp64")


def test_master_weight_optimizer_keeps_fp32_masters_and_moments():
    """bf16 weights and gradients (2 + 2 bytes), fp32 master, momentum and variance (12 bytes), and
    the update made on the master: bf16 weights track the fp32 trajectory instead of rounding each
    small update away."""
    from advisor.executor.parallel import make_torch_optimizer, optimizer_state_tensors
    from advisor.executor.measure import tensor_bytes

    w = torch.nn.Parameter(torch.full((1000,), 1.0, dtype=torch.bfloat16))
    opt = make_torch_optimizer("adam", 1e-4, master_weights=True)([w])
    for _ in range(50):
        w.grad = torch.ones_like(w)
        opt.step()
        opt.zero_grad()
    assert w.dtype == torch.bfloat16 and w.grad is None
    assert tensor_bytes(optimizer_state_tensors(opt)) == 12 * 1000 + 4   # master, exp_avg, exp_avg_sq + the step count
    master = opt.masters[0]
    assert float(master[0].detach()) == pytest.approx(1.0 - 50 * 1e-4, rel=1e-4)   # Adam's step is lr per step here
    assert float(w[0].detach()) == float(master[0].detach().to(torch.bfloat16))
    plain = torch.nn.Parameter(torch.full((1000,), 1.0, dtype=torch.bfloat16))
    opt = make_torch_optimizer("adam", 1e-4)([plain])
    for _ in range(50):
        plain.grad = torch.ones_like(plain)
        opt.step()
    assert float(plain[0].detach()) == 1.0   # each 1e-4 step rounds away in bf16 (its spacing below 1.0 is 2^-8)


def test_moe_models_are_refused():
    plan = tiny_plan(dict(dp=2), model=dict(moe=dict(num_experts=4, top_k=2, expert_ffn_hidden_size=64)))
    with pytest.raises(AdvisorError, match="model.moe"):
        run_config_from_plan(plan)


def test_missing_or_bad_fields_are_named():
    plan = tiny_plan(dict(dp=2))
    del plan["parallel"]["dp"]
    with pytest.raises(AdvisorError, match="parallel.dp"):
        run_config_from_plan(plan)
    plan = tiny_plan(dict(dp=2))
    plan["training"]["global_batch_size"] = 7
    with pytest.raises(AdvisorError, match="training.global_batch_size"):
        run_config_from_plan(plan)
    plan = tiny_plan(dict(dp=2))
    plan["cluster"]["devices"] = 4
    with pytest.raises(AdvisorError, match="cluster.devices"):
        run_config_from_plan(plan)


def test_nproc_must_match_the_plan_before_anything_starts():
    plan = tiny_plan(dict(dp=2))
    with pytest.raises(AdvisorError, match="--nproc 4"):
        prepare_plan(plan, "plan", ExecuteOptions(nproc=4))


def test_a_plan_that_does_not_fit_is_refused_before_starting():
    plan = tiny_plan(dict(dp=2))
    plan["hardware"]["device"]["memory_gib"] = 0.01          # 10 MiB devices: the plan cannot fit
    with pytest.raises(InfeasibleError, match="does not fit its hardware"):
        prepare_plan(plan, "plan", ExecuteOptions())


def test_a_full_size_model_that_would_not_fit_this_machine_is_refused():
    plan = _llama8b_plan()
    with pytest.raises(InfeasibleError, match="use --tiny"):
        prepare_plan(plan, "plan", ExecuteOptions(dtype="fp32", backend="gloo"))


# ---- --tiny --------------------------------------------------------------------------------------
def _llama8b_plan() -> dict:
    return llama3_8b_plan()


def test_tiny_keeps_every_parallel_knob_and_the_model_family():
    plan = _llama8b_plan()
    cfg = run_config_from_plan(plan, tiny=True, dtype="fp32")
    p, m = cfg.parallel, cfg.model
    assert (p.dp, p.tp, p.pp, p.virtual_pipeline_stages, p.num_micro_batches) == (2, 2, 2, 2, 8)
    assert (p.sequence_parallel, p.zero_stage, p.recompute, p.pipeline_schedule) == (True, 1, "selective", "interleaved-1f1b")
    assert p.mesh_order == ("pp", "dp", "cp", "tp")
    src = plan["model"]
    assert (m.ffn_activation, m.norm, m.tie_embeddings) == (src["ffn_activation"], src["norm"], src["tie_embeddings"])
    assert m.num_attention_heads // m.num_kv_heads > 1                      # still GQA
    assert m.num_layers == sum(p.stage_layers) and all(x % 2 == 0 for x in p.stage_layers)
    assert m.num_params() < 5e6
    assert refusals(cfg) == []


def test_tiny_scale_widens_and_lengthens_the_tiny_model_only():
    plan = _llama8b_plan()
    one = run_config_from_plan(plan, tiny=True, dtype="fp32")
    four = run_config_from_plan(plan, tiny=True, dtype="fp32", tiny_scale=4)
    assert four.model.hidden_size == 4 * one.model.hidden_size
    assert four.model.head_dim == 4 * one.model.head_dim
    assert four.seq_length == 4 * one.seq_length
    assert (four.model.num_layers, four.model.num_attention_heads, four.model.num_kv_heads) == (
        one.model.num_layers, one.model.num_attention_heads, one.model.num_kv_heads)
    assert four.parallel == one.parallel
    with pytest.raises(AdvisorError, match="--tiny-scale must be a positive integer"):
        run_config_from_plan(plan, tiny=True, tiny_scale=0)


def test_tiny_plan_is_predicted_and_fits():
    prep = prepare_plan(_llama8b_plan(), "plan", ExecuteOptions(tiny=True, dtype="fp32"))
    assert prep.memory_prediction["parameters"] > 0


def test_shrink_leaves_the_original_plan_alone():
    plan = _llama8b_plan()
    before = copy.deepcopy(plan)
    shrink_plan(plan)
    assert plan == before


# ---- pipeline layout ------------------------------------------------------------------------------
def test_chunk_layout_looped_and_v_shaped():
    cfg = run_config_from_plan(tiny_plan(dict(pp=2, num_micro_batches=4, virtual_pipeline_stages=2,
                                              pipeline_schedule="interleaved-1f1b")))
    assert [(s, r, ls) for s, r, ls in chunk_layout(cfg)] == [(0, 0, (0,)), (1, 1, (1,)), (2, 0, (2,)), (3, 1, (3,))]
    v = with_parallel(cfg, pipeline_schedule="zbv-zero-bubble")
    assert [r for _, r, _ in chunk_layout(v)] == [0, 1, 1, 0]
    uneven = run_config_from_plan(tiny_plan(dict(pp=2, num_micro_batches=4, stage_layers=[1, 3])))
    assert [ls for _, _, ls in chunk_layout(uneven)] == [(0,), (1, 2, 3)]


# ---- the model ------------------------------------------------------------------------------------
def _cfg(**kw) -> ModelConfig:
    base = dict(num_layers=2, hidden_size=32, num_attention_heads=4, num_kv_heads=2, ffn_hidden_size=48,
                ffn_activation="swiglu", vocab_size=64, seq_length=16, tie_embeddings=True, norm="rmsnorm")
    base.update(kw)
    return ModelConfig(**base)


def test_initialization_does_not_depend_on_the_split():
    cfg = _cfg()
    full = dict(GPT(cfg, range(2), True, True, init_seed=7).named_parameters())
    first = dict(GPT(cfg, [0], True, False, init_seed=7).named_parameters())
    last = dict(GPT(cfg, [1], False, True, init_seed=7).named_parameters())
    for name, p in {**first, **last}.items():
        ref = full["embed.tok.weight"] if name == "head.weight" else full[name]   # tied copy
        assert torch.equal(p, ref), name


def test_fused_style_rmsnorm_and_swiglu_gradients():
    x = torch.randn(2, 3, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: _RMSNormFn.apply(a, b, 1e-5), (x, w))
    g = torch.randn(2, 3, 8, dtype=torch.float64, requires_grad=True)
    u = torch.randn(2, 3, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(_SwiGLUFn.apply, (g, u))


@pytest.mark.parametrize("attention", ["math", "flash"])
def test_attention_paths_agree(attention):
    torch.manual_seed(0)
    tokens = torch.randint(0, 64, (2, 17))
    losses = {}
    for att in ("math", "flash"):
        model = GPT(_cfg(attention=att), range(2), True, True, init_seed=3)
        with torch.no_grad():
            losses[att] = float(cross_entropy(model(tokens[:, :-1]), tokens[:, 1:]))
    assert math.isclose(losses["math"], losses["flash"], rel_tol=1e-5)


# ---- activation accounting -------------------------------------------------------------------------
def expected_activation_bytes(m: ModelConfig, b: int, s: int) -> int:
    """What this engine keeps for backward per micro-batch (fp32, no parallelism, no dropout),
    tensor by tensor: Korthikanti et al.'s section 4.1 list without the dropout masks and outputs."""
    h, f, a = m.hidden_size, m.ffn_hidden_size, m.num_attention_heads
    kv = m.num_kv_heads * m.head_dim
    sb = s * b
    stats = 2 * sb if m.norm == "layernorm" else sb                       # mean+rstd, or rstd
    mlp = (3 if m.ffn_activation == "swiglu" else 2) * sb * f             # gate, up, down-in / gelu in, out
    core = a * s * s * b if m.attention == "math" else a * sb             # softmax output / log-sum-exp
    # norm1 in, qkv in, q, proj in, norm2 in, fc1 in (6 sbh) + k, v + mlp + core + norm statistics
    per_layer = 6 * sb * h + 2 * sb * kv + mlp + core + 2 * stats
    ends = 2 * sb * h + stats + sb * m.vocab_size                          # final norm in, head in, log-softmax
    extra_bytes = 2 * sb * 8                                              # token ids and targets (int64)
    if m.attention == "math":
        extra_bytes += s * s * (a // m.num_kv_heads)                       # the causal mask (bool, cached)
    if m.position_embedding == "rotary":
        extra_bytes += 2 * s * m.head_dim * 4                             # cos, sin tables (cached)
    return 4 * (m.num_layers * per_layer + ends) + extra_bytes


@pytest.mark.parametrize("kw", [
    dict(),
    dict(attention="flash"),
    dict(norm="layernorm", ffn_activation="gelu", ffn_hidden_size=128, position_embedding="learned"),
    dict(num_kv_heads=4, position_embedding="none", attention="flash"),
])
def test_saved_activation_bytes_match_the_tensor_by_tensor_count(kw):
    m = _cfg(**kw)
    model = GPT(m, range(m.num_layers), True, True)
    tracker = ActivationTracker()
    tracker.enabled = True
    tracker.watch_chunk("all", model)
    tokens = torch.randint(0, m.vocab_size, (2, m.seq_length + 1))
    with tracker.hooks():
        loss = cross_entropy(model(tokens[:, :-1]), tokens[:, 1:])
    tracker.close()
    loss.backward()
    measured = tracker.first_microbatch_bytes()
    expected = expected_activation_bytes(m, 2, m.seq_length)
    assert abs(measured - expected) / expected < 0.01, (measured, expected)
    assert tracker.live_bytes == 0            # everything saved was released by backward


def test_tracker_ignores_parameters_and_counts_checkpoint_inputs():
    from advisor.executor.parallel import apply_recompute

    m = _cfg(attention="math")
    model = GPT(m, range(2), True, True)
    tracker = ActivationTracker()
    tracker.enabled = True
    tracker.watch_chunk("all", model)
    for w in apply_recompute(model, "full", None):
        tracker.watch_checkpoint(w)
    tokens = torch.randint(0, m.vocab_size, (2, m.seq_length + 1))
    with tracker.hooks():
        loss = cross_entropy(model(tokens[:, :-1]), tokens[:, 1:])
    tracker.close()
    loss.backward()
    sb = 2 * m.seq_length
    # the two block inputs the checkpoints keep, then the final norm input and statistics, the head
    # input, the log-softmax and the token ids and targets
    expected = 4 * (2 * sb * m.hidden_size) + 4 * (2 * sb * m.hidden_size + sb + sb * m.vocab_size) + 2 * sb * 8
    assert abs(tracker.first_microbatch_bytes() - expected) / expected < 0.01


def test_matrix_covers_every_shape_with_and_without_recompute():
    shapes = {"dp", "zero1", "zero2", "zero3", "tp", "tp+sp", "pp-gpipe", "pp-1f1b", "pp-interleaved", "dp×tp",
              "pp×dp", "pp×tp", "pp×dp×tp", "cp", "dp×cp", "cp×tp", "pp×cp"}
    for shape in shapes:
        assert shape in MATRIX
        assert any(n.startswith(shape + "+") for n in MATRIX), shape
    assert all(run_config_from_plan(p).dtype == "fp32" for p in matrix_plans().values())


# ---- the command line (no processes start: every case is refused up front) ------------------------


@pytest.mark.parametrize("change, code, words", [
    (dict(ep=2, dp=1), 2, "parallel.ep = 2"),
    ("missing", 2, "plan file not found"),
    ("nproc", 2, "--nproc 3"),
    ("tiny-device", 1, "does not fit its hardware"),
])
def test_execute_refuses_with_one_sentence_and_exit_code(tmp_path, monkeypatch, capsys, change, code, words):
    plan = tiny_plan(dict(dp=2))
    args = []
    if isinstance(change, dict):
        plan = tiny_plan(change)
    elif change == "nproc":
        args = ["--nproc", "3"]
    elif change == "tiny-device":
        plan["hardware"]["device"]["memory_gib"] = 0.01
    path = tmp_path / "plan.json"
    if change != "missing":
        path.write_text(json.dumps(plan))
    assert _cli(monkeypatch, "execute", str(path), *args) == code
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err


def test_tiny_scale_needs_tiny(tmp_path, monkeypatch, capsys):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(tiny_plan(dict(dp=2))))
    assert _cli(monkeypatch, "execute", str(path), "--tiny-scale", "4") == 2
    err = capsys.readouterr().err
    assert "--tiny-scale 4 needs --tiny" in err and "Traceback" not in err


def _op_counter():
    """A TorchDispatchMode that counts the operators dispatched under it (``.n``)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.n += 1
            return func(*args, **(kwargs or {}))

    return Count()


def _layer_ops(**design) -> int:
    """Operators one executor block's forward + backward dispatches (TorchDispatchMode count)."""
    from advisor.executor.model import Block, ModelConfig

    base = dict(num_layers=1, hidden_size=32, num_attention_heads=2, num_kv_heads=2, ffn_hidden_size=64,
                ffn_activation="gelu", vocab_size=64, seq_length=8, norm="layernorm", use_bias=False,
                position_embedding="learned", attention="math")
    block = Block(ModelConfig(**{**base, **design}))
    x = torch.randn(1, 8, 32, requires_grad=True)
    block(x).sum().backward()                      # warm-up: lazy initialisation dispatches too
    count = _op_counter()
    with count:
        block(x).sum().backward()
    return count.n


def test_layer_operator_counts_are_the_cost_models():
    """advisor.cost.compute.LAYER_OPS is this count: each feature adds its operators to the base."""
    from advisor.cost.compute import LAYER_OPS

    base = _layer_ops()
    assert base == LAYER_OPS["base"]
    features = {"bias": dict(use_bias=True), "rotary": dict(position_embedding="rotary"),
                "rmsnorm": dict(norm="rmsnorm"), "gated_mlp": dict(ffn_activation="swiglu"),
                "fused_attention": dict(attention="flash")}
    for name, design in features.items():
        assert _layer_ops(**design) - base == LAYER_OPS[name], name
    llama = dict(position_embedding="rotary", norm="rmsnorm", ffn_activation="swiglu", attention="flash")
    additive = base + sum(LAYER_OPS[k] for k in ("rotary", "rmsnorm", "gated_mlp", "fused_attention"))
    assert abs(_layer_ops(**llama) - additive) <= 3


def test_training_settings_are_run_noted_or_refused_by_name():
    """#32: a training setting that changes what is computed is refused by name; one that changes only
    how fast a framework runs the same arithmetic is noted; grad_reduce_dtype is run."""
    def cfg(**training):
        return run_config_from_plan(tiny_plan(dict(dp=2), training=dict(dtype="bf16", **training)))

    for key, value, words in (("dropout", True, "no dropout"), ("recompute_modules", ["core_attn", "mlp"], "core_attn"),
                              ("fp8_recipe", "delayed", "FP8")):
        with pytest.raises(AdvisorError, match=f"training.{key} = .*{words}"):
            cfg(**{key: value})
    assert cfg(recompute_modules=["core_attn"]).notes == ()
    noted = cfg(framework="megatron", overlap_grad_reduce=True, tp_comm_overlap=True)
    assert "priced for megatron, run on PyTorch's own stack" in noted.notes[0]
    assert "overlap_grad_reduce = True, tp_comm_overlap = True" in noted.notes[1]
    assert cfg(overlap_grad_reduce=False).notes == ()      # the executor reduces after accumulation too
    assert cfg(grad_reduce_dtype="bf16").grad_reduce_dtype == "bf16"
    fp32 = run_config_from_plan(tiny_plan(dict(dp=2), training=dict(dtype="bf16", grad_reduce_dtype="bf16")),
                                dtype="fp32")
    assert fp32.grad_reduce_dtype is None and "reduced in fp32" in fp32.notes[-1]


def test_the_readme_headline_plan_is_accepted_at_tiny_scale(tmp_path, monkeypatch, capsys):
    """The README's recommendation for llama3-70b on 64 H100s (dp 1, tp 4, pp 4, cp 4, sequence parallel,
    ZeRO-1, bf16, ring attention) passes every refusal and is predicted; running its 64 ranks x 256
    micro-batches takes minutes on two cores, so it runs in benchmarks/executor_matrix.py --headline."""
    out = tmp_path / "plan.json"
    assert _cli(monkeypatch, "recommend", "--model", "llama3-70b", "--hardware", "dgx-h100", "--nodes", "8",
                "--top", "3", "--out", str(out)) == 0
    capsys.readouterr()
    plan = json.loads(out.read_text())
    assert (plan["parallel"]["cp"], plan["parallel"]["tp"], plan["parallel"]["pp"]) == (4, 4, 4)
    prep = prepare_plan(plan, "headline", ExecuteOptions(tiny=True, oversubscribe=True))
    p = prep.cfg.parallel
    assert (prep.cfg.dtype, p.world_size, p.cp, p.sequence_parallel, p.zero_stage) == ("bf16", 64, 4, True, 1)
    assert prep.cfg.seq_length % (2 * p.cp * p.tp) == 0
    stages = prep.memory_prediction["stages"]
    assert len(stages) == 4 and all(st["optimizer"] > 0 and st["host_optimizer"] == 0 for st in stages)


def test_a_block_in_copies_computes_the_whole_micro_batch_and_launches_each_copys_kernels():
    """Multi-copy (Block.copies): the same output and gradients as the uncut micro-batch (fp64), and every copy
    dispatches the block's operators itself (advisor.cost.multi_copy.launch_scale): the cut, the join and the
    gradients' accumulation over copies add a few, the rotary tables built once per block save a few."""
    from advisor.executor.model import Block, ModelConfig

    cfg = ModelConfig(num_layers=1, hidden_size=32, num_attention_heads=2, num_kv_heads=2, ffn_hidden_size=64,
                      ffn_activation="swiglu", vocab_size=64, seq_length=8, norm="rmsnorm", use_bias=False,
                      position_embedding="rotary", attention="flash")
    torch.manual_seed(0)
    block = Block(cfg).double()
    x = torch.randn(4, 8, 32, dtype=torch.float64)
    results, ops = {}, {}
    for copies in (1, 2, 4):
        block.copies = copies
        block.zero_grad(set_to_none=True)
        xi = x.clone().requires_grad_()
        block(xi).sum().backward()                 # warm-up
        block.zero_grad(set_to_none=True)
        xi = x.clone().requires_grad_()
        count = _op_counter()
        with count:
            out = block(xi)
            out.sum().backward()
        results[copies] = (out.detach(), xi.grad, [p.grad.clone() for p in block.parameters()])
        ops[copies] = count.n
    for copies in (2, 4):
        out, gx, gp = results[copies]
        assert torch.allclose(out, results[1][0], rtol=1e-12, atol=1e-12)
        assert torch.allclose(gx, results[1][1], rtol=1e-12, atol=1e-12)
        assert all(torch.allclose(a, b, rtol=1e-10, atol=1e-12) for a, b in zip(gp, results[1][2]))
        assert ops[copies] == pytest.approx(copies * ops[1], rel=0.02), ops     # 197, 395, 783 operators
