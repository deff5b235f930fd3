"""`advisor recommend`: the library call (advisor/commands/recommend.py), ranking (advisor/search/rank.py), the
report and the command line."""

from __future__ import annotations

import json
import sys
from dataclasses import replace

import numpy as np
import pytest

from advisor import cli
from advisor.commands import recommend as rec
from advisor.cost.band import table as band_table
from advisor.cost.comm import slowest_tier
from advisor.errors import AdvisorError, InfeasibleError
from advisor.commands.inputs import resolve_inputs
from advisor.plan import load_plan
from advisor.search.rank import TIE_BAND, rank, simplicity_key
from advisor.search import Pins, SearchOutcome
from advisor.search import enumerate as en
from advisor.space.rules import violations
from advisor.space.strategy import Strategy, StrategyBatch


def _inputs(model="llama3-8b", hardware="dgx-a100-80g", **size):
    size = size or {"nodes": 2}
    size.setdefault("global_batch_size", 64)
    return resolve_inputs(model, hardware, **size)


def _recommend(inputs, **kw):
    return rec.recommend(inputs.model, inputs.hardware, inputs.cluster, inputs.job, **kw)


@pytest.fixture(scope="module")
def llama():
    i = _inputs()
    return i, _recommend(i, top_k=5)


# ---- the library call ---------------------------------------------------------------------------
def test_plans_are_legal_feasible_and_ranked(llama):
    i, result = llama
    assert len(result.plans) == 5
    tps = [e.tokens_per_s for e in result.estimates]
    assert tps[0] >= max(tps) * (1 - TIE_BAND)
    for plan, e in zip(result.plans, result.estimates):
        assert violations(i.model, i.cluster, i.job, plan.strategy) == []
        assert e.feasible
        assert plan.prediction["tokens_per_s"] == pytest.approx(e.tokens_per_s)
        assert plan.search["searcher"] == "enumerate"
    assert [p.search["rank"] for p in result.plans] == [1, 2, 3, 4, 5]


def test_best_plan_is_the_best_throughput_up_to_the_tie_band(llama):
    """No candidate in the whole space beats plan 1 by more than the tie band."""
    i, result = llama
    outcome = en.search(i.model, i.hardware, i.cluster, i.job, Pins(), top_k=1)
    from advisor.cost.estimate import estimate_batch
    best = estimate_batch(i.model, i.hardware, i.cluster, i.job, outcome.finalists).tokens_per_s.max()
    assert result.estimates[0].tokens_per_s >= best * (1 - TIE_BAND)


def test_search_summary(llama):
    _, result = llama
    d = result.to_dict()
    assert set(d) == {"plans", "search"}
    s = d["search"]
    assert {"searcher", "candidates", "feasible", "seconds", "pruned"} <= set(s)
    assert s["candidates"] > s["scored"] > 0
    assert all(isinstance(v, int) and v > 0 for v in s["pruned"].values())


def test_pins_are_respected():
    i = _inputs()
    pins = Pins(tp=2, pp=2, zero_stage=1, recompute="selective", micro_batch_size=1)
    result = _recommend(i, pins=pins, top_k=3)
    for plan in result.plans:
        s = plan.strategy
        assert (s.tp, s.pp, s.zero_stage, s.recompute, s.micro_batch_size) == (2, 2, 1, "selective", 1)


def test_results_do_not_depend_on_top_k(llama):
    i, result = llama
    one = _recommend(i, top_k=1)
    assert one.best.strategy == result.best.strategy


def test_ascend_tp_group_stays_in_one_hccs_group():
    i = _inputs("gpt3-13b", "ascend-910", nodes=8, global_batch_size=128)
    result = _recommend(i, top_k=5)
    hw = i.hardware
    for plan in result.plans:
        s = plan.strategy
        assert int(slowest_tier(hw, s.tp, s.stride("tp"))) == 0
        assert hw.node.group_size % (s.tp * s.stride("tp")) == 0 or s.tp == 1
    pinned = _recommend(i, pins=Pins(tp=8), top_k=1)
    assert pinned.best.strategy.tp == 8


def test_moe_plans_use_expert_parallelism_legally():
    i = _inputs("mixtral-8x7b", "dgx-h100", nodes=4, global_batch_size=64, seq_length=4096)
    result = _recommend(i, top_k=3)
    for plan in result.plans:
        s = plan.strategy
        assert (s.dp * s.cp) % s.ep == 0 and 8 % s.ep == 0


# ---- errors -------------------------------------------------------------------------------------
def test_unknown_searcher_names_the_flag():
    i = _inputs()
    with pytest.raises(AdvisorError, match="--searcher magic"):
        _recommend(i, searcher="magic")


@pytest.mark.parametrize("pins, message", [
    (Pins(tp=3), "--tp 3 does not divide the 16 devices"),
    (Pins(tp=16), "--tp 16 leaves no legal strategy"),       # llama3-8b has 8 kv heads
    (Pins(tp=4, pp=8), "--tp 4 x --pp 8 = 32 does not divide the 16 devices"),
    (Pins(cp=4, tp=1, pp=1, dp=2), "--dp 2 x --tp 1 x --pp 1 x --cp 4 = 8, but the cluster has 16 devices"),
])
def test_bad_pins_are_refused_naming_the_flag(pins, message):
    i = _inputs()
    with pytest.raises(AdvisorError) as err:
        _recommend(i, pins=pins)
    assert message in str(err.value)
    assert err.value.exit_code == 2


def test_bad_pin_values_are_refused():
    with pytest.raises(AdvisorError, match="--zero"):
        Pins(zero_stage=5)
    with pytest.raises(AdvisorError, match="--recompute"):
        Pins(recompute="some")
    with pytest.raises(AdvisorError, match="--top"):
        _recommend(_inputs(), top_k=0)


def test_nothing_fits_names_the_smallest_change():
    """llama3-70b on one 8 x 80 GB node with ZeRO pinned off: ZeRO 3 or more nodes would fit."""
    i = _inputs("llama3-70b", "dgx-a100-80g", nodes=1, global_batch_size=32, seq_length=4096)
    with pytest.raises(InfeasibleError) as err:
        _recommend(i, pins=Pins(zero_stage=0))
    text = str(err.value)
    assert err.value.exit_code == 1
    assert "--zero 3" in text or "--zero 2" in text or "--zero 1" in text
    assert "--nodes" in text


def test_smallest_cluster_is_found_by_searching():
    i = _inputs("llama3-70b", "dgx-a100-40g", devices=4, global_batch_size=32, seq_length=4096)
    bigger = rec.smallest_cluster(i.model, i.hardware, i.cluster, i.job, Pins())
    assert bigger is not None and bigger.devices > 4
    assert rec.fits_somewhere(i.model, i.hardware, bigger, i.job, Pins())
    smaller = rec.Cluster.of(i.hardware, devices=bigger.devices - (8 if bigger.devices > 8 else 1))
    assert not rec.fits_somewhere(i.model, i.hardware, smaller, i.job, Pins())


# ---- ranking ------------------------------------------------------------------------------------
def _batch(strategies):
    return StrategyBatch.from_strategies(strategies, 8)


def test_rank_prefers_the_simpler_plan_within_the_tie_band():
    from advisor.specs.hardware import load_hardware
    hw = load_hardware("dgx-a100-80g")
    simple = Strategy(dp=8, tp=1, pp=1, num_micro_batches=1)
    complex_ = Strategy(dp=4, tp=2, pp=1, num_micro_batches=2, zero_stage=1, offload_optimizer=True)
    slow = Strategy(dp=2, tp=4, pp=1, num_micro_batches=4)
    b = _batch([complex_, simple, slow])
    key = simplicity_key(b, hw)
    inside, outside = 100.0 * (1.0 - 0.9 * TIE_BAND), 100.0 * (1.0 - 1.1 * TIE_BAND)
    order = rank(np.array([100.0, inside, 90.0 * (1.0 - TIE_BAND)]), key, 3)
    assert order.tolist() == [1, 0, 2]          # within the tie band: the simpler first
    order = rank(np.array([100.0, outside, 90.0 * (1.0 - TIE_BAND)]), key, 3)
    assert order.tolist() == [0, 1, 2]          # outside the band: throughput decides
    assert TIE_BAND == pytest.approx(band_table()["pair"])      # the band: the model's error comparing two plans


def test_rank_drops_exact_duplicates_and_infeasible():
    key = np.zeros((4, 9), dtype=np.int64)
    key[1, 0] = 1
    order = rank(np.array([10.0, 10.0, 9.0, 20.0]), key, 4, feasible=np.array([True, True, True, False]),
                 memory_bytes=np.array([1.0, 1.0, 1.0, 1.0]))
    assert order.tolist() == [0, 2]


def test_simplicity_key_orders_the_criteria():
    from advisor.specs.hardware import load_hardware
    hw = load_hardware("dgx-a100-80g")
    base = Strategy(dp=16, tp=1, pp=1, num_micro_batches=1)
    variants = [
        base,
        replace(base, dp=8, tp=2, num_micro_batches=2),                        # one more active dimension
        replace(base, zero_stage=1, offload_optimizer=True),                   # offload
        replace(base, zero_stage=2),                                           # larger ZeRO stage
    ]
    key = simplicity_key(_batch(variants), hw)
    # no offload first, then fewer dimensions, then the ZeRO stage (#30's order)
    assert sorted(range(4), key=lambda r: tuple(key[r])) == [0, 3, 1, 2]


def test_tp_across_nodes_is_less_simple():
    from advisor.specs.hardware import load_hardware
    hw = load_hardware("dgx-a100-80g")
    inside = Strategy(dp=2, tp=8, pp=1, num_micro_batches=1)
    across = replace(inside, mesh_order=("pp", "cp", "tp", "dp"))        # tp stride 2: spans 2 nodes
    key = simplicity_key(_batch([inside, across]), hw)
    assert tuple(key[0]) < tuple(key[1])


# ---- searcher registry --------------------------------------------------------------------------
def test_searchers_can_be_added_by_name(monkeypatch):
    i = _inputs()

    def fixed(model, hw, cluster, job, pins, top_k, progress):
        s = Strategy(dp=4, tp=4, pp=1, micro_batch_size=1, num_micro_batches=16, zero_stage=1)
        stats = en.SearchStats(searcher="fixed", candidates=1, scored=1, feasible=1, seconds=0.0)
        return SearchOutcome(StrategyBatch.from_strategies([s], model.num_layers), stats, operator_strategies=({"op": 1},))

    monkeypatch.setitem(rec.SEARCHERS, "fixed", fixed)
    result = _recommend(i, searcher="fixed", top_k=3)
    assert len(result.plans) == 1 and result.best.strategy.tp == 4
    assert result.best.operator_strategies == {"op": 1}
    assert result.best.search["searcher"] == "fixed"


# ---- command line -------------------------------------------------------------------------------
def _run(monkeypatch, capsys, *args) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["advisor", "recommend", *args])
    with pytest.raises(SystemExit) as done:
        cli.main()
        raise SystemExit(0)
    out = capsys.readouterr()
    return int(done.value.code or 0), out.out, out.err


def test_cli_json_and_out(monkeypatch, capsys, tmp_path):
    path = tmp_path / "best.json"
    code, out, err = _run(monkeypatch, capsys, "--model", "llama3-8b", "--hardware", "dgx-a100-80g", "--nodes", "2",
                          "--global-batch", "64", "--top", "3", "--json", "--out", str(path))
    assert code == 0, err
    data = json.loads(out)
    assert len(data["plans"]) == 3 and data["search"]["searcher"] == "enumerate"
    assert json.loads(path.read_text()) == data["plans"][0]
    assert load_plan(path).strategy.dp == data["plans"][0]["parallel"]["dp"]


def test_cli_table(monkeypatch, capsys):
    code, out, _ = _run(monkeypatch, capsys, "--model", "llama3-8b", "--hardware", "dgx-a100-80g", "--nodes", "2",
                        "--gbs", "64", "--top", "2", "--pp", "2")
    assert code == 0
    assert "tokens/s" in out and "limit" in out and "pruned" in out
    assert "searching" not in out          # no progress bar when stdout is not a terminal


def test_cli_exit_codes(monkeypatch, capsys):
    code, _, err = _run(monkeypatch, capsys, "--model", "llama3-8b", "--hardware", "dgx-a100-80g", "--nodes", "2",
                        "--tp", "3")
    assert code == 2 and "--tp 3" in err
    code, _, err = _run(monkeypatch, capsys, "--model", "llama3-70b", "--hardware", "dgx-a100-40g", "--devices", "2",
                        "--global-batch", "8", "--seq-len", "2048")
    assert code == 1 and "smallest change that fits" in err and "Traceback" not in err
    code, _, err = _run(monkeypatch, capsys, "--model", "no-such-model", "--hardware", "dgx-a100-80g", "--nodes", "1")
    assert code == 2


def test_no_fit_with_zero_0_and_no_offload_pinned_names_the_change():
    """The relaxations tried for a message: offload with --zero 0 pinned would leave no ZeRO/offload pair at all
    (offload needs ZeRO >= 1), which raised IndexError; it now tries --offload --zero 1."""
    from advisor.commands.recommend import relaxed_pins

    offload = dict(relaxed_pins(Pins(zero_stage=0, offload_optimizer=False)))
    assert "--offload" not in offload and offload["--offload --zero 1"] == Pins(zero_stage=1, offload_optimizer=True)
    assert dict(relaxed_pins(Pins(zero_stage=2, offload_optimizer=False)))["--offload"].zero_stage == 2


def test_progress_bar_only_after_a_second_on_a_terminal(monkeypatch):
    import io

    from rich.console import Console

    from advisor.render import report

    with report.search_progress(Console(file=io.StringIO()), enabled=False) as hook:
        assert hook is None
    quick = Console(file=io.StringIO(), force_terminal=True)
    with report.search_progress(quick, enabled=True) as hook:
        hook(1, 2)                       # well under a second: nothing shown
    assert "searching" not in quick.file.getvalue()
    monkeypatch.setattr(report, "PROGRESS_AFTER_S", 0.0)
    slow = Console(file=io.StringIO(), force_terminal=True)
    with report.search_progress(slow, enabled=True) as hook:
        hook(1, 2)
        hook(2, 2)
    assert "searching" in slow.file.getvalue()


def test_sweeps_can_skip_the_suggestion_searches():
    i = _inputs("llama3-70b", "dgx-a100-40g", devices=2, global_batch_size=8, seq_length=2048)
    with pytest.raises(InfeasibleError) as err:
        _recommend(i, suggest=False)
    assert "no strategy for llama3-70b fits" in str(err.value) and "smallest change" not in str(err.value)


@pytest.mark.parametrize("model,hardware,devices", [("llama3-70b", "dgx-h100", 64)])
def test_the_answer_does_not_depend_on_top(model, hardware, devices):
    """--top 1 is the first row of --top 5, and --top 5 the first rows of a deeper listing (the first
    SEARCH_DEPTH rows come from a search of that depth whatever --top asks); no row repeats another."""
    i = resolve_inputs(model, hardware, devices=devices)
    runs = {k: rec.recommend(i.model, i.hardware, i.cluster, i.job, top_k=k) for k in (1, 5, rec.SEARCH_DEPTH + 4)}
    firsts = {k: [p.strategy for p in r.plans] for k, r in runs.items()}
    assert firsts[1] == firsts[5][:1]
    assert firsts[5] == firsts[rec.SEARCH_DEPTH + 4][:5]
    deep = runs[rec.SEARCH_DEPTH + 4]
    assert len(set(firsts[rec.SEARCH_DEPTH + 4])) == len(deep.plans) == rec.SEARCH_DEPTH + 4
    assert [p.search["rank"] for p in deep.plans] == list(range(1, rec.SEARCH_DEPTH + 5))
    assert runs[1].plans[0].prediction["tokens_per_s"] == runs[5].plans[0].prediction["tokens_per_s"]
