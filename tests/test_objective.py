"""--objective time-to-target: McCandlish et al.'s steps and tokens to a target, Kaplan et al.'s critical
batch and minimum steps, and the global batch chosen jointly with the parallelism."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from advisor.commands.objective import candidate_batches, target_from_flags, time_to_target
from advisor.commands.recommend import recommend
from advisor.cost.convergence import (KAPLAN_ALPHA_B, KAPLAN_ALPHA_N, KAPLAN_ALPHA_S, KAPLAN_B_STAR_TOKENS, KAPLAN_N_C,
                                      KAPLAN_S_C, Target, convergence, non_embedding_params)
from advisor.errors import AdvisorError
from _cli import run_cli
from advisor.plan import plan_from_dict, plan_to_dict
from advisor.specs.hardware import load_hardware
from advisor.specs.job import Cluster, TrainingJob
from advisor.specs.model import load_model

MODEL = load_model("gpt3-1.3b")
A100 = load_hardware("dgx-a100-80g")


def test_mccandlish_steps_and_tokens():
    target = Target(tokens=1e10, critical_batch_tokens=2e6)
    at_critical = convergence(MODEL, target, 2e6)
    # at B = B_crit: twice the minimum steps and twice the minimum tokens (McCandlish eq. 2.11)
    assert at_critical.tokens_to_target == pytest.approx(2e10)
    assert at_critical.steps_to_target == pytest.approx(2 * 1e10 / 2e6)
    small, large = convergence(MODEL, target, 2e4), convergence(MODEL, target, 2e8)
    assert small.tokens_to_target == pytest.approx(1e10 * 1.01)          # tokens barely above E_min
    assert large.steps_to_target == pytest.approx(1e10 / 2e6 * 1.01)      # steps barely above S_min
    for c in (small, at_critical, large):                                  # E = S x B
        assert c.tokens_to_target == pytest.approx(c.steps_to_target * c.batch_tokens)


def test_kaplan_critical_batch_and_minimum_steps_from_a_loss():
    loss = 2.6
    c = convergence(MODEL, Target(loss=loss), 1e6)
    assert c.critical_batch_tokens == pytest.approx(KAPLAN_B_STAR_TOKENS / loss ** (1 / KAPLAN_ALPHA_B))
    n = non_embedding_params(MODEL)
    assert 1.1e9 < n < 1.3e9                        # GPT-3 XL: 1.3B with its embeddings
    s_min = KAPLAN_S_C / (loss - (KAPLAN_N_C / n) ** KAPLAN_ALPHA_N) ** (1 / KAPLAN_ALPHA_S)
    assert c.minimum_tokens == pytest.approx(s_min * c.critical_batch_tokens)
    # a lower loss needs a larger critical batch (Kaplan Fig. 10)
    assert convergence(MODEL, Target(loss=2.4), 1e6).critical_batch_tokens > c.critical_batch_tokens
    with pytest.raises(AdvisorError, match="below what"):
        convergence(MODEL, Target(loss=1.0), 1e6)


@pytest.mark.parametrize("kwargs, message", [
    ({}, "exactly one"), ({"tokens": 1e9, "loss": 2.0}, "exactly one"), ({"tokens": 1e9}, "critical batch"),
    ({"loss": -1.0}, "positive"), ({"loss": math.inf}, "positive"),
])
def test_targets_are_checked(kwargs, message):
    with pytest.raises(AdvisorError, match=message):
        Target(**kwargs)


def test_flags_name_themselves():
    assert target_from_flags("300B", None, "4M") == Target(tokens=3e11, critical_batch_tokens=4e6)
    with pytest.raises(AdvisorError, match="--target-tokens"):
        target_from_flags("lots", None, "4M")
    with pytest.raises(AdvisorError, match="needs --target-tokens"):
        target_from_flags(None, None, None)


def test_the_chosen_batch_reaches_the_target_first_and_every_batch_is_the_enumerators_best():
    cluster = Cluster.of(A100, devices=8)
    job = TrainingJob(global_batch_size=512, seq_length=2048)
    target = Target(tokens=2e10, critical_batch_tokens=4e6)
    result, trials = time_to_target(MODEL, A100, cluster, job, target, top_k=2)
    assert [t.global_batch_size for t in trials][:7] == sorted(candidate_batches(job, cluster))[:7] or len(trials) >= 7
    timed = [t for t in trials if t.time_to_target_s is not None]
    best = min(timed, key=lambda t: t.time_to_target_s)
    chosen = result.best
    assert chosen.training.global_batch_size == best.global_batch_size
    for t in timed:   # each batch's figure is the throughput search's best plan at that batch
        alone = recommend(MODEL, A100, cluster, replace(job, global_batch_size=t.global_batch_size), top_k=1)
        assert t.time_to_target_s == pytest.approx(t.convergence.steps_to_target * alone.estimates[0].step_time_s)
    ttt = chosen.prediction["time_to_target"]
    assert ttt["seconds"] == pytest.approx(best.time_to_target_s)
    assert ttt["tokens_to_target"] == pytest.approx(2e10 * (1 + 2048 * best.global_batch_size / 4e6))
    # an interior optimum: neither the smallest nor the largest batch tried, or the search went past the range
    sizes = [t.global_batch_size for t in trials]
    assert best.global_batch_size not in (sizes[0], sizes[-1]) or len(sizes) > 7
    # the plan keeps its target through JSON
    again = plan_from_dict(json.loads(json.dumps(plan_to_dict(chosen))), "plan")
    assert again.target == target.to_dict()


def test_plan_targets_are_validated():
    plan = plan_to_dict(recommend(MODEL, A100, Cluster.of(A100, devices=8),
                                  TrainingJob(global_batch_size=64, seq_length=2048), top_k=1).best)
    plan["training"]["target"] = {"tokens": 1e9}
    with pytest.raises(AdvisorError, match="training: target"):
        plan_from_dict(plan, "plan.json")
    plan["training"]["target"] = {"loss": 2.5, "colour": 1}
    with pytest.raises(AdvisorError, match="colour"):
        plan_from_dict(plan, "plan.json")


def test_cli_time_to_target_json_table_and_refusals(tmp_path, monkeypatch, capsys):
    from typer.testing import CliRunner

    from advisor.cli import app

    runner = CliRunner()
    base = ["recommend", "--model", "gpt3-1.3b", "--hardware", "dgx-a100-80g", "--devices", "8", "--top", "1"]
    out = tmp_path / "plan.json"
    result = runner.invoke(app, base + ["--objective", "time-to-target", "--target-loss", "2.6", "--json",
                                        "--out", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    timed = [b for b in data["batches"] if b["time_to_target_s"] is not None]
    best = min(timed, key=lambda b: b["time_to_target_s"])
    plan = data["plans"][0]
    assert plan["training"]["global_batch_size"] == best["global_batch_size"]
    assert plan["training"]["target"] == {"loss": 2.6}
    assert plan["prediction"]["time_to_target"]["seconds"] == pytest.approx(best["time_to_target_s"])
    assert json.loads(out.read_text())["training"]["target"] == {"loss": 2.6}
    table = runner.invoke(app, base + ["--objective", "time-to-target", "--target-tokens", "20B",
                                       "--critical-batch-tokens", "4M"])
    assert table.exit_code == 0, table.output
    assert "chosen" in table.output and "to the target, by global batch" in " ".join(table.output.split())
    for extra, message in ((["--objective", "speed"], "--objective must be one of"),
                           (["--objective", "time-to-target"], "needs --target-tokens"),
                           (["--objective", "time-to-target", "--target-tokens", "20B"], "critical batch"),
                           (["--target-loss", "2.6"], "go with --objective time-to-target")):
        code, _, err = run_cli(monkeypatch, capsys, *base, *extra)      # one sentence, exit 2
        assert code == 2 and message in " ".join(err.split()), err


def test_whatif_chooses_the_batch_at_every_point():
    from advisor.whatif import whatif

    target = Target(loss=2.6)
    result = whatif("gpt3-1.3b", ["dgx-a100-80g"], devices=[8, 32], global_batch=[512], workers=1, target=target,
                    objective="time-to-target")
    for p in result.points:
        alone, _ = time_to_target(MODEL, A100, Cluster.of(A100, devices=p.devices),
                                  TrainingJob(global_batch_size=512, seq_length=MODEL.seq_length), target, top_k=1)
        assert p.target_batch_size == alone.best.training.global_batch_size
        assert p.time_to_target_s == pytest.approx(alone.best.prediction["time_to_target"]["seconds"])
        assert p.to_dict()["time_to_target_s"] == p.time_to_target_s
    # more devices reach the target sooner, with a batch at least as large
    small, large = result.points
    assert large.time_to_target_s < small.time_to_target_s and large.target_batch_size >= small.target_batch_size
    plain = whatif("gpt3-1.3b", ["dgx-a100-80g"], devices=[8], global_batch=[512], workers=1)
    assert plain.points[0].time_to_target_s is None and plain.points[0].global_batch_size == 512
    for kwargs in ({"target": target}, {"objective": "time-to-target"}, {"objective": "speed"}):
        with pytest.raises(AdvisorError):
            whatif("gpt3-1.3b", ["dgx-a100-80g"], devices=[8], workers=1, **kwargs)


def test_usage_errors_are_not_reported_as_nothing_fits():
    cluster, job = Cluster.of(A100, devices=8), TrainingJob(global_batch_size=512, seq_length=2048)
    for kwargs, message in (({"searcher": "bogus"}, "unknown searcher"), ({"top_k": 0}, "--top")):
        with pytest.raises(AdvisorError, match=message) as caught:
            time_to_target(MODEL, A100, cluster, job, Target(loss=2.6), **kwargs)
        assert type(caught.value) is AdvisorError          # exit 2, not InfeasibleError's exit 1


# ---- --objective cost: the cluster size that trains a token for the least money ---------------------
def test_cost_objective_tries_each_halving_and_picks_the_fastest_near_the_cheapest():
    from advisor.commands.objective_cost import COST_TIE_BAND, cheapest, cluster_sizes
    from advisor.specs.hardware import load_hardware
    from advisor.specs.job import Cluster, TrainingJob
    from advisor.specs.model import load_model

    hw = load_hardware("dgx-a100-80g")
    assert [(c.nodes, c.devices) for c in cluster_sizes(hw, Cluster(4, 32))] == [
        (4, 32), (2, 16), (1, 8), (1, 4), (1, 2), (1, 1)]
    model = load_model("gpt3-1.3b")
    job = TrainingJob(global_batch_size=256, seq_length=2048, train_tokens=1e11)
    result, trials = cheapest(model, hw, Cluster(2, 16), job, top_k=1)
    priced = [t for t in trials if t.usd_per_million_tokens is not None]
    assert [t.devices for t in trials][:3] == [16, 8, 4] and len(priced) >= 3
    for t in priced:    # $ per 1M tokens = devices x $/device-hour / (tokens/s x 3600) x 1e6
        assert t.usd_per_million_tokens == pytest.approx(t.devices * hw.price_per_device_hour_usd / 3600 / t.tokens_per_s * 1e6)
    chosen = next(t for t in priced if t.devices == result.best.cluster.devices)
    lowest = min(t.usd_per_million_tokens for t in priced)
    assert chosen.usd_per_million_tokens <= lowest * (1 + COST_TIE_BAND)
    assert all(t.tokens_per_s <= chosen.tokens_per_s for t in priced if t.usd_per_million_tokens <= lowest * (1 + COST_TIE_BAND))


def test_cost_objective_needs_a_price(monkeypatch, capsys):
    from advisor.commands.objective_cost import cheapest
    from advisor.specs.hardware import hardware_from_dict, load_hardware
    from advisor.specs.job import Cluster, TrainingJob
    from advisor.specs.model import load_model

    raw = dict(load_hardware("dgx-a100-80g").raw)
    raw.pop("price_per_device_hour_usd")
    with pytest.raises(AdvisorError, match="price_per_device_hour_usd"):
        cheapest(load_model("gpt3-1.3b"), hardware_from_dict(raw, "t"), Cluster(1, 8),
                 TrainingJob(global_batch_size=64, seq_length=2048))
    code, text, _ = run_cli(monkeypatch, capsys, "recommend", "--model", "gpt3-1.3b", "--hardware", "dgx-a100-80g",
                            "--nodes", "2", "--global-batch", "256", "--objective", "cost", "--top", "1", "--json")
    assert code == 0 and [s["devices"] for s in json.loads(text)["sizes"]][:2] == [16, 8]


def test_cost_objective_with_pins_that_divide_no_size(monkeypatch, capsys):
    code, _, err = run_cli(monkeypatch, capsys, "recommend", "--model", "gpt3-1.3b", "--hardware", "dgx-a100-80g",
                           "--nodes", "1", "--objective", "cost", "--tp", "3")
    assert code == 2 and "pinned degrees" in err
