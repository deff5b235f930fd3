"""The rank starter (advisor.runtime.starter): every rank of a launch forked from one process that imported the
rank's module once, each in a session of its own with its own environment, log and exit code; a starter that
cannot start them is named; a launcher that dies leaves no rank and no temporary folder behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from advisor.runtime.launch import ExecutionFailed, LaunchOptions, launch_module
from _procs import processes_naming

TESTS = str(Path(__file__).resolve().parent)


@pytest.fixture(autouse=True)
def _probe_on_path(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", TESTS + os.pathsep + os.environ.get("PYTHONPATH", ""))


def _ranks(out: Path, n: int) -> list[dict]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(n)]


def test_ranks_are_forked_from_one_starter_that_imported_their_module_once(tmp_path, monkeypatch):
    monkeypatch.setenv("PROBE_SECRET", "s3cret-token")
    launch_module("_rank_probe", ["--code", "0"], tmp_path, LaunchOptions(nproc=3, timeout_s=120))
    ranks = _ranks(tmp_path, 3)
    starter = ranks[0]["ppid"]
    assert [r["rank"] for r in ranks] == [0, 1, 2] and {r["world"] for r in ranks} == {3}
    assert {r["ppid"] for r in ranks} == {starter} and starter != os.getpid()
    assert len({r["pid"] for r in ranks}) == 3
    for r in ranks:
        assert r["sid"] == r["pid"] == r["pgid"]                 # a session (and process group) of its own
        assert r["preloaded_by"] == starter                      # imported once, before the fork
        assert r["parent_env"] == str(starter)                   # the watchdog watches the starter
        assert r["secret"] == "s3cret-token"                     # the user's environment reaches every rank...
        # the rendezvous port is held by the launcher's store for the whole launch, every rank its client: a port
        # found free and released for rank 0 was taken by another process under parallel tests (EADDRINUSE)
        assert r["agent_store"] == "True" and r["port_held"]
        assert r["name"] == "__main__" and r["argv"] == ["--code", "0", "--out-dir", str(tmp_path)]
        assert int((tmp_path / f"rank{r['rank']}.pid").read_text()) == r["pid"]
        assert (tmp_path / f"rank{r['rank']}.exit").read_text() == "0"
        assert (tmp_path / f"rank{r['rank']}.log").read_text() == f"rank {r['rank']} says hello\n"
    assert "s3cret" not in (tmp_path / "starter.json").read_text()     # ...but is never written to a file
    assert processes_naming(str(tmp_path)) == []


def test_a_ranks_exit_code_reaches_the_launcher(tmp_path):
    with pytest.raises(ExecutionFailed, match="rank 1 exited with code 7") as err:
        launch_module("_rank_probe", ["--code", "7"], tmp_path, LaunchOptions(nproc=2, timeout_s=120, grace_s=30))
    assert err.value.rank == 1 and err.value.exit_codes[1] == 7
    assert processes_naming(str(tmp_path)) == []


def test_a_starter_that_cannot_import_the_module_is_named_with_its_error(tmp_path):
    with pytest.raises(ExecutionFailed, match="the process starting the ranks exited with code 1") as err:
        launch_module("_no_such_rank_module", [], tmp_path, LaunchOptions(nproc=2, timeout_s=120))
    assert "No module named '_no_such_rank_module'" in str(err.value)
    assert processes_naming(str(tmp_path)) == []



def test_a_deadline_that_passes_while_the_starter_imports_is_named_as_the_deadline(tmp_path, monkeypatch):
    """A starter still importing the rank's module when the launch's deadline passes (PyTorch's import took longer
    than a 3 s test deadline under load) is stopped by the launcher: the deadline is the error, not the starter's
    exit by the launcher's own SIGTERM."""
    monkeypatch.setenv("PROBE_PRELOAD_SLEEP_S", "30")
    with pytest.raises(ExecutionFailed, match="did not finish within 1 s") as err:
        launch_module("_rank_probe", ["--code", "0"], tmp_path, LaunchOptions(nproc=2, timeout_s=1))
    assert "the process starting the ranks" not in str(err.value)
    assert err.value.timed_out and err.value.exit_codes == {}
    assert processes_naming(str(tmp_path)) == []

LAUNCHER = """
import sys
from advisor.runtime.files import temporary_folder
from advisor.runtime.launch import LaunchOptions, launch_module
with temporary_folder("advisor-starter-test-") as out:
    print(out, flush=True)
    launch_module("_rank_probe", ["--wait"], out, LaunchOptions(nproc=2, timeout_s=600), temporary=True)
"""


def test_a_killed_launcher_leaves_no_rank_and_no_temporary_folder(tmp_path):
    """SIGKILL leaves the launcher no chance to stop anything: the starter sees it gone, stops the ranks and
    removes the launch's temporary folder."""
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER], stdout=subprocess.PIPE, text=True, env=env)
    try:
        out = Path(launcher.stdout.readline().strip())
        end = time.monotonic() + 120
        while not all((out / f"rank{r}.json").exists() for r in range(2)):   # both ranks are up
            assert time.monotonic() < end and launcher.poll() is None
            time.sleep(0.05)
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
        end = time.monotonic() + 120
        while (out.exists() or processes_naming(str(out))) and time.monotonic() < end:
            time.sleep(0.05)
    finally:
        if launcher.poll() is None:
            launcher.kill()
        launcher.stdout.close()
    assert not out.exists()
    assert processes_naming(str(out)) == []


def test_a_rank_that_builds_an_optimizer_imports_nothing_its_starter_did_not():
    """The parameter-server roles and the calibration probes preload TORCH_PRELOAD, and it holds what the first
    optimizer step imports (torch._dynamo and torch._inductor, about 1 s of CPU per rank otherwise): in a fresh
    interpreter that imported only TORCH_PRELOAD, the executor's AdamW (as the calibration probe builds it)
    imports no module of torch._dynamo or torch._inductor."""
    pytest.importorskip("torch")
    import importlib

    from advisor.runtime.rank import TORCH_PRELOAD

    for module in ("advisor.executor.ps.node", "advisor.calibrate"):
        assert set(TORCH_PRELOAD) <= set(importlib.import_module(module).PRELOAD), module
    code = (
        "import importlib, json, sys\n"
        "from advisor.runtime.rank import TORCH_PRELOAD\n"
        "for name in TORCH_PRELOAD: importlib.import_module(name)\n"
        "import torch\n"
        "from advisor.executor.parallel import make_torch_optimizer\n"
        "before = set(sys.modules)\n"
        "p = torch.nn.Parameter(torch.ones(4)); p.grad = torch.ones(4)\n"
        "make_torch_optimizer('adamw', 1e-3)([p]).step()\n"
        "print(json.dumps(sorted(set(sys.modules) - before)))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    new = json.loads(out.stdout.strip().splitlines()[-1])
    assert [m for m in new if m.startswith(("torch._dynamo", "torch._inductor"))] == []
