"""Supernets (advisor.specs.supernet), NASPipe's schedule (advisor.cost.naspipe), their pricing and the
pipeline executor against sequential training (advisor.executor.supernet)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from advisor.cost.naspipe import dependencies, sample_subnets, sequential_s, simulate, stage_blocks
from advisor.cost.supernet import SupernetRun, estimate_supernet
from advisor.errors import AdvisorError, InfeasibleError
from advisor.plan import dumps_plan, load_plan, plan_from_dict
from advisor.search.supernet import balanced_stage_layers, search_supernet, supernet_strategy
from advisor.specs.hardware import load_hardware
from advisor.space.strategy import StrategyBatch
from advisor.specs.job import Cluster, TrainingJob
from advisor.specs.model import load_model, model_from_dict
from tests._cli import run_cli

HAT = "hat-supernet"


def test_bundled_supernet_and_refusals():
    net = load_model(HAT)
    assert len(net.candidates) == 8 and net.num_layers == 12
    # 12 layers x every candidate, the tied embedding (37000 x 640) and its positions (512 x 640), the final norm
    assert net.supernet_params == pytest.approx(331.4e6, rel=1e-3)
    base = {"family": "supernet", "name": "s", "source": "test", "num_layers": 2, "hidden_size": 64,
            "num_attention_heads": 4, "vocab_size": 100, "seq_length": 16}
    for block, words in (({"candidates": [{"name": "a", "kind": "conv", "kernel_size": 3}]}, "2 to 64"),
                         ({"candidates": [{"name": "a", "kind": "rnn"}, {"name": "b", "kind": "conv", "kernel_size": 3}]}, "kind"),
                         ({"candidates": [{"name": "a", "kind": "conv", "kernel_size": 3}] * 2}, "repeats")):
        with pytest.raises(AdvisorError, match=words):
            model_from_dict({**base, "supernet": block}, "test")


# ---- the schedule -----------------------------------------------------------------------------------
def _orders_respect_dependencies(schedule, deps) -> bool:
    for s, order in enumerate(schedule.orders):
        position = {a: i for i, a in enumerate(order)}
        for j, row in enumerate(deps):
            if any(position[("B", i)] > position[("F", j)] for i in row[s]):
                return False
    return True


def test_schedule_keeps_causal_order_and_pipelines_what_does_not_share():
    n, p = 8, 4
    fwd, bwd = np.ones((n, p)), 2 * np.ones((n, p))
    # every subnet shares every stage's block with the one before: nothing can overlap
    same = [[frozenset({(s, 0)}) for s in range(p)] for _ in range(n)]
    chained = simulate(fwd, bwd, 0.0, dependencies(same), window=p)
    assert chained.makespan_s == pytest.approx(sequential_s(fwd, bwd, 0.0))
    # no two subnets share anything: a plain pipeline, (n + p - 1) x (f + b) at most
    apart = [[frozenset({(s, j)}) for s in range(p)] for j in range(n)]
    free = simulate(fwd, bwd, 0.0, dependencies(apart), window=p)
    assert free.makespan_s <= (n + p - 1) * 3.0 and free.makespan_s < chained.makespan_s / 2
    # sampled subnets: the order on every stage respects each dependency, and it sits between the two
    choices = sample_subnets(32, 12, 8, seed=3)
    blocks = stage_blocks(choices, (3, 3, 3, 3), shared_ends=False)
    deps = dependencies(blocks)
    f32, b32 = np.ones((32, 4)), 2 * np.ones((32, 4))
    csp = simulate(f32, b32, 0.0, deps, window=4)
    assert _orders_respect_dependencies(csp, deps)
    assert simulate(f32, b32, 0.0, dependencies(blocks, causal=False), 4).makespan_s <= csp.makespan_s < sequential_s(f32, b32, 0.0)
    assert not _orders_respect_dependencies(simulate(f32, b32, 0.0, dependencies(blocks, causal=False), 4), deps)


def test_training_the_shared_ends_serializes_the_pipeline():
    net, hw = load_model(HAT), load_hardware("dgx-a100-80g")
    job = TrainingJob(global_batch_size=32, seq_length=512)
    s = supernet_strategy(net, hw, job, pp=4, dp=1)
    frozen = estimate_supernet(net, hw, job, s, SupernetRun(subnets=48))
    trained = estimate_supernet(net, hw, job, s, SupernetRun(subnets=48, train_shared=True))
    assert frozen.no_dependency.makespan_s <= frozen.naspipe.makespan_s < frozen.sequential_s
    assert frozen.speedup > 1.2
    assert trained.naspipe.makespan_s == pytest.approx(trained.sequential_s, rel=1e-9)


def test_stages_balance_the_head():
    assert balanced_stage_layers(1.0, 0.0, 12, 4) == (3, 3, 3, 3)
    assert balanced_stage_layers(1.0, 2.0, 12, 4) == (4, 4, 3, 1)     # the head is worth two layers
    assert balanced_stage_layers(1.0, 5.0, 12, 1) == (12,)


def test_search_ranks_by_subnets_per_second():
    net, hw = load_model(HAT), load_hardware("dgx-a100-80g")
    plans = search_supernet(net, hw, Cluster(1, 4), TrainingJob(global_batch_size=32, seq_length=512), top_k=3)
    rates = [p.estimate.subnets_per_s for p in plans]
    assert rates == sorted(rates, reverse=True) and {p.strategy.pp for p in plans} == {1, 2, 4}


# ---- plans and the executor -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pipeline_plan(tmp_path_factory):
    import sys
    from unittest import mock

    from advisor import cli

    path = tmp_path_factory.mktemp("supernet") / "plan.json"
    with mock.patch.object(sys, "argv", ["advisor", "recommend", "--model", HAT, "--hardware", "dgx-a100-80g",
                                         "--devices", "4", "--pp", "4", "--out", str(path)]):
        with pytest.raises(SystemExit) as done:
            cli.main()
            raise SystemExit(0)
    assert (done.value.code or 0) == 0
    return path


def test_supernet_plan_round_trips(pipeline_plan):
    plan = load_plan(pipeline_plan)
    assert plan.strategy.pp == 4 and plan.supernet == SupernetRun()
    text = dumps_plan(plan)
    assert dumps_plan(plan_from_dict(json.loads(text))) == text
    data = json.loads(text)
    data["parallel"]["tp"] = 2
    with pytest.raises(AdvisorError, match="'tp'"):
        plan_from_dict(data)


def test_pipeline_losses_equal_sequential_training_and_differ_without_the_causal_order(pipeline_plan):
    from advisor.commands.supernet import execute_supernet as run_supernet

    plan = load_plan(pipeline_plan)
    report = run_supernet(plan, subnets=12, tiny=True, timeout_s=120)
    assert report["losses_match"] and report["max_loss_difference"] <= 1e-5
    assert len(report["losses"]) == 12 and report["overtakes"] > 0
    unordered = run_supernet(plan, subnets=12, tiny=True, timeout_s=120, causal=False)
    assert unordered["max_loss_difference"] > 1e-4     # overtaking a subnet that shares a block changes training


def test_cli_estimate_and_execute(monkeypatch, capsys, pipeline_plan):
    code, text, _ = run_cli(monkeypatch, capsys, "estimate", "--plan", str(pipeline_plan), "--json")
    assert code == 0 and json.loads(text)["speedup_over_sequential"] > 1.0
    code, text, _ = run_cli(monkeypatch, capsys, "recommend", "--model", HAT, "--hardware", "dgx-a100-80g",
                            "--devices", "4", "--global-batch", "32", "--json")
    plans = json.loads(text)["plans"]
    assert code == 0 and plans[0]["parallel"]["dp"] == 4 and plans[-1]["prediction"]["supernet"]["overtakes"] > 0
    code, text, _ = run_cli(monkeypatch, capsys, "execute", str(pipeline_plan), "--tiny", "--steps", "8", "--json")
    assert code == 0 and json.loads(text)["losses_match"] is True
    code, _, err = run_cli(monkeypatch, capsys, "recommend", "--model", HAT, "--hardware", "dgx-a100-80g",
                           "--devices", "4", "--tp", "2")
    assert code == 2 and "--tp" in err


def test_what_a_supernet_plan_does_not_do_is_refused(monkeypatch, capsys, pipeline_plan):
    for args, words in ((("export", str(pipeline_plan), "--to", "megatron"), "nothing to export"),
                        (("execute", str(pipeline_plan), "--tiny", "--nproc", "2"), "one rank per pipeline stage"),
                        (("recommend", "--model", HAT, "--hardware", "dgx-a100-80g:1,dgx-h100:1"), "supernet"),
                        (("whatif", "--model", HAT, "--hardware", "dgx-a100-80g", "--nodes", "1"), "supernet")):
        code, _, err = run_cli(monkeypatch, capsys, *args)
        assert code == 2 and words in err, args


def test_supernet_estimate_refuses_a_pipeline_deeper_than_the_layers(monkeypatch, capsys):
    code, _, err = run_cli(monkeypatch, capsys, "estimate", "--model", HAT, "--hardware", "dgx-a100-80g",
                           "--nodes", "2", "--pp", "16")
    assert code == 2 and "--pp 16" in err


def test_context_switching_keeps_the_candidates_weights_on_the_host():
    """NASPipe's reproducible runtime: the candidates' weights in host memory, copied in and out around
    the forward and the update (two each way, blocking); the optimizer states stay on the device."""
    from advisor.cost.memory import state_bytes_per_param
    from advisor.cost.supernet import action_times_s

    net, hw = load_model(HAT), load_hardware("dgx-a100-80g")
    job = TrainingJob(global_batch_size=32, seq_length=512)
    s = supernet_strategy(net, hw, job, 4, 1)
    resident = estimate_supernet(net, hw, job, s, SupernetRun(subnets=16))
    switched = estimate_supernet(net, hw, job, s, SupernetRun(subnets=16, context_switch=True))
    wb, gb, ob = state_bytes_per_param(job)
    params = [c.params(net.base) for c in net.candidates]
    layers = max(s.resolved_stage_layers(net.num_layers))      # the fullest stage's process
    assert switched.host_gib == pytest.approx(layers * sum(params) * wb / 2 ** 30)
    assert switched.host_capacity_gib == pytest.approx(hw.host.memory_gib / hw.node.devices_per_node)
    # per layer of the fullest stage: every candidate's states, the weights and gradients of the
    # window's (4) largest blocks instead of every candidate's
    saved = layers * (sum(params) - 4 * max(params)) * (wb + gb) / 2 ** 30
    assert resident.memory_gib - switched.memory_gib == pytest.approx(saved)
    choices = sample_subnets(16, net.num_layers, len(net.candidates), 0)
    f0, b0, _ = action_times_s(net, hw, job, s, choices, False)
    f1, b1, _ = action_times_s(net, hw, job, s, choices, False, context_switch=True)
    bounds = np.cumsum((0,) + tuple(s.resolved_stage_layers(net.num_layers)))
    blocks = np.array([[np.array(params)[choices[i, bounds[st]:bounds[st + 1]]].sum() for st in range(s.pp)]
                       for i in range(16)])
    copy = blocks * wb / (hw.host.pcie_bandwidth_gbps * 1e9)
    assert np.allclose(f1 - f0, 2 * copy) and np.allclose(b1 - b0, 2 * copy)
    assert switched.naspipe.makespan_s > resident.naspipe.makespan_s
    assert SupernetRun(context_switch=True).to_dict()["context_switch"] is True


def test_checkpointing_recomputes_each_stage_and_keeps_its_input():
    """NASPipe's runtime checkpoints each stage's forward: the backward replays it, and a subnet in
    flight keeps only the stage's input. Where the plain run does not fit, the search tries
    checkpointing, then context switching, then both (advisor.search.supernet.MEMORY_OPTIONS)."""
    from advisor.cost.supernet import action_times_s

    net, hw = load_model(HAT), load_hardware("dgx-a100-80g")
    job = TrainingJob(global_batch_size=32, seq_length=512)
    s = supernet_strategy(net, hw, job, 4, 1)
    choices = sample_subnets(16, net.num_layers, len(net.candidates), 0)
    from advisor.cost.compute import gemm_time_s, head_compute_s

    f0, b0, _ = action_times_s(net, hw, job, s, choices, False)
    f1, b1, _ = action_times_s(net, hw, job, s, choices, False, checkpoint=True)
    # the blocks' forward again, and on the last stage the head's GEMM but not the loss (outside the checkpoint)
    batch = StrategyBatch.from_strategies([s], net.num_layers)
    head_s, flops = head_compute_s(net.base, hw, job, batch)
    replay = f0.copy()
    replay[:, -1] += float(gemm_time_s(hw, job.compute_dtype, flops)[0]) - float(head_s[0])
    assert np.allclose(f1, f0) and np.allclose(b1, b0 + replay)
    plain = estimate_supernet(net, hw, job, s, SupernetRun(subnets=16))
    ckpt = estimate_supernet(net, hw, job, s, SupernetRun(subnets=16, checkpoint=True))
    switched = estimate_supernet(net, hw, job, s, SupernetRun(subnets=16, context_switch=True))
    both = estimate_supernet(net, hw, job, s, SupernetRun(subnets=16, checkpoint=True, context_switch=True))
    assert ckpt.memory_gib < plain.memory_gib and ckpt.naspipe.makespan_s > plain.naspipe.makespan_s
    # both, on one stage: per layer, one block's weights and gradients on the device (the one
    # computing) instead of every candidate's (checkpointing alone) or one per subnet in flight
    # (context switching alone)
    from advisor.cost.memory import state_bytes_per_param
    wb, gb, _ = state_bytes_per_param(job)
    params = [c.params(net.base) for c in net.candidates]
    one = supernet_strategy(net, hw, job, 1, 1)
    alone, combined = (estimate_supernet(net, hw, job, one, SupernetRun(subnets=16, checkpoint=True, **kw))
                       for kw in ({}, {"context_switch": True}))
    assert alone.memory_gib - combined.memory_gib == pytest.approx(
        net.num_layers * (sum(params) - max(params)) * (wb + gb) / 2 ** 30, rel=1e-9)
    assert both.memory_gib < min(ckpt.memory_gib, switched.memory_gib)
    # between the two: only checkpointing (and both) fit, and the faster of them is chosen
    small = hw.with_overrides(memory_gib=(switched.memory_gib + ckpt.memory_gib) / 2)
    plans = search_supernet(net, small, Cluster(1, 4), job, SupernetRun(subnets=16), pp=4)
    assert plans[0].estimate.checkpoint and plans[0].estimate.feasible
    assert plans[0].estimate.subnets_per_s == pytest.approx(max(ckpt.subnets_per_s, both.subnets_per_s))
    # where context switching also fits, the faster one wins
    roomy = hw.with_overrides(memory_gib=(switched.memory_gib + plain.memory_gib) / 2)
    best = search_supernet(net, roomy, Cluster(1, 4), job, SupernetRun(subnets=16), pp=4)[0].estimate
    assert best.subnets_per_s == pytest.approx(max(ckpt.subnets_per_s, switched.subnets_per_s, both.subnets_per_s))
    # nothing fits: the refusal names the leanest need
    tiny = hw.with_overrides(memory_gib=both.memory_gib / 2)
    with pytest.raises(InfeasibleError, match=f"{min(both.memory_gib, ckpt.memory_gib):.1f} GiB"):
        search_supernet(net, tiny, Cluster(1, 4), job, SupernetRun(subnets=16), pp=4)
    assert SupernetRun(checkpoint=True, context_switch=True).memory_knobs == "ckpt+host"


def test_supernets_refuse_set_flags(monkeypatch, capsys):
    for flags in (["--moe-token-drop"], ["--offload-params"], ["--recompute", "full"]):
        code, _, err = run_cli(monkeypatch, capsys, "recommend", "--model", HAT, "--hardware", "dgx-a100-80g",
                               "--devices", "4", *flags)
        assert code == 2 and "not available for a supernet" in err
    code, _, err = run_cli(monkeypatch, capsys, "estimate", "--model", HAT, "--hardware", "dgx-a100-80g",
                           "--devices", "4", "--pp", "4", "--global-batch", "4")
    assert code == 0, err          # estimate's default --recompute none is not a request
