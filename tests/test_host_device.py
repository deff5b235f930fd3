"""Host&Device heterogeneous training of recommendation models (issue 13): the largest embedding
tables in each worker's host memory, looked up and updated by the host CPU (MindSpore's tutorial
"Host&Device Heterogeneous"), the rest data parallel on the devices."""

from __future__ import annotations

import ast
import json

import pytest
from typer.testing import CliRunner

from advisor.cli import app
from advisor.cost.memory import GIB
from advisor.cost.parameter_server import DEFAULT_HOST_MEMORY_GBPS, HOST_MEMORY_EFFICIENCY
from advisor.cost.recsys import STATE_BYTES, RecsysConfig, touched_rows
from advisor.cost.recsys_estimate import estimate_recsys
from advisor.cost.recsys_host import embedding_traffic
from advisor.errors import AdvisorError
from advisor.export import export_plan
from advisor.plan import load_plan, plan_from_dict, plan_to_dict
from advisor.search.parameter_server import PsPins, recommend_recsys
from advisor.specs.hardware import load_hardware
from advisor.specs.job import Cluster, TrainingJob
from advisor.specs.model import load_model
from advisor.specs.recommendation import PARAM_BYTES

A100 = load_hardware("dgx-a100-80g")
runner = CliRunner()


@pytest.fixture(scope="module")
def dlrm():
    return load_model("dlrm-criteo-1tb")


def _job(batch=65536):
    return TrainingJob(global_batch_size=batch, seq_length=1, dtype="bf16", optimizer="adam")


def test_memory_moves_to_the_host(dlrm):
    cluster = Cluster.of(A100, devices=2)
    by_size = sorted(dlrm.tables, key=lambda t: -t.params)
    host = tuple(t.name for t in by_size[:4])
    e = estimate_recsys(dlrm, A100, cluster, _job(), RecsysConfig("host", host_tables=host))
    device_tables = sum(t.params for t in dlrm.tables if t.name not in host)
    assert e.worker_memory.parameters_gib == pytest.approx((dlrm.dense_params + device_tables) * PARAM_BYTES / GIB)
    assert e.worker_memory.optimizer_gib == pytest.approx((dlrm.dense_params + device_tables) * STATE_BYTES["adam"] / GIB)
    rows = sum(touched_rows(t.rows, t.lookups_per_sample, 65536, dlrm.unique_row_fraction) * t.dim * PARAM_BYTES
               for t in by_size[:4])
    per_process = sum(t.params for t in by_size[:4]) * (PARAM_BYTES + STATE_BYTES["adam"]) + rows
    assert e.traffic_bytes["host_memory_per_node"] == pytest.approx(2 * per_process)
    pooled = 65536 / 2 * sum(t.output_width for t in by_size[:4]) * 2
    assert e.traffic_bytes["pcie_per_step"] == pytest.approx(2 * pooled + 2 * rows)
    assert e.time_s["pcie_s"] == pytest.approx((2 * pooled + 2 * rows) / (A100.host.pcie_bandwidth_gbps * 1e9))
    # a single process has nobody to exchange rows with: only the pooled values cross PCIe
    one = estimate_recsys(dlrm, A100, Cluster.of(A100, devices=1), _job(), RecsysConfig("host", host_tables=host))
    assert one.traffic_bytes["pcie_per_step"] == pytest.approx(2 * 65536 * sum(t.output_width for t in by_size[:4]) * 2)
    # the lookups run at the host's bandwidth shared by the node's processes (two here)
    bw = DEFAULT_HOST_MEMORY_GBPS * 1e9 * HOST_MEMORY_EFFICIENCY
    traffic = sum(embedding_traffic(dlrm, by_size[:4], 65536 / 2, 2, False))
    assert e.time_s["host_embedding_s"] == pytest.approx(traffic / (bw / 2))


def test_host_copies_are_checked_against_host_memory(dlrm):
    e = estimate_recsys(dlrm, A100, Cluster.of(A100, devices=8), _job(), RecsysConfig("host"))
    assert not e.feasible and "host has 2048 GiB" in e.reasons[0]


def test_search_keeps_tables_on_the_host_only_where_devices_cannot_hold_them(dlrm):
    # two A100s cannot hold DLRM's 269 GB of tables replicated or sharded; without servers, the host can
    r = recommend_recsys(dlrm, A100, Cluster.of(A100, devices=2), _job(), PsPins(mode="none"))
    best = r.estimates[0]
    assert best.config.mode == "host" and len(best.config.host_tables) == 4
    for mode in ("replicated", "sharded"):
        assert not estimate_recsys(dlrm, A100, Cluster.of(A100, devices=2), _job(), RecsysConfig(mode)).feasible
    assert r.best.embedding_placement == "host" and r.best.host_tables == best.config.host_tables
    # Wide & Deep fits the devices: the host is never chosen, and it is slower there
    wd = load_model("wide-deep-criteo")
    cluster = Cluster.of(A100, nodes=2)
    job = TrainingJob(global_batch_size=16000, seq_length=1, dtype="bf16", optimizer="adam")
    r2 = recommend_recsys(wd, A100, cluster, job)
    assert r2.estimates[0].config.mode != "host"
    host = estimate_recsys(wd, A100, cluster, job, RecsysConfig("host"))
    assert host.samples_per_s < r2.estimates[0].samples_per_s


def test_plan_round_trip_estimate_and_export(tmp_path, dlrm):
    out = tmp_path / "host.json"
    r = runner.invoke(app, ["recommend", "--model", "dlrm-criteo-1tb", "--hardware", "dgx-a100-80g", "--devices", "2",
                            "--ps-mode", "none", "--out", str(out)])
    assert r.exit_code == 0, r.output
    data = json.loads(out.read_text())
    assert data["parallel"]["embedding_placement"] == "host" and len(data["parallel"]["host_tables"]) == 4
    plan = load_plan(out)
    again = runner.invoke(app, ["estimate", "--plan", str(out), "--json"])
    assert json.loads(again.output)["samples_per_s"] == pytest.approx(data["prediction"]["samples_per_s"], rel=1e-12)
    script = export_plan(plan, "mindspore").files["ps_context.py"]
    tree = ast.parse(script)
    tables = next(ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                  and n.targets[0].id == "HOST_TABLES")
    assert tables == data["parallel"]["host_tables"]
    assert "set_device('CPU')" in script and "parallel_mode='data_parallel'" in script
    # validation names the key
    bad = plan_to_dict(plan)
    bad["parallel"] = {**bad["parallel"], "embedding_placement": "replicated"}
    with pytest.raises(AdvisorError, match="key 'host_tables' needs embedding_placement 'host'"):
        plan_from_dict(bad, "test")
    bad["parallel"] = {**bad["parallel"], "embedding_placement": "host", "host_tables": ["nope"]}
    with pytest.raises(AdvisorError, match="'nope', which is not a table"):
        plan_from_dict(bad, "test")
    refused = runner.invoke(app, ["execute", str(out), "--tiny"])
    assert isinstance(refused.exception, AdvisorError) and "without parameter servers" in str(refused.exception)


class _FakePrimitive:
    def __init__(self):
        self.device = None

    def set_device(self, target):
        self.device = target


def _fake_mindspore(monkeypatch):
    """Just enough of mindspore for ps_context.py: the calls it makes, and ops.Primitive."""
    import sys
    import types

    ms = types.ModuleType("mindspore")
    ms.GRAPH_MODE = 0
    ms.set_context = lambda **kw: None
    ms.set_auto_parallel_context = lambda **kw: None
    ms.ops = types.SimpleNamespace(Primitive=_FakePrimitive)
    comm = types.ModuleType("mindspore.communication")
    comm.init = lambda: None
    monkeypatch.setitem(sys.modules, "mindspore", ms)
    monkeypatch.setitem(sys.modules, "mindspore.communication", comm)


class _Param:
    def __init__(self, name):
        self.name = name


class _Cell:
    def __init__(self):
        self.lookup = _FakePrimitive()


class _Net:
    def __init__(self, tables):
        self.cells = {f"embeddings.{t}": _Cell() for t in tables}
        self.cells["top_mlp_0"] = _Cell()
        self.params = [_Param(f"embeddings.{t}.weight") for t in tables] + [_Param("top_mlp_0.weight")]

    def cells_and_names(self):
        return list(self.cells.items())

    def trainable_params(self):
        return self.params


def test_place_on_host_runs_the_host_lookups_on_the_cpu(monkeypatch, dlrm):
    _fake_mindspore(monkeypatch)
    r = recommend_recsys(dlrm, A100, Cluster.of(A100, devices=2), _job(), PsPins(mode="none"))
    script = export_plan(r.best, "mindspore").files["ps_context.py"]
    scope: dict = {}
    exec(compile(script, "ps_context.py", "exec"), scope)
    host_tables = list(r.best.host_tables)
    net = _Net([t.name for t in dlrm.tables])
    host, device = scope["place_on_host"](net)
    assert sorted(p.name.split(".")[1] for p in host) == sorted(host_tables)
    assert len(device) == len(dlrm.tables) - len(host_tables) + 1
    for name, cell in net.cells.items():
        assert cell.lookup.device == ("CPU" if name.split(".")[-1] in host_tables else None)
    with pytest.raises(RuntimeError, match="host tables"):
        scope["place_on_host"](_Net([t.name for t in dlrm.tables if t.name != host_tables[0]]))
    # a plan without host_tables keeps every table on the host
    data = plan_to_dict(r.best)
    del data["parallel"]["host_tables"]
    every = plan_from_dict(data, "test")
    e = estimate_recsys(dlrm, A100, Cluster.of(A100, devices=2), _job(), RecsysConfig("host"))
    assert every.host_tables is None and e.worker_memory.parameters_gib == pytest.approx(
        dlrm.dense_params * PARAM_BYTES / GIB)
    assert "HOST_TABLES = " + repr([t.name for t in dlrm.tables]) in export_plan(every, "mindspore").files["ps_context.py"]
    with pytest.raises(AdvisorError, match="recommendation model: --to megatron"):
        export_plan(every, "megatron")
    data["parallel"]["full_batch"] = True
    with pytest.raises(AdvisorError, match="full_batch"):
        plan_from_dict(data, "test")
