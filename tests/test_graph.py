"""Operator graphs: transformer graphs agree with the model description; JSON graphs load or fail clearly."""

from __future__ import annotations

import copy
import json
from dataclasses import replace

import numpy as np
import pytest

from advisor.cost.memory import layer_activation_terms
from advisor.errors import AdvisorError
from advisor.graph.loader import EXAMPLES_DIR, bundled_graphs, graph_from_dict, load_graph
from advisor.graph.transformer import transformer_graph
from advisor.space.strategy import Strategy, StrategyBatch
from advisor.specs.job import TrainingJob
from advisor.specs.model import load_model, model_from_dict

JOB = TrainingJob(global_batch_size=8, seq_length=2048, dropout=True)  # the graph keeps Megatron-style dropout masks


def _flops(graph) -> float:
    return sum(op.flops * op.count for op in graph.operators)


@pytest.mark.parametrize("name", ["gpt3-175b", "llama3-70b", "mixtral-8x7b", "bert-large"])
def test_parameters_and_flops_match_the_model_description(name):
    model = load_model(name)
    job = TrainingJob(global_batch_size=8, seq_length=model.seq_length)
    g = transformer_graph(model, job, batch=2)
    assert g.num_params == model.num_params
    tokens = 2 * model.seq_length
    # the graph's attention operators compute the whole s x s product (what the operator-level
    # searchers shard), as a non-causal count does
    assert _flops(g) == pytest.approx(model.forward_flops_per_token(causal=False) * tokens, rel=1e-9)


@pytest.mark.parametrize("attention", ["math", "flash"])
def test_saved_activations_per_layer_match_the_cost_model(attention):
    # math attention: sbh(34 + 5as/h) per layer without parallelism (Korthikanti et al. 2022, section 4.1)
    model = load_model("gpt3-175b")
    job = replace(JOB, attention=attention)
    g = transformer_graph(model, job, batch=1)
    saved = sum(g.tensors[t].nbytes for op in g.operators if op.name.startswith("layer.") for t in op.saves)
    batch = StrategyBatch.from_strategies([Strategy(dp=1, tp=1, pp=1)], model.num_layers)
    terms = layer_activation_terms(model, job, batch, moe_layer=False)
    assert saved == pytest.approx(float(terms.no_recompute[0]))
    if attention == "math":
        s, h, a = 2048, model.hidden_size, model.num_attention_heads
        assert saved == pytest.approx(s * h * (34 + 5 * a * s / h))


def test_gqa_shrinks_key_value_projection():
    model = load_model("llama3-70b")
    g = transformer_graph(model, JOB, batch=1)
    assert g.tensors["layer.wkv"].shape == (model.hidden_size, model.num_kv_heads, 2, model.head_dim)
    qkv = next(op for op in g.operators if op.name == "layer.qkv")
    assert "g" in qkv.all_labels and "r" in qkv.no_cut


def test_repeated_layers_are_one_template_with_links():
    model = load_model("gpt3-175b")
    g = transformer_graph(model, JOB, batch=1)
    assert {op.count for op in g.operators if op.name.startswith("layer.")} == {96}
    loops = [e for e in g.edges if e.src_tensor == "layer.res2_out" and e.dst_tensor == "layer.x_in"]
    assert sorted(e.count for e in loops) == [95, 95]           # into ln1 and the residual of the next layer
    first = [e for e in g.edges if e.src_tensor == "x_emb"]
    assert [e.count for e in first] == [1, 1]
    small = transformer_graph(replace(model, num_layers=2), JOB, batch=1)
    assert len(small.operators) == len(g.operators) and len(small.edges) == len(g.edges)


def test_mixed_dense_and_moe_layers_link_in_sequence():
    raw = {"name": "moe-mix", "source": "test", "num_layers": 6, "hidden_size": 256, "num_attention_heads": 4,
           "vocab_size": 1000, "seq_length": 128,
           "moe": {"num_experts": 4, "top_k": 2, "expert_ffn_hidden_size": 512, "layer_frequency": 2}}
    model = model_from_dict(raw, "test")
    g = transformer_graph(model, TrainingJob(global_batch_size=4, seq_length=128), batch=2)
    counts = {op.name.split(".")[0]: op.count for op in g.operators if "." in op.name}
    assert counts == {"layer": 3, "moe_layer": 3}
    links = {(link.source, link.target): link.count for link in g.links}
    assert links[("layer.res2_out", "moe_layer.x_in")] == 3
    assert links[("moe_layer.res2_out", "layer.x_in")] == 2
    assert g.num_params == model.num_params


def test_pipeline_stage_graphs():
    model = load_model("gpt3-175b")
    middle = transformer_graph(model, JOB, batch=1, layers=(8, 16), first_stage=False, last_stage=False)
    assert {op.name for op in middle.operators}.isdisjoint({"embed", "head", "loss"})
    assert middle.operators[0].count == 8
    last = transformer_graph(model, JOB, batch=1, layers=(88, 96), first_stage=False)
    assert last.tensors["w_head"].tied_to is None          # the last stage keeps its own copy of tied embeddings


# ---- JSON graphs ---------------------------------------------------------------------------------
def test_bundled_examples_load():
    assert {"resnet_cnn", "dlrm_recommender"} <= set(bundled_graphs())
    cnn = load_graph("resnet_cnn")
    conv = next(op for op in cnn.operators if op.name == "conv_a")
    assert conv.count == 3 and {"h", "w"} <= conv.no_cut and conv.flops > 0
    dlrm = load_graph(EXAMPLES_DIR / "dlrm_recommender.json")
    lookup = next(op for op in dlrm.operators if op.name == "lookup0")
    assert lookup.sum_labels == {"v"}                          # row-sharded tables leave partial sums
    assert dlrm.num_params > 1e9


def _example() -> dict:
    return json.loads((EXAMPLES_DIR / "resnet_cnn.json").read_text())


@pytest.mark.parametrize("mutate, words", [
    (lambda d: d.update(colour="red"), ["unknown key 'colour'"]),
    (lambda d: d["tensors"]["images"].update(shape=[128, -3, 224, 224]), ["tensors['images']", "'shape'", "-3"]),
    (lambda d: d["operators"][0].update(inputs=["images", "nope"]), ["operators[0] ('conv1')", "'inputs'", "'nope'"]),
    (lambda d: d["operators"][0].update(kind="fft"), ["operators[0]", "'kind'", "'fft'"]),
    (lambda d: d["operators"][12].update(inputs=["gap_out", "conv1_w"]), ["operators[12] ('fc')", "matmul"]),
    (lambda d: d["operators"][2].update(einsum="abc->abc"), ["operators[2] ('relu1')", "'einsum'", "'abc->abc'"]),
    (lambda d: d["operators"][1].pop("outputs"), ["operators[1] ('bn1')", "missing required key 'outputs'"]),
    (lambda d: d["links"][0].update(to="gap_out"), ["links[0]", "'to'", "gap_out"]),
    (lambda d: d["operators"][3].update(outputs=["relu1_out"]), ["operators[3] ('pool1')", "relu1_out"]),
    (lambda d: d["operators"][0].update(no_cut=["q"]), ["operators[0] ('conv1')", "'no_cut'", "'q'"]),
])
def test_bad_graph_json_names_file_key_and_value(tmp_path, mutate, words):
    data = copy.deepcopy(_example())
    mutate(data)
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(data))
    with pytest.raises(AdvisorError) as err:
        load_graph(path)
    message = str(err.value)
    assert "broken.json" in message
    for word in words:
        assert word in message, message


def test_malformed_and_missing_files(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(AdvisorError, match="bad.json: malformed JSON"):
        load_graph(bad)
    with pytest.raises(AdvisorError, match="not found.*resnet_cnn"):
        load_graph(tmp_path / "absent.json")


def test_einsum_override_and_defaults():
    g = graph_from_dict({
        "name": "tiny", "tensors": {"x": {"shape": [4, 8]}, "w": {"shape": [8, 6], "param": True},
                                    "y": {"shape": [4, 6]}, "z": {"shape": [4, 6]}},
        "operators": [
            {"name": "mm", "kind": "matmul", "inputs": ["x", "w"], "outputs": ["y"], "einsum": "ik,kj->ij"},
            {"name": "act", "kind": "elementwise", "inputs": ["y"], "outputs": ["z"]},
        ]}, "tiny.json")
    mm = g.operators[0]
    assert mm.labels == (("i", "k"), ("k", "j"), ("i", "j")) and mm.sum_labels == {"k"}
    assert mm.flops == 2 * 4 * 8 * 6
    assert mm.saves == ("x",)
    assert [(e.src, e.dst) for e in g.edges] == [(0, 1)]
    assert np.isclose(g.num_params, 48)
