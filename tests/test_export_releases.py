"""Every release an export claims (--target-version) is checked by that release's own parser (issue 29).

`.ci/run` installs each claimed DeepSpeed and torchtitan release, beside the newest one, into a folder
of its own under $ADVISOR_RELEASES (`deepspeed-0.15/`, `torchtitan-0.2.1/`, ...). Each export of the
standard plans for that release is parsed in a separate process with that folder first on the path:
DeepSpeed's DeepSpeedConfig (with the plan's data-parallel size) and torchtitan's ConfigManager plus
ParallelDims' degree checks. The release that is installed normally is checked the same way.
A release that is neither installed nor under $ADVISOR_RELEASES is skipped, naming it.

A DeepSpeed claim names a minor release; `.ci/run` checks its newest patch. Where a feature came in a
later patch (AutoTP training in 0.16.4), the export says so in its refusal for 0.15 and in the module
docstring of advisor/export/deepspeed.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from _export_plans import REFUSED, plans
from advisor.errors import AdvisorError
from advisor.export import export_plan, supported_versions

HERE = Path(__file__).resolve().parent
FILES = {"deepspeed": "ds_config.json", "torchtitan": "torchtitan.toml"}


def _claimed(target: str) -> list[str]:
    return list(supported_versions(target)[0])


def _release_path(target: str, claimed: str) -> str | None:
    """'' for the release installed normally, a folder for one under $ADVISOR_RELEASES, None if absent."""
    try:
        installed = metadata.version(target)
    except metadata.PackageNotFoundError:
        installed = None
    if installed is not None and _same_release(installed, claimed):
        return ""
    root = os.environ.get("ADVISOR_RELEASES")
    if root:
        folder = Path(root) / f"{target}-{claimed}"
        if folder.is_dir():
            return str(folder)
    return None


def _same_release(installed: str, claimed: str) -> bool:
    """A claim of a minor release (DeepSpeed '0.16') is met by any of its patches; torchtitan claims exact ones."""
    return installed == claimed or installed.startswith(claimed + ".")


def _parse(target: str, folder: str, cases: list[dict], tmp_path: Path) -> dict:
    manifest = tmp_path / "cases.json"
    manifest.write_text(json.dumps(cases))
    env = dict(os.environ)
    if folder:
        env["PYTHONPATH"] = os.pathsep.join([folder, env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, str(HERE / "_release_parse.py"), target, str(manifest)],
                          capture_output=True, text=True, env=env, timeout=600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT "):])


@pytest.mark.parametrize("target,claimed", [(t, v) for t in FILES for v in _claimed(t)])
def test_each_claimed_release_parses_its_export(target, claimed, tmp_path):
    folder = _release_path(target, claimed)
    if folder is None:
        pytest.skip(f"{target} {claimed} is not installed (.ci/run puts it under $ADVISOR_RELEASES)")
    cases, expected = [], {}
    for name, plan in plans().items():
        if (name, target) in REFUSED:
            continue
        try:
            result = export_plan(plan, target, claimed)
        except AdvisorError:
            continue            # refused by name for this release: nothing is written to parse
        path = tmp_path / f"{name}.{FILES[target].rsplit('.', 1)[1]}"
        path.write_text(result.files[FILES[target]])
        cases.append({"name": name, "path": str(path), "dp": plan.strategy.dp, "world": plan.strategy.devices})
        expected[name] = plan
    assert len(cases) >= 5, f"only {len(cases)} plans export to {target} {claimed}"
    report = _parse(target, folder, cases, tmp_path)
    assert _same_release(report["version"], claimed), (report["version"], claimed, folder)
    errors = {name: got["error"] for name, got in report["cases"].items() if got["error"]}
    assert not errors, f"{target} {report['version']} refuses: {errors}"
    for name, got in report["cases"].items():
        s, job = expected[name].strategy, expected[name].training
        if target == "deepspeed":
            assert got["train_batch_size"] == job.global_batch_size, name
            assert got["micro_batch"] == s.micro_batch_size, name
            assert got["accumulation"] == s.num_micro_batches, name
            assert got["zero_stage"] == s.zero_stage, name
        else:
            assert (got["dp"], got["tp"], got["pp"], got["cp"]) == (s.dp, s.tp, s.pp, s.cp), name
