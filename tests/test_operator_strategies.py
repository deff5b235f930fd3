"""Semi-automatic parallelism (issue 13): --operator-strategies kept by the operator-level searchers,
priced, completed into the plan, re-estimated, and exported to MindSpore (shard() calls and a strategy
file).

gpt3-1.3b on 8 A100s (one tensor-parallel group of 8: the finest mesh is 2 x 2 x 2), global batch 512
x 2048 tokens. The fixed strategy cuts FC1 two ways by batch and four by its hidden size (a 2-D cut
Megatron's layout never takes)."""

from __future__ import annotations

import ast
import json
import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from advisor.cost.estimate import estimate
from advisor.cost.memory import GIB
from advisor.errors import AdvisorError
from advisor.export import export_plan
from advisor.plan import plan_from_dict, plan_to_dict, save_plan
from advisor.commands.recommend import recommend
from advisor.search.intra_op import build_problem, layout_key
from advisor.search.operator_plan import estimate_with_layout, layout_of, operator_plan
from advisor.space.strategy import Strategy, StrategyBatch
from advisor.specs.hardware import load_hardware
from advisor.specs.job import Cluster, TrainingJob
from advisor.specs.model import load_model
from advisor.specs.operator_strategies import load_operator_strategies, parse_operator_strategies

ROOT = Path(__file__).resolve().parents[1]
MODEL, HW = load_model("gpt3-1.3b"), load_hardware("dgx-a100-80g")
JOB = TrainingJob(global_batch_size=512, seq_length=2048)
CLUSTER = Cluster.of(HW, devices=8)
TP8 = Strategy(dp=1, tp=8, pp=1, micro_batch_size=2, num_micro_batches=256, zero_stage=1)
FC1_2D = {"layer.fc1": [[2, 1, 1], [1, 4], [4]]}
REL = 1e-9


def fixed(data) -> object:
    return parse_operator_strategies(data, "test strategies")


def cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "advisor", *args], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=300)


@pytest.fixture(scope="module")
def semi_plan(tmp_path_factory):
    """recommend --searcher drec --operator-strategies (FC1 2-D), the best plan saved."""
    result = recommend(MODEL, HW, CLUSTER, JOB, searcher="drec", top_k=2, suggest=False,
                       operator_strategies=fixed(FC1_2D))
    path = tmp_path_factory.mktemp("semi") / "plan.json"
    save_plan(result.best, path)
    return result.best, path


# ---- refusals ------------------------------------------------------------------------------------
@pytest.mark.parametrize("data,says", [
    ({"layer.fcX": [[1, 1, 1], [1, 8], [8]]}, "operator 'layer.fcX' is not in the operator graph"),
    ({"layer.fc1": [[1, 1, 1], [1, 8]]}, "operator 'layer.fc1' takes 3 inputs"),
    ({"layer.fc1": [[1, 1], [1, 8], [8]]}, "input 0 (layer.ln2_out, shape [2, 2048, 2048]) has 3 dimensions, the file gives 2"),
    ({"layer.qkv": [[1, 1, 1], [1, 3, 1, 1], [1, 3, 1, 1], [3, 1, 1], [3, 1, 1]]},
     "input 1 (layer.wq), dimension 1 ('g', size 16): cut 3 does not divide it"),
    ({"layer.fc1": [[1, 1, 1], [1, 16], [16]]}, "cuts [1, 16] use 16 devices, more than the 8"),
    ({"layer.fc1": [[1, 1, 2], [1, 1], [1]]}, "are the same axis ('h') but are cut 2 and 1 ways"),
    ({"layer.ln1": [[1, 1, 2], [2], [2]]}, "dimension 2 ('h', size 2048): a norm operator is not cut"),
    ({"layer.fc1": [[1, 1, 1], [1, 2], [2]], "layer.fc2": [[1, 1, 3], [3, 1]]}, "cut 3 does not divide it"),
])
def test_a_strategy_that_cannot_hold_is_refused_naming_operator_and_dimension(data, says):
    with pytest.raises(AdvisorError) as err:
        layout_of(MODEL, HW, CLUSTER, JOB, TP8, fixed(data))
    assert says in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("data,says", [
    ({"layer.fc1": [[1, 1, 1], [1, 0], [1]]}, "input 1, dimension 1: a cut must be a positive integer"),
    ({"layer.fc1": [[1, 1, 1], [1, -2], [1]]}, "a cut must be a positive integer"),
    ({"layer.fc1": [[1, 1, 1], [1, True], [1]]}, "a cut must be a positive integer"),
    ({"layer.fc1": "2x4"}, "must map to a list of 1 to 64 inputs"),
    ({}, "expected a mapping of operator names"),
])
def test_malformed_files_are_refused_at_load(data, says):
    with pytest.raises(AdvisorError) as err:
        fixed(data)
    assert says in str(err.value)


def test_the_cli_exits_2_with_one_sentence(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("layer.fc1: [[1, 1, 1], [1, 16], [16]]\n")
    r = cli("estimate", "--model", "gpt3-1.3b", "--hardware", "dgx-a100-80g", "--devices", "8", "--gbs", "512",
            "--tp", "8", "--mbs", "2", "--operator-strategies", str(bad))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "operator 'layer.fc1', input 1 (layer.w1): cuts [1, 16] use 16 devices" in r.stderr
    r = cli("recommend", "--model", "gpt3-1.3b", "--hardware", "dgx-a100-80g", "--devices", "8",
            "--operator-strategies", str(bad))
    assert r.returncode == 2 and "--operator-strategies needs --searcher drec or ilp" in r.stderr


def test_configurations_the_cuts_do_not_divide_are_left_out():
    """A batch cut of 2 needs a micro-batch of 2 or more: with --mbs 1 pinned nothing can hold it."""
    from advisor.search import Pins

    with pytest.raises(AdvisorError, match="none of the .* best configurations can hold the operator strategies"):
        operator_plan(MODEL, HW, CLUSTER, JOB, "drec", Pins(micro_batch_size=1), fixed=fixed(FC1_2D))


# ---- the searchers keep them, price them, and the plan round-trips --------------------------------
@pytest.mark.parametrize("searcher", ["drec", "ilp"])
def test_the_searchers_keep_the_fixed_strategies(searcher):
    out = operator_plan(MODEL, HW, CLUSTER, JOB, searcher, fixed=fixed(FC1_2D), time_limit_s=5.0)
    assert len(out.finalists) > 0
    for i, rec in enumerate(out.operator_strategies):
        assert int(out.finalists.tp[i]) % 8 == 0 and int(out.finalists.micro_batch_size[i]) % 2 == 0
        assert rec["fixed"] == ["layer.fc1"]
        assert rec["strategies"]["layer.fc1"] == FC1_2D["layer.fc1"]
        assert rec["operators"]["layer.fc1"]["inputs"]["layer.w1"] == [1, 4]
        assert set(rec["strategies"]) == {op for op in rec["operators"]}      # every operator completed


def test_a_fixed_non_megatron_strategy_is_priced():
    rec = layout_of(MODEL, HW, CLUSTER, JOB, TP8, fixed(FC1_2D))
    plain = estimate(MODEL, HW, CLUSTER, JOB, TP8)
    priced = estimate_with_layout(MODEL, HW, CLUSTER, JOB, TP8, rec)
    pricing = rec["pricing"]
    assert pricing["delta_step_s"] == pytest.approx(pricing["chosen_cost_s"] - pricing["reference_cost_s"], rel=REL)
    assert priced.tokens_per_s != plain.tokens_per_s
    # price_layouts' arithmetic with pp = 1 (every layer in the graph): the step changes by the difference
    step = plain.step_time_s + pricing["delta_step_s"]
    assert priced.step_time_s == pytest.approx(step, rel=REL)
    assert priced.tokens_per_s == pytest.approx(plain.tokens_per_s * plain.step_time_s / step, rel=REL)
    assert priced.memory_gib.total == pytest.approx(plain.memory_gib.total + pricing["delta_memory_bytes"] / GIB, rel=REL)
    # the completed strategies are what was priced: fixing all of them gives the same cost
    batch = StrategyBatch.from_strategies([TP8], MODEL.num_layers)
    key = layout_key(MODEL, JOB, batch, 0)
    problem = build_problem(MODEL, HW, JOB, key, fixed(rec["strategies"]))
    assert all(len(problem.strategies(v)) >= 1 for v in range(problem.num_ops))
    chosen = [problem.strategies(v)[0] for v in range(problem.num_ops)]
    assert problem.evaluate(chosen).cost_s == pytest.approx(pricing["chosen_cost_s"], rel=1e-6)


def test_the_completed_plan_round_trips(semi_plan):
    plan, path = semi_plan
    rec = plan.operator_strategies
    assert rec["strategies"]["layer.fc1"] == FC1_2D["layer.fc1"] and rec["fixed"] == ["layer.fc1"]
    again = plan_from_dict(json.loads(json.dumps(plan_to_dict(plan))))
    assert again.operator_strategies == rec
    # the whole plan fed back as --operator-strategies: every operator fixed, the same layout and price
    every = load_operator_strategies(path)
    assert len(every) == len(rec["strategies"])
    rec2 = layout_of(plan.model, plan.hardware, plan.cluster, plan.training, plan.strategy, every)
    assert rec2["strategies"] == rec["strategies"]
    assert rec2["pricing"]["chosen_cost_s"] == pytest.approx(rec["pricing"]["chosen_cost_s"], rel=1e-6)


def test_estimate_of_the_plan_equals_the_recommend_prediction(semi_plan):
    plan, path = semi_plan
    r = cli("estimate", "--plan", str(path), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["tokens_per_s"] == plan.prediction["tokens_per_s"]
    assert out["memory_gib"]["total"] == plan.prediction["memory_gib"]["total"]
    assert out["operator_strategies"]["strategies"] == plan.operator_strategies["strategies"]
    uniform = estimate(plan.model, plan.hardware, plan.cluster, plan.training, plan.strategy)
    assert out["tokens_per_s"] != uniform.tokens_per_s


# ---- export ----------------------------------------------------------------------------------------
def test_export_writes_a_shard_call_for_every_operator_and_a_strategy_file(semi_plan):
    plan, _ = semi_plan
    result = export_plan(plan, "mindspore")
    script, ckpt = result.files["operator_strategies.py"], json.loads(result.files["strategy_ckpt.json"])
    tree = ast.parse(script)
    entries = {k.value: v for node in ast.walk(tree) if isinstance(node, ast.Dict)
               for k, v in zip(node.keys, node.values) if isinstance(k, ast.Constant)}
    for name in plan.operator_strategies["strategies"]:
        calls = [c for c in ast.walk(entries[name]) if isinstance(c, ast.Call) and getattr(c.func, "attr", "") == "shard"]
        assert calls, name
    fc1 = ast.literal_eval(entries["layer.fc1"].elts[0].args[0])
    assert fc1 == ((2, 1), (1, 4))                     # rows cut by batch 2 x dp 1, FC1's hidden size by 4
    assert 'AutoParallel(net, parallel_mode="semi_auto")' in script and "load_param_strategy_file" in script
    assert "ms.set_auto_parallel_context(" in script and "strategy_ckpt_config" in script
    # MindSpore's JSON strategy checkpoint (StrategyCheckpointInfo::FromJson keys)
    assert ckpt["current_stage"] == 0
    s = plan.strategy
    assert ckpt["parallel_strategy_item"]["MatMul_layer.0.w1"] == {"stage": 0, "parallel_strategy": [[2, 1], [1, 4]]}
    for name, item in ckpt["parallel_layout_item"].items():
        assert set(item) == {"dev_matrix", "tensor_map", "tensor_shape", "field", "opt_weight_shard_step",
                             "opt_weight_shard_size"}
        assert math.prod(item["dev_matrix"]) == s.dp * s.tp * s.cp
        assert len(item["tensor_map"]) == len(item["tensor_shape"])
        for dim, axis in zip(item["tensor_shape"], item["tensor_map"]):
            if axis >= 0:
                assert dim % item["dev_matrix"][len(item["dev_matrix"]) - 1 - axis] == 0
    assert ckpt["parallel_layout_item"]["layer.0.w1"]["tensor_shape"] == [MODEL.hidden_size, MODEL.ffn_hidden_size]
    assert not any("operator_strategies: the per-operator shardings" in u for u in result.unsupported)
    # #32: the context loads these layouts semi-automatically; MindSpore is not also told to search its own
    context = result.files["parallel_context.py"]
    assert "parallel_mode='semi_auto_parallel'" in context and "recursive_programming" not in context
    assert "strategy_ckpt_config={'load_file': './strategy_ckpt.json'" in context


def test_names_in_a_hand_edited_plan_never_become_code(semi_plan):
    plan, _ = semi_plan
    rec = json.loads(json.dumps(plan.operator_strategies))
    evil = "x'): __import__('os').system('id') #\n"
    rec["strategies"][evil] = rec["strategies"].pop("layer.fc2")
    rec["operators"][evil] = rec["operators"].pop("layer.fc2")
    result = export_plan(replace(plan, operator_strategies=rec), "mindspore")
    tree = ast.parse(result.files["operator_strategies.py"])
    called = {getattr(n.func, "attr", getattr(n.func, "id", None)) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    assert "system" not in called and "__import__" not in called
    assert evil in {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)}


def test_mindspore_loads_the_export(semi_plan, tmp_path):
    """With MindSpore installed: its shard() accepts every strategy and its own loader parses the file."""
    ms = pytest.importorskip("mindspore")
    from mindspore.parallel._parallel_serialization import _build_searched_strategy

    plan, _ = semi_plan
    for name, text in export_plan(plan, "mindspore").files.items():
        (tmp_path / name).write_text(text)
    namespace: dict = {"__file__": str(tmp_path / "operator_strategies.py")}
    exec(compile((tmp_path / "operator_strategies.py").read_text(), "operator_strategies.py", "exec"), namespace)
    prims = namespace["sharded_primitives"]()
    assert set(prims) == set(plan.operator_strategies["strategies"])
    layouts = _build_searched_strategy(str(tmp_path / "strategy_ckpt.json"))
    assert "layer.0.w1" in layouts
    namespace["legacy_context"]()
    assert ms.get_auto_parallel_context("strategy_ckpt_config")["load_file"].endswith("strategy_ckpt.json")
