"""--memory-margin: a share of each device's memory every plan must leave free (TrainingJob.memory_margin), applied
by estimate's verdict, the search's fit test and bounds, and kept in the plan."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from advisor.commands.estimate_request import estimate_request
from advisor.commands.inputs import resolve_inputs
from advisor.commands.recommend import recommend
from advisor.errors import AdvisorError
from advisor.search import Pins

STRATEGY = {"tp": 1, "zero_stage": 3}


def test_a_plan_that_fits_the_device_but_not_its_margin_does_not_fit():
    bare = estimate_request("llama3-8b", "dgx-h100", 1, None, job={}, strategy=STRATEGY)
    used = bare.estimate.memory_gib.total / 80.0
    assert bare.estimate.feasible and 0.6 < used < 0.9
    margin = round(1.0 - used + 0.05, 3)            # leaves less than the plan needs
    tight = estimate_request("llama3-8b", "dgx-h100", 1, None, job={"memory_margin": margin}, strategy=STRATEGY)
    assert not tight.estimate.feasible
    assert tight.estimate.capacity_gib == pytest.approx(80.0 * (1.0 - margin))
    assert "margin" in tight.estimate.reasons[0]
    # the margin changes the verdict only, never the price
    assert tight.estimate.tokens_per_s == bare.estimate.tokens_per_s
    assert tight.estimate.memory_gib.total == bare.estimate.memory_gib.total


@pytest.mark.parametrize("margin", [0.1, 0.25])
def test_recommended_plans_leave_the_margin_free(margin):
    i = resolve_inputs("llama3-70b", "dgx-h100", devices=32, memory_margin=margin)
    plans = recommend(i.model, i.hardware, i.cluster, i.job, pins=Pins(), top_k=5).plans
    assert plans and all(p.prediction["memory_gib"]["total"] <= 80.0 * (1.0 - margin) for p in plans)
    bare = resolve_inputs("llama3-70b", "dgx-h100", devices=32)
    best = recommend(bare.model, bare.hardware, bare.cluster, bare.job, pins=Pins(), top_k=1).plans[0]
    assert best.prediction["memory_gib"]["total"] > 80.0 * 0.9     # without it the #1 fills the device


def test_the_margin_is_kept_in_the_plan_and_refused_out_of_range(tmp_path):
    out = tmp_path / "plan.json"
    r = subprocess.run([sys.executable, "-m", "advisor", "recommend", "--model", "llama3-8b", "--hardware", "dgx-h100",
                        "--nodes", "1", "--top", "1", "--memory-margin", "0.2", "--out", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    plan = json.loads(out.read_text())
    assert plan["training"]["memory_margin"] == 0.2 and plan["prediction"]["memory_gib"]["total"] <= 64.0
    with pytest.raises(AdvisorError, match="--memory-margin"):
        resolve_inputs("llama3-8b", "dgx-h100", devices=8, memory_margin=0.95)
