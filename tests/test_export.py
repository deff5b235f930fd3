"""The export registry and `advisor export` end to end (run as a subprocess, as users run it).

Per-target vocabulary checks are in tests/test_export_<target>.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from _export_plans import REFUSED, plans
from advisor.errors import AdvisorError
from advisor.export import TARGETS, ExportResult, export_plan, write_export
from advisor.plan import save_plan

ROOT = Path(__file__).resolve().parents[1]


def advisor(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "advisor", *args], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=120)


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("plans") / "plan.json"
    save_plan(plans()["gpt3_gpipe_fp16"], path)
    return path


def test_every_target_exports_every_plan():
    for name, plan in plans().items():
        for target in TARGETS:
            if (name, target) in REFUSED:
                with pytest.raises(AdvisorError, match=REFUSED[name, target]):
                    export_plan(plan, target)
                continue
            result = export_plan(plan, target)
            assert isinstance(result, ExportResult) and result.target == target
            assert result.files and all(body.strip() for body in result.files.values()), (name, target)
            assert all(isinstance(u, str) and u for u in result.unsupported)


def test_unsupported_features_name_the_plan_field():
    for name, plan in plans().items():
        for target in TARGETS:
            if (name, target) in REFUSED:
                continue
            for item in export_plan(plan, target).unsupported:
                assert item.split(" ", 1)[0].split(".")[0] in ("parallel", "training", "cluster"), item


def test_operator_strategies_are_reported():
    from dataclasses import replace

    plan = replace(plans()["llama8b_dp_drec"], operator_strategies={"layers.0.attention.wq": [[1, 8], [8, 1]]})
    for target in TARGETS:
        assert any(u.startswith("operator_strategies") for u in export_plan(plan, target).unsupported), target


def test_unknown_target_names_the_flag():
    with pytest.raises(AdvisorError, match="--to: unknown export target 'slurm'"):
        export_plan(plans()["llama8b_dp_drec"], "slurm")


def test_write_export_file_and_folder(tmp_path):
    one = export_plan(plans()["llama8b_dp_drec"], "torchtitan")
    assert write_export(one, tmp_path / "t.toml") == [tmp_path / "t.toml"]
    assert write_export(one, tmp_path) == [tmp_path / "torchtitan.toml"]          # an existing folder
    many = export_plan(plans()["llama8b_dp_drec"], "deepspeed")
    written = write_export(many, tmp_path / "ds")
    assert sorted(p.name for p in written) == sorted(many.files)
    with pytest.raises(AdvisorError, match="--out"):
        write_export(many, tmp_path / "t.toml")                                   # a file, but several outputs


def test_cli_refuses_what_the_target_cannot_run_and_lossy_warns(plan_file):
    r = advisor("export", str(plan_file), "--to", "megatron")      # a GPipe plan: Megatron-LM has no GPipe
    assert r.returncode == 2 and r.stdout == "", r.stdout
    assert ("--to megatron cannot launch this plan as priced: parallel.pipeline_schedule: the framework does not "
            "run this pipeline schedule (megatron runs 1f1b, interleaved-1f1b; schedule = gpipe, pp = 8)") in r.stderr
    r = advisor("export", str(plan_file), "--to", "megatron", "--lossy")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("#!/usr/bin/env bash") and "--pipeline-model-parallel-size 8" in r.stdout
    assert "warning: megatron cannot express parallel.pipeline_schedule = gpipe" in r.stderr


def test_cli_out_and_json(plan_file, tmp_path):
    r = advisor("export", str(plan_file), "--to", "mindspore", "--out", str(tmp_path / "ms"))
    assert r.returncode == 2 and "priced for Megatron-LM" in r.stderr and not (tmp_path / "ms").exists()
    r = advisor("export", str(plan_file), "--to", "mindspore", "--out", str(tmp_path / "ms"), "--lossy")
    assert r.returncode == 0, r.stderr
    assert {p.name for p in (tmp_path / "ms").iterdir()} == {   # the gpt3 plan runs on Ascend: rank table too
        "parallel_context.py", "mindformers_parallel.yaml", "launch_msrun.sh", "launch_dynamic_scheduler.sh",
        "launch_dynamic_worker.sh", "launch_mpirun.sh", "hostfile", "rank_table.json", "launch_rank_table.sh"}
    assert "note: rank_table.json: server_id and device_ip values are placeholders" in r.stderr
    r = advisor("export", str(plan_file), "--to", "k8s", "--json", "--lossy")   # the plan's framework: Megatron-LM
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["target"] == "k8s" and "pytorchjob.yaml" in doc["files"] and doc["unsupported"]
    assert any("does not run on this device" in n for n in doc["notes"])     # NVIDIA's image, Ascend devices
    r = advisor("export", str(plan_file), "--to", "k8s", "--framework", "mindspore", "--json", "--lossy")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert "msjob.yaml" in doc["files"] and doc["unsupported"][0].startswith("training.framework = megatron")


def test_cli_bad_input_exit_2(plan_file, tmp_path):
    for args, needle in (([str(plan_file), "--to", "slurm"], "--to"),
                         ([str(tmp_path / "missing.json"), "--to", "k8s"], "missing.json")):
        r = advisor("export", *args)
        assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr, r.stderr
    bad = tmp_path / "bad.json"
    data = json.loads(plan_file.read_text())
    data["parallel"]["tp"] = 3
    bad.write_text(json.dumps(data))
    r = advisor("export", str(bad), "--to", "deepspeed")
    assert r.returncode == 2 and "tp" in r.stderr and "Traceback" not in r.stderr
