"""The MindSpore exports checked with MindSpore's own code (issue 13: "checked with MindSpore's own
loader where it installs on CPU").

MindSpore installs on this platform's CPU, but it needs a newer protobuf than OR-Tools takes, so it
lives in an environment of its own: .ci/run makes one and names its interpreter in
ADVISOR_MINDSPORE_PYTHON (or this interpreter, where it has MindSpore). tests/_mindspore_check.py
runs there on the exported folders: MindSpore's strategy-file loader and its checkpoint slicing on
every parameter layout, every shard() of operator_strategies.py, the AutoParallel wrapper with the
strategy file, set_auto_parallel_context with the exported keywords, and the host embedding's
Primitive.set_device / optimizer target on a small cell.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from advisor.export import export_plan
from advisor.plan import load_plan

ROOT = Path(__file__).resolve().parents[1]
MS_PYTHON = os.environ.get("ADVISOR_MINDSPORE_PYTHON") or (
    sys.executable if importlib.util.find_spec("mindspore") is not None else None)
pytestmark = pytest.mark.skipif(MS_PYTHON is None, reason="no interpreter with MindSpore (.ci/run makes one)")

PLANS = {
    # operator-level strategies (strategy_ckpt.json, operator_strategies.py): D-Rec around a user's
    # 2 x 4 cut of the first MLP GEMM, so that layouts cut weights over a 2 x 4 device matrix
    "operators": ["--model", "gpt3-1.3b", "--devices", "8", "--searcher", "drec", "--operator-strategies", "FC1"],
    # the word embedding on the host (host_embedding.py)
    "host": ["--model", "llama3-8b", "--devices", "8", "--gbs", "64", "--seq-len", "4096", "--zero", "1",
             "--recompute", "none", "--dp", "8", "--host-embedding"],
    # pipeline stages with interleaving and the optimizer sharded (parallel_context.py's pipeline keys)
    "pipeline": ["--model", "llama2-7b", "--devices", "16", "--gbs", "64", "--seq-len", "4096", "--pp", "2",
                 "--vpp", "2", "--zero", "1", "--tp", "2"],
    # a hybrid parameter-server plan (ps_context.py)
    "ps": ["--model", "wide-deep-criteo", "--devices", "2", "--ps-mode", "hybrid", "--ps-servers", "2"],
}


FC1 = '{"layer.fc1": [[2, 1, 1], [1, 4], [4]]}'


def _export(tmp_path: Path, name: str, args: list[str]) -> Path:
    plan = tmp_path / f"{name}.json"
    if "FC1" in args:
        (tmp_path / "fc1.json").write_text(FC1)
        args = [str(tmp_path / "fc1.json") if a == "FC1" else a for a in args]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "advisor", "recommend", "--hardware", "ascend-910b",
                           # the plans MindSpore parses, fitted on the point figure (not the memory band's margin)
                           *([] if "--ps-mode" in args else ["--framework", "mindspore", "--memory-margin", "0"]),
                           "--out", str(plan), *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    out = tmp_path / name
    out.mkdir()
    for file, text in export_plan(load_plan(str(plan)), "mindspore").files.items():
        (out / file).write_text(text)
    return out


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mindspore-exports")
    folders = {name: _export(tmp, name, args) for name, args in PLANS.items()}
    report = {}
    for name, folder in folders.items():       # one process each: MindSpore's contexts are global
        done = subprocess.run([MS_PYTHON, "-E", str(ROOT / "tests" / "_mindspore_check.py"), str(folder)],
                              capture_output=True, text=True, timeout=600, cwd=folder)   # its logs stay out of the checkout
        line = next((x for x in done.stdout.splitlines() if x.startswith("MINDSPORE-CHECK ")), None)
        assert line is not None, (done.stdout + done.stderr)[-3000:]
        report[name] = json.loads(line[len("MINDSPORE-CHECK "):])[str(folder)]
    return report, folders


def test_mindspores_loader_reads_the_strategy_file_and_slices_every_layout(checked):
    report, folders = checked
    strategy = report["operators"]["strategy_ckpt.json"]
    written = json.loads((folders["operators"] / "strategy_ckpt.json").read_text())["parallel_layout_item"]
    assert "error" not in strategy, strategy
    assert strategy["parameters"] == strategy["loaded"] == len(written) > 100
    assert strategy["cut"] >= 24        # the MLP weights of every layer, at least
    assert strategy["problems"] == []


def test_a_layout_that_disagrees_with_its_operator_is_caught(checked, tmp_path):
    """The same file with one weight stored cut along its other dimension: MindSpore reads it, and
    the check finds that the operator reading it cuts that input otherwise."""
    import shutil

    _, folders = checked
    broken = tmp_path / "broken"
    shutil.copytree(folders["operators"], broken)
    path = broken / "strategy_ckpt.json"
    data = json.loads(path.read_text())
    name, item = next((k, v) for k, v in data["parallel_layout_item"].items() if any(m != -1 for m in v["tensor_map"]))
    item["tensor_map"] = item["tensor_map"][::-1]
    path.write_text(json.dumps(data))
    done = subprocess.run([MS_PYTHON, "-E", str(ROOT / "tests" / "_mindspore_check.py"), str(broken)],
                          capture_output=True, text=True, timeout=600, cwd=broken)
    line = next(x for x in done.stdout.splitlines() if x.startswith("MINDSPORE-CHECK "))
    problems = json.loads(line[len("MINDSPORE-CHECK "):])[str(broken)]["strategy_ckpt.json"]["problems"]
    assert any(p.startswith(f"{name}: stored cut") for p in problems), problems


def test_every_shard_and_the_auto_parallel_wrapper_are_accepted(checked):
    """MindSpore's shard() on CPU checks each strategy's form; AutoParallel takes the cell and the
    strategy file's path (it reads the file when it compiles, which needs devices)."""
    report, folders = checked
    ops = report["operators"]["operator_strategies.py"]
    assert "error" not in ops, ops
    assert ops["primitives"] == ops["with_strategy"] > ops["operators"] > 10
    assert ops["auto_parallel"] == "AutoParallel"
    assert ops["strategy_file"] == str(folders["operators"] / "strategy_ckpt.json")


def test_set_auto_parallel_context_takes_the_exported_keywords(checked):
    report, _ = checked
    for name, devices, stages in (("operators", 8, 1), ("host", 8, 1), ("pipeline", 16, 2)):
        ctx = report[name]["parallel_context.py"]
        assert "error" not in ctx, (name, ctx)
        assert (ctx["device_num"], ctx["pipeline_stages"]) == (devices, stages), name


def test_the_host_embedding_runs_its_lookup_and_optimizer_on_the_cpu(checked):
    report, _ = checked
    host = report["host"]["host_embedding.py"]
    assert "error" not in host, host
    assert host["host"] == ["tok_embeddings.embedding_weight"]
    assert host["device"] == ["head.bias", "head.weight"]
    assert host["gather_target"] == "CPU"
    assert "host_embedding.py" not in report["pipeline"]


def test_the_parameter_server_context_and_the_mindspore_versions_that_have_it(checked):
    """set_ps_context takes effect; place_on_servers marks the server tensors where MindSpore still has
    set_param_ps (2.7 and older) and otherwise stops with a sentence that names the version."""
    report, _ = checked
    ps = report["ps"]["ps_context.py"]
    assert "error" not in ps, ps
    assert ps["enable_ps"] is True
    if ps["has_set_param_ps"]:
        assert ps["placed"] is True
    else:
        assert ps["placed"] is False and "needs MindSpore 2.7 or older" in ps["refusal"]
