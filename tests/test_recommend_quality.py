"""Quality of `recommend` on published configurations: for each run in
benchmarks/data/published_runs.yaml (same model, hardware, device count, global batch), the
recommended plan is predicted at least as fast as the published configuration
(benchmarks/recommend_quality.py prints the ratios)."""

from __future__ import annotations

import pytest

from advisor.validation.published import load_published_runs, predict
from advisor.commands.recommend import recommend
from advisor.specs.hardware import load_hardware
from advisor.specs.job import Cluster

RUNS = load_published_runs()


@pytest.mark.parametrize("run", RUNS, ids=[r.id for r in RUNS])
def test_recommended_plan_is_at_least_as_fast_as_the_published_one(run):
    hw = load_hardware(run.hardware)
    published = predict(run, hw)
    result = recommend(run.model, hw, Cluster.of(hw, devices=run.devices), run.job, top_k=1)
    best = result.estimates[0]
    assert best.feasible
    assert best.step_time_s <= published.step_time_s * (1 + 1e-9)
