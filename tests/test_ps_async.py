"""Asynchronous parameter servers in the executor (issue 14): no rounds, each push applied as it
comes, the next step's pull sent before the current step is computed; every worker's loss matches a
single-process replay of the servers' records, and the staleness is measured next to the cost
model's. Each run starts 2-5 processes of a tiny model for a few steps."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from advisor.executor.ps.config import ps_config_from_plan  # noqa: E402
from advisor.executor.ps.layouts import async_next_kind  # noqa: E402
from advisor.executor.ps.model import run_reference  # noqa: E402
from advisor.executor.ps.replay import replay  # noqa: E402
from advisor.executor.ps.run import run_ps  # noqa: E402
from advisor.executor.ps.wire import PULL, PUSH  # noqa: E402
from _procs import processes_naming  # noqa: E402
from test_ps_executor import rec_plan  # noqa: E402


def async_plan(mode: str = "ps", **kw) -> dict:
    plan = rec_plan(mode, **kw)
    plan["parallel"]["parameter_server"]["synchronous"] = False
    return plan


def _run(plan: dict, tmp_path: Path, steps: int = 5, **kw) -> dict:
    work = tmp_path / "roles"
    try:
        return run_ps(plan, "plan.json", steps=steps, tiny=True, dtype="fp32", timeout_s=180, pg_timeout_s=60,
                      workdir=str(work), **kw)
    finally:
        assert processes_naming(str(work)) == []


def _servers(report: dict) -> list[dict]:
    return sorted((r for r in report["ranks"] if r["role"] == "server"), key=lambda r: r["index"])


def test_an_asynchronous_worker_asks_one_step_ahead():
    kinds, pulls, pushes = [], 0, 0
    while pushes < 3:
        kind = async_next_kind(pulls, pushes, 3)
        kinds.append(kind)
        pulls, pushes = (pulls + 1, pushes) if kind == PULL else (pulls, pushes + 1)
    assert kinds == [PULL, PULL, PUSH, PULL, PUSH, PUSH]
    assert [async_next_kind(1, 0, 1)] == [PUSH]          # a one-step run: pull, then push


def test_one_worker_lands_each_gradient_one_update_late(tmp_path):
    """One worker, one server: the pull of step k + 1 is answered before push k is applied, so every
    push after the first misses exactly one update (its own): the cost model's staleness N = 1. The
    losses equal the replay's, and from step 1 on differ from synchronous training (step 1 is
    computed on the initial weights, where a synchronous run has applied step 0's update)."""
    plan = async_plan("ps", workers=1, servers=1, optimizer="sgd")
    report = _run(plan, tmp_path)
    (server,) = _servers(report)
    assert server["async"]["staleness"] == [0, 1, 1, 1, 1]
    assert [v for _, _, v in server["async"]["pulls"]] == [0, 0, 1, 2, 3]
    assert report["loss_max_rel_diff"] <= 1e-4 and report["loss"]["ok"]
    assert report["staleness"]["mean"] == 1.0
    sync = run_reference(ps_config_from_plan(plan, steps=5, tiny=True, dtype="fp32"))["losses"]
    assert report["loss"]["parallel"][0] == pytest.approx(sync[0], rel=1e-6)
    assert report["loss"]["parallel"][1] != pytest.approx(sync[1], rel=1e-4)


def test_two_by_two_matches_its_replay_and_a_tampered_record_does_not(tmp_path):
    plan = async_plan("ps", workers=2, servers=2, optimizer="adam")
    report = _run(plan, tmp_path)
    assert report["parameter_server"]["synchronous"] is False
    assert report["loss_max_rel_diff"] <= 1e-4
    servers = _servers(report)
    for s in servers:
        record = s["async"]
        # every push applied once; the first on fresh weights; a push of step k >= 1 at least one
        # update late (its own pull k was answered before its push k - 1 was applied), and never later
        # than the updates applied before it
        assert sorted((w, k) for w, k, _ in record["applied"]) == [(w, k) for w in (0, 1) for k in range(5)]
        assert record["staleness"][0] == 0
        for i, ((_, k, n), late) in enumerate(zip(record["applied"], record["staleness"])):
            assert n == 2 and late <= i and (late >= 1 if k >= 1 else True)
    assert report["staleness"]["mean"] >= 1.0
    cfg = ps_config_from_plan(plan, steps=5, tiny=True, dtype="fp32")
    losses = {(w["index"], k): x for w in report["ranks"] if w["role"] == "worker" for k, x in enumerate(w["losses"])}
    assert replay(cfg, servers) == pytest.approx(losses, rel=1e-6)
    # worker 0's step-3 gradient said to come from the initial weights instead: the replay disagrees
    tampered = copy.deepcopy(servers)
    for s in tampered:
        s["async"]["pulls"] = [[w, k, 0 if (w, k) == (0, 3) else v] for w, k, v in s["async"]["pulls"]]
    assert replay(cfg, tampered)[(0, 3)] != pytest.approx(losses[(0, 3)], rel=1e-4)


def test_the_report_sets_the_measured_staleness_beside_the_predicted(tmp_path):
    predicted = {"worker_memory_gib": {"parameters": 1e-6}, "server_memory_gib": {"parameters": 1e-6},
                 "staleness_steps": 2.0}
    report = _run(async_plan("ps", workers=2, servers=1, optimizer="sgd"), tmp_path, steps=4,
                  predict=lambda executed: predicted)
    assert report["staleness"]["predicted"] == 2.0 and report["staleness"]["mean"] >= 1.0


def test_a_killed_asynchronous_worker_is_isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("ADVISOR_PS_TEST_KILL_WORKER", "1:2")
    report = _run(async_plan("ps", workers=3, servers=2, optimizer="adam"), tmp_path)
    (gone,) = report["parameter_server"]["left"]
    assert (gone["worker"], gone["signal"]) == (1, "SIGKILL")
    for s in _servers(report):      # worker 1 never got past its step 1; the others pushed every step
        applied = {(w, k) for w, k, _ in s["async"]["applied"]}
        assert {(w, k) for w in (0, 2) for k in range(5)} <= applied
        assert not any(w == 1 and k >= 2 for w, k in applied)
    assert report["loss_max_rel_diff"] <= 1e-4


def test_an_asynchronous_hybrid_run_reports_its_losses_without_a_replay(tmp_path):
    report = _run(async_plan("hybrid", workers=2, servers=2, optimizer="sgd"), tmp_path, steps=3)
    assert report["loss"]["reference"] is None and report["loss_max_rel_diff"] is None
    assert len(report["loss"]["parallel"]) == 3 and any("not replayed" in n for n in report["notes"])


def test_a_kept_workdir_never_feeds_an_earlier_runs_results(tmp_path):
    """--workdir kept between runs: the second run reads its own results, not the first's."""
    first = _run(rec_plan("ps", optimizer="sgd"), tmp_path, steps=3)
    second = _run(rec_plan("ps", optimizer="adagrad"), tmp_path, steps=3)
    assert first["loss_max_rel_diff"] <= 1e-4 and second["loss_max_rel_diff"] <= 1e-4
    assert second["loss"]["parallel"][2] != pytest.approx(first["loss"]["parallel"][2], rel=1e-6)


def test_a_replay_sharing_no_code_with_the_run_agrees(tmp_path):
    """Independent of advisor.executor.ps.step_math: whole tables, the model's forward with dense
    gradients, and plain SGD (w -= lr g / n) applied in the order the server recorded, each gradient
    taken at the version its pull saw: the workers' losses, to float rounding."""
    from advisor.executor.ps.model import forward, global_batch, init_rows, loss_of, pool, worker_slice

    plan = async_plan("ps", workers=3, servers=1, optimizer="sgd")
    report = _run(plan, tmp_path)
    cfg = ps_config_from_plan(plan, steps=5, tiny=True, dtype="fp32")
    (server,) = _servers(report)
    seen = {(w, k): v for w, k, v in server["async"]["pulls"]}
    shapes = cfg.model.param_shapes()
    weights = {name: init_rows(cfg.model, name, 0, shape[0], cfg.seed) for name, shape in shapes.items()}
    versions = [weights]
    expected = {}
    for w, k, n in server["async"]["applied"]:
        params = {name: t.clone().requires_grad_() for name, t in versions[seen[(w, k)]].items()}
        batch = worker_slice(global_batch(cfg, k), [w], cfg.local_batch_size)
        pooled = [pool(t, params[t.name], batch[t.name], sparse=False) for t in cfg.model.tables]
        loss = loss_of(forward(cfg.model, params, pooled, batch["dense"]), batch["label"])
        loss.backward()
        expected[(w, k)] = loss.item()
        versions.append({name: versions[-1][name] - cfg.learning_rate * params[name].grad / n for name in shapes})
    measured = {(r["index"], k): x for r in report["ranks"] if r["role"] == "worker" for k, x in enumerate(r["losses"])}
    assert measured == pytest.approx(expected, rel=1e-5)
