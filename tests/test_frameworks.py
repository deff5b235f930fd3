"""The framework records (advisor.specs.frameworks): the cost model reads them instead of comparing
framework names, and one table prices what selective recomputation keeps, replays and counts in HFU."""

from __future__ import annotations

import ast
from dataclasses import fields
from pathlib import Path

import pytest

from advisor.cost import recompute
from advisor.cost.estimate import estimate
from advisor.space.strategy import Strategy
from advisor.specs.frameworks import FRAMEWORKS, Framework, frameworks_with
from advisor.specs.hardware import load_hardware
from advisor.specs.job import Cluster, TrainingJob
from advisor.specs.model import load_model

ROOT = Path(__file__).resolve().parents[1]
NAMES = set(FRAMEWORKS)


def _names_compared(tree: ast.AST) -> list[int]:
    """Lines where a framework name (a string constant equal to a record's name) is compared with ==, !=,
    in or not in, or used as a key of a literal mapping (a framework switch written as a table)."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            consts = [c for c in [node.left, *node.comparators] for c in ast.walk(c)
                      if isinstance(c, ast.Constant) and c.value in NAMES]
            if consts:
                lines.append(node.lineno)
        if isinstance(node, ast.Dict) and any(isinstance(k, ast.Constant) and k.value in NAMES for k in node.keys):
            lines.append(node.lineno)
    return lines


def test_the_cost_model_compares_no_framework_names():
    found = {}
    for path in sorted((ROOT / "advisor" / "cost").rglob("*.py")):
        lines = _names_compared(ast.parse(path.read_text()))
        if lines:
            found[str(path.relative_to(ROOT))] = lines
    assert found == {}, f"framework behaviour belongs in advisor/specs/frameworks.py, not in {found}"


def test_every_record_documents_its_fields_and_names_itself():
    source = (ROOT / "advisor" / "specs" / "frameworks.py").read_text()
    klass = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "Framework")
    documented = set()
    body = klass.body
    for node, after in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
            documented.add(node.target.id)
    assert documented == {f.name for f in fields(Framework)}
    for name, record in FRAMEWORKS.items():
        assert record.name == name


def test_selective_policies_name_known_units():
    for record in FRAMEWORKS.values():
        for unit in record.selective_recompute or ():
            assert unit in recompute.UNITS


def test_frameworks_with_lists_the_records_that_have_a_capability():
    assert frameworks_with("unfused_optimizer") == "pytorch, torchtitan, deepspeed or mindspore"
    assert frameworks_with("cuda_graphs") == "megatron"
    assert frameworks_with("host_embedding") == "mindspore"


def _selective(framework: str, attention: str):
    model, hw = load_model("llama3-8b"), load_hardware("dgx-h100")
    job = TrainingJob(global_batch_size=16, seq_length=4096, framework=framework, attention=attention)
    s = Strategy(dp=8, tp=1, pp=1, micro_batch_size=1, num_micro_batches=2, recompute="selective", zero_stage=1)
    return estimate(model, hw, Cluster(nodes=1, devices=8), job, s)


@pytest.mark.parametrize("framework", sorted(FRAMEWORKS))
@pytest.mark.parametrize("attention", ["flash", "math"])
def test_hfu_counts_exactly_the_replayed_work_that_is_timed(framework, attention):
    """HFU exceeds MFU exactly when selective recomputation replays a GEMM or the attention core, which
    is also when the recompute time part holds that work (one table for memory, time and FLOPs)."""
    e = _selective(framework, attention)
    replays_flops = any(name in ("attention_core", "up_projection", "mlp_forward", "alternate_linear")
                        for unit in recompute.selective_units(TrainingJob(global_batch_size=16, seq_length=4096,
                                                                          framework=framework, attention=attention),
                                                            moe_layer=False)
                        for name in unit.replays)
    assert (e.hfu > e.mfu * (1 + 1e-9)) == replays_flops
    assert e.time_s["recompute"] > 0


def test_mindspore_selective_with_flash_replays_only_the_activation():
    """MindFormers' select_recompute replays SwiGLU's SiLU and Mul (memory-bound): no FLOPs are replayed
    with flash attention, while with math attention its scores are replayed and counted."""
    flash, math = _selective("mindspore", "flash"), _selective("mindspore", "math")
    assert flash.hfu == pytest.approx(flash.mfu, rel=1e-12)
    assert math.hfu > math.mfu * 1.001


def test_a_strategy_setting_with_a_frameworks_map_is_a_rule_of_the_search():
    """An on/off Strategy setting whose record names its frameworks is illegal, vectorized, elsewhere."""
    from dataclasses import replace

    from advisor.space.rules import framework_rule
    from advisor.space.strategy import StrategyBatch
    from advisor.specs.setting import Setting

    rule, sentence = framework_rule("full_batch", Setting(doc="every rank reads the whole batch", kind="boolean",
                                                          flags=("--full-batch",),
                                                          frameworks={"mindspore": {"true": "full_batch = true"}}))
    s = Strategy(dp=8, num_micro_batches=2)
    b = StrategyBatch.from_strategies([s, replace(s, full_batch=True)], 32)
    model, cluster = load_model("llama3-8b"), Cluster(nodes=1, devices=8)
    megatron = TrainingJob(global_batch_size=16, seq_length=4096)
    mindspore = replace(megatron, framework="mindspore")
    assert rule(model, cluster, megatron, b).tolist() == [False, True]
    assert rule(model, cluster, mindspore, b).tolist() == [False, False]
    assert sentence == "--full-batch needs a framework that runs it (mindspore)"
    with pytest.raises(TypeError, match="on/off"):
        framework_rule("tp", Setting(doc="x", kind="positive_int", frameworks={"megatron": {"2": "--tp 2"}}))
