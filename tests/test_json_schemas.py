"""Every --json output and the plan file match their JSON Schema (advisor/schemas/*.schema.json).

The commands run in this process (tests/_cli.py), as a user runs them; each recommend runs once per
module (the plans it saves feed estimate --plan and export). plan.schema.json is generated from the
settings' records (advisor.schemas.generate): a test checks the file is what the generator writes now.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from _cli import run_cli

pytest.importorskip("jsonschema")

from advisor.errors import AdvisorError  # noqa: E402
from advisor.schemas import SUFFIX, load_schema, schema_id, schema_names, validate  # noqa: E402

SCHEMAS = Path(__file__).resolve().parents[1] / "advisor" / "schemas"

RECOMMEND = {
    "transformer": ("--model", "llama3-8b", "--hardware", "dgx-h100", "--nodes", "1"),
    "recommendation": ("--model", "wide-deep-criteo", "--hardware", "dgx-a100-80g", "--nodes", "1"),
    "supernet": ("--model", "hat-supernet", "--hardware", "dgx-a100-80g", "--devices", "4", "--pp", "4"),
    "mixed": ("--model", "llama3-8b", "--hardware", "dgx-a100-80g:1,dgx-h100:1"),
}
EXPORT_TARGETS = ("megatron", "deepspeed", "torchtitan", "mindspore", "k8s")


class _Captured:
    """What run_cli reads from capsys, for a run outside a test function (a module-scoped fixture)."""

    def __init__(self) -> None:
        self.out, self.err = io.StringIO(), io.StringIO()

    def readouterr(self) -> SimpleNamespace:
        done = SimpleNamespace(out=self.out.getvalue(), err=self.err.getvalue())
        for stream in (self.out, self.err):
            stream.seek(0)
            stream.truncate()
        return done


def _run_once(*args: str) -> tuple[int, str, str]:
    captured = _Captured()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(captured.out), \
            contextlib.redirect_stderr(captured.err):
        return run_cli(mp, captured, *args)


@pytest.fixture(scope="module")
def recommended(tmp_path_factory):
    """family -> (recommend --json's document, the path of the plan --out saved); each run once, when first asked."""
    folder = tmp_path_factory.mktemp("plans")
    done: dict[str, tuple[dict, Path]] = {}

    def get(family: str) -> tuple[dict, Path]:
        if family not in done:
            out = folder / f"{family}.json"
            code, text, err = _run_once("recommend", *RECOMMEND[family], "--json", "--out", str(out))
            assert code == 0, f"recommend {family}: exit {code}: {err}"
            done[family] = (json.loads(text), out)
        return done[family]

    return get


def _json(monkeypatch, capsys, *args: str) -> dict:
    code, out, err = run_cli(monkeypatch, capsys, *args)
    assert code == 0, f"advisor {' '.join(args)}: exit {code}: {err}"
    return json.loads(out)


# ---- the schemas themselves --------------------------------------------------------------------------
def test_every_schema_is_a_valid_draft_2020_12_schema_with_its_id():
    from jsonschema import Draft202012Validator

    names = schema_names()
    assert {"plan", "recommend", "estimate", "whatif", "export", "list"} <= set(names)
    for name in names:
        schema = load_schema(name)
        Draft202012Validator.check_schema(schema)
        assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
        assert schema["$id"] == schema_id(name) == f"https://advisor.invalid/schemas/{name}{SUFFIX}"
        assert schema.get("title") and schema.get("description")


def test_plan_schema_is_what_the_generator_writes_now():
    from advisor.schemas.generate import SCHEMA_FILE, render

    assert SCHEMA_FILE == SCHEMAS / "plan.schema.json"
    assert SCHEMA_FILE.read_text(encoding="utf-8") == render(), \
        "advisor/schemas/plan.schema.json is out of date with the settings' records: run python -m advisor.schemas.generate"


def test_plan_blocks_have_one_property_per_setting_with_its_doc():
    from advisor.plan import _PARALLEL_EXTRA
    from advisor.plan_codec import block_keys
    from advisor.space.strategy import Strategy
    from advisor.specs.job import TrainingJob
    from advisor.specs.setting import settings_of

    defs = load_schema("plan")["$defs"]
    for cls, block, extra in ((TrainingJob, "training", ("target",)), (Strategy, "parallel", _PARALLEL_EXTRA)):
        required, optional = block_keys(cls)
        schema = defs[block]
        assert schema["additionalProperties"] is False
        assert schema["required"] == list(required)
        assert set(schema["properties"]) == {*required, *optional, *extra}
        for fl, s in settings_of(cls):
            if fl.name in schema["properties"]:
                assert schema["properties"][fl.name]["description"] == " ".join(s.doc.split())


def test_unknown_schema_name_is_refused():
    with pytest.raises(AdvisorError, match="no JSON schema named"):
        load_schema("nonesuch")
    with pytest.raises(AdvisorError, match="no JSON schema named"):
        load_schema("../plan")


def test_importing_advisor_does_not_import_jsonschema():
    code = ("import sys, advisor, advisor.schemas, advisor.plan, advisor.cli; "
            "sys.exit(1 if 'jsonschema' in sys.modules else 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr or "advisor imported jsonschema"


# ---- list ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("what", ["models", "hardware"])
def test_list_json(monkeypatch, capsys, what):
    doc = _json(monkeypatch, capsys, "list", what, "--json")
    assert doc[what]
    validate(doc, "list")


# ---- recommend and its plans ---------------------------------------------------------------------------
@pytest.mark.parametrize("family", list(RECOMMEND))
def test_recommend_json(recommended, family):
    doc, _ = recommended(family)
    validate(doc, "recommend")


@pytest.mark.parametrize("family", list(RECOMMEND))
def test_saved_plan(recommended, family):
    doc, path = recommended(family)
    plan = json.loads(path.read_text(encoding="utf-8"))
    assert plan == doc["plans"][0]
    validate(plan, "plan")


def test_plan_schema_refuses_a_bad_dtype_and_an_unknown_parallel_key(recommended):
    _, path = recommended("transformer")
    plan = json.loads(path.read_text(encoding="utf-8"))
    bad = copy.deepcopy(plan)
    bad["training"]["dtype"] = "fp7"
    with pytest.raises(AdvisorError, match=r"\$\.training\.dtype: 'fp7' is not one of") as caught:
        validate(bad, "plan")
    assert "\n" not in str(caught.value)
    bad = copy.deepcopy(plan)
    bad["parallel"]["warp_speed"] = 9
    with pytest.raises(AdvisorError, match=r"\$\.parallel: .*'warp_speed' was unexpected"):
        validate(bad, "plan")
    # the recommend document holding such a plan fails too, at the plan's path
    with pytest.raises(AdvisorError, match=r"\$\.plans\[0\]\.parallel"):
        validate({"plans": [bad], "search": {"searcher": "enumerate", "seconds": 0.0}}, "recommend")


# ---- estimate ------------------------------------------------------------------------------------------
def test_estimate_json_transformer(monkeypatch, capsys):
    doc = _json(monkeypatch, capsys, "estimate", *RECOMMEND["transformer"], "--tp", "8", "--gbs", "64", "--json")
    validate(doc, "estimate")
    assert "strategy" in doc and "tokens_per_s" in doc


def test_estimate_json_recommendation(monkeypatch, capsys):
    doc = _json(monkeypatch, capsys, "estimate", *RECOMMEND["recommendation"], "--ps-mode", "hybrid", "--json")
    validate(doc, "estimate")
    assert "samples_per_s" in doc


@pytest.mark.parametrize("family", ["supernet", "mixed"])
def test_estimate_json_of_a_saved_plan(monkeypatch, capsys, recommended, family):
    _, path = recommended(family)
    doc = _json(monkeypatch, capsys, "estimate", "--plan", str(path), "--json")
    validate(doc, "estimate")


# ---- export --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("target", EXPORT_TARGETS)
def test_export_json(monkeypatch, capsys, recommended, target):
    _, path = recommended("transformer")      # a Megatron plan: the other targets write it with --lossy only
    doc = _json(monkeypatch, capsys, "export", str(path), "--to", target, "--json", "--lossy")
    validate(doc, "export")
    assert doc["target"] == target


# ---- whatif --------------------------------------------------------------------------------------------
def test_whatif_json(monkeypatch, capsys):
    doc = _json(monkeypatch, capsys, "whatif", "--model", "gpt3-1.3b", "--hardware", "dgx-h100", "--nodes", "1",
                "--workers", "1", "--json")
    assert doc["points"]
    validate(doc, "whatif")


# ---- execute (torch; about 30 s on a 2-core machine) ---------------------------------------------------
@pytest.mark.slow
def test_execute_json(monkeypatch, capsys, tmp_path):
    pytest.importorskip("torch")
    plan = tmp_path / "plan.json"
    code, _, err = run_cli(monkeypatch, capsys, "recommend", "--model", "llama3-8b", "--hardware", "dgx-h100",
                           "--devices", "2", "--tp", "2", "--gbs", "4", "--no-offload", "--memory-margin", "0",
                           "--out", str(plan))   # the plan for the check, not the memory band's
    assert code == 0, err
    doc = _json(monkeypatch, capsys, "execute", str(plan), "--tiny", "--dtype", "fp32", "--steps", "2", "--json")
    validate(doc, "execute")
