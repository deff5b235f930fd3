"""Energy and emissions (advisor.cost.carbon): utilisation-dependent device power, the rest of the node,
PUE and grid intensity; --objective carbon ranks by tokens per joule."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from advisor.search.rank import TIE_BAND

from advisor.commands.recommend import recommend
from advisor.cost import carbon
from advisor.cost.estimate import estimate
from advisor.errors import AdvisorError
from _cli import run_cli
from advisor.plan import plan_from_dict, plan_to_dict
from advisor.space.strategy import Strategy
from advisor.specs.hardware import load_hardware
from advisor.specs.job import Cluster, TrainingJob
from advisor.specs.model import load_model

H100 = load_hardware("dgx-h100")
BEST = max(eff for _, eff in H100.device.gemm_curve("bf16"))


def test_device_power_rises_linearly_from_the_in_job_floor_to_the_tdp():
    floor = carbon.device_power_w(H100, "bf16", 0.0)
    assert floor == pytest.approx(700 * 110 / 300)
    assert carbon.device_power_w(H100, "bf16", BEST) == pytest.approx(700)
    assert carbon.device_power_w(H100, "bf16", 2 * BEST) == pytest.approx(700)       # never above the TDP
    half = carbon.device_power_w(H100, "bf16", BEST / 2)
    assert half == pytest.approx((floor + 700) / 2)
    # the rest of each node (DGX H100: 10.2 kW max less 8 x 700 W)
    assert carbon.cluster_power_w(H100, "bf16", 16, BEST) == pytest.approx(16 * 700 + 2 * 4600)
    assert carbon.device_power_w(replace(H100, power_watts=None), "bf16", 0.3) is None
    # a job on one device of a node pays an eighth of the rest of the node
    assert carbon.cluster_power_w(H100, "bf16", 1, BEST) == pytest.approx(700 + 4600 / 8)


def test_energy_and_emissions():
    kwh = carbon.energy_kwh(1000.0, 3600.0, 1.5)
    assert kwh == pytest.approx(1.5)
    assert carbon.emissions_tco2e(1000.0, 400.0) == pytest.approx(0.4)


@pytest.mark.parametrize("text, value", [("world", 481.0), ("France", 56.0), ("250", 250.0), (" 0 ", 0.0)])
def test_grid_intensity_by_region_or_number(text, value):
    assert carbon.grid_intensity(text) == value


@pytest.mark.parametrize("text", ["mars", "-5", "1e9", "nan"])
def test_bad_grid_intensity_is_refused(text):
    with pytest.raises(AdvisorError, match="--grid-intensity"):
        carbon.grid_intensity(text)


@pytest.mark.parametrize("pue", [0.9, 3.5, float("nan")])
def test_bad_pue_is_refused(pue):
    with pytest.raises(AdvisorError, match="pue"):
        carbon.check_pue(pue)
    with pytest.raises(AdvisorError, match="pue"):
        TrainingJob(global_batch_size=8, seq_length=128, pue=pue)


def test_estimate_carries_energy_and_emissions():
    model = load_model("llama3-8b")
    cluster = Cluster.of(H100, devices=16)
    s = Strategy(dp=16, tp=1, pp=1, cp=1, micro_batch_size=1, num_micro_batches=2, zero_stage=1, recompute="selective")
    job = TrainingJob(global_batch_size=32, seq_length=8192, train_tokens=1e12, pue=1.2, grid_gco2e_per_kwh=381.0)
    e = estimate(model, H100, cluster, job, s)
    power = 16 * carbon.device_power_w(H100, "bf16", e.hfu) + 2 * 4600
    assert e.energy_to_train_kwh == pytest.approx(power * e.time_to_train_s / 3.6e6 * 1.2)
    assert e.emissions_to_train_tco2e == pytest.approx(e.energy_to_train_kwh * 381 / 1e6)
    plain = estimate(model, H100, cluster, replace(job, grid_gco2e_per_kwh=None), s)
    assert plain.emissions_to_train_tco2e is None and plain.energy_to_train_kwh == pytest.approx(e.energy_to_train_kwh)


def test_carbon_objective_maximizes_tokens_per_joule():
    model = load_model("llama3-8b")
    cluster = Cluster.of(H100, nodes=2)
    job = TrainingJob(global_batch_size=64, seq_length=8192, train_tokens=1e12, grid_gco2e_per_kwh=481.0)
    fast = recommend(model, H100, cluster, job, top_k=20)
    green = recommend(model, H100, cluster, job, top_k=20, objective="carbon")

    def per_joule(e):
        return e.tokens_per_s / carbon.cluster_power_w(H100, "bf16", cluster.devices, e.hfu)
    # the carbon ranking's first plan emits no more than any plan the throughput ranking lists, within the tie band
    assert per_joule(green.estimates[0]) >= max(per_joule(e) for e in fast.estimates) * (1.0 - TIE_BAND)
    assert green.estimates[0].emissions_to_train_tco2e <= (min(e.emissions_to_train_tco2e for e in fast.estimates)
                                                            / (1.0 - TIE_BAND))
    assert green.best.prediction["emissions_tco2e"] == pytest.approx(green.estimates[0].emissions_to_train_tco2e)
    with pytest.raises(AdvisorError, match="power_watts"):
        recommend(model, replace(H100, power_watts=None), cluster, job, objective="carbon")


def test_plan_keeps_the_site():
    model = load_model("llama3-8b")
    cluster = Cluster.of(H100, devices=8)
    job = TrainingJob(global_batch_size=16, seq_length=8192, pue=1.1, grid_gco2e_per_kwh=56.0)
    plan = recommend(model, H100, cluster, job, top_k=1).best
    again = plan_from_dict(json.loads(json.dumps(plan_to_dict(plan))), "plan")
    assert (again.training.pue, again.training.grid_gco2e_per_kwh) == (1.1, 56.0)
    raw = plan_to_dict(plan)
    raw["training"]["grid_gco2e_per_kwh"] = -1
    with pytest.raises(AdvisorError, match="grid_gco2e_per_kwh"):
        plan_from_dict(raw, "plan.json")


def test_cli_flags_reach_the_prediction(monkeypatch, capsys):
    from typer.testing import CliRunner

    from advisor.cli import app

    runner = CliRunner()
    base = ["--model", "llama3-8b", "--hardware", "dgx-h100", "--devices", "8", "--tokens", "100B"]
    out = runner.invoke(app, ["recommend", *base, "--top", "1", "--grid-intensity", "france", "--pue", "1.1",
                              "--objective", "carbon", "--json"])
    assert out.exit_code == 0, out.output
    plan = json.loads(out.output)["plans"][0]
    assert plan["training"]["grid_gco2e_per_kwh"] == 56.0 and plan["training"]["pue"] == 1.1
    assert plan["prediction"]["emissions_tco2e"] == pytest.approx(plan["prediction"]["energy_kwh"] * 56 / 1e6)
    table = runner.invoke(app, ["estimate", *base, "--tp", "1", "--mbs", "1", "--zero", "3", "--recompute", "full",
                                "--grid-intensity", "400"])
    assert table.exit_code == 0, table.output
    assert "tCO2e" in table.output
    code, _, err = run_cli(monkeypatch, capsys, "recommend", *base, "--grid-intensity", "mars")
    assert code == 2 and "--grid-intensity" in err
    code, _, err = run_cli(monkeypatch, capsys, "recommend", *base[:-2], "--grid-intensity", "world")
    assert code == 2 and "give --tokens" in " ".join(err.split())


def test_recommendation_models_are_ranked_by_throughput_only():
    dlrm = load_model("dlrm-criteo-1tb")
    a100 = load_hardware("dgx-a100-80g")
    with pytest.raises(AdvisorError, match="ranked by throughput"):
        recommend(dlrm, a100, Cluster.of(a100, nodes=2), TrainingJob(global_batch_size=65536, seq_length=1),
                  objective="carbon")
