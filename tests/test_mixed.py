"""Heterogeneous clusters (advisor.specs.mixed, advisor.cost.mixed, advisor.search.mixed): parsing, the
composed cost model against the homogeneous one, the work split by speed, plans and the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest

from advisor.commands.inputs import resolve_inputs
from advisor.commands.mixed import estimate_plan, mixed_inputs, recommend_mixed
from advisor.cost.estimate import estimate
from advisor.cost.mixed_estimate import estimate_mixed
from advisor.errors import AdvisorError
from advisor.plan import dumps_plan, plan_from_dict, save_plan
from advisor.search import Pins
from advisor.search.mixed_split import micro_batches_by_speed, stage_layers_by_speed
from advisor.space.strategy import Strategy
from advisor.specs.hardware import hardware_from_dict, load_hardware
from advisor.specs.job import Cluster
from advisor.specs.mixed import ClusterPart, MixedHardware, MixedLayout, parse_mixed
from tests._cli import run_cli


def _twin(nodes: int = 2) -> MixedHardware:
    """Two parts of the same A100 profile under two names: the mixed model must equal the homogeneous one."""
    a100 = load_hardware("dgx-a100-80g")
    twin = hardware_from_dict({**a100.raw, "name": "a100-twin"}, "test")
    return MixedHardware((ClusterPart(a100, nodes), ClusterPart(twin, nodes)))


# ---- parsing -------------------------------------------------------------------------------------
def test_parse_mixed_reads_parts_and_refuses_malformed_specs():
    mixed = parse_mixed("dgx-a100-80g:4,dgx-h100:2")
    assert mixed.names == ("dgx-a100-80g", "dgx-h100")
    assert (mixed.nodes, mixed.devices) == (6, 48)
    for bad, words in (("dgx-a100-80g:4", "2 to 4 parts"), ("dgx-a100-80g:4,dgx-a100-80g:2", "named twice"),
                       ("dgx-a100-80g:x,dgx-h100:2", "positive integer"), ("dgx-a100-80g:0,dgx-h100:2", "positive"),
                       (":4,dgx-h100:2", "PROFILE:NODES"), ("no-such-profile:1,dgx-h100:1", "no-such-profile")):
        with pytest.raises(AdvisorError, match=words):
            parse_mixed(bad)


# ---- the composed cost model equals the homogeneous one on identical parts ----------------------
@pytest.mark.parametrize("layout", ["pipeline", "data"])
def test_identical_parts_price_like_one_homogeneous_cluster(layout):
    mixed = _twin()
    inputs = resolve_inputs("llama3-8b", mixed.parts[0].profile, devices=mixed.devices, global_batch_size=64)
    if layout == "pipeline":
        s = Strategy(dp=2, tp=8, pp=2, micro_batch_size=1, num_micro_batches=32, zero_stage=1, recompute="selective",
                     mesh_order=("pp", "dp", "cp", "tp"))
        lay = MixedLayout("pipeline", stage_devices=mixed.names)
    else:
        s = Strategy(dp=4, tp=8, pp=1, micro_batch_size=1, num_micro_batches=16, zero_stage=1, recompute="selective",
                     mesh_order=("dp", "pp", "cp", "tp"))
        lay = MixedLayout("data", replica_devices=(mixed.names[0],) * 2 + (mixed.names[1],) * 2,
                          replica_micro_batches=(16,) * 4)
    mixed_e = estimate_mixed(inputs.model, mixed, inputs.job, s, lay)
    homo = estimate(inputs.model, mixed.parts[0].profile, Cluster(4, 32), inputs.job, s)
    assert mixed_e.feasible and homo.feasible
    assert mixed_e.step_time_s == pytest.approx(homo.step_time_s, rel=1e-9)
    assert mixed_e.memory_gib == pytest.approx(homo.memory_gib.total, rel=1e-9)
    for part in homo.time_s:
        assert mixed_e.time_s[part] == pytest.approx(homo.time_s[part], rel=1e-9, abs=1e-12), part


def test_a_slower_link_between_types_slows_the_pipeline_boundary_only():
    a100 = load_hardware("dgx-a100-80g")
    slow = a100.with_overrides(inter_node_gbps=1.0)
    slow = hardware_from_dict({**slow.raw, "name": "a100-slow-nic"}, "test")
    mixed = MixedHardware((ClusterPart(a100, 2), ClusterPart(slow, 2)))
    inputs = resolve_inputs("llama3-8b", a100, devices=32, global_batch_size=64)
    s = Strategy(dp=1, tp=8, pp=4, micro_batch_size=1, num_micro_batches=64, recompute="selective")
    fast_first = estimate_mixed(inputs.model, mixed, inputs.job, s, MixedLayout("pipeline", stage_devices=mixed.names[:1] * 2 + mixed.names[1:] * 2))
    homo = estimate(inputs.model, a100, Cluster(4, 32), inputs.job, s)
    # 2 sends per micro-batch cross the 1 GB/s boundary: 64 x 2 x (8192 x 4096 x 2 / 8 bytes) / 1e9 at least
    crossing = 2 * 64 * 8192 * 4096 * 2 / 8 / 1e9
    assert fast_first.time_s["pp_comm"] >= crossing
    assert homo.time_s["pp_comm"] < crossing / 10
    assert fast_first.time_s["compute"] == pytest.approx(homo.time_s["compute"], rel=1e-9)


# ---- work sized to speed ----------------------------------------------------------------------
def test_layers_follow_speed_and_memory():
    fixed = np.zeros((1, 2))
    per_layer = np.array([[1.0, 2.0]])        # stage 0 twice as fast
    active = np.ones((1, 2), dtype=bool)
    assert stage_layers_by_speed(fixed, per_layer, np.array([[99, 99]]), active, 30).tolist() == [[20, 10]]
    assert stage_layers_by_speed(fixed, per_layer, np.array([[15, 99]]), active, 30).tolist() == [[15, 15]]
    # no split fits: all zeros (the caller keeps even layers)
    assert stage_layers_by_speed(fixed, per_layer, np.array([[10, 10]]), active, 30).tolist() == [[0, 0]]


def test_micro_batches_follow_speed_and_sum_to_the_batch():
    q, full = micro_batches_by_speed(np.zeros((1, 2)), np.array([[1.0, 3.0]]), np.array([[1, 1]]), np.array([8]))
    assert (q.tolist(), full.tolist()) == ([[6, 2]], [[1, 1]])
    # two replicas per type, 9 micro-batches: the fast type's replicas run 4 and 3 (one of them full)
    q, full = micro_batches_by_speed(np.zeros((1, 2)), np.array([[1.0, 3.0]]), np.array([[2, 2]]), np.array([9]))
    replicas = np.array([[2, 2]])
    counts = q * full + (q - 1) * (replicas - full)
    assert counts.sum() == 9 and q.tolist() == [[4, 1]] and full.tolist() == [[1, 2]]
    assert np.all((full == replicas) | (q - 1 >= 1))      # every replica runs at least one
    # pace 4 (the fast replicas at 4 and 3, the slow ones at 1 each, 3 s): no other split is faster


# ---- the search ---------------------------------------------------------------------------------
def test_mixed_cluster_beats_either_half_and_the_faster_type_gets_more_work():
    mixed, inputs = mixed_inputs("llama3-8b", "dgx-a100-80g:2,dgx-h100:2", None, None, global_batch_size=256)
    result = recommend_mixed(inputs, mixed, top_k=3)
    best = result.estimates[0]
    halves = []
    for name in mixed.names:
        hw = load_hardware(name)
        half = resolve_inputs("llama3-8b", hw, nodes=2, global_batch_size=256)
        from advisor.commands.recommend import recommend
        halves.append(recommend(half.model, hw, half.cluster, half.job, top_k=1).estimates[0].tokens_per_s)
    assert best.feasible
    assert best.tokens_per_s > max(halves)
    assert best.tokens_per_s < sum(halves) * 1.02          # no better than the halves side by side
    lay = best.layout
    if lay.kind == "data":
        a = [m for d, m in zip(lay.replica_devices, lay.replica_micro_batches) if d == "dgx-a100-80g"]
        h = [m for d, m in zip(lay.replica_devices, lay.replica_micro_batches) if d == "dgx-h100"]
        assert min(h) > max(a)
        assert sum(lay.replica_micro_batches) * result.best.strategy.micro_batch_size == 256
    else:
        layers = result.best.strategy.stage_layers
        on_h = [n for n, d in zip(layers, lay.stage_devices) if d == "dgx-h100"]
        on_a = [n for n, d in zip(layers, lay.stage_devices) if d == "dgx-a100-80g"]
        assert min(on_h) > max(on_a)
    # the plan's own estimate reprices to the search's figure
    assert estimate_plan(result.best).tokens_per_s == pytest.approx(best.tokens_per_s, rel=1e-9)


def test_mixed_search_offers_both_context_parallel_kinds():
    from advisor.search.mixed import _rows
    mixed, inputs = mixed_inputs("llama3-8b", "dgx-a100-80g:2,dgx-h100:2", None, None, global_batch_size=256)
    rows = _rows(inputs.model, mixed, inputs.job, Pins(cp=4))
    assert set(rows["cp_comm"].tolist()) == {0, 1}
    only_ring = _rows(inputs.model, mixed, inputs.job, Pins(cp=4, cp_comm="p2p"))
    assert set(only_ring["cp_comm"].tolist()) == {0}


def test_pinned_pipeline_sizes_stages_by_type():
    mixed, inputs = mixed_inputs("llama3-70b", "dgx-a100-80g:4,dgx-h100:4", None, None, global_batch_size=128)
    result = recommend_mixed(inputs, mixed, Pins(dp=1, pp=4, tp=4), top_k=1)
    plan, e = result.best, result.estimates[0]
    assert e.layout.kind == "pipeline" and e.feasible
    speed = {d: n for d, n in zip(e.layout.stage_devices, plan.strategy.stage_layers)}
    assert sum(plan.strategy.stage_layers) == 80
    assert speed["dgx-h100"] > speed["dgx-a100-80g"]


# ---- plans ----------------------------------------------------------------------------------------
def test_mixed_plan_round_trips_and_refuses_a_layout_that_does_not_place(tmp_path):
    mixed, inputs = mixed_inputs("llama3-8b", "dgx-a100-80g:1,dgx-h100:1", None, None, global_batch_size=32)
    plan = recommend_mixed(inputs, mixed, top_k=1).best
    text = dumps_plan(plan)
    data = json.loads(text)
    assert [p["nodes"] for p in data["hardware"]] == [1, 1]
    assert dumps_plan(plan_from_dict(json.loads(text))) == text
    if plan.layout.kind == "data":
        assert sum(data["parallel"]["dp_batch_split"]) == pytest.approx(1.0)
        data["parallel"]["replica_devices"][0] = "dgx-b200"
        words = "not a part of the cluster"
    else:
        data["parallel"]["stage_devices"] = data["parallel"]["stage_devices"][:-1]
        words = "device types given"
    with pytest.raises(AdvisorError, match=words):
        plan_from_dict(data)
    homo = json.loads(text)
    homo["hardware"] = homo["hardware"][0]["profile"]
    with pytest.raises(AdvisorError, match="mixed cluster"):
        plan_from_dict(homo)


# ---- the command line -------------------------------------------------------------------------
def test_cli_recommend_estimate_export_and_refusals(monkeypatch, capsys, tmp_path):
    out = tmp_path / "mixed.json"
    code, text, _ = run_cli(monkeypatch, capsys, "recommend", "--model", "llama3-70b", "--hardware",
                            "dgx-a100-80g:4,dgx-h100:4", "--pp", "4", "--dp", "1", "--global-batch", "128",
                            "--top", "2", "--out", str(out))
    assert code == 0 and "pipeline: dgx-" in text and out.exists()
    code, text, _ = run_cli(monkeypatch, capsys, "estimate", "--plan", str(out), "--json")
    assert code == 0 and json.loads(text)["layout"] == "pipeline"
    code, text, _ = run_cli(monkeypatch, capsys, "export", str(out), "--to", "megatron")
    assert code == 0 and "--pipeline-model-parallel-layout" in text
    code, _, err = run_cli(monkeypatch, capsys, "export", str(out), "--to", "k8s")
    assert code == 2 and "pod template" in err
    code, _, err = run_cli(monkeypatch, capsys, "execute", str(out))
    assert code == 2 and "mixed cluster" in err
    code, _, err = run_cli(monkeypatch, capsys, "recommend", "--model", "llama3-8b", "--hardware",
                           "dgx-a100-80g:1,dgx-h100:1", "--nodes", "2")
    assert code == 2 and "per part" in err
    code, _, err = run_cli(monkeypatch, capsys, "recommend", "--model", "llama3-8b", "--hardware",
                           "dgx-a100-80g:1,dgx-h100:1", "--searcher", "drec")
    assert code == 2 and "--searcher" in err
    code, text, _ = run_cli(monkeypatch, capsys, "estimate", "--model", "llama3-70b", "--hardware",
                            "dgx-a100-80g:4,dgx-h100:4", "--tp", "8", "--pp", "8", "--dp", "1", "--recompute", "full",
                            "--global-batch", "128", "--json")
    assert code == 0 and json.loads(text)["feasible"] is True
    code, _, err = run_cli(monkeypatch, capsys, "estimate", "--model", "llama3-70b", "--hardware",
                           "dgx-a100-80g:4,dgx-h100:4", "--tp", "4", "--pp", "4", "--dp", "4")
    assert code == 1 and "fits in no layout" in err


def test_a_data_layout_plan_is_not_exported(tmp_path, monkeypatch, capsys):
    mixed, inputs = mixed_inputs("llama3-8b", "dgx-a100-80g:1,dgx-h100:1", None, None, global_batch_size=32)
    plan = recommend_mixed(inputs, mixed, Pins(pp=1), top_k=1).best
    assert plan.layout.kind == "data"
    path = tmp_path / "data.json"
    save_plan(plan, path)
    code, _, err = run_cli(monkeypatch, capsys, "export", str(path), "--to", "torchtitan")
    assert code == 2 and "same share" in err


def test_whatif_replace_half_adds_a_mixed_twin_of_each_even_point():
    from advisor.whatif import whatif

    result = whatif("llama3-8b", ["dgx-a100-80g"], nodes=[1, 2], global_batch=[128], workers=1, replace_half="dgx-h100")
    labels = [(p.hardware, p.nodes) for p in result.points]
    assert labels == [("dgx-a100-80g", 1), ("dgx-a100-80g", 2), ("dgx-a100-80g+dgx-h100", 2)]
    homo, mixed = result.points[1], result.points[2]
    assert mixed.fits and mixed.plan.mixed.label == "dgx-a100-80g:1,dgx-h100:1"
    assert mixed.tokens_per_s > homo.tokens_per_s * 1.3       # an H100 node is well over 1.3 A100 nodes
    with pytest.raises(AdvisorError, match="--replace-half goes with --nodes"):
        whatif("llama3-8b", ["dgx-a100-80g"], devices=[16], workers=1, replace_half="dgx-h100")
    with pytest.raises(AdvisorError, match="already runs"):
        whatif("llama3-8b", ["dgx-a100-80g"], nodes=[2], workers=1, replace_half="dgx-a100-80g")


def test_malformed_mixed_plans_are_refused_with_a_sentence(tmp_path, monkeypatch, capsys):
    mixed, inputs = mixed_inputs("llama3-8b", "dgx-a100-80g:1,dgx-h100:1", None, None, global_batch_size=32)
    plan = recommend_mixed(inputs, mixed, Pins(pp=1), top_k=1).best
    data = json.loads(dumps_plan(plan))
    too_big = json.loads(json.dumps(data))
    too_big["parallel"]["dp_batch_split"][0] = 1e308
    with pytest.raises(AdvisorError, match="dp_batch_split"):
        plan_from_dict(too_big)
    supernet = json.loads(json.dumps(data))
    from advisor.specs.model import MODELS_DIR
    import yaml
    supernet["model"] = yaml.safe_load((MODELS_DIR / "hat-supernet.yaml").read_text())
    with pytest.raises(AdvisorError, match="transformer plans"):
        plan_from_dict(supernet)
    # swapping is not priced on mixed clusters: a result with the reason, not a wrong figure
    from dataclasses import replace as _replace
    e = estimate_mixed(inputs.model, mixed, inputs.job, _replace(plan.strategy, swap_layers=(1,)), plan.layout)
    assert not e.feasible and "swap" in e.reasons[0]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**data, "model": "gpt"}))
    code, _, err = run_cli(monkeypatch, capsys, "estimate", "--plan", str(bad))
    assert code == 2 and "model" in err
