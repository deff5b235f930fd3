"""The framework's published recipe beside recommend's #1 (#30): advisor/specs/recipes.yaml, written from the
measured runs by benchmarks/write_recipes.py, priced under the user's job."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from advisor.commands.inputs import resolve_inputs
from advisor.commands.recommend import recommend
from advisor.search import Pins
from advisor.render.report import recipe_line
from advisor.search.recipes import recipe_for

ROOT = Path(__file__).resolve().parents[1]


def test_the_bundled_recipes_are_what_the_measured_runs_give():
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "write_recipes.py"), "--check"], timeout=300)
    assert r.returncode == 0, "run python benchmarks/write_recipes.py"


def test_the_megatron_bridge_recipe_is_priced_beside_the_first_plan():
    i = resolve_inputs("llama3-70b", "dgx-h100", devices=64, dtype="fp8", global_batch_size=256)
    recipe = recipe_for(i.model, i.hardware, i.cluster, i.job)
    assert recipe.entry["run"] == "mbridge-26.02-h100-llama3-70b-fp8"
    assert "Megatron-Bridge" in recipe.entry["source"] and "26.02" in recipe.entry["source"]
    s = recipe.strategy
    assert (s.dp, s.tp, s.pp, s.virtual_pipeline_stages, s.micro_batch_size, s.num_micro_batches) == (2, 4, 8, 5, 1, 128)
    assert recipe.estimate.feasible
    first = recommend(i.model, i.hardware, i.cluster, i.job, pins=Pins(), top_k=1).estimates[0]
    vs = recipe.vs(first)
    assert vs["gain"] == pytest.approx(first.tokens_per_s / recipe.estimate.tokens_per_s - 1.0)
    low = first.band.tokens_per_s(first.tokens_per_s)[0]
    assert vs["inside_band"] == (recipe.estimate.tokens_per_s >= low)
    assert "plan 1 vs recipe" in recipe_line(recipe, first)


def test_no_recipe_where_none_was_published_and_a_batch_it_cannot_split_is_said():
    i = resolve_inputs("llama3-70b", "dgx-h100", devices=48)
    assert recipe_for(i.model, i.hardware, i.cluster, i.job) is None
    i = resolve_inputs("llama3-70b", "dgx-h100", devices=64, global_batch_size=255)
    recipe = recipe_for(i.model, i.hardware, i.cluster, i.job)
    assert recipe.estimate is None and "does not divide the global batch 255" in recipe.why_not


def test_recommend_json_carries_the_recipe():
    r = subprocess.run([sys.executable, "-m", "advisor", "recommend", "--model", "llama3-70b", "--hardware", "dgx-h100",
                        "--nodes", "8", "--dtype", "fp8", "--global-batch", "256", "--top", "1", "--json"],
                       capture_output=True, text=True, timeout=300, check=True)
    recipe = json.loads(r.stdout)["recipe"]
    assert recipe["run"] == "mbridge-26.02-h100-llama3-70b-fp8" and recipe["parallel"]["tp"] == 4
    assert set(recipe["vs_first"]) == {"gain", "inside_band", "differences"}
    assert recipe["published"]["measured_tokens_per_s_per_device"] == 1621
