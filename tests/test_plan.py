"""Plan JSON (advisor/plan.py): exact round trips, and malformed or inconsistent plans refused with
the field named (exit 2 from the command line)."""

from __future__ import annotations

import copy
import json

import pytest

from advisor.errors import AdvisorError
from advisor.commands.inputs import resolve_inputs
from advisor.plan import dumps_plan, load_plan, plan_from_dict, plan_to_dict, save_plan
from advisor.commands.recommend import recommend
from _cli import run_cli as _run_cli


@pytest.fixture(scope="module")
def recommended():
    i = resolve_inputs("llama3-8b", "dgx-a100-80g", nodes=2, global_batch_size=64, train_tokens="1T")
    return recommend(i.model, i.hardware, i.cluster, i.job, top_k=3)


@pytest.fixture()
def plan_dict(recommended):
    return json.loads(dumps_plan(recommended.best))


def test_recommended_plans_round_trip_exactly(recommended):
    for plan in recommended.plans:
        text = dumps_plan(plan)
        again = plan_from_dict(json.loads(text))
        assert dumps_plan(again) == text
        assert again.strategy == plan.strategy


def test_save_then_load_gives_the_same_file(recommended, tmp_path):
    first = tmp_path / "a.json"
    second = tmp_path / "b.json"
    save_plan(recommended.best, first)
    save_plan(load_plan(first), second)
    assert first.read_text() == second.read_text()


def test_plan_carries_prediction_and_search(plan_dict):
    for key in ("step_time_s", "tokens_per_s", "mfu", "tflops_per_device", "memory_gib", "time_s"):
        assert key in plan_dict["prediction"]
    assert set(plan_dict["prediction"]["memory_gib"]) >= {"parameters", "gradients", "optimizer", "activations", "buffers", "total"}
    assert {"searcher", "candidates", "feasible", "seconds"} <= set(plan_dict["search"])
    p = plan_dict["parallel"]
    assert p["dp"] * p["tp"] * p["pp"] * p["cp"] == plan_dict["cluster"]["devices"]
    assert sum(p["stage_layers"]) == plan_dict["model"]["num_layers"]
    assert sorted(p["mesh_order"]) == ["cp", "dp", "pp", "tp"]


def _broken(plan_dict, path, value):
    data = copy.deepcopy(plan_dict)
    node = data
    for key in path[:-1]:
        node = node[key]
    if value is _DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return data


_DELETE = object()


@pytest.mark.parametrize("path, value, named", [
    (("parallel",), _DELETE, "parallel"),
    (("schema_version",), 2, "schema_version"),
    (("parallel", "dp"), "two", "dp"),
    (("parallel", "tp"), 0, "tp"),
    (("parallel", "speed"), 3, "speed"),
    (("parallel", "mesh_order"), ["tp", "tp", "dp", "pp"], "mesh_order"),
    (("parallel", "recompute"), "sometimes", "recompute"),
    (("parallel", "stage_layers"), [1, 2], "stage_layers"),
    (("parallel", "zero_stage"), -1, "zero_stage"),
    (("training", "global_batch_size"), 0, "global_batch_size"),
    (("cluster", "devices"), 10_000, "devices"),
    (("model", "num_attention_heads"), 7, "num_attention_heads"),
    (("hardware", "device"), "fast", "device"),
    (("prediction",), [1, 2], "prediction"),
])
def test_malformed_plans_are_refused_with_the_field_named(plan_dict, path, value, named):
    with pytest.raises(AdvisorError) as err:
        plan_from_dict(_broken(plan_dict, path, value))
    assert named in str(err.value)


def test_inconsistent_degrees_are_refused(plan_dict):
    data = copy.deepcopy(plan_dict)
    data["parallel"]["dp"] *= 2
    with pytest.raises(AdvisorError, match="dp x tp x pp x cp"):
        plan_from_dict(data)


def test_inconsistent_batch_is_refused(plan_dict):
    data = copy.deepcopy(plan_dict)
    data["parallel"]["num_micro_batches"] += 1
    with pytest.raises(AdvisorError, match="global batch"):
        plan_from_dict(data)


def test_cli_refuses_a_bad_plan_with_exit_2(plan_dict, tmp_path, monkeypatch, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(_broken(plan_dict, ("parallel", "tp"), 3)))
    code, _, err = _run_cli(monkeypatch, capsys, "estimate", "--plan", str(bad))
    assert code == 2
    assert "tp" in err and "Traceback" not in err
    junk = tmp_path / "junk.json"
    junk.write_text("{not json")
    code, _, err = _run_cli(monkeypatch, capsys, "estimate", "--plan", str(junk))
    assert code == 2 and "malformed JSON" in err


def test_cli_estimates_a_recommended_plan(recommended, tmp_path, monkeypatch, capsys):
    path = tmp_path / "plan.json"
    save_plan(recommended.best, path)
    code, out, _ = _run_cli(monkeypatch, capsys, "estimate", "--plan", str(path), "--json")
    assert code == 0
    assert json.loads(out)["tokens_per_s"] == pytest.approx(recommended.estimates[0].tokens_per_s, rel=1e-9)


def test_plan_to_dict_is_json_serializable(recommended):
    json.dumps(plan_to_dict(recommended.best))
