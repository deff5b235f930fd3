"""torchtitan export: parsed by torchtitan 0.2's own ConfigManager (which refuses unknown fields) and
its ParallelDims check when torchtitan is installed, and always checked against the field lists of
torchtitan 0.2's torchtitan/config/job_config.py (dataclasses Parallelism, Training,
ActivationCheckpoint; pytorch/torchtitan tag v0.2.0, the torchtitan==0.2.0 wheel on PyPI).
"""

from __future__ import annotations

import importlib.util
import math
import sys
import tomllib
from pathlib import Path

import pytest

from _export_plans import plans
from _release_parse import load_torchtitan
from advisor.export._recompute import FULL, NONE, OP_LEVEL, priced_recompute
from advisor.export import export_plan

SOURCE = "torchtitan 0.2.0 torchtitan/config/job_config.py"
PARALLELISM_FIELDS = {
    "data_parallel_replicate_degree", "enable_compiled_autograd", "data_parallel_shard_degree",
    "fsdp_reshard_after_forward", "tensor_parallel_degree", "disable_loss_parallel", "enable_async_tensor_parallel",
    "pipeline_parallel_degree", "module_fqns_per_model_part", "pipeline_parallel_first_stage_less_layers",
    "pipeline_parallel_last_stage_less_layers", "pipeline_parallel_layers_per_stage", "pipeline_parallel_schedule",
    "pipeline_parallel_schedule_csv", "pipeline_parallel_microbatch_size", "context_parallel_degree",
    "context_parallel_rotate_method", "expert_parallel_degree", "expert_tensor_parallel_degree",
}
TRAINING_FIELDS = {
    "dataset", "dataset_path", "local_batch_size", "global_batch_size", "seq_len", "max_norm", "steps",
    "enable_cpu_offload", "dtype", "mixed_precision_param", "mixed_precision_reduce", "gc_freq", "gc_debug", "seed",
    "deterministic", "debug_moe_force_load_balance",
}
ACTIVATION_CHECKPOINT_FIELDS = {
    "mode", "selective_ac_option", "per_op_sac_force_recompute_mm_shapes_by_fqns", "early_stop", "memory_budget",
    "visualize_memory_budget_pareto",
}
MODEL_FIELDS = {"name", "flavor", "hf_assets_path", "tokenizer_path", "converters", "print_after_conversion"}
LITERALS = {  # Literal[...] annotations in the same file
    ("parallelism", "fsdp_reshard_after_forward"): {"default", "always", "never"},
    ("training", "mixed_precision_param"): {"bfloat16", "float32"},
    ("activation_checkpoint", "mode"): {"selective", "full", "memory_budget", "none"},
}
SCHEDULES = {"GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV"}


@pytest.fixture(scope="module")
def exported():
    out = {}
    for name, plan in plans().items():
        result = export_plan(plan, "torchtitan")
        out[name] = (plan, result, tomllib.loads(result.files["torchtitan.toml"]))
    return out


def test_sections_and_fields_are_torchtitans(exported):
    for name, (_, _, doc) in exported.items():
        assert set(doc) - {"model"} == {"parallelism", "training", "activation_checkpoint"}, name
        assert set(doc.get("model", {})) <= MODEL_FIELDS, (name, SOURCE)
        assert set(doc["parallelism"]) <= PARALLELISM_FIELDS, (name, set(doc["parallelism"]) - PARALLELISM_FIELDS, SOURCE)
        assert set(doc["training"]) <= TRAINING_FIELDS, (name, SOURCE)
        assert set(doc["activation_checkpoint"]) <= ACTIVATION_CHECKPOINT_FIELDS, (name, SOURCE)
        for (section, key), allowed in LITERALS.items():
            if key in doc[section]:
                assert doc[section][key] in allowed, (name, section, key)
        if "pipeline_parallel_schedule" in doc["parallelism"]:
            assert doc["parallelism"]["pipeline_parallel_schedule"] in SCHEDULES


def test_degrees_and_batches_match_the_plan(exported):
    for name, (plan, _, doc) in exported.items():
        s, j = plan.strategy, plan.training
        par, train = doc["parallelism"], doc["training"]
        dp = par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"]
        assert dp == s.dp, name
        world = dp * par["context_parallel_degree"] * par["tensor_parallel_degree"] * par["pipeline_parallel_degree"]
        assert world == plan.strategy.devices, name
        # torchtitan train.py: gradient accumulation = global / (local x dp); PP splits the local batch
        accumulation = train["global_batch_size"] // (train["local_batch_size"] * dp)
        assert train["global_batch_size"] == j.global_batch_size and train["seq_len"] == j.seq_length
        if s.pp > 1:
            assert accumulation == 1
            assert train["local_batch_size"] // par["pipeline_parallel_microbatch_size"] == s.num_micro_batches
        else:
            assert accumulation == s.num_micro_batches and train["local_batch_size"] == s.micro_batch_size
        if j.train_tokens:
            assert train["steps"] == math.ceil(j.train_tokens / j.tokens_per_step)
        # the priced recomputation, or none written and the reason reported (advisor.export._recompute)
        priced = priced_recompute(plan)
        ac = doc["activation_checkpoint"]
        written = {NONE: "none", FULL: "full", OP_LEVEL: "selective"}.get(priced.kind)
        if written is not None and (priced.kind == NONE or priced.layers is None):
            assert ac["mode"] == written, name
            assert (ac.get("selective_ac_option") == "op") == (priced.kind == OP_LEVEL), name
        else:
            assert "mode" not in ac and "parallel.recompute" in " ".join(exported[name][1].unsupported), name


def test_pipeline_parts_follow_the_stage_layers(exported):
    for name, (plan, _, doc) in exported.items():
        s, m = plan.strategy, plan.model
        par = doc["parallelism"]
        if s.pp == 1:
            assert "module_fqns_per_model_part" not in par
            continue
        parts = par["module_fqns_per_model_part"]
        assert len(parts) == s.pp * s.virtual_pipeline_stages, name
        flat = [x for part in parts for x in part]
        assert flat[0] == "tok_embeddings" and flat[-2:] == ["norm", "output"]
        assert [x for x in flat if x.startswith("layers.")] == [f"layers.{i}" for i in range(m.num_layers)]
        # part i runs on pipeline rank i mod pp (torchtitan pipeline_module_split, loop style)
        per_rank = [0] * s.pp
        for i, part in enumerate(parts):
            per_rank[i % s.pp] += sum(x.startswith("layers.") for x in part)
        assert per_rank == list(s.resolved_stage_layers(m.num_layers)), name


def _torchtitan_config():
    """torchtitan's ConfigManager and ParallelDims (tests/_release_parse.py loads them without Triton)."""
    try:
        _, config_manager, parallel_dims = load_torchtitan()
    except Exception as exc:  # pragma: no cover - absent, or a torchtitan we cannot load
        pytest.skip(f"torchtitan cannot be imported here: {exc}")
    return config_manager, parallel_dims


def test_torchtitan_config_manager_parses_the_export(exported, tmp_path):
    ConfigManager, ParallelDims = _torchtitan_config()
    from torch.distributed.pipelining.schedules import get_schedule_class

    for name, (plan, result, doc) in exported.items():
        path = tmp_path / f"{name}.toml"
        path.write_text(result.files["torchtitan.toml"])
        cfg = ConfigManager().parse_args(["--job.config_file", str(path)])
        par = cfg.parallelism
        assert par.tensor_parallel_degree == plan.strategy.tp, name
        assert par.pipeline_parallel_degree == plan.strategy.pp, name
        assert cfg.training.local_batch_size == doc["training"]["local_batch_size"]
        if "mode" in doc["activation_checkpoint"]:
            assert cfg.activation_checkpoint.mode == doc["activation_checkpoint"]["mode"]
        # torchtitan's own degree checks (parallel_dims.py _validate)
        dims = ParallelDims(dp_replicate=par.data_parallel_replicate_degree, dp_shard=par.data_parallel_shard_degree,
                            cp=par.context_parallel_degree, tp=par.tensor_parallel_degree,
                            pp=par.pipeline_parallel_degree, ep=par.expert_parallel_degree,
                            etp=par.expert_tensor_parallel_degree, world_size=plan.strategy.devices)
        assert dims.dp_replicate * dims.dp_shard == plan.strategy.dp, name
        if plan.strategy.pp > 1:
            get_schedule_class(par.pipeline_parallel_schedule)


def test_torchtitan_refuses_an_unknown_field(tmp_path):
    ConfigManager, _ = _torchtitan_config()
    text = export_plan(plans()["llama8b_dp_drec"], "torchtitan").files["torchtitan.toml"]
    path = tmp_path / "bad.toml"
    path.write_text(text.replace("[parallelism]\n", "[parallelism]\ntensor_paralel_degree = 2\n"))
    with pytest.raises(ValueError):
        ConfigManager().parse_args(["--job.config_file", str(path)])


def test_unexpressible_features_are_reported(exported):
    def unsupported(name):
        return " ".join(exported[name][1].unsupported)

    assert "zero_stage = 1" in unsupported("llama8b_dp_drec")
    assert "sequence_parallel = false" in unsupported("gpt3_gpipe_fp16")
    assert "fp16" in unsupported("gpt3_gpipe_fp16")
    assert "offload_optimizer" in unsupported("llama8b_cp_zero3_offload")
    assert "mesh_order" in unsupported("llama8b_cp_zero3_offload")
    assert "full recomputation of 4 layer(s) per stage" in unsupported("mixtral_ep_vpp")
    assert "Megatron-style selective" in unsupported("llama70b_uneven_pp")      # attention-core only
    assert "recompute" not in unsupported("llama8b_torchtitan_sac")
    # expressible exactly: ZeRO-3 and ZeRO-2 are FSDP2 resharding policies ("default": resharded after the forward
    # without pipelining, kept under it, as the torchtitan record prices ZeRO-3)
    doc = exported["llama8b_cp_zero3_offload"][2]
    assert doc["parallelism"]["fsdp_reshard_after_forward"] == "default"
    assert exported["llama7b_zero2_pp"][2]["parallelism"]["fsdp_reshard_after_forward"] == "never"
    assert exported["gpt3_gpipe_fp16"][2]["parallelism"]["data_parallel_replicate_degree"] == 2


# ---- the architecture: torchtitan's own flavors -------------------------------------------------------------------
def _shipped_flavors() -> dict:
    """Each flavor's keyword arguments as the installed torchtitan's source writes them (read with ast: importing
    the models needs Triton), defaults of the model's args dataclass filled in."""
    import ast

    if "torchtitan" in sys.modules:                   # load_torchtitan's package stand-in has no spec
        paths = list(sys.modules["torchtitan"].__path__)
    else:
        spec = importlib.util.find_spec("torchtitan")
        if spec is None:
            pytest.skip("torchtitan is not installed")
        paths = list(spec.submodule_search_locations)
    root = Path(paths[0]) / "models"
    out = {}
    for name, table in (("llama3", "llama3_args"), ("qwen3", "qwen3_args")):
        tree = ast.parse((root / name / "__init__.py").read_text())
        defaults = {}
        for node in ast.walk(ast.parse((root / name / "model" / "args.py").read_text())):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
                try:
                    defaults[node.target.id] = ast.literal_eval(node.value)
                except ValueError:
                    pass
        for node in ast.walk(tree):
            if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == table or \
                    isinstance(node, ast.Assign) and any(getattr(t, "id", None) == table for t in node.targets):
                for key, call in zip(node.value.keys, node.value.values):
                    args = {kw.arg: kw.value for kw in call.keywords}
                    moe = args.pop("moe_args", None)
                    flat = {k: ast.literal_eval(v) for k, v in args.items()}
                    if moe is not None:
                        flat.update({kw.arg: ast.literal_eval(kw.value) for kw in moe.keywords})
                    out[(name, ast.literal_eval(key))] = {**defaults, **flat}
    return out


def test_the_flavor_table_is_torchtitans():
    from advisor.export.torchtitan_flavors import FLAVORS

    shipped = _shipped_flavors()
    for key, args in FLAVORS.items():
        assert key in shipped, key
        assert {k: shipped[key].get(k) for k in args} == args, key


def test_a_bundled_model_with_a_flavor_exports_its_architecture(tmp_path):
    """qwen3-30b-a3b's head_dim (128, wider than hidden / heads) was a refusal: its flavor carries it, and the file
    reads back at the same price, the flavor checked against --model."""
    from advisor.commands.estimate_request import estimate_request
    from advisor.commands.inputs import resolve_inputs
    from advisor.commands.recommend import recommend
    from advisor.errors import AdvisorError
    from advisor.export.torchtitan_flavors import flavor_of
    from advisor.search import Pins

    i = resolve_inputs("qwen3-30b-a3b", "dgx-h100", devices=16, framework="torchtitan")
    plan = recommend(i.model, i.hardware, i.cluster, i.job, pins=Pins(), top_k=1).plans[0]
    result = export_plan(plan, "torchtitan")
    assert not result.unsupported, result.unsupported
    doc = tomllib.loads(result.files["torchtitan.toml"])
    assert (doc["model"]["name"], doc["model"]["flavor"]) == ("qwen3", "30B-A3B")
    path = tmp_path / "torchtitan.toml"
    path.write_text(result.files["torchtitan.toml"])
    back = estimate_request("qwen3-30b-a3b", "dgx-h100", None, 16, job={}, strategy={}, launch=str(path))
    assert back.estimate.tokens_per_s == pytest.approx(plan.prediction["tokens_per_s"], rel=1e-12)
    with pytest.raises(AdvisorError, match="num_layers = 48, but --model qwen3-235b-a22b has 94"):
        estimate_request("qwen3-235b-a22b", "dgx-h100", None, 16, job={}, strategy={}, launch=str(path))
    assert [flavor_of(resolve_inputs(n, "dgx-h100", devices=8).model) for n in
            ("llama3-8b", "llama3-70b", "llama3-405b", "qwen3-235b-a22b", "mixtral-8x7b", "deepseek-v3")] == \
        [("llama3", "8B"), ("llama3", "70B"), ("llama3", "405B"), ("qwen3", "235B-A22B"), None, None]
