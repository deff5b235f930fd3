"""advisor whatif: the sweep grid, the relationships between its points, and the command line.

The cost model is being calibrated, so these tests check relationships (faster links or more memory
never make the best plan slower, time and cost follow from throughput, scaling efficiency is relative
to the smallest point), not absolute figures. recommend() ranks plans within 1% as ties and prefers
the simpler one, so "never slower" allows that 1%.
"""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

import advisor.commands.recommend as recommend_module
from advisor.cli import app
from advisor.errors import AdvisorError
from advisor.specs.hardware import load_hardware
from advisor.cost.carbon import DEFAULT_PUE, IN_JOB_FLOOR
from advisor.render.whatif import whatif_tables
from advisor.whatif import parse_list, parse_names, whatif

TIE = 0.99


@pytest.fixture(scope="module")
def links():
    return whatif("llama3-8b", ["dgx-a100-80g"], nodes=[1, 2, 4], inter_node_gbps=[12.5, 100], tokens="100B",
                  workers=1)


def _point(result, **where):
    (p,) = [p for p in result.points if all(getattr(p, k) == v for k, v in where.items())]
    return p


def test_grid_order_and_size(links):
    assert len(links.points) == 2 * 3
    assert [(p.inter_node_gbps, p.nodes) for p in links.points] == [
        (12.5, 1), (12.5, 2), (12.5, 4), (100.0, 1), (100.0, 2), (100.0, 4)]
    assert all(p.devices == 8 * p.nodes for p in links.points)
    assert {p.variant for p in links.points} == {"dgx-a100-80g[inter12.5]", "dgx-a100-80g[inter100]"}
    assert all(p.fits for p in links.points)


def test_faster_network_is_never_slower(links):
    for nodes in (1, 2, 4):
        slow = _point(links, inter_node_gbps=12.5, nodes=nodes)
        fast = _point(links, inter_node_gbps=100.0, nodes=nodes)
        assert fast.tokens_per_s >= slow.tokens_per_s * TIE


def test_time_cost_and_energy_follow_from_throughput(links):
    hw = load_hardware("dgx-a100-80g")
    BEST_A100 = max(eff for _, eff in hw.device.gemm_curve("bf16"))
    for p in links.points:
        assert p.time_to_train_s == pytest.approx(100e9 / p.tokens_per_s, rel=1e-9)
        device_hours = p.time_to_train_s / 3600.0 * p.devices
        assert p.cost_usd == pytest.approx(device_hours * hw.price_per_device_hour_usd, rel=1e-9)
        # facility energy (advisor.cost.carbon): devices at their utilisation-dependent power, the rest of
        # each node, times the default PUE
        device_w = hw.power_watts * (IN_JOB_FLOOR + (1 - IN_JOB_FLOOR) * min(1.0, p.plan.prediction["hfu"] / BEST_A100))
        it_w = p.devices * device_w + p.nodes * hw.host.power_watts
        assert p.energy_kwh == pytest.approx(it_w * p.time_to_train_s / 3.6e6 * DEFAULT_PUE, rel=1e-9)
        assert hw.power_watts * IN_JOB_FLOOR * device_hours / 1000 < p.energy_kwh
        assert p.step_time_s == pytest.approx(p.global_batch_size * p.seq_length / p.tokens_per_s, rel=1e-6)
        assert 0 < p.mfu < 1


def test_scaling_efficiency_is_relative_to_the_smallest_point(links):
    for inter in (12.5, 100.0):
        base = _point(links, inter_node_gbps=inter, nodes=1)
        assert base.scaling_efficiency == pytest.approx(1.0)
        for nodes in (2, 4):
            p = _point(links, inter_node_gbps=inter, nodes=nodes)
            expected = (p.tokens_per_s / p.devices) / (base.tokens_per_s / base.devices)
            assert p.scaling_efficiency == pytest.approx(expected)


def test_more_memory_fits_at_least_as_often_and_is_not_slower():
    result = whatif("llama3-70b", ["dgx-a100-80g"], nodes=[1, 2], memory_gib=[40, 80], workers=1)
    for nodes in (1, 2):
        small = _point(result, memory_gib=40.0, nodes=nodes)
        big = _point(result, memory_gib=80.0, nodes=nodes)
        assert big.fits or not small.fits
        if small.fits:
            assert big.tokens_per_s >= small.tokens_per_s * TIE


def test_points_that_do_not_fit_say_why():
    result = whatif("llama3-405b", ["dgx-a100-40g"], nodes=[1], workers=1)
    (p,) = result.points
    assert not p.fits and p.plan is None and p.tokens_per_s is None and p.scaling_efficiency is None
    assert "fits" in p.reason
    json.dumps(result.to_dict())   # serialisable as is


def test_whatif_uses_recommend(monkeypatch):
    calls = []
    real = recommend_module.recommend

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(recommend_module, "recommend", spy)
    result = whatif("gpt3-1.3b", ["dgx-h100"], nodes=[1], global_batch=[64], workers=1)
    assert len(calls) == 1 and calls[0]["top_k"] == 1
    (p,) = result.points
    hw = load_hardware("dgx-h100")
    from advisor.specs.job import Cluster, TrainingJob
    from advisor.specs.model import load_model

    direct = real(load_model("gpt3-1.3b"), hw, Cluster.of(hw, nodes=1),
                  TrainingJob(global_batch_size=64, seq_length=2048, dtype="bf16"), top_k=1)
    assert p.plan.strategy == direct.best.strategy
    assert p.tokens_per_s == pytest.approx(direct.estimates[0].tokens_per_s)


def test_parallel_workers_give_the_same_answers():
    kwargs = dict(nodes=[1, 2], global_batch=[128, 256], seq_len=[2048])
    serial = whatif("gpt3-1.3b", ["dgx-a100-80g", "dgx-h100"], workers=1, **kwargs)
    parallel = whatif("gpt3-1.3b", ["dgx-a100-80g", "dgx-h100"], workers=2, **kwargs)
    assert [p.to_dict() for p in serial.points] == [p.to_dict() for p in parallel.points]
    assert len(serial.points) == 2 * 2 * 2


def test_batch_and_sequence_axes_make_separate_series():
    result = whatif("gpt3-1.3b", ["dgx-h100"], devices=[8, 16], global_batch=[64, 128], workers=1)
    assert {p.series for p in result.points} == {("dgx-h100", 64, 2048), ("dgx-h100", 128, 2048)}
    for p in result.points:
        if p.devices == 8:
            assert p.scaling_efficiency == pytest.approx(1.0)


def test_bad_input_names_the_flag():
    with pytest.raises(AdvisorError, match="--nodes: 'x'"):
        parse_list("--nodes", "8,x")
    with pytest.raises(AdvisorError, match="--inter-node-gbps: '-5'"):
        parse_list("--inter-node-gbps", "25,-5", float)
    with pytest.raises(AdvisorError, match="--memory-gib"):
        parse_list("--memory-gib", "80,80", float)
    with pytest.raises(AdvisorError, match="--hardware"):
        parse_names("--hardware", "dgx-h100,,x")
    with pytest.raises(AdvisorError, match="exactly one of --nodes or --devices"):
        whatif("gpt3-1.3b", ["dgx-h100"], nodes=[1], devices=[8])
    with pytest.raises(AdvisorError, match="--searcher"):
        whatif("gpt3-1.3b", ["dgx-h100"], nodes=[1], searcher="nope")
    with pytest.raises(AdvisorError, match="--dtype bf16"):
        whatif("gpt3-1.3b", ["dgx-v100"], nodes=[1], dtype="bf16")
    with pytest.raises(AdvisorError, match="unknown hardware profile 'nope'"):
        whatif("gpt3-1.3b", ["nope"], nodes=[1])


def test_tables_render(links):
    from rich.console import Console

    console = Console(width=160, record=True)
    for table in whatif_tables(links):
        console.print(table)
    text = console.export_text()
    assert "inter GB/s" in text and "scaling" in text and "100%" in text


runner = CliRunner()


def test_cli_json():
    res = runner.invoke(app, ["whatif", "--model", "gpt3-1.3b", "--hardware", "dgx-a100-80g,dgx-h100",
                              "--nodes", "1,2", "--global-batch", "128", "--tokens", "1B", "--json", "--workers", "1"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert len(doc["points"]) == 4
    for p in doc["points"]:
        assert p["fits"] and p["tokens_per_s"] > 0 and p["time_to_train_s"] > 0
        assert set(p) >= {"hardware", "nodes", "devices", "mfu", "step_time_s", "cost_usd", "energy_kwh",
                          "scaling_efficiency", "parallel"}
        assert math.isclose(p["time_to_train_s"], 1e9 / p["tokens_per_s"])


def test_cli_table_and_plot(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "w.png"
    res = runner.invoke(app, ["whatif", "--model", "gpt3-1.3b", "--hardware", "dgx-h100", "--nodes", "1,2",
                              "--global-batch", "128", "--plot", str(out), "--workers", "1"])
    assert res.exit_code == 0, res.output
    assert "dgx-h100" in res.stdout and out.stat().st_size > 10_000


def test_cli_bad_input_exit_2():
    """Run as users do: main() maps the error to exit 2 and one sentence on stderr, no traceback."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    for args, flag in ((["--nodes", "1,zero"], "--nodes"), (["--nodes", "1", "--inter-node-gbps", "fast"], "--inter-node-gbps"),
                       (["--nodes", "1", "--tokens", "lots"], "--tokens")):
        r = subprocess.run([sys.executable, "-m", "advisor", "whatif", "--model", "gpt3-1.3b", "--hardware", "dgx-h100",
                            *args], capture_output=True, text=True, cwd=root, timeout=120,
                           env={**os.environ, "COLUMNS": "200"})
        assert r.returncode == 2, r.stderr
        assert flag in r.stderr and "Traceback" not in r.stderr and r.stdout == ""
