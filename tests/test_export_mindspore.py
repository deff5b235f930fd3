"""MindSpore / MindFormers export.

Always: the set_auto_parallel_context keywords and values are checked against the MindSpore API
reference of mindspore.set_auto_parallel_context (MindSpore 2.x; the same text is the function's
docstring in the mindspore 2.10.0 wheel), and the MindFormers sections against
mindformers/tools/register/template.py and mindformers/models/llama/llama_config.py of the
mindformers 2.1.0 wheel (ParallelConfig, RecomputeConfig, RunnerConfig, LlamaConfig arguments).

With MindSpore at hand (importable here, or an interpreter named by ADVISOR_MINDSPORE_PYTHON, since
its protobuf pin clashes with other packages): the exported parallel_context.py is run, so
MindSpore's own set_auto_parallel_context refuses any unknown keyword or bad value; and where
MindFormers imports there, the YAML is loaded with MindFormers' MindFormerConfig (which refuses
unknown parallel_config / recompute_config / runner_config keys), the parallel settings are built
into its TransformerOpParallelConfig, and its LayerSetting computes the layers per pipeline stage
from the exported offset.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys

import pytest
import yaml

from _export_plans import plans
from advisor.export import export_plan

CONTEXT_KEYWORDS = {  # mindspore.set_auto_parallel_context, "Args"
    "device_num", "global_rank", "gradients_mean", "gradient_fp32_sync", "loss_repeated_mean", "parallel_mode",
    "search_mode", "auto_parallel_search_mode", "parameter_broadcast", "all_reduce_fusion_config",
    "strategy_ckpt_load_file", "strategy_ckpt_save_file", "enable_parallel_optimizer", "parallel_optimizer_config",
    "dataset_strategy", "enable_alltoall", "pipeline_stages", "pipeline_config", "force_fp32_communication",
    "pipeline_result_broadcast", "comm_fusion", "strategy_ckpt_config", "group_ckpt_save_file", "auto_pipeline",
    "dump_local_norm", "dump_local_norm_path", "dump_device_local_norm", "full_batch",
}
PARALLEL_MODES = {"stand_alone", "data_parallel", "hybrid_parallel", "semi_auto_parallel", "auto_parallel"}
SEARCH_MODES = {"recursive_programming", "sharding_propagation", "dynamic_programming"}
PIPELINE_CONFIG_KEYS = {"pipeline_interleave", "pipeline_scheduler"}
PIPELINE_SCHEDULERS = {"gpipe", "1f1b", "seqpipe", "seqvpp", "seqsmartvpp", "zero_bubble_v"}
OPTIMIZER_CONFIG_KEYS = {"gradient_accumulation_shard", "parallel_optimizer_threshold", "optimizer_weight_shard_size",
                         "optimizer_level"}
OPTIMIZER_LEVELS = {"level1", "level2", "level3"}

MINDFORMERS_PARALLEL_CONFIG = {  # template.py ParallelConfig
    "data_parallel", "model_parallel", "context_parallel", "expert_parallel", "pipeline_stage", "micro_batch_num",
    "seq_split_num", "use_seq_parallel", "optimizer_shard", "gradient_aggregation_group", "vocab_emb_dp",
    "context_parallel_algo", "ulysses_degree_in_cp", "mem_coeff",
}
MINDFORMERS_RECOMPUTE_CONFIG = {  # template.py RecomputeConfig
    "recompute", "select_recompute", "parallel_optimizer_comm_recompute", "select_comm_recompute",
    "mp_comm_recompute", "recompute_slice_activation", "select_recompute_exclude", "select_comm_recompute_exclude",
}
MINDFORMERS_RUNNER_CONFIG = {"batch_size", "epochs", "sink_mode", "sink_size", "gradient_accumulation_steps",
                             "num_classes", "stop_step"}
LLAMA_CONFIG_ARGS = {  # llama_config.py LlamaConfig.__init__ (the ones the export writes, and their neighbours)
    "batch_size", "seq_length", "hidden_size", "num_layers", "num_heads", "n_kv_heads", "max_position_embedding",
    "intermediate_size", "vocab_size", "compute_dtype", "layernorm_compute_type", "softmax_compute_type",
    "rotary_dtype", "param_init_type", "pp_interleave_num", "offset", "use_flash_attention",
}
TOP_SECTIONS = {"use_legacy", "train_dataset", "parallel", "parallel_config", "recompute_config", "runner_config",
                "model"}
# mindformers/core/optim/__init__.py (2.1.0 wheel): AdamW.__new__ takes use_fused (FusedAdamW when True);
# build_optim's get_tft_wrapped_cls pops it from the optimizer section
ADAMW_ARGS = {"type", "learning_rate", "betas", "eps", "weight_decay", "use_fused", "amsgrad", "maximize", "swap"}


@pytest.fixture(scope="module")
def exported():
    out = {}
    for name, plan in plans().items():
        result = export_plan(plan, "mindspore")
        out[name] = (plan, result, _call_kwargs(result.files["parallel_context.py"]),
                     yaml.safe_load(result.files["mindformers_parallel.yaml"]))
    return out


def _call_kwargs(source: str) -> dict:
    """The keyword arguments of the ms.set_auto_parallel_context(...) call, read without MindSpore."""
    tree = ast.parse(source)
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "set_auto_parallel_context"]
    assert len(calls) == 1
    return {kw.arg: ast.literal_eval(kw.value) for kw in calls[0].keywords}


def test_context_keywords_are_documented(exported):
    for name, (plan, _, ctx, doc) in exported.items():
        assert set(ctx) <= CONTEXT_KEYWORDS, (name, set(ctx) - CONTEXT_KEYWORDS)
        assert ctx["parallel_mode"] in PARALLEL_MODES and ctx["search_mode"] in SEARCH_MODES
        assert set(ctx.get("pipeline_config", {})) <= PIPELINE_CONFIG_KEYS
        if "pipeline_config" in ctx:
            assert ctx["pipeline_config"]["pipeline_scheduler"] in PIPELINE_SCHEDULERS
            # set_pipeline_config: without interleaving only '1f1b' is allowed
            if not ctx["pipeline_config"]["pipeline_interleave"]:
                assert ctx["pipeline_config"]["pipeline_scheduler"] == "1f1b", name
        assert set(ctx.get("parallel_optimizer_config", {})) <= OPTIMIZER_CONFIG_KEYS
        if "parallel_optimizer_config" in ctx:
            assert ctx["parallel_optimizer_config"]["optimizer_level"] in OPTIMIZER_LEVELS
        # MindFormers passes `parallel` to the same call, dataset_strategy's lists turned into tuples
        # (mindformers/core/context/parallel.py, _set_ms_auto_parallel_context)
        yaml_ctx = dict(doc["parallel"])
        if "dataset_strategy" in yaml_ctx:
            yaml_ctx["dataset_strategy"] = tuple(tuple(x) for x in yaml_ctx["dataset_strategy"])
        assert ctx == yaml_ctx, name
        assert ctx["device_num"] == plan.cluster.devices and ctx["pipeline_stages"] == plan.strategy.pp
        assert ctx["enable_parallel_optimizer"] == (plan.strategy.zero_stage >= 1)


def test_mindformers_keys_are_documented(exported):
    for name, (plan, _, _, doc) in exported.items():
        # MoE plans add the experts (moe_config); dense plans must not have one
        adam = plan.training.optimizer in ("adam", "adamw")
        assert set(doc) == (TOP_SECTIONS | ({"moe_config"} if plan.model.moe is not None else set())
                            | ({"optimizer"} if adam else set())), name
        if adam:
            assert set(doc["optimizer"]) <= ADAMW_ARGS and doc["optimizer"]["type"] == "AdamW", name
        assert doc["use_legacy"] is True, name
        assert set(doc["parallel_config"]) <= MINDFORMERS_PARALLEL_CONFIG, name
        assert set(doc["recompute_config"]) <= MINDFORMERS_RECOMPUTE_CONFIG, name
        assert set(doc["runner_config"]) <= MINDFORMERS_RUNNER_CONFIG, name
        assert set(doc["model"]["model_config"]) <= LLAMA_CONFIG_ARGS, name


def test_degrees_stages_and_batches(exported):
    for name, (plan, _, ctx, doc) in exported.items():
        s, m = plan.strategy, plan.model
        pc = doc["parallel_config"]
        assert pc["data_parallel"] * pc["model_parallel"] * pc["context_parallel"] * pc["pipeline_stage"] == s.devices
        assert (pc["data_parallel"], pc["model_parallel"], pc["pipeline_stage"], pc["expert_parallel"]) == \
            (s.dp, s.tp, s.pp, s.ep)
        # MindFormers: global batch = batch_size x data_parallel x micro_batch_num x gradient_accumulation_steps
        rc = doc["runner_config"]
        assert rc["batch_size"] * pc["data_parallel"] * pc["micro_batch_num"] * rc["gradient_accumulation_steps"] \
            == plan.training.global_batch_size, name
        # LayerSetting: layers of (v, p) = num_layers // (pp x vpp) + offset[v][p]
        mc = doc["model"]["model_config"]
        v = mc.get("pp_interleave_num", 1)
        offset = mc["offset"]
        rows = [[0] * s.pp] * v if offset == 0 else ([offset] if v == 1 else offset)
        layers = [[m.num_layers // (s.pp * v) + x for x in row] for row in rows]
        per_stage = [sum(layers[vi][p] for vi in range(v)) for p in range(s.pp)]
        assert per_stage == list(s.resolved_stage_layers(m.num_layers)), name
        if s.zero_stage:
            assert ctx["parallel_optimizer_config"]["optimizer_level"] == f"level{s.zero_stage}"
        # dataset sharding: each rank reads its dp shard; MindFormers' base_trainer requires
        # dataset_strategy[0][0] == data_parallel and one entry per train_dataset.input_columns
        assert ctx["full_batch"] is s.full_batch is False, name
        assert ctx["dataset_strategy"] == ((pc["data_parallel"], 1),) * len(doc["train_dataset"]["input_columns"]), name


def test_drec_plans_use_mindsporess_recursive_programming(exported):
    ctx = exported["llama8b_dp_drec"][2]
    assert ctx["parallel_mode"] == "auto_parallel" and ctx["search_mode"] == "recursive_programming"
    assert exported["llama70b_uneven_pp"][2]["parallel_mode"] == "semi_auto_parallel"


def test_unexpressible_features_are_reported(exported):
    def unsupported(name):
        return " ".join(exported[name][1].unsupported)

    assert exported["llama8b_cp_zero3_offload"][3]["optimizer"]["swap"] is True    # AdamW's swap to the host
    assert "mesh_order" in unsupported("llama8b_cp_zero3_offload")
    assert "attention core" in unsupported("llama70b_uneven_pp")       # Megatron's selective: not MindFormers'
    assert "gpipe" in unsupported("gpt3_gpipe_fp16")
    # a Megatron plan: only the framework it was priced for stands between it and MindSpore
    assert [u.split(":")[0] for u in exported["mixtral_ep_vpp"][1].unsupported] == ["training.framework = megatron"]


def _mindspore_python() -> str | None:
    if importlib.util.find_spec("mindspore") is not None:
        return sys.executable
    return os.environ.get("ADVISOR_MINDSPORE_PYTHON") or None


CHECK = r"""
import json, sys, yaml
import mindspore as ms
try:
    from mindformers.tools.register.config import MindFormerConfig
    from mindformers.modules.transformer.transformer import TransformerOpParallelConfig, TransformerRecomputeConfig
    from mindformers.parallel_core.training_graph.transformer.utils import LayerSetting
except Exception as exc:
    MindFormerConfig = None
    unavailable = "unavailable: %s" % exc
results = {}
# one process for every export (MindFormers' import is the slow part); the context is reset before each
for name, ctx_path, yaml_path in zip(sys.argv[1::3], sys.argv[2::3], sys.argv[3::3]):
    ms.reset_auto_parallel_context()
    out = {}
    exec(compile(open(ctx_path).read(), "parallel_context.py", "exec"), {})
    out["context"] = {k: ms.get_auto_parallel_context(k) for k in
                      ("device_num", "pipeline_stages", "parallel_mode", "enable_parallel_optimizer", "search_mode")}
    if MindFormerConfig is None:
        out["mindformers"] = unavailable
    else:
        doc = yaml.safe_load(open(yaml_path))
        doc["run_mode"] = "train"
        full = yaml_path + ".train.yaml"
        yaml.safe_dump(doc, open(full, "w"))
        cfg = MindFormerConfig(full)
        pc = TransformerOpParallelConfig(recompute=TransformerRecomputeConfig(**dict(cfg.recompute_config)),
                                         **dict(cfg.parallel_config))
        mc = doc["model"]["model_config"]
        layers = mc.get("num_layers", mc.get("num_hidden_layers"))
        setting = LayerSetting(layers, mc["offset"], pc, mc.get("pp_interleave_num", 1))
        out["mindformers"] = {"dp": pc.data_parallel, "mp": pc.model_parallel, "pp": pc.pipeline_stage,
                              "micro_batch_num": pc.micro_batch_num,
                              "layer_list": [[int(x) for x in row] for row in setting.layer_list]}
    results[name] = out
print("RESULT" + json.dumps(results))
"""


def test_mindspore_accepts_the_export(exported, tmp_path):
    python = _mindspore_python()
    if python is None:
        pytest.skip("MindSpore not installed (set ADVISOR_MINDSPORE_PYTHON to a python that has it)")
    script = tmp_path / "check.py"
    script.write_text(CHECK)
    args = []
    for name, (plan, result, _, _) in exported.items():
        ctx_path, yaml_path = tmp_path / f"{name}_ctx.py", tmp_path / f"{name}.yaml"
        ctx_path.write_text(result.files["parallel_context.py"])
        yaml_path.write_text(result.files["mindformers_parallel.yaml"])
        args += [name, str(ctx_path), str(yaml_path)]
    proc = subprocess.run([python, "-E", str(script), *args], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")][-1]
    results = json.loads(line[len("RESULT"):])
    assert set(results) == set(exported)
    for name, (plan, result, _, _) in exported.items():
        out = results[name]
        s = plan.strategy
        assert out["context"]["device_num"] == plan.cluster.devices and out["context"]["pipeline_stages"] == s.pp, name
        mf = out["mindformers"]
        if isinstance(mf, dict):
            assert (mf["dp"], mf["mp"], mf["pp"]) == (s.dp, s.tp, s.pp), name
            per_stage = [sum(row[p] for row in mf["layer_list"]) for p in range(s.pp)]
            assert per_stage == list(s.resolved_stage_layers(plan.model.num_layers)), name


def test_optimizer_section_is_the_priced_step():
    """The fused or per-operation AdamW the plan was priced with (advisor.cost.optimizer_step)."""
    from dataclasses import replace

    plan = next(p for p in plans().values() if p.training.optimizer == "adamw")
    for impl, fused in ((plan.training.optimizer_impl, True), ("fused", True), ("unfused", False)):
        job = replace(plan.training, framework="mindspore", optimizer_impl=impl)
        doc = yaml.safe_load(export_plan(replace(plan, training=job), "mindspore").files["mindformers_parallel.yaml"])
        assert doc["optimizer"] == {"type": "AdamW", "use_fused": fused}, impl


def test_optimizer_level_is_never_next_to_gradient_accumulation_shard(exported):
    # MindSpore 2.x set_parallel_optimizer_config refuses gradient_accumulation_shard, whatever its value,
    # with optimizer_level level1 or level3; a shipped YAML's key must go, which the export says
    from advisor.export.mindspore import MERGE_NOTE
    zero_stages = set()
    for name, (plan, result, ctx, _) in exported.items():
        config = ctx.get("parallel_optimizer_config", {})
        assert "gradient_accumulation_shard" not in config, name
        zero_stages.add(plan.strategy.zero_stage)
        assert (MERGE_NOTE in result.notes) == (plan.strategy.zero_stage in (1, 3)), name
    assert {1, 3} <= zero_stages        # both refused levels are among the exported plans


MERGED = r"""
import sys, yaml
import mindspore as ms
shipped = {"gradient_accumulation_shard": False, "parallel_optimizer_threshold": 64}   # MindFormers' shipped YAMLs
ours = yaml.safe_load(open(sys.argv[1]))["parallel"]["parallel_optimizer_config"]
merged = {k: v for k, v in {**shipped, **ours}.items() if k != "gradient_accumulation_shard"}   # as MERGE_NOTE says
ms.set_auto_parallel_context(parallel_mode="semi_auto_parallel", enable_parallel_optimizer=True,
                             parallel_optimizer_config=merged)
try:
    ms.reset_auto_parallel_context()
    ms.set_auto_parallel_context(parallel_mode="semi_auto_parallel", enable_parallel_optimizer=True,
                                 parallel_optimizer_config={**shipped, **ours})
except ValueError:
    print("REFUSED")
else:
    print("ACCEPTED")
"""


def test_mindspore_takes_the_merge_the_note_asks_for(exported, tmp_path):
    python = _mindspore_python()
    if python is None:
        pytest.skip("MindSpore not installed (set ADVISOR_MINDSPORE_PYTHON to a python that has it)")
    script = tmp_path / "merge.py"
    script.write_text(MERGED)
    name = next(n for n, (p, *_) in exported.items() if p.strategy.zero_stage == 1)
    path = tmp_path / "ours.yaml"
    path.write_text(exported[name][1].files["mindformers_parallel.yaml"])
    proc = subprocess.run([python, "-E", str(script), str(path)], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # without the deletion MindSpore refuses the merge: the note is needed, not decoration
    assert proc.stdout.strip().splitlines()[-1] == "REFUSED"
