"""#29: models MindFormers' legacy Llama cannot express (head_dim, latent attention, shared experts, dense first
layers) export on its mcore path (advisor.export.mindformers_mcore), read back at the same price, and MindFormers'
own config conversion builds the priced architecture and degrees."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from advisor.commands.estimate_request import estimate_request
from advisor.commands.inputs import resolve_inputs
from advisor.commands.recommend import recommend
from advisor.export import export_plan
from advisor.search import Pins

CHECK = Path(__file__).with_name("_mindformers_mcore_check.py")


@pytest.fixture(scope="module")
def plans():
    out = {}
    # DeepSeek-V3 at the layout the search picks for it (pinned: the search itself is not under test here)
    for name, devices, pins in (("qwen3-30b-a3b", 32, Pins()), ("deepseek-v3", 256, Pins(tp=1, pp=32, ep=8, cp=1)),
                                ("llama3-8b", 8, Pins())):
        i = resolve_inputs(name, "dgx-h100", devices=devices, framework="mindspore")
        out[name] = recommend(i.model, i.hardware, i.cluster, i.job, pins=pins, top_k=1).plans[0]
    return out


def _doc(plan) -> tuple[dict, object]:
    result = export_plan(plan, "mindspore")
    return yaml.safe_load(result.files["mindformers_parallel.yaml"]), result


def test_models_the_legacy_path_cannot_express_go_to_mcore(plans):
    doc, result = _doc(plans["qwen3-30b-a3b"])
    assert not result.unsupported
    mc = doc["model"]["model_config"]
    assert doc["use_legacy"] is False and "moe_config" not in doc
    assert (mc["model_type"], mc["head_dim"], mc["num_experts"], mc["moe_intermediate_size"]) == ("qwen3_moe", 128, 128, 768)
    doc, result = _doc(plans["deepseek-v3"])
    mc = doc["model"]["model_config"]
    assert not result.unsupported and doc["use_legacy"] is False
    assert (mc["kv_lora_rank"], mc["n_shared_experts"], mc["first_k_dense_replace"], mc["num_nextn_predict_layers"]) \
        == (512, 1, 3, 0)
    doc, _ = _doc(plans["llama3-8b"])
    assert doc["use_legacy"] is True and "num_layers" in doc["model"]["model_config"]     # LlamaConfig's keys


def test_multi_copy_is_refused_on_the_mcore_path(plans):
    plan = plans["qwen3-30b-a3b"]
    copied = replace(plan, strategy=replace(plan.strategy, micro_batch_copies=2))
    assert any(u.startswith("parallel.micro_batch_copies = 2") for u in export_plan(copied, "mindspore").unsupported)


@pytest.mark.parametrize("name, devices", [("qwen3-30b-a3b", 32), ("deepseek-v3", 256)])
def test_the_export_reads_back_at_the_same_price(plans, tmp_path, name, devices):
    plan = plans[name]
    for file, text in export_plan(plan, "mindspore").files.items():
        (tmp_path / file).write_text(text)
    back = estimate_request(name, "dgx-h100", None, devices, job={}, strategy={},
                            launch=str(tmp_path / "mindformers_parallel.yaml"))
    assert back.estimate.tokens_per_s == pytest.approx(plan.prediction["tokens_per_s"], rel=1e-9)
    assert back.estimate.memory_gib.total == pytest.approx(plan.prediction["memory_gib"]["total"], rel=1e-9)
    with pytest.raises(Exception, match="num_layers"):
        estimate_request("llama3-8b", "dgx-h100", None, devices, job={}, strategy={},
                         launch=str(tmp_path / "mindformers_parallel.yaml"))


def _python() -> str | None:
    python = os.environ.get("ADVISOR_MINDSPORE_PYTHON")
    if python is None:
        return None
    # outside the checkout: importing MindFormers starts its logger, which writes ./output/log
    probe = subprocess.run([python, "-c", "import mindformers.tools.register.config"], capture_output=True, timeout=300,
                           cwd=tempfile.gettempdir())
    return python if probe.returncode == 0 else None


def test_mindformers_builds_the_priced_model(plans, tmp_path):
    python = _python()
    if python is None:
        pytest.skip("MindFormers not installed in ADVISOR_MINDSPORE_PYTHON's environment")
    names = ["qwen3-30b-a3b", "deepseek-v3"]
    paths = []
    for name in names:
        path = tmp_path / f"{name}.yaml"
        path.write_text(export_plan(plans[name], "mindspore").files["mindformers_parallel.yaml"])
        paths.append(str(path))
    proc = subprocess.run([python, "-E", str(CHECK), *paths], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = [json.loads(ln[len("RESULT"):]) for ln in proc.stdout.splitlines() if ln.startswith("RESULT")]
    assert len(results) == len(names)
    for name, tc in zip(names, results):
        _check(plans[name], tc)


def _check(plan, tc: dict) -> None:
    m, s = plan.model, plan.strategy
    assert (tc["num_layers"], tc["hidden_size"], tc["num_attention_heads"]) == (m.num_layers, m.hidden_size,
                                                                               m.num_attention_heads)
    assert (tc["num_moe_experts"], tc["moe_router_topk"], tc["moe_ffn_hidden_size"]) == (
        m.moe.num_experts, m.moe.top_k, m.moe.expert_ffn_hidden_size)
    assert (tc["tensor_model_parallel_size"], tc["pipeline_model_parallel_size"], tc["expert_model_parallel_size"],
            tc["data_parallel_size"], tc["context_parallel_size"]) == (s.tp, s.pp, s.ep, s.dp, s.cp)
    assert tc["moe_expert_capacity_factor"] is None and tc["mtp_num_layers"] == 0       # dropless, no MTP
    if m.mla is None:
        assert (tc["num_query_groups"], tc["kv_channels"]) == (m.num_kv_heads, m.head_dim)
    else:
        assert tc["multi_latent_attention"] and (tc["kv_lora_rank"], tc["q_lora_rank"]) == (m.mla.kv_lora_rank,
                                                                                            m.mla.q_lora_rank)
        assert (tc["moe_shared_expert_intermediate_size"], tc["first_k_dense_replace"]) == (
            m.moe.shared_ffn, m.moe.first_k_dense_layers)
