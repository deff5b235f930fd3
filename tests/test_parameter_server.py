"""Recommendation models, the parameter-server cost model, its search, the plan field and the exports."""

from __future__ import annotations

import ast
import os
import json
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from advisor.cost.parameter_server import DEFAULT_HOST_MEMORY_GBPS, HOST_MEMORY_EFFICIENCY
from advisor.cost.recsys import RecsysConfig
from advisor.cost.recsys_estimate import estimate_recsys
from advisor.errors import AdvisorError
from advisor.export import export_plan
from advisor.export.k8s_mindspore import export as export_msjob
from advisor.plan import dumps_plan, plan_from_dict, plan_to_dict
from advisor.search.parameter_server import PsPins, candidates, recommend_recsys
from advisor.search.rank import TIE_BAND as TIE
from advisor.specs.hardware import load_hardware
from advisor.specs.job import Cluster, TrainingJob
from advisor.specs.model import bundled_models, load_model, model_from_dict, model_to_dict
from advisor.specs.recommendation import RecModelSpec

ROOT = Path(__file__).resolve().parents[1]
A100 = load_hardware("dgx-a100-80g")


def tiny(**changes) -> dict:
    data = {"family": "recommendation", "name": "tiny", "source": "test",
            "embedding_tables": [{"name": "items", "rows": 1000, "dim": 4, "lookups_per_sample": 2, "sparse": True}],
            "dense": {"top_mlp": [1], "interaction": "cat"}}
    data.update(changes)
    return data


# ---- models --------------------------------------------------------------------------------------
def test_bundled_recommendation_models_and_their_sizes():
    assert {"dlrm-criteo-1tb", "wide-deep-criteo"} <= set(bundled_models("recommendation"))
    assert not set(bundled_models("recommendation")) & set(bundled_models("transformer"))
    dlrm = load_model("dlrm-criteo-1tb")
    assert isinstance(dlrm, RecModelSpec) and len(dlrm.tables) == 26 and dlrm.dense_features == 13
    assert dlrm.embedding_params == 187_767_399 * 128
    assert dlrm.interaction_width == 27 * 26 // 2 + 128 == 479          # DLRM's ln_top[0] for MLPerf
    bottom = 13 * 512 + 512 + 512 * 256 + 256 + 256 * 128 + 128
    top = 479 * 1024 + 1024 + 1024 * 1024 + 1024 + 1024 * 512 + 512 + 512 * 256 + 256 + 256 + 1
    assert dlrm.dense_params == bottom + top
    wd = load_model("wide-deep-criteo")
    mlp = 3121 * 1024 + 1024 + 1024 * 512 + 512 + 512 * 256 + 256 + 256 * 128 + 128 + 128 + 1
    assert wd.num_params == 200_000 + 200_000 * 80 + mlp
    for name in ("dlrm-criteo-1tb", "wide-deep-criteo"):
        model = load_model(name)
        assert model_from_dict(model_to_dict(model), "round trip") == model


@pytest.mark.parametrize("change, key", [
    ({"dense": {"top_mlp": [1]}}, "interaction"),
    ({"embedding_tables": []}, "embedding_tables"),
    ({"embedding_tables": [{"name": "a b", "rows": 1, "dim": 1, "lookups_per_sample": 1, "sparse": True}]}, "name"),
    ({"embedding_tables": [{"name": "a", "rows": 0, "dim": 1, "lookups_per_sample": 1, "sparse": True}]}, "rows"),
    ({"embedding_tables": [{"name": "a", "rows": 1, "dim": 1, "lookups_per_sample": 1, "sparse": True, "hot": 1}]}, "hot"),
    ({"dense": {"bottom_mlp": [8], "top_mlp": [1], "interaction": "dot"}, "dense_features": 3}, "interaction"),
    ({"dense": {"bottom_mlp": [8], "top_mlp": [1], "interaction": "cat"}}, "bottom_mlp"),
    ({"unique_row_fraction": 1.5}, "unique_row_fraction"),
    ({"family": "gnn"}, "family"),
])
def test_bad_descriptions_name_the_key(change, key):
    with pytest.raises(AdvisorError) as info:
        model_from_dict(tiny(**change), "m.yaml")
    assert "m.yaml" in str(info.value) and key in str(info.value)


# ---- cost model ----------------------------------------------------------------------------------
def test_ps_bytes_and_server_time_by_hand():
    model = model_from_dict(tiny(), "t")
    cluster, job = Cluster.of(A100, devices=2), TrainingJob(global_batch_size=8, seq_length=1, optimizer="sgd")
    names = tuple(model.tensor_params())
    assert names == ("items", "top_mlp_0") and model.dense_params == 5
    e = estimate_recsys(model, A100, cluster, job, RecsysConfig("ps", 1, "dedicated", True, names))
    # per worker: b = 4 samples x 2 lookups = 8 rows; push 8 x (4 x 4 values + 2 x 8 key bytes) + 5 x 4 dense
    assert e.traffic_bytes["push_bytes_per_worker"] == 8 * (16 + 16) + 20
    assert e.traffic_bytes["pull_bytes_per_worker"] == 8 * 16 + 20
    assert e.traffic_bytes["server_in_bytes"] == 2 * 276 and e.traffic_bytes["server_out_bytes"] == 2 * 148
    assert e.time_s["server_nic_s"] == pytest.approx(552 / (25e9 * 0.85))
    # host: SGD 12 bytes on the 16 rows x 4 the batch touched and the 5 dense, plus reading 2 pushes and
    # gathering 2 pulls (4 bytes each value)
    work = 16 * 4 * 12 + 2 * 2 * 8 * 4 * 4 + 5 * 12 + 2 * 2 * 5 * 4
    assert e.time_s["server_update_s"] == pytest.approx(work / (DEFAULT_HOST_MEMORY_GBPS * 1e9 * HOST_MEMORY_EFFICIENCY))
    assert e.server_memory.parameters_gib == pytest.approx((4000 + 5) * 4 / 2 ** 30)
    ps_phase = max(e.time_s["worker_nic_s"], e.time_s["server_nic_s"], e.time_s["server_update_s"])
    assert e.time_s["handling_s"] == 0.0          # a bundled profile: no measured per-operator time
    assert e.step_time_s == pytest.approx(e.time_s["compute_s"] + ps_phase + e.time_s["latency_s"])
    assert e.samples_per_s == pytest.approx(8 / e.step_time_s)
    # a calibrated profile prices each piece's handling (advisor.cost.ps_handling): a table piece
    # (16 worker operations; 3 per worker and 4 on the server) and a Linear served as weight and bias
    # (5 each; 3 per worker and 3 on the server each), plus the optimizer's time per tensor
    measured = replace(A100, inter=replace(A100.inter, message_overhead_us=80.0),
                       device=replace(A100.device, launch_overhead_us=6.0, optimizer_overhead_us_per_tensor=10.0))
    m = estimate_recsys(model, measured, cluster, job, RecsysConfig("ps", 1, "dedicated", True, names))
    handling = (16 + 2 * 5) * 6e-6 + ((3 * 2 + 4) + 2 * (3 * 2 + 3)) * 6e-6 + 3 * 10e-6
    assert m.time_s["handling_s"] == pytest.approx(handling)
    assert m.step_time_s == pytest.approx(m.time_s["compute_s"] + ps_phase + m.time_s["latency_s"] + handling)


def test_messages_cost_their_busiest_endpoint():
    """Measured per-message host time: three messages (pull request, answer, push) per worker-server
    pair, a server handling those of every worker in turn, a worker those of every server. Without a
    measured time: a push and a pull round trip of latency, whatever the worker count."""
    model = model_from_dict(tiny(), "t")
    job = TrainingJob(global_batch_size=64, seq_length=1, optimizer="sgd")
    names = tuple(model.tensor_params())
    measured = replace(A100, inter=replace(A100.inter, message_overhead_us=250.0))
    for devices, servers in ((2, 1), (8, 2), (2, 4)):
        cluster = Cluster.of(A100, devices=devices)
        config = RecsysConfig("ps", servers, "dedicated", True, names)
        plain = estimate_recsys(model, A100, cluster, job, config)
        assert plain.time_s["latency_s"] == pytest.approx(4 * A100.inter.latency_s)
        slow = estimate_recsys(model, measured, cluster, job, config)
        assert slow.time_s["latency_s"] == pytest.approx(3 * max(devices, servers) * 250e-6)
        # (a measured profile also prices each piece's handling, advisor.cost.ps_handling)
        assert slow.time_s["handling_s"] > 0.0 and plain.time_s["handling_s"] == 0.0
        assert slow.step_time_s - plain.step_time_s == pytest.approx(
            3 * max(devices, servers) * 250e-6 - 4 * A100.inter.latency_s + slow.time_s["handling_s"])
        # asynchronous: the workers pay their own messages, the servers theirs, nobody waits for both
        asyn = estimate_recsys(model, measured, cluster, job, replace(config, synchronous=False))
        # asynchronous: the part is the busier side's handling, nothing where it is not priced
        assert estimate_recsys(model, A100, cluster, job, replace(config, synchronous=False)).time_s["handling_s"] == 0.0
        assert 0.0 < asyn.time_s["handling_s"] < slow.time_s["handling_s"]
        assert asyn.step_time_s >= 3 * devices * 250e-6 and asyn.step_time_s < slow.step_time_s + 1e-12


def test_colocated_servers_fewer_than_nodes_leave_some_workers_without_a_local_server():
    """The slowest worker sends everything over the network when its node has no server; with a
    server on every node a 1/S share stays local."""
    model = load_model("dlrm-criteo-1tb")
    cluster = Cluster.of(A100, nodes=4)
    job = TrainingJob(global_batch_size=65536, seq_length=1, optimizer="sgd")
    tables = tuple(t.name for t in model.tables)
    nic = A100.inter.effective_bandwidth_bytes_per_s

    def worker_nic(servers):
        e = estimate_recsys(model, A100, cluster, job, RecsysConfig("hybrid", servers, "colocated", True, tables))
        return e, max(e.traffic_bytes["push_bytes_per_worker"], e.traffic_bytes["pull_bytes_per_worker"])

    e2, w2 = worker_nic(2)
    e4, w4 = worker_nic(4)
    assert w2 == w4
    exchange2 = e2.time_s["worker_nic_s"] * nic - w2            # the collective share of the NIC time
    exchange4 = e4.time_s["worker_nic_s"] * nic - w4 * 3 / 4
    assert exchange2 == pytest.approx(exchange4, rel=1e-9)


def test_more_servers_never_slower_until_another_bound():
    model = load_model("dlrm-criteo-1tb")
    cluster = Cluster.of(A100, nodes=4)
    job = TrainingJob(global_batch_size=65536, seq_length=1, optimizer="sgd")
    tables = tuple(t.name for t in model.tables)
    steps, nics = [], []
    for servers in (1, 2, 4, 8, 16, 32):
        e = estimate_recsys(model, A100, cluster, job, RecsysConfig("hybrid", servers, "dedicated", True, tables))
        steps.append(e.step_time_s)
        nics.append(e.time_s["server_nic_s"])
    assert all(b <= a * (1 + 1e-9) for a, b in zip(steps, steps[1:])), steps
    assert all(b <= a * (1 + 1e-9) for a, b in zip(nics, nics[1:])), nics
    assert steps[-1] < steps[0] / 4


def test_bigger_tables_favour_the_parameter_server():
    model = load_model("wide-deep-criteo")
    cluster = Cluster.of(A100, nodes=8)
    job = TrainingJob(global_batch_size=16000 * 8 // 64 * 64, seq_length=1, optimizer="sgd")
    ratios = []
    for scale in (1, 4, 16):
        scaled = replace(model, tables=tuple(replace(t, rows=t.rows * scale) for t in model.tables))
        coll = recommend_recsys(scaled, A100, cluster, job, PsPins(mode="none"), top_k=1).estimates[0].samples_per_s
        ps = recommend_recsys(scaled, A100, cluster, job, PsPins(mode="hybrid"), top_k=1).estimates[0].samples_per_s
        ratios.append(ps / coll)
    assert ratios[0] < ratios[1] < ratios[2]
    assert ratios[0] < 1 < ratios[-1]          # collective first, PS once the tables are 16x larger


def test_asynchronous_ps_drops_the_barrier_and_reports_staleness():
    model = load_model("wide-deep-criteo")
    cluster, job = Cluster.of(A100, nodes=2), TrainingJob(global_batch_size=16000, seq_length=1)
    tables = tuple(t.name for t in model.tables)
    sync = estimate_recsys(model, A100, cluster, job, RecsysConfig("hybrid", 4, "dedicated", True, tables))
    asyn = estimate_recsys(model, A100, cluster, job, RecsysConfig("hybrid", 4, "dedicated", False, tables))
    assert sync.staleness_steps is None and asyn.staleness_steps == cluster.devices
    assert asyn.samples_per_s > sync.samples_per_s


def test_replicated_dlrm_does_not_fit_and_says_why():
    model = load_model("dlrm-criteo-1tb")
    e = estimate_recsys(model, A100, Cluster.of(A100, nodes=1), TrainingJob(global_batch_size=65536, seq_length=1),
                        RecsysConfig("replicated"))
    assert not e.feasible and "worker memory" in e.reasons[0]


# ---- search --------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, nodes", [("wide-deep-criteo", 2), ("dlrm-criteo-1tb", 2), ("dlrm-criteo-1tb", 8)])
def test_search_picks_what_the_cost_model_says_is_best(name, nodes):
    model, cluster = load_model(name), Cluster.of(A100, nodes=nodes)
    job = TrainingJob(global_batch_size=model.global_batch_size // cluster.devices * cluster.devices, seq_length=1)
    result = recommend_recsys(model, A100, cluster, job, top_k=3)
    every = [estimate_recsys(model, A100, cluster, job, c) for c in candidates(model, cluster, PsPins())]
    # the oracle: samples/s per charged device (dedicated server hosts count as devices; #32)
    from advisor.search.parameter_server import charged_devices

    def rate(e):
        return e.samples_per_s / charged_devices(e.config, cluster.devices)
    top = max(rate(e) for e in every if e.feasible)
    assert rate(result.estimates[0]) >= (1 - TIE) * top
    assert result.search.candidates == len(every)


def test_pins_are_honoured():
    model, cluster = load_model("dlrm-criteo-1tb"), Cluster.of(A100, nodes=4)
    job = TrainingJob(global_batch_size=65536, seq_length=1)
    r = recommend_recsys(model, A100, cluster, job, PsPins(mode="ps", servers=3), top_k=5)
    assert all(e.config.mode == "ps" and e.config.servers == 3 for e in r.estimates)
    assert r.best.parameter_server["servers"] == 3 and set(r.best.parameter_server["tensors"]) == set(model.tensor_params())
    r = recommend_recsys(model, A100, cluster, job, PsPins(mode="none"), top_k=5)
    assert all(p.parameter_server is None for p in r.plans) and r.best.embedding_placement == "sharded"
    with pytest.raises(AdvisorError, match="--ps-servers"):
        PsPins(mode="none", servers=2)
    with pytest.raises(AdvisorError, match="--searcher"):
        recommend_recsys(model, A100, cluster, job, searcher="ilp")


# ---- plan ----------------------------------------------------------------------------------------
def _plan(mode="hybrid", nodes=2):
    model, cluster = load_model("wide-deep-criteo"), Cluster.of(A100, nodes=nodes)
    job = TrainingJob(global_batch_size=16000, seq_length=1)
    return recommend_recsys(model, A100, cluster, job, PsPins(mode=mode), top_k=1).best


def test_plan_round_trip_with_parameter_server():
    plan = _plan("hybrid")
    data = json.loads(dumps_plan(plan))
    ps = data["parallel"]["parameter_server"]
    assert ps["mode"] == "hybrid" and set(ps["sharding"]) == set(ps["tensors"])
    assert data["parallel"]["embedding_placement"] == "servers"
    again = plan_from_dict(data, "p.json")
    assert again.parameter_server == plan.parameter_server and json.loads(dumps_plan(again)) == data
    collective = json.loads(dumps_plan(_plan("none")))
    assert collective["parallel"]["parameter_server"] is None
    del collective["parallel"]["parameter_server"]          # a plan written before the field still loads
    assert plan_from_dict(collective, "old.json").parameter_server is None


@pytest.mark.parametrize("edit, field", [
    (lambda ps: ps["sharding"].update({next(iter(ps["sharding"])): [99]}), "sharding"),
    (lambda ps: ps.update(tensors=ps["tensors"] + ["nope"]), "tensors"),
    (lambda ps: ps.update(mode="ps"), "ps"),
    (lambda ps: ps.update(servers=0), "servers"),
])
def test_bad_parameter_server_field_is_refused_by_name(edit, field):
    data = json.loads(dumps_plan(_plan("hybrid")))
    edit(data["parallel"]["parameter_server"])
    with pytest.raises(AdvisorError) as info:
        plan_from_dict(data, "p.json")
    assert "parameter_server" in str(info.value) and field in str(info.value)


def test_run_worker_fails_when_a_worker_fails(tmp_path):
    """#32: run_worker.sh waits for each worker and exits with the first failure's code (a bare wait exits 0)."""
    if not shutil.which("bash"):
        pytest.skip("no bash")
    script = tmp_path / "run_worker.sh"
    script.write_text(export_plan(_plan("hybrid"), "mindspore").files["run_worker.sh"])
    train = tmp_path / "train.py"
    train.write_text("import os, sys\nsys.exit(3 if os.environ['DEVICE_ID'] == '1' else 0)\n")
    env = {**os.environ, "MS_SCHED_HOST": "127.0.0.1", "TRAIN_SCRIPT": str(train), "LOCAL_WORKERS": "3"}
    failed = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert failed.returncode == 3 and "worker 1 failed with exit code 3" in failed.stderr
    train.write_text("import sys\nsys.exit(0)\n")
    assert subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, timeout=60).returncode == 0


def test_an_asynchronous_plan_is_not_exported_as_a_synchronous_job():
    """#32: MindSpore's parameter servers have no asynchronous mode; the MindSpore and MSJob exports say so
    (and so exit 2 without --lossy) instead of launching the synchronous job."""
    model, cluster = load_model("wide-deep-criteo"), Cluster.of(A100, nodes=2)
    job = TrainingJob(global_batch_size=16000, seq_length=1)
    plan = recommend_recsys(model, A100, cluster, job, PsPins(mode="hybrid", synchronous=False), top_k=1).best
    assert plan.parameter_server["synchronous"] is False
    for target in ("mindspore", "k8s"):
        unsupported = export_plan(plan, target).unsupported
        assert any(u.startswith("parallel.parameter_server.synchronous = false") for u in unsupported), target
    assert not any("synchronous" in u for u in export_plan(_plan("hybrid"), "mindspore").unsupported)


def test_replicated_servers_forward_their_update_and_hold_a_copy_by_hand():
    """replicas 1 (Li et al. 2014 section 4.3): each server forwards the update it applied to the next server,
    which applies it to its copy of the shard: one aggregated update more out of and into every server, the
    optimizer's memory work once more, and the weights and state of two shards on each."""
    model = model_from_dict(tiny(), "t")
    cluster, job = Cluster.of(A100, devices=2), TrainingJob(global_batch_size=8, seq_length=1, optimizer="sgd")
    names = tuple(model.tensor_params())
    sharding = (("items", (0,)), ("top_mlp_0", (1,)))
    plain = estimate_recsys(model, A100, cluster, job, RecsysConfig("ps", 2, "dedicated", True, names, sharding))
    copied = estimate_recsys(model, A100, cluster, job,
                             RecsysConfig("ps", 2, "dedicated", True, names, sharding, replicas=1))
    # server 0 holds the table: the batch of 8 touches 16 rows of 4 values, forwarded with their 8-byte keys
    # to server 1, which sends server 0 the 5 dense values of its layer
    forwarded_table, forwarded_dense = 16 * (4 * 4 + 8), 5 * 4
    assert copied.traffic_bytes["server_in_bytes"] == plain.traffic_bytes["server_in_bytes"] + forwarded_dense
    assert copied.traffic_bytes["server_out_bytes"] == plain.traffic_bytes["server_out_bytes"] + forwarded_table
    # each server holds both shards: the table's 4000 and the layer's 5 parameters
    assert copied.server_memory.parameters_gib == pytest.approx((4000 + 5) * 4 / 2 ** 30)
    assert plain.server_memory.parameters_gib == pytest.approx(4000 * 4 / 2 ** 30)
    # each repeats the other's optimizer update (SGD: 12 bytes a value) on its copy: server 0, the table's own
    # work (16 rows x 4 values updated, 2 pushes read and 2 pulls gathered of 8 rows) and the layer's 5 values;
    # server 1, the layer's own (5 updated, 2 + 2 x 5 read and gathered) and the table's 16 x 4
    host = DEFAULT_HOST_MEMORY_GBPS * 1e9 * HOST_MEMORY_EFFICIENCY
    table_work, layer_work = 16 * 4 * 12 + 2 * 2 * 8 * 4 * 4, 5 * 12 + 2 * 2 * 5 * 4
    assert plain.time_s["server_update_s"] * host == pytest.approx(table_work, rel=1e-9)
    assert copied.time_s["server_update_s"] * host == pytest.approx(
        max(table_work + 5 * 12, layer_work + 16 * 4 * 12), rel=1e-9)
    assert copied.step_time_s >= plain.step_time_s


def test_replicated_plans_round_trip_and_are_not_exported_to_mindspore():
    """The plan carries replicas; MindSpore's parameter server keeps no copy, so its exports say so (exit 2)."""
    model, cluster = load_model("wide-deep-criteo"), Cluster.of(A100, nodes=2)
    job = TrainingJob(global_batch_size=16000, seq_length=1)
    plan = recommend_recsys(model, A100, cluster, job, PsPins(mode="ps", servers=2, replicas=1), top_k=1).best
    data = json.loads(dumps_plan(plan))
    assert data["parallel"]["parameter_server"]["replicas"] == 1
    assert plan_from_dict(data, "p.json").parameter_server["replicas"] == 1
    for target in ("mindspore", "k8s"):
        assert any(u.startswith("parallel.parameter_server.replicas = 1") for u in export_plan(plan, target).unsupported)
    data["parallel"]["parameter_server"]["replicas"] = 2
    with pytest.raises(AdvisorError, match="replicas' must be 0 or 1"):
        plan_from_dict(data, "p.json")
    with pytest.raises(AdvisorError, match="at least 2 servers"):
        PsPins(mode="ps", servers=1, replicas=1)


def test_transformer_plan_refuses_a_parameter_server():
    plan = plan_to_dict(_plan("hybrid"))
    from tests._export_plans import plans   # the transformer plans of the export tests
    data = plan_to_dict(next(iter(plans().values())))
    data["parallel"]["parameter_server"] = plan["parallel"]["parameter_server"]
    with pytest.raises(AdvisorError, match="family: recommendation"):
        plan_from_dict(data, "p.json")


# ---- exports -------------------------------------------------------------------------------------
def test_mindspore_export_of_a_ps_plan(tmp_path):
    plan = _plan("hybrid")
    result = export_plan(plan, "mindspore")
    assert set(result.files) == {"ps_context.py", "run_scheduler.sh", "run_server.sh", "run_worker.sh"}
    ast.parse(result.files["ps_context.py"])
    assert "set_ps_context(enable_ps=True)" in result.files["ps_context.py"]
    assert "set_param_ps()" in result.files["ps_context.py"]
    for role, name in (("MS_SCHED", "run_scheduler.sh"), ("MS_PSERVER", "run_server.sh"), ("MS_WORKER", "run_worker.sh")):
        text = result.files[name]
        assert f"export MS_ROLE={role}\n" in text
        assert f"export MS_SERVER_NUM={plan.parameter_server['servers']}\n" in text
        assert f"export MS_WORKER_NUM={plan.cluster.devices}\n" in text
        assert "MS_SCHED_HOST" in text and "MS_SCHED_PORT" in text
        if shutil.which("bash"):
            path = tmp_path / name
            path.write_text(text)
            assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    ast.parse(export_plan(_plan("none"), "mindspore").files["ps_context.py"])
    # MindSpore's PS API ends at 2.7 (set_param_ps is in no later wheel): said, and refused for newer targets
    assert any("2.7 or older" in n for n in result.notes) and not result.unsupported
    newer = export_plan(plan, "mindspore", target_version="2.10")
    assert any(u.startswith("--target-version 2.10: MindSpore 2.8 removed") for u in newer.unsupported)
    assert export_plan(plan, "mindspore", target_version="2.7").unsupported == ()
    for spelled in ("v2.8.0", "r2.8", "2.8rc1"):
        assert export_plan(plan, "mindspore", target_version=spelled).unsupported, spelled
    assert "hasattr(ms.Parameter, 'set_param_ps')" in result.files["ps_context.py"]


def test_k8s_msjob_has_the_roles():
    plan = _plan("ps")
    for result in (export_plan(plan, "k8s"), export_msjob(plan)):
        docs = [d for d in yaml.safe_load_all(result.files["msjob.yaml"]) if d]
        assert len(docs) == 1 and docs[0]["kind"] == "MSJob" and docs[0]["apiVersion"] == "mindspore.gitee.com/v1"
        specs = docs[0]["spec"]["msReplicaSpecs"]
        assert set(specs) == {"Scheduler", "PS", "Worker"}
        assert specs["Scheduler"]["replicas"] == 1
        assert specs["PS"]["replicas"] == plan.parameter_server["servers"]
        assert specs["Worker"]["replicas"] == plan.cluster.devices
        roles = {k: {e["name"]: e["value"] for e in v["template"]["spec"]["containers"][0]["env"]}["MS_ROLE"]
                 for k, v in specs.items()}
        assert roles == {"Scheduler": "MS_SCHED", "PS": "MS_PSERVER", "Worker": "MS_WORKER"}


def test_k8s_msjob_of_a_collective_plan_has_a_scheduler_and_a_worker_per_device():
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _export_plans import make_plan

    for hardware, resource, image in (("dgx-a100-80g", "nvidia.com/gpu", "mindspore-gpu"),
                                      ("ascend-910b", "huawei.com/Ascend910", "mindspore-ascend")):
        plan = make_plan("llama3-8b", hardware, 2, {"dp": 16, "tp": 1, "pp": 1, "micro_batch_size": 1, "num_micro_batches": 4},
                         global_batch_size=64, seq_length=4096)
        doc = yaml.safe_load(export_msjob(plan).files["msjob.yaml"])
        specs = doc["spec"]["msReplicaSpecs"]
        assert set(specs) == {"Scheduler", "Worker"} and specs["Scheduler"]["replicas"] == 1
        assert specs["Worker"]["replicas"] == 16 and "-ps-" not in doc["metadata"]["name"]
        worker = specs["Worker"]["template"]["spec"]["containers"][0]
        assert worker["resources"]["limits"] == {resource: 1} and image in worker["image"]
        assert "resources" not in specs["Scheduler"]["template"]["spec"]["containers"][0]


def test_hostile_model_name_stays_in_comments():
    plan = _plan("hybrid")
    evil = replace(plan, model=replace(plan.model, name="x\nimport os; os.system('rm -rf /')"), model_raw=None)
    text = export_plan(evil, "mindspore").files["ps_context.py"]
    tree = ast.parse(text)
    assert not any(isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "system" for n in ast.walk(tree))


# ---- command line --------------------------------------------------------------------------------
def _advisor(*args):
    return subprocess.run([sys.executable, "-m", "advisor", *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_cli_recommend_estimate_and_refusals(tmp_path):
    out = tmp_path / "plan.json"
    r = _advisor("recommend", "--model", "dlrm-criteo-1tb", "--hardware", "dgx-a100-80g", "--nodes", "2",
                 "--ps-mode", "hybrid", "--ps-servers", "4", "--json", "--out", str(out))
    assert r.returncode == 0, r.stderr
    best = json.loads(r.stdout)["plans"][0]
    assert best["parallel"]["parameter_server"]["servers"] == 4
    r = _advisor("estimate", "--plan", str(out), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["mode"] == "hybrid"
    r = _advisor("recommend", "--model", "llama3-8b", "--hardware", "dgx-a100-80g", "--nodes", "1", "--ps-mode", "ps")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "transformer" in r.stderr
    r = _advisor("recommend", "--model", "wide-deep-criteo", "--hardware", "dgx-a100-80g", "--nodes", "1",
                 "--searcher", "drec")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "recommendation model" in r.stderr


# ---- device work and sharded placement (advisor.cost.recsys_kernels) -----------------------------------
def test_embedding_bytes_by_hand():
    from advisor.cost.recsys_kernels import TableWork, embedding_bytes
    w = TableWork(dim=4, lookups=10, unique_rows=3, outputs=8)
    fwd, bwd = embedding_bytes([w], act=2, fp16_scaling=False)
    assert fwd == 10 * (16 + 8) + 8 * 2
    # pooled gradient read, COO rows and ids written, 8 sort passes of 32 bytes, coalesce 10 + 3 rows
    assert bwd == 8 * 2 + 10 * (16 + 8) + 10 * 8 * 32 + 10 * 16 + 3 * 16
    assert embedding_bytes([w], act=2, fp16_scaling=True)[1] == bwd + 2 * 10 * 16


def test_sharded_placement_table_wise_then_column_wise_then_row_wise():
    from advisor.cost.recsys_kernels import place_tables
    dlrm = load_model("dlrm-criteo-1tb")
    placed = place_tables(dlrm, 8, budget_params=60e9 / 8)       # tables fit whole: table-wise, <= 4 each
    assert sorted(len(p) for p in placed) == [3, 3, 3, 3, 3, 3, 4, 4]
    assert all(p.row_share == 1 and p.columns == 128 for d in placed for p in d)
    placed = place_tables(dlrm, 128, budget_params=60e9 / 8)     # 26 x 128 columns over 128 devices
    assert {p.columns for d in placed for p in d} == {16}
    assert max(sum(p.output for p in d) for d in placed) == 32
    placed = place_tables(dlrm, 8, budget_params=3e9)             # the 40M-row tables split by rows
    c1 = [p for d in placed for p in d if p.table.name == "C1"]
    assert len(c1) == 2 and all(p.row_share == 0.5 for p in c1)
    assert sum(p.params for d in placed for p in d) == pytest.approx(dlrm.embedding_params)


def test_sharded_dlrm_busiest_device_sets_the_embedding_time():
    dlrm = load_model("dlrm-criteo-1tb")
    cluster, job = Cluster.of(A100, nodes=1), TrainingJob(global_batch_size=65536, seq_length=1, dtype="fp16",
                                                          optimizer="sgd")
    e = estimate_recsys(dlrm, A100, cluster, job, RecsysConfig("sharded"))
    assert e.feasible and e.worker_memory.parameters_gib < 80
    # 4 whole tables on the busiest device send 4 x 65536 x 128 fp16 values; it receives 8192 x 26 x 128
    assert e.traffic_bytes["alltoall_buffer"] == 4 * 65536 * 128 * 2 + 4 * 65536 * 8


def test_cli_k8s_export_of_a_mindspore_plan_is_a_mindspore_job_unless_asked_otherwise(tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _export_plans import make_plan

    from advisor.plan import save_plan

    path = tmp_path / "ascend.json"
    save_plan(make_plan("llama3-8b", "ascend-910b", 2, {"dp": 16, "tp": 1, "pp": 1, "micro_batch_size": 1,
                                                        "num_micro_batches": 4}, global_batch_size=64, seq_length=4096,
                        framework="mindspore"),
              path)
    r = _advisor("export", str(path), "--to", "k8s", "--json")
    assert r.returncode == 0, r.stderr
    doc = yaml.safe_load(json.loads(r.stdout)["files"]["msjob.yaml"])
    worker = doc["spec"]["msReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert doc["kind"] == "MSJob" and "mindspore-ascend" in worker["image"]
    assert worker["resources"]["limits"] == {"huawei.com/Ascend910": 1}
    r = _advisor("export", str(path), "--to", "k8s", "--framework", "megatron", "--json")   # a PyTorchJob
    assert r.returncode == 2 and "priced for MindSpore, and this export launches Megatron-LM" in r.stderr
    r = _advisor("export", str(path), "--to", "k8s", "--framework", "pytorch", "--json")
    assert r.returncode == 2 and "--framework with --to k8s takes megatron, torchtitan, deepspeed" in r.stderr
    r = _advisor("export", str(path), "--to", "k8s", "--framework", "megatron", "--json", "--lossy")
    assert r.returncode == 0, r.stderr
    docs = list(yaml.safe_load_all(next(iter(json.loads(r.stdout)["files"].values()))))
    assert any(d and d.get("kind") == "PyTorchJob" for d in docs)


def test_adagrad_is_priced_for_recommendation_models_only():
    """Adagrad's one fp32 sum per parameter (Duchi et al. 2011): in the recommendation cost model's
    memory and server traffic; transformer plans are refused with it."""
    model = model_from_dict(tiny(), "t")
    cluster = Cluster.of(A100, devices=2)
    names = tuple(model.tensor_params())
    figures = {}
    for opt in ("sgd", "adagrad", "adam"):
        job = TrainingJob(global_batch_size=8, seq_length=1, optimizer=opt)
        figures[opt] = estimate_recsys(model, A100, cluster, job, RecsysConfig("ps", 1, "dedicated", True, names))
    params = figures["sgd"].server_memory.parameters_gib
    assert figures["adagrad"].server_memory.optimizer_gib == pytest.approx(params)          # 4 bytes vs 4
    assert figures["adam"].server_memory.optimizer_gib == pytest.approx(2 * params)
    assert (figures["sgd"].time_s["server_update_s"] < figures["adagrad"].time_s["server_update_s"]
            < figures["adam"].time_s["server_update_s"])
    plan = plan_to_dict(recommend_llama_plan())
    plan["training"]["optimizer"] = "adagrad"
    with pytest.raises(AdvisorError, match="recommendation models only"):
        plan_from_dict(plan, "plan.json")


def recommend_llama_plan():
    from advisor.commands.recommend import recommend

    hw = load_hardware("dgx-h100")
    return recommend(load_model("llama3-8b"), hw, Cluster.of(hw, devices=8),
                     TrainingJob(global_batch_size=16, seq_length=8192), top_k=1).best


def test_dedicated_server_hosts_are_charged_in_the_ranking():
    """#32: a plan that adds dedicated server hosts is ranked by its samples/s per charged device (the
    cluster's devices plus one per host), so a faster plan on more machines can rank below."""
    from advisor.cost.recsys import RecEstimate, RecsysConfig
    from advisor.search.parameter_server import charged_devices, rank_estimates

    def est(config, rate):
        return RecEstimate(config=config, feasible=True, reasons=(), worker_memory=None, capacity_gib=80.0,
                           time_s={}, step_time_s=1.0, samples_per_s=rate, tflops_per_device=0.0, mfu=0.0,
                           bottleneck="compute")

    replicated = est(RecsysConfig("replicated"), 1000.0)
    dedicated = est(RecsysConfig("ps", 8, "dedicated", True, ("t",)), 1400.0)     # 40% faster, 8 more hosts
    colocated = est(RecsysConfig("ps", 2, "colocated", True, ("t",)), 1200.0)
    assert charged_devices(dedicated.config, 16) == 24 and charged_devices(colocated.config, 16) == 16
    order = rank_estimates([dedicated, replicated, colocated], 16)
    assert order[0] is colocated and order[-1] is dedicated      # 1400 / 24 = 58 < 1000 / 16 = 62.5 < 1200 / 16
    assert rank_estimates([replicated, dedicated], 64)[0] is dedicated   # 1400 / 72 = 19.4 > 1000 / 64 = 15.6
