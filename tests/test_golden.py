"""Golden tests: the cost model against measured runs from public papers (benchmarks/data/).

Thresholds are the issue's goals; benchmarks/accuracy.py prints the full figures.
"""

from __future__ import annotations

import statistics

import pytest

from advisor.validation.published import load_published_runs, predict, published_errors, vtrain_ranking


@pytest.fixture(scope="module")
def errors():
    return {e.run_id: e for e in published_errors()}


def test_korthikanti_table5_iteration_times(errors):
    rel = [abs(e.relative_error) for k, e in errors.items() if k.startswith("korthikanti")]
    assert len(rel) == 8
    assert statistics.mean(rel) <= 0.03
    assert max(rel) <= 0.08


def test_sc21_table1_tflops(errors):
    rel = [abs(e.relative_error) for k, e in errors.items() if k.startswith("sc21")]
    assert len(rel) == 10
    assert statistics.mean(rel) <= 0.08


def test_selective_recompute_beats_full_as_measured(errors):
    # Korthikanti Table 5: sequence parallelism + selective recomputation is faster for every model.
    for size in ("22b", "175b", "530b", "1t"):
        assert errors[f"korthikanti-{size}-seqsel"].predicted < errors[f"korthikanti-{size}-full"].predicted


def test_published_configurations_fit_in_memory():
    for run in load_published_runs():
        assert predict(run).feasible, run.id


def test_vtrain_ranking():
    scores = vtrain_ranking()
    assert len(scores) == 24
    assert statistics.median(s.kendall_tau for s in scores) >= 0.8
    assert sum(s.best_in_top3 for s in scores) / len(scores) >= 0.9
