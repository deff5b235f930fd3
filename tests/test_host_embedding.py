"""A transformer's word embedding on the host CPU (issue 13, Host&Device heterogeneous training):
priced (advisor.cost.host_embedding), searched by the enumerator, refused where no framework runs
it, kept in plans and exported for MindSpore."""

from __future__ import annotations

import ast
import json
from dataclasses import replace

import numpy as np
import pytest

from advisor.cost import comm
from advisor.cost import host_embedding as he
from advisor.cost.estimate import estimate, estimate_batch
from advisor.cost.parameter_server import host_memory_bytes_per_s
from advisor.cost.memory import ALLOCATOR_OVERHEAD, GIB, stage_params, state_bytes_per_param
from advisor.errors import AdvisorError
from advisor.export import export_plan
from advisor.plan import Plan, plan_from_dict, plan_to_dict
from advisor.search import Pins
from advisor.search import enumerate as en
from advisor.space.rules import legal_mask, violations
from advisor.space.strategy import Strategy, StrategyBatch
from advisor.specs.hardware import hardware_from_dict, load_hardware
from advisor.specs.job import Cluster, TrainingJob
from advisor.specs.model import load_model, model_from_dict
from tests._cli import run_cli

ASCEND = load_hardware("ascend-910b")
LLAMA = load_model("llama3-8b")           # untied: its 128,256 x 4,096 table is apart from the head
JOB = TrainingJob(global_batch_size=64, seq_length=4096, dtype="bf16", framework="mindspore")
Z1 = Strategy(dp=8, tp=1, pp=1, micro_batch_size=1, num_micro_batches=8, zero_stage=1)


def _estimate(strategy, model=LLAMA, hw=ASCEND, job=JOB, devices=8):
    return estimate(model, hw, Cluster.of(hw, devices=devices), job, strategy)


def test_the_table_leaves_the_first_stage_only():
    """Weights, gradients and optimizer states of vocab x h / tp parameters leave stage 0; the last
    stage (with the untied head) keeps everything."""
    s = Strategy(dp=2, tp=2, pp=2, micro_batch_size=1, num_micro_batches=32, zero_stage=0)
    both = StrategyBatch.from_strategies([s, replace(s, host_embedding=True)], LLAMA.num_layers)
    dense, _ = stage_params(LLAMA, both)
    table = LLAMA.vocab_size * LLAMA.hidden_size / 2
    assert dense[0, 0] - dense[1, 0] == pytest.approx(table)
    assert dense[0, 1] == dense[1, 1]
    wb, gb, ob = state_bytes_per_param(JOB)
    e = estimate_batch(LLAMA, ASCEND, Cluster.of(ASCEND, devices=8), JOB, both)
    total = e.memory.stage_total
    # ZeRO-0: weights, gradients and states whole, plus the allocator's share of them
    assert total[0, 0] - total[1, 0] == pytest.approx(table * (wb + gb + ob) * (1 + ALLOCATOR_OVERHEAD))
    assert total[0, 1] == pytest.approx(total[1, 1])
    hosted = _estimate(replace(s, host_embedding=True))
    # fp32 weight, AdamW's two moments and the gradient
    assert he.state_bytes(JOB) + he.HOST_GRAD_BYTES == 16.0
    assert hosted.host_embedding_gib * GIB == pytest.approx(table * 16.0)


def test_one_replica_pays_lookups_copies_and_the_host_adam():
    """dp = 1 (nothing to exchange): per micro-batch the host gather and scatter-add at the host's
    share of its memory bandwidth and both PCIe copies; per step Adam and the cleared gradient. With
    a pipeline only the first stage's micro-batch grows."""

    def pair(s, devices):
        cluster = Cluster.of(ASCEND, devices=devices)
        return [estimate_batch(LLAMA, ASCEND, cluster, JOB, StrategyBatch.from_strategies([x], LLAMA.num_layers))
                for x in (s, replace(s, host_embedding=False))]

    s = Strategy(dp=1, tp=1, pp=1, micro_batch_size=1, num_micro_batches=64, zero_stage=0, host_embedding=True)
    e, base = pair(s, 1)
    h, tokens = LLAMA.hidden_size, 4096.0
    host_bw = 204.8e9 * 0.75                # the parameter server's default socket, one process on it
    pcie = ASCEND.host.pcie_bandwidth_gbps * 1e9
    per_mb = (tokens * h * 4 + tokens * h * 2) / host_bw + 2 * tokens * h * 2 / pcie + tokens * h * 10 / host_bw
    table = LLAMA.vocab_size * h
    assert host_memory_bytes_per_s(ASCEND) == pytest.approx(host_bw)
    assert he.update_bytes(JOB) + he.ZERO_BYTES == 32.0        # AdamW: gradient read, 3 x fp32 read + written, clear
    added_offload = e.time_s["offload"][0] - base.time_s["offload"][0]
    assert added_offload == pytest.approx(64 * per_mb + table * 32 / host_bw, rel=1e-6)
    # 8 stages on one node: one first-stage process, so it keeps the host to itself
    e, base = pair(replace(s, pp=8), 8)
    assert e.stage_micro_batch_s[0, 0] - base.stage_micro_batch_s[0, 0] == pytest.approx(per_mb, rel=1e-9)
    assert e.stage_micro_batch_s[0, 1:] == pytest.approx(base.stage_micro_batch_s[0, 1:])


def test_replicas_exchange_the_cheaper_of_dense_and_sparse_gradients():
    """Few tokens per step against a huge table: the rows are gathered, far cheaper than the dense
    all-reduce; many tokens against a small table: the dense gradient is all-reduced. The host memory
    is the same either way (gathered rows are added into the dense gradient as they come back)."""
    huge = model_from_dict({"name": "wide-vocab", "source": "test", "num_layers": 2, "hidden_size": 1024,
                            "num_attention_heads": 8, "ffn_hidden_size": 4096, "vocab_size": 2_000_000,
                            "seq_length": 256}, "test")
    small = model_from_dict({"name": "small-vocab", "source": "test", "num_layers": 2, "hidden_size": 1024,
                             "num_attention_heads": 8, "ffn_hidden_size": 4096, "vocab_size": 1000,
                             "seq_length": 256}, "test")
    job = TrainingJob(global_batch_size=8, seq_length=256, dtype="bf16", framework="mindspore")
    s = Strategy(dp=8, tp=1, pp=1, micro_batch_size=1, num_micro_batches=1, zero_stage=1, host_embedding=True)
    b = StrategyBatch.from_strategies([s], 2)
    from advisor.cost.placement import placements
    groups = placements(ASCEND, b, ("dp_cp", "pp"))
    pcie = ASCEND.host.pcie_bandwidth_gbps * 1e9
    host_bw = 204.8e9 * 0.75 / 8                # 8 first-stage processes share the node's host

    def dense_exchange(model):
        grad = model.vocab_size * 1024 * 4.0
        return comm.group_time_s(ASCEND, "all_reduce", grad, groups["dp_cp"])[0] + 2 * grad / pcie

    def exchanged(model):
        out = he.host_embedding(model, ASCEND, job, b, groups["dp_cp"], groups["pp"])
        update = model.vocab_size * 1024 * 32.0 / host_bw
        return out, out.step_s[0] - update

    wide, wide_s = exchanged(huge)
    narrow, narrow_s = exchanged(small)
    assert wide_s < 0.05 * dense_exchange(huge)
    assert narrow_s == pytest.approx(dense_exchange(small), rel=1e-9)
    assert wide.host_bytes[0] == pytest.approx(huge.vocab_size * 1024 * 16)
    assert narrow.host_bytes[0] == pytest.approx(small.vocab_size * 1024 * 16)


@pytest.mark.parametrize("framework, tied, rule", [("megatron", False, True), ("mindspore", True, True),
                                                   ("mindspore", False, False)])
def test_rule_needs_mindspore_and_an_untied_table(framework, tied, rule):
    model = replace(LLAMA, tie_embeddings=tied)
    job = replace(JOB, framework=framework)
    broken = violations(model, Cluster.of(ASCEND, devices=8), job, replace(Z1, host_embedding=True))
    assert bool(broken) == rule
    if rule:
        assert "host" in broken[0] and f"framework = {framework}" in broken[0]


def test_options_follow_pins_and_framework():
    opts = en.zero_offload_options(Pins(), "mindspore", LLAMA)
    assert {o for _, o in opts} == {0, 1, 2, 3, 4}     # 2: parameter offload, which MindSpore has
    assert (0, 4) not in opts                       # the optimizer offloaded needs ZeRO >= 1, as before
    assert {o for _, o in en.zero_offload_options(Pins(host_embedding=True), "mindspore", LLAMA)} == {3, 4}
    assert {o for _, o in en.zero_offload_options(Pins(host_embedding=False), "mindspore", LLAMA)} == {0, 1, 2}
    assert {o for _, o in en.zero_offload_options(Pins(), "megatron", LLAMA)} == {0, 1}
    with pytest.raises(AdvisorError, match="--framework mindspore"):
        en.zero_offload_options(Pins(host_embedding=True), "megatron", LLAMA)
    with pytest.raises(AdvisorError, match="ties its embedding"):
        en.zero_offload_options(Pins(host_embedding=True), "mindspore", replace(LLAMA, tie_embeddings=True))
    with pytest.raises(AdvisorError, match="give one of them"):
        Pins(offload_params=True, host_embedding=True)


def test_search_picks_it_where_only_it_fits():
    """llama3-8b, 8 x 910B, ZeRO-1 without recomputation or offload: 65 GiB without the table's
    states, 62 GiB with them on the host: the only fitting plans put the table there."""
    pins = Pins(dp=8, zero_stage=1, recompute="none", offload_optimizer=False, micro_batch_size=1)
    cluster = Cluster.of(ASCEND, devices=8)
    out = en.search(LLAMA, ASCEND, cluster, JOB, pins, top_k=3)
    best = out.finalists.strategy(0)
    assert best.host_embedding
    e = _estimate(best)
    assert e.feasible and not _estimate(replace(best, host_embedding=False)).feasible


def _memory_tight_profile():
    raw = load_hardware("ascend-910").raw
    raw = {**raw, "device": {**raw["device"], "memory_gib": 6},
           "node": {**raw["node"], "devices_per_node": 4,
                    "intra_node": {**raw["node"]["intra_node"], "group_size": 2}}}
    return hardware_from_dict(raw, "ascend-910 with 6 GiB and 4 per node")


@pytest.mark.parametrize("hosted", [None, True])
def test_enumerator_matches_brute_force_with_the_host_embedding(hosted):
    """A model whose table dwarfs its layers on devices with little memory: the best of every
    degree, ZeRO stage, offload, host-embedding choice, recomputation and a few mesh orders, priced
    one by one, is never faster than the enumerator's best (its bounds stay bounds with the new
    options; its space holds more: schedules, every mesh order)."""
    model = model_from_dict({"name": "vocab-heavy", "source": "test", "num_layers": 4, "hidden_size": 1024,
                             "num_attention_heads": 8, "ffn_hidden_size": 4096, "vocab_size": 250_000,
                             "seq_length": 1024}, "test")
    hw = _memory_tight_profile()
    cluster = Cluster.of(hw, devices=8)
    job = TrainingJob(global_batch_size=8, seq_length=1024, dtype="fp16", framework="mindspore")
    out = en.search(model, hw, cluster, job, Pins(host_embedding=hosted), top_k=3)
    found = en.top_distinct(estimate_batch(model, hw, cluster, job, out.finalists).tokens_per_s, 50)
    rows = []
    for dp, tp, pp in [(d, t, 8 // (d * t)) for d in (1, 2, 4, 8) for t in (1, 2, 4, 8) if 8 % (d * t) == 0]:
        for mbs in [x for x in (1, 2, 4, 8) if 8 % (dp * x) == 0]:
            for zero in range(4):
                for off in (False, True):
                    for host in ((False, True) if hosted is None else (True,)):
                        for rc in ("none", "selective", "full"):
                            for sp in (False, True):
                                for order in (("pp", "dp", "cp", "tp"), ("pp", "tp", "cp", "dp"),
                                              ("tp", "pp", "cp", "dp"), ("dp", "pp", "cp", "tp")):
                                    rows.append(Strategy(dp=dp, tp=tp, pp=pp, micro_batch_size=mbs,
                                                         num_micro_batches=8 // (dp * mbs), zero_stage=zero,
                                                         offload_optimizer=off, host_embedding=host, recompute=rc,
                                                         sequence_parallel=sp, mesh_order=order))
    batch = StrategyBatch.from_strategies(rows, model.num_layers)
    batch = batch.take(legal_mask(model, cluster, job, batch))
    if hw.node.group_size < hw.node.devices_per_node:
        batch = batch.take(en.tp_inside_fast_group(hw, batch.tp, batch.tp_stride))
    e = estimate_batch(model, hw, cluster, job, batch)
    assert e.feasible.any()
    best = np.argmax(np.where(e.feasible, e.tokens_per_s, 0.0))
    assert found[0] >= e.tokens_per_s[best] * (1 - 1e-9)
    assert out.finalists.host_embedding.all() if hosted else True


def test_plan_round_trip_and_exports():
    e = _estimate(replace(Z1, host_embedding=True))
    plan = Plan(model=LLAMA, hardware=ASCEND, cluster=Cluster.of(ASCEND, devices=8), training=JOB,
                strategy=replace(Z1, host_embedding=True), prediction={"step_time_s": e.step_time_s})
    data = plan_to_dict(plan)
    assert data["parallel"]["host_embedding"] is True
    assert plan_from_dict(data).strategy.host_embedding
    assert "host_embedding" not in plan_to_dict(replace(plan, strategy=Z1))["parallel"]
    ms = export_plan(plan, "mindspore")
    script = ms.files["host_embedding.py"]
    ast.parse(script)
    assert 'set_device("CPU")' in script and 'target = "CPU"' in script and "'tok_embeddings'" in script
    assert any("host_embedding.py" in n for n in ms.notes)
    assert "host_embedding.py" not in export_plan(replace(plan, strategy=Z1), "mindspore").files
    for target in ("megatron", "deepspeed", "torchtitan"):
        result = export_plan(plan, target)
        assert any(u.startswith("parallel.host_embedding = true") for u in result.unsupported), target


def test_cli_estimate_and_refusal(tmp_path, monkeypatch, capsys):
    def cli(args):
        return run_cli(monkeypatch, capsys, *args)

    code, out, err = cli(["estimate", "--model", "llama3-8b", "--hardware", "ascend-910b", "--devices", "8", "--gbs", "64",
                  "--seq-len", "4096", "--zero", "1", "--framework", "mindspore", "--host-embedding", "--json"])
    assert code == 0, err
    data = json.loads(out)
    assert data["strategy"]["host_embedding"] is True
    assert data["host_embedding_gib"] == pytest.approx(LLAMA.vocab_size * LLAMA.hidden_size * 16 / GIB)
    assert any("host-embedding" in x for x in data["confidence"]["extrapolated"])
    code, out, err = cli(["estimate", "--model", "llama3-8b", "--hardware", "ascend-910b", "--devices", "8", "--gbs", "64",
                   "--seq-len", "4096", "--zero", "1", "--host-embedding"])
    assert code == 2 and "framework mindspore" in err
    code, out, err = cli(["recommend", "--model", "llama3-8b", "--hardware", "ascend-910b", "--devices", "8", "--gbs",
                      "64", "--seq-len", "4096", "--framework", "mindspore", "--host-embedding", "--top", "2",
                      "--out", str(tmp_path / "p.json")])
    assert code == 0, err
    assert "+hemb" in out
    from advisor.plan import load_plan
    assert load_plan(str(tmp_path / "p.json")).strategy.host_embedding


def test_only_first_stage_processes_hold_a_table_and_share_the_host():
    """llama3-8b on one 8-device node, pp 8: one first-stage process, so the node holds one table and
    that process has the host's bandwidth; dp 8: eight tables sharing it."""
    cluster = Cluster.of(ASCEND, devices=8)
    deep = Strategy(dp=1, tp=1, pp=8, micro_batch_size=1, num_micro_batches=64, host_embedding=True)
    wide = replace(Z1, host_embedding=True)
    e = estimate_batch(LLAMA, ASCEND, cluster, JOB, StrategyBatch.from_strategies([deep, wide], LLAMA.num_layers))
    table = LLAMA.vocab_size * LLAMA.hidden_size * 16.0
    assert e.host_node_bytes[0] == pytest.approx(table)
    assert e.host_node_bytes[1] == pytest.approx(8 * table + 8 * (e.memory.host_total[1] - table))
    update = LLAMA.vocab_size * LLAMA.hidden_size * 32.0 / (204.8e9 * 0.75)
    assert update <= e.time_s["offload"][0] < 2 * update       # the host's whole bandwidth for one update
    assert e.time_s["offload"][1] >= 8 * update                 # eight updates share it


def test_search_keeps_plans_whose_node_holds_fewer_tables():
    """Host memory for 4 tables of 7.8 GiB but not 8: data-parallel-only host-embedding plans (8
    first-stage processes per node, each with the whole table) do not fit; the enumerator still finds
    the ones with pipeline stages inside the node or the table split over tensor-parallel ranks, and
    every plan it returns fits."""
    raw = ASCEND.raw
    small_host = hardware_from_dict({**raw, "host": {**raw["host"], "memory_gib": 40}}, "ascend-910b, 40 GiB host")
    cluster = Cluster.of(small_host, devices=8)
    assert not _estimate(replace(Z1, host_embedding=True), hw=small_host).feasible
    out = en.search(LLAMA, small_host, cluster, JOB, Pins(host_embedding=True, offload_optimizer=False), top_k=3)
    assert len(out.finalists)
    for i in range(len(out.finalists)):
        s = out.finalists.strategy(i)
        assert s.host_embedding and s.tp * s.pp > 1 and _estimate(s, hw=small_host).feasible


def test_leanest_pairs_keep_both_host_options():
    from advisor.search.enumerate_bounds import leanest_options
    options = en.zero_offload_options(Pins(), "mindspore", LLAMA)
    assert leanest_options(options) == [(3, 4), (3, 2), (2, 4)]
    assert leanest_options([(0, 0), (0, 3)]) == [(0, 3)]


def test_parameter_offload_and_the_host_embedding_do_not_go_together():
    broken = violations(LLAMA, Cluster.of(ASCEND, devices=8), JOB,
                        replace(Z1, zero_stage=3, offload_optimizer=True, offload_params=True, host_embedding=True))
    assert broken and "offload_params = True" in broken[0]
