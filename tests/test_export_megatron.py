"""Megatron-LM export, checked against Megatron-LM's own vocabulary.

Megatron-LM is not installable on this CPU machine (it needs CUDA, Transformer Engine and Apex), so
every flag of the export is checked against a table transcribed from NVIDIA/Megatron-LM
megatron/training/arguments.py (commit 000c4ac24f61159c138b0975def722c65245983c): the flag name, whether
it takes a value, its type and its choices. The table builds an argparse parser with
allow_abbrev=False, as Megatron's parse_args does, so an unknown or misspelled flag fails. The
checks Megatron's validate_args applies to these flags are re-stated below with the source line they
come from. The custom pipeline layout is parsed with the grammar of
megatron/core/transformer/pipeline_parallel_layer_layout.py (parse_str_to_list).
"""

from __future__ import annotations

import argparse
import re
import shlex
import shutil
import subprocess

import pytest

from _export_plans import plans
from advisor.export import export_plan
from advisor.export._recompute import CORE_ATTENTION, FULL, NONE, priced_recompute
from advisor.export.megatron import GROUPS, megatron_launch

ARGUMENTS_PY = "NVIDIA/Megatron-LM megatron/training/arguments.py @ 000c4ac24f61159c138b0975def722c65245983c"

# flag -> (type, choices[, nargs]); type None = store_true/store_false. Transcribed from ARGUMENTS_PY.
MEGATRON_FLAGS: dict[str, tuple] = {
    # _add_distributed_args
    "--tensor-model-parallel-size": (int, None),
    "--pipeline-model-parallel-size": (int, None),
    "--decoder-first-pipeline-num-layers": (int, None),
    "--decoder-last-pipeline-num-layers": (int, None),
    "--pipeline-model-parallel-layout": (str, None),
    "--num-layers-per-virtual-pipeline-stage": (int, None),
    "--num-virtual-stages-per-pipeline-rank": (int, None),
    "--overlap-grad-reduce": (None, None),
    "--overlap-param-gather": (None, None),
    "--use-distributed-optimizer": (None, None),
    "--use-megatron-fsdp": (None, None),
    "--data-parallel-sharding-strategy": (str, ("no_shard", "optim", "optim_grads", "optim_grads_params")),
    "--context-parallel-size": (int, None),
    "--cp-comm-type": (str, None, "+"),                 # p2p, a2a, allgather, a2a+p2p
    "--use-tp-pp-dp-mapping": (None, None),
    # _add_training_args
    "--micro-batch-size": (int, None),
    "--global-batch-size": (int, None),
    "--recompute-granularity": (str, ("full", "selective")),
    "--recompute-method": (str, ("uniform", "block")),
    "--recompute-num-layers": (int, None),
    "--recompute-modules": (str, None, "*"),            # core_attn, moe_act, layernorm, mla_up_proj, ...
    "--kv-channels": (int, None),
    "--moe-grouped-gemm": (None, None),
    "--train-iters": (int, None),
    "--optimizer": (str, ("adam", "sgd", "muon", "dist_muon")),
    "--optimizer-cpu-offload": (None, None),
    "--optimizer-offload-fraction": (float, None),
    "--sequence-parallel": (None, None),
    "--no-gradient-accumulation-fusion": (None, None),
    "--disable-bias-linear": (None, None),
    # _add_checkpointing_args
    "--ckpt-format": (str, ("torch", "torch_dist", "zarr", "torch_dcp", "fsdp_dtensor")),
    # _add_mixed_precision_args
    "--fp16": (None, None),
    "--bf16": (None, None),
    # _add_transformer_engine_args
    "--fp8-format": (str, ("e4m3", "hybrid")),
    "--fp8-recipe": (str, ("tensorwise", "delayed", "mxfp8", "blockwise", "custom")),
    "--fp8-param-gather": (None, None),
    "--fp4-format": (str, ("e2m1",)),                   # Megatron-Core 0.15 (dest fp4)
    "--fp4-recipe": (str, ("nvfp4",)),
    "--tp-comm-overlap": (None, None),
    "--grad-reduce-in-bf16": (None, None),
    # _add_training_args (CUDA graphs)
    "--cuda-graph-impl": (str, ("none", "local", "transformer_engine")),
    "--cuda-graph-scope": (str, ("full", "attn", "full_iteration")),
    "--external-cuda-graph": (None, None),
    "--enable-cuda-graph": (None, None),
    "--te-rng-tracker": (None, None),
    "--no-check-for-nan-in-loss-and-grad": (None, None),     # store_false, dest check_for_nan_in_loss_and_grad
    # _add_network_size_args
    "--num-layers": (int, None),
    "--hidden-size": (int, None),
    "--ffn-hidden-size": (int, None),
    "--num-attention-heads": (int, None),
    "--attention-backend": (str, ("flash", "fused", "unfused", "local", "auto")),   # AttnBackend members
    "--group-query-attention": (None, None),
    "--num-query-groups": (int, None),
    "--max-position-embeddings": (int, None),
    "--position-embedding-type": (str, ("learned_absolute", "rope", "mrope", "relative", "none")),
    "--normalization": (str, ("LayerNorm", "RMSNorm")),
    "--swiglu": (None, None),
    "--untie-embeddings-and-output-weights": (None, None),
    # _add_data_args / _add_tokenizer_args
    "--seq-length": (int, None),
    "--mock-data": (None, None),
    "--no-create-attention-mask-in-dataloader": (None, None),     # store_false, dest create_attention_mask_in_dataloader
    "--vocab-size": (int, None),
    "--tokenizer-type": (str, ("BertWordPieceLowerCase", "BertWordPieceCase", "GPT2BPETokenizer",
                               "SentencePieceTokenizer", "GPTSentencePieceTokenizer", "HuggingFaceTokenizer",
                               "Llama2Tokenizer", "TikTokenizer", "MultimodalTokenizer", "NullTokenizer",
                               "NullMultimodalTokenizer", "SFTTokenizer")),
    # _add_learning_rate_args / _add_regularization_args
    "--lr": (float, None),
    "--min-lr": (float, None),
    "--lr-decay-style": (str, ("constant", "linear", "cosine", "inverse-square-root", "WSD")),
    "--weight-decay": (float, None),
    "--attention-dropout": (float, None),
    "--hidden-dropout": (float, None),
    "--clip-grad": (float, None),
    # _add_experimental_args
    "--use-precision-aware-optimizer": (None, None),
    # _add_moe_args
    "--expert-model-parallel-size": (int, None),
    "--num-experts": (int, None),
    "--moe-layer-freq": (str, None),
    "--moe-ffn-hidden-size": (int, None),
    "--moe-shared-expert-intermediate-size": (int, None),
    "--expert-tensor-parallel-size": (int, None),
    # _add_mla_args and the attention arguments (window attention: --window-size takes tuple_type "W,0")
    "--multi-latent-attention": (None, None),
    "--q-lora-rank": (int, None),
    "--kv-lora-rank": (int, None),
    "--qk-head-dim": (int, None),
    "--qk-pos-emb-head-dim": (int, None),
    "--v-head-dim": (int, None),
    "--window-size": (str, None),
    "--window-attn-skip-freq": (str, None),
    "--moe-router-topk": (int, None),
    "--moe-token-dispatcher-type": (str, ("allgather", "alltoall", "flex")),
    "--moe-expert-capacity-factor": (float, None),
    "--moe-pad-expert-input-to-capacity": (None, None),
    # _add_logging_args / _add_validation_args
    "--log-interval": (int, None),
    "--log-throughput": (None, None),
    "--eval-iters": (int, None),
}


def megatron_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(allow_abbrev=False, exit_on_error=False)
    for flag, (kind, choices, *nargs) in MEGATRON_FLAGS.items():
        if kind is None:
            parser.add_argument(flag, action="store_true")
        else:
            parser.add_argument(flag, type=kind, choices=choices, nargs=nargs[0] if nargs else None)
    return parser


def parse_script(text: str) -> dict[str, list[str]]:
    """The bash arrays of the launch script, with ${VAR:-default} replaced by its default."""
    arrays = {}
    for name, body in re.findall(r"^(\w+)=\(\n(.*?)^\)$", text, flags=re.S | re.M):
        body = re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", body)
        arrays[name] = shlex.split(body)
    return arrays


def parse_layout(layout: str) -> list[list[str]]:
    """pipeline_parallel_layer_layout.py parse_str_to_list: cosmetic commas, (..)*n and x*n unrolled."""
    s = layout.replace(",", "")
    for pattern in (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)"):
        s = re.sub(pattern, lambda m: m.group(1) * int(m.group(2)), s)
    stages = [list(stage) for stage in s.split("|")]
    assert all(ch in "ELtm" for stage in stages for ch in stage), layout
    return stages


def eval_moe_pattern(text: str) -> list[int] | int:
    """arguments.py moe_freq_type / _eval_pattern: an int, or a list expression of , digits [ ] ( ) + *."""
    if "[" not in text:
        return int(text)
    assert not re.search(r"[^,\d\[\]\(\)\+\*]", text), text
    return eval(text)  # noqa: S307 - the same restricted evaluation Megatron performs


@pytest.fixture(scope="module")
def exported():
    return {name: (plan, export_plan(plan, "megatron")) for name, plan in plans().items()}


def test_every_flag_is_a_megatron_flag(exported):
    parser = megatron_parser()
    for name, (plan, result) in exported.items():
        arrays = parse_script(result.files["megatron_pretrain_gpt.sh"])
        args = [a for g in GROUPS for a in arrays[g]]
        try:
            parser.parse_args(args)
        except (argparse.ArgumentError, SystemExit) as exc:   # pragma: no cover - shows the bad flag
            pytest.fail(f"{name}: {exc} (flags per {ARGUMENTS_PY})")
        assert args == megatron_launch(plan).args(), name


def test_validate_args_rules(exported):
    parser = megatron_parser()
    for name, (plan, result) in exported.items():
        s, m, j = plan.strategy, plan.model, plan.training
        text = result.files["megatron_pretrain_gpt.sh"]
        arrays = parse_script(text)
        a = parser.parse_args([x for g in GROUPS for x in arrays[g]])
        dist = arrays["DISTRIBUTED_ARGS"]
        world = int(dist[dist.index("--nnodes") + 1]) * int(dist[dist.index("--nproc-per-node") + 1])
        model_size = a.tensor_model_parallel_size * a.pipeline_model_parallel_size * a.context_parallel_size
        # validate_args: world size divisible by tp x pp x cp; dp = world / (tp x pp x cp)
        assert world % model_size == 0, name
        if plan.cluster.devices % plan.cluster.nodes == 0:
            assert world // model_size == s.dp, name
            assert a.global_batch_size % (a.micro_batch_size * s.dp) == 0, name
            assert a.global_batch_size // (a.micro_batch_size * s.dp) == s.num_micro_batches, name
        # no more than one of the three virtual-pipeline options
        assert sum(x is not None for x in (a.num_layers_per_virtual_pipeline_stage, a.num_virtual_stages_per_pipeline_rank,
                                           a.pipeline_model_parallel_layout)) <= 1, name
        if a.pipeline_model_parallel_layout is not None:
            stages = parse_layout(a.pipeline_model_parallel_layout)
            flat = [x for st in stages for x in st]
            assert len(stages) % a.pipeline_model_parallel_size == 0
            assert flat[0] == "E" and flat[-1] == "L" and flat.count("E") == 1 and flat.count("L") == 1, name
            assert flat.count("t") == a.num_layers == m.num_layers, name
            vpp = len(stages) // a.pipeline_model_parallel_size
            assert vpp == s.virtual_pipeline_stages, name
            per_rank = [sum(stages[v * s.pp + p].count("t") for v in range(vpp)) for p in range(s.pp)]
            assert per_rank == list(s.resolved_stage_layers(m.num_layers)), name
        elif a.num_layers_per_virtual_pipeline_stage is not None:
            assert a.num_layers % a.pipeline_model_parallel_size == 0
            per_stage = a.num_layers // a.pipeline_model_parallel_size
            assert per_stage % a.num_layers_per_virtual_pipeline_stage == 0
            assert per_stage // a.num_layers_per_virtual_pipeline_stage == s.virtual_pipeline_stages, name
        else:
            assert a.num_layers % a.pipeline_model_parallel_size == 0, name
            assert s.virtual_pipeline_stages == 1
        if a.context_parallel_size > 1:
            assert a.seq_length % (2 * a.context_parallel_size) == 0
        assert a.max_position_embeddings >= a.seq_length
        if a.recompute_granularity == "selective":
            assert a.recompute_method is None
        if a.optimizer_cpu_offload:
            assert a.use_precision_aware_optimizer
        if a.use_megatron_fsdp:
            assert a.ckpt_format == "fsdp_dtensor"
        if a.overlap_param_gather:
            assert (a.use_distributed_optimizer or a.use_megatron_fsdp) and a.overlap_grad_reduce
        assert not (a.fp16 and a.bf16)
        if a.expert_model_parallel_size and a.expert_model_parallel_size > 1:
            assert a.num_experts % a.expert_model_parallel_size == 0 and not a.fp16
        if (a.tensor_model_parallel_size > 1 or a.context_parallel_size > 1) and not a.use_megatron_fsdp:
            assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in text, name
        if a.num_experts is not None:
            pattern = eval_moe_pattern(a.moe_layer_freq)
            if isinstance(pattern, list):
                assert len(pattern) == m.num_layers and sum(pattern) == m.num_moe_layers
        # the plan's degrees and knobs are all there
        assert (a.tensor_model_parallel_size, a.pipeline_model_parallel_size, a.context_parallel_size) == (s.tp, s.pp, s.cp)
        assert a.sequence_parallel == s.sequence_parallel
        assert (a.micro_batch_size, a.global_batch_size, a.seq_length) == (s.micro_batch_size, j.global_batch_size,
                                                                           j.seq_length)
        # the priced recomputation, or none written and the reason reported (advisor.export._recompute)
        priced = priced_recompute(plan)
        if priced.kind in (NONE, FULL, CORE_ATTENTION):
            assert a.recompute_granularity == {NONE: None, FULL: "full", CORE_ATTENTION: "selective"}[priced.kind]
        else:
            assert a.recompute_granularity is None
            assert "parallel.recompute" in " ".join(megatron_launch(plan).unsupported), name
        assert a.use_distributed_optimizer == (s.zero_stage >= 1)
        assert a.optimizer_cpu_offload == s.offload_optimizer
        assert (a.num_layers, a.hidden_size, a.num_attention_heads) == (m.num_layers, m.hidden_size, m.num_attention_heads)
        if m.num_kv_heads != m.num_attention_heads:
            assert a.group_query_attention and a.num_query_groups == m.num_kv_heads


def test_activation_swap_is_reported_with_megatrons_own_reason():
    """Swapped layers (priced as Megatron-Core's cpu_offloading at pp 1 in the calibration runs): the target
    releases' command line cannot ask for them, so the export says why, from the framework record, and does not
    write a flag Megatron-LM 0.13-0.15 would refuse."""
    from dataclasses import replace

    plan = plans()["llama8b_cuda_graphs_attn"]
    swapped = replace(plan, strategy=replace(plan.strategy, pp=1, stage_layers=None, recompute="none",
                                             recompute_layers=None, swap_layers=(8,)))
    result = export_plan(swapped, "megatron")
    reason = [u for u in result.unsupported if u.startswith("parallel.swap_layers = [8]")]
    assert len(reason) == 1 and "core_v0.16.0" in reason[0] and "will not fit as priced" in reason[0]
    assert "cpu-offloading" not in " ".join(megatron_launch(swapped).args())


def test_cuda_graphs_map_to_transformer_engine_graphs():
    from dataclasses import replace

    plan = plans()["llama8b_cuda_graphs_attn"]
    a = megatron_parser().parse_args(megatron_launch(plan).args())
    assert (a.cuda_graph_impl, a.cuda_graph_scope, a.external_cuda_graph) == ("transformer_engine", "attn", False)
    # before 0.15 the TE implementation is --external-cuda-graph (arguments.py at core_v0.14.0)
    a = megatron_parser().parse_args(megatron_launch(plan, "0.14").args())
    assert (a.cuda_graph_impl, a.cuda_graph_scope, a.external_cuda_graph) == (None, "attn", True)
    # scopes the target releases do not have are reported, not written
    moe = plans()["mixtral_recompute_modules"]
    moe = replace(moe, training=replace(moe.training, cuda_graphs=("attn", "moe_router")))
    launch = megatron_launch(moe)
    assert "--cuda-graph-scope" not in launch.args()
    assert any("training.cuda_graphs = attn, moe_router" in u for u in launch.unsupported)
    # one graph per iteration: the local implementation, which validate_args wants without the NaN check
    whole = replace(plan, training=replace(plan.training, cuda_graphs=("full_iteration",)))
    a = megatron_parser().parse_args(megatron_launch(whole).args())
    assert (a.cuda_graph_impl, a.cuda_graph_scope, a.no_check_for_nan_in_loss_and_grad) == ("local", "full_iteration", True)
    a = megatron_parser().parse_args(megatron_launch(whole, "0.14").args())
    assert (a.enable_cuda_graph, a.cuda_graph_scope) == (True, "full_iteration")
    assert "--cuda-graph-scope" not in megatron_launch(whole, "0.13").args()


def test_zero_stages_map_to_megatron_sharding():
    p = plans()
    a = megatron_parser().parse_args(megatron_launch(p["llama8b_cp_zero3_offload"]).args())
    assert a.use_megatron_fsdp and a.data_parallel_sharding_strategy == "optim_grads_params"
    a = megatron_parser().parse_args(megatron_launch(p["llama7b_zero2_pp"]).args())
    assert a.use_megatron_fsdp and a.data_parallel_sharding_strategy == "optim_grads"
    a = megatron_parser().parse_args(megatron_launch(p["gpt3_gpipe_fp16"]).args())
    assert not a.use_distributed_optimizer and not a.use_megatron_fsdp and a.fp16


def test_unexpressible_features_are_reported(exported):
    def unsupported(name):
        return " ".join(exported[name][1].unsupported)

    assert "gpipe" in unsupported("gpt3_gpipe_fp16")                          # Megatron runs 1F1B only
    assert "mesh_order" in unsupported("llama8b_cp_zero3_offload")            # not a Megatron rank order
    assert "zero_stage = 2" in unsupported("llama7b_zero2_pp")                # FSDP with pipeline parallelism
    assert "--use-tp-pp-dp-mapping" in exported["llama7b_zero2_pp"][1].files["megatron_pretrain_gpt.sh"]
    assert "mesh_order" not in unsupported("llama7b_zero2_pp")                # expressible by that flag
    assert exported["llama70b_uneven_pp"][1].unsupported == ()
    assert "9 on 2 nodes" in unsupported("llama8b_partial_node")


def test_gpt3_style_model_flags(exported):
    a = megatron_parser().parse_args(megatron_launch(plans()["gpt3_gpipe_fp16"]).args())
    assert a.position_embedding_type == "learned_absolute" and a.normalization == "LayerNorm"
    assert not a.swiglu and not a.disable_bias_linear


def test_torchrun_accepts_the_launch_arguments(exported):
    run = pytest.importorskip("torch.distributed.run")
    for name, (plan, result) in exported.items():
        arrays = parse_script(result.files["megatron_pretrain_gpt.sh"])
        ns = run.get_args_parser().parse_args(arrays["DISTRIBUTED_ARGS"] + ["pretrain_gpt.py"])
        assert int(ns.nnodes) == plan.cluster.nodes, name


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash not installed")
def test_script_is_valid_bash(exported, tmp_path):
    for name, (_, result) in exported.items():
        path = tmp_path / f"{name}.sh"
        path.write_text(result.files["megatron_pretrain_gpt.sh"])
        proc = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert proc.returncode == 0, f"{name}: {proc.stderr}"


@pytest.mark.parametrize("model, devices, job, pins", [
    ("deepseek-v3", 512, {"global_batch_size": 4096, "seq_length": 4096, "dtype": "fp8"}, {}),   # MLA, shared, dense 3
    ("gpt-oss-20b", 16, {}, {}),                                                               # windowed layers
    ("qwen3-235b-a22b", 256, {"global_batch_size": 2048, "seq_length": 4096, "dtype": "fp8"},   # MoE parallel folding
     {"tp": 2, "ep": 32, "fold_experts": True}),
])
def test_the_models_architecture_is_written_and_reads_back(tmp_path, model, devices, job, pins):
    """MLA, shared experts, leading dense layers, sliding-window attention and folded experts as pretrain_gpt.py
    flags that its parser takes; the launch read back with --from prices the plan exactly."""
    from advisor.commands.estimate_request import estimate_request
    from advisor.commands.inputs import resolve_inputs
    from advisor.commands.recommend import recommend
    from advisor.search import Pins

    i = resolve_inputs(model, "dgx-h100", devices=devices, **job)
    plan = recommend(i.model, i.hardware, i.cluster, i.job, pins=Pins(**pins), top_k=1).plans[0]
    result = export_plan(plan, "megatron")
    assert not result.unsupported, result.unsupported
    a = megatron_parser().parse_args(megatron_launch(plan).args())
    m = plan.model
    if m.mla is not None:
        assert a.multi_latent_attention and (a.q_lora_rank, a.kv_lora_rank, a.qk_head_dim, a.qk_pos_emb_head_dim,
                                             a.v_head_dim) == (m.mla.q_lora_rank, m.mla.kv_lora_rank,
                                                               m.mla.qk_nope_head_dim, m.mla.qk_rope_head_dim,
                                                               m.mla.v_head_dim)
    if m.moe is not None:
        pattern = eval_moe_pattern(a.moe_layer_freq)
        pattern = [int(k % pattern == 0) for k in range(m.num_layers)] if isinstance(pattern, int) else pattern
        assert pattern == [int(m.is_moe_layer(k)) for k in range(m.num_layers)]
        assert (a.moe_shared_expert_intermediate_size or 0) == m.moe.shared_ffn
    if m.sliding_window is not None:
        assert tuple(int(x) for x in a.window_size.split(",")) == (m.sliding_window, 0)
        windowed = eval_moe_pattern(a.window_attn_skip_freq)
        assert sum(windowed) / len(windowed) == 1.0 / m.sliding_window_every
    assert (a.expert_tensor_parallel_size == 1) == plan.strategy.fold_experts
    script = tmp_path / "launch.sh"
    script.write_text(result.files["megatron_pretrain_gpt.sh"])
    back = estimate_request(model, "dgx-h100", None, None, job={}, strategy={}, launch=str(script))
    assert back.estimate.tokens_per_s == pytest.approx(plan.prediction["tokens_per_s"], rel=1e-12)
    # the 0.13 and 0.14 releases have no window attention flags: refused there, not dropped
    if m.sliding_window is not None:
        assert any("sliding_window" in u for u in export_plan(plan, "megatron", target_version="0.13").unsupported)


def test_an_nvfp4_plan_launches_with_the_fp4_flags():
    """NVFP4 is --fp4-format e2m1 --fp4-recipe nvfp4 beside --bf16, never with --fp8-format (Megatron-Core 0.15's
    validate_args refuses both together)."""
    from _export_plans import make_plan

    plan = make_plan("llama3-8b", "dgx-b200", 2, {"dp": 8, "tp": 2, "pp": 1, "sequence_parallel": True,
                                                   "micro_batch_size": 1, "num_micro_batches": 4, "zero_stage": 1},
                     global_batch_size=32, seq_length=8192, dtype="fp8")
    from dataclasses import replace
    plan = replace(plan, training=replace(plan.training, fp8_recipe="nvfp4"))
    args = megatron_launch(plan).args()
    a = megatron_parser().parse_args(args)
    assert (a.bf16, a.fp4_format, a.fp4_recipe, a.fp8_format) == (True, "e2m1", "nvfp4", None)
