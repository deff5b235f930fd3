"""Signals, temporary folders, refusals before launch, atomic writes (issue 12).

Processes are signalled only once they have reached a known point (no sleeps): the command has
installed its handlers (SIGTERM shows in /proc/PID/status SigCgt only then), and for execute and
calibrate every rank has joined its process group (its rank<R>.ready file exists).
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from advisor.errors import AdvisorError, InfeasibleError
from advisor.runtime.capacity import RANK_FOOTPRINT_BYTES, RANKS_PER_CORE, Machine, capacity_problems
from advisor.runtime.files import json_text, write_atomic, write_json
from _procs import processes_naming
from _cli import cli_exit_code as _cli

ROOT = Path(__file__).resolve().parents[1]
GIB = 2 ** 30
WAIT_S = 240          # how long a test waits for a process to reach a point before giving up


def _env(**extra) -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), **extra)


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def _tiny_plan_file(tmp_path: Path, parallel: dict | None = None) -> Path:
    pytest.importorskip("torch")
    from advisor.executor.matrix import tiny_plan

    plan = tiny_plan(parallel or dict(dp=2))
    plan["cluster"]["nodes"] = -(-plan["cluster"]["devices"] // 8)       # 8 devices per node of the profile
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    return path


def _wait_until(predicate, proc: subprocess.Popen, what: str) -> None:
    end = time.monotonic() + WAIT_S
    while not predicate():
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the command ended (rc {proc.returncode}) before {what}: {err[-2000:]}")
        if time.monotonic() > end:
            proc.kill()
            pytest.fail(f"gave up waiting for {what}")
        time.sleep(0.02)


def _handles_sigterm(pid: int) -> bool:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signal.SIGTERM - 1) & 1)
    return False


def _ranks_ready(scratch: Path, prefix: str, nproc: int) -> bool:
    return any(all((d / f"rank{r}.ready").exists() for r in range(nproc)) for d in scratch.glob(prefix + "*"))


def _ours(scratch: Path) -> list[str]:
    """advisor's temporary folders left in TMPDIR (torch keeps caches of its own there)."""
    return [p.name for p in scratch.iterdir() if p.name.startswith("advisor-")]


# ---- refused before anything starts ---------------------------------------------------------------
@pytest.mark.parametrize("argv, words", [
    (["execute", "PLAN", "--backend", "mpi"], "--backend must be one of auto, gloo, nccl"),
    (["execute", "PLAN", "--timeout", "0"], "--timeout must be a positive number"),
    (["execute", "PLAN", "--timeout", "-5"], "--timeout must be a positive number"),
    (["execute", "PLAN", "--timeout", "inf"], "--timeout must be a positive number"),
    (["execute", "PLAN", "--nproc", "0"], "--nproc must be at least 1"),
    (["calibrate", "--nproc", "0"], "--nproc must be at least 2"),
    (["calibrate", "--backend", "mpi"], "--backend must be auto, gloo or nccl"),
])
def test_bad_options_are_refused_before_any_process_starts(tmp_path, monkeypatch, capsys, argv, words):
    plan = _tiny_plan_file(tmp_path)

    def no_process(*args, **kwargs):
        raise AssertionError("a process was started")
    monkeypatch.setattr(subprocess, "Popen", no_process)
    assert _cli(monkeypatch, *[str(plan) if a == "PLAN" else a for a in argv]) == 2
    err = capsys.readouterr().err
    assert words in err and len(_lines(err)) == 1 and "Traceback" not in err


def test_more_ranks_than_cores_or_memory_are_refused_with_the_numbers():
    two_cores = Machine(cores=2, available_bytes=24 * GIB)
    assert capacity_problems(2 * RANKS_PER_CORE, machine=two_cores) == []       # the executor matrix: 8 on 2
    [cores] = capacity_problems(2 * RANKS_PER_CORE + 1, machine=two_cores)
    assert "9 ranks on 2 cores" in cores and "--oversubscribe" in cores
    assert capacity_problems(9, oversubscribe=True, machine=two_cores) == []
    small = Machine(cores=64, available_bytes=1 * GIB)            # 8 x 146 MiB > 80% of 1 GiB
    [memory] = capacity_problems(8, machine=small)
    assert f"8 ranks x ({RANK_FOOTPRINT_BYTES / 2 ** 20:.0f} MiB of Python and torch)" in memory
    assert "1.0 GiB is available" in memory
    [model] = capacity_problems(2, 2 * GIB, machine=Machine(64, 4 * GIB), hint="; use --tiny")
    assert "2 ranks x (146 MiB of Python and torch + 2.00 GiB of model)" in model and model.endswith("use --tiny")
    assert capacity_problems(512, processes=False, machine=small) == []   # --results: nothing starts here


def test_execute_refuses_a_plan_with_more_ranks_than_this_machine_holds(tmp_path, monkeypatch, capsys):
    import advisor.runtime.capacity as capacity

    monkeypatch.setattr(capacity, "this_machine", lambda: Machine(cores=2, available_bytes=24 * GIB))
    plan = _tiny_plan_file(tmp_path, dict(dp=16))
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail("a process was started"))
    assert _cli(monkeypatch, "execute", str(plan)) == InfeasibleError.exit_code
    err = capsys.readouterr().err
    assert "refused before starting any process: 16 ranks on 2 cores" in err and len(_lines(err)) == 1


# ---- one sentence, exit 2 --------------------------------------------------------------------------
def test_no_arguments_is_one_sentence_and_exit_2():
    proc = subprocess.run([sys.executable, "-m", "advisor"], capture_output=True, text=True, env=_env(), timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert _lines(proc.stderr) == ["error: no command given; run 'advisor --help' to see the commands"]


@pytest.mark.parametrize("content", [None, "not json {", "[1, 2]", '{"world_size": 2}',
                                     '{"backend": "gloo", "world_size": 2, "configs": [{}], "ranks": [[], []]}'])
def test_execute_results_on_a_folder_that_is_not_a_results_folder(tmp_path, monkeypatch, capsys, content):
    plan = _tiny_plan_file(tmp_path)
    folder = tmp_path / "run"
    folder.mkdir()
    if content is not None:
        (folder / "results.json").write_text(content)
    assert _cli(monkeypatch, "execute", str(plan), "--results", str(folder)) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --results: ") and len(_lines(err)) == 1 and "Traceback" not in err


# ---- atomic writes ---------------------------------------------------------------------------------
WRITERS = r"""
import json, resource, sys
from pathlib import Path
from advisor.errors import AdvisorError
folder = Path(sys.argv[1])
big = {"name": "x" * 4096, "notes": [], "figures": list(range(2000))}

def plan():
    from advisor.commands.inputs import resolve_inputs
    from advisor.plan import save_plan
    from advisor.commands.recommend import recommend
    i = resolve_inputs("gpt3-1.3b", "dgx-a100-80g", nodes=1)
    best = recommend(i.model, i.hardware, i.cluster, i.job, top_k=1).best
    return lambda path: save_plan(best, path), best

save, best = plan()
from advisor.validation.execute_report import write_report
from advisor.export import export_plan, write_export
from advisor.runtime.files import write_json
writers = {
    "plan.json": save,
    "report.json": lambda path: write_report(big, path),
    "export.sh": lambda path: write_export(export_plan(best, "megatron"), path),
    "data.json": lambda path: write_json(path, big),
}
for name in writers:
    (folder / name).write_text("previous\n")
resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))     # any file over 1 KiB fails: EFBIG
out = {}
for name, write in writers.items():
    try:
        write(folder / name)
        out[name] = "written"
    except AdvisorError as exc:
        out[name] = str(exc)
print(json.dumps(out))
"""


def test_a_failed_write_leaves_the_previous_file_and_says_so(tmp_path):
    proc = subprocess.run([sys.executable, "-c", WRITERS, str(tmp_path)], capture_output=True, text=True, env=_env(),
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name, message in json.loads(proc.stdout).items():
        assert "cannot write" in message and f"{tmp_path / name} is left as it was" in message, (name, message)
        assert (tmp_path / name).read_text() == "previous\n", name
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.json", "export.sh", "plan.json", "report.json"]


def test_recommend_out_over_a_file_size_limit_is_one_sentence_and_exit_2(tmp_path):
    out = tmp_path / "plan.json"
    out.write_text("previous\n")

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))
    proc = subprocess.run([sys.executable, "-m", "advisor", "recommend", "--model", "gpt3-1.3b", "--hardware",
                           "dgx-a100-80g", "--nodes", "1", "--top", "1", "--out", str(out)], capture_output=True,
                          text=True, env=_env(), timeout=120, preexec_fn=limit)
    assert proc.returncode == 2
    [line] = _lines(proc.stderr)
    assert line.startswith("error: cannot write the plan to") and line.endswith(f"{out} is left as it was")
    assert out.read_text() == "previous\n" and [p.name for p in tmp_path.iterdir()] == ["plan.json"]


def test_atomic_write_keeps_the_mode_and_replaces_whole(tmp_path):
    path = tmp_path / "f.json"
    path.write_text("old")
    path.chmod(0o640)
    write_json(path, {"a": 1})
    assert json.loads(path.read_text()) == {"a": 1} and path.stat().st_mode & 0o777 == 0o640
    write_atomic(tmp_path / "g.bin", lambda fh: fh.write(b"\x00\x01"))
    assert (tmp_path / "g.bin").read_bytes() == b"\x00\x01"
    with pytest.raises(AdvisorError, match="folder .* does not exist"):
        write_atomic(tmp_path / "missing" / "x", "y")


def test_json_is_never_infinite_or_nan(monkeypatch, capsys):
    from advisor.cli import print_json
    from advisor.validation.execute_report import json_ready

    with pytest.raises(AdvisorError, match="non-finite"):
        json_text({"a": float("inf")})
    with pytest.raises(AdvisorError, match="non-finite"):
        print_json({"a": float("nan")})
    ready = json_ready({"loss": [1.0, float("nan")], "rel": float("inf"), "notes": []})
    assert ready["loss"] == [1.0, None] and ready["rel"] is None and "2 figure(s)" in ready["notes"][0]


# ---- signals ---------------------------------------------------------------------------------------
def test_ctrl_c_during_a_whatif_sweep_exits_130_with_one_line():
    """SIGINT to the whole process group, as a terminal's Ctrl-C: the sweep's worker processes get
    it too and must stay quiet."""
    cmd = [sys.executable, "-m", "advisor", "whatif", "--model", "llama3-405b", "--hardware",
           "dgx-h100,dgx-a100-80g,dgx-b200,dgx-h200", "--nodes", "8,16,32,64,128,256", "--seq-len", "4096,8192",
           "--workers", "2", "--json"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
                            start_new_session=True)
    _wait_until(lambda: _handles_sigterm(proc.pid), proc, "the command installed its handlers")
    _wait_until(lambda: bool(_children(proc.pid)), proc, "the sweep's workers started")
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=WAIT_S)
    assert proc.returncode == 130 and out == ""
    assert _lines(err) == ["advisor: interrupted"]


def test_an_interrupt_that_python_had_to_drop_is_sent_again(capsys):
    """A signal handled inside a finalizer (or an at-fork hook, as logging's in every fork) cannot
    raise there: Python drops the exception. handled() raises it again, in ordinary code."""
    from advisor.runtime import signals

    class DropsIt:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGINT)     # handled here, inside the finalizer
            sum(range(1000))                         # (bytecode for the handler to run in)

    with pytest.raises(signals.Interrupted) as err:
        with signals.handled():
            obj = DropsIt()
            del obj
            time.sleep(60)                           # raised again in here, RETRY_S later
    assert err.value.exit_code == 130
    assert "Exception ignored" not in capsys.readouterr().err
    assert signal.getsignal(signal.SIGINT) is not signals._handler      # the previous handler is back


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for t in Path(f"/proc/{pid}/task").iterdir() for c in (t / "children").read_text().split()]
    except OSError:
        return []


@pytest.mark.slow
@pytest.mark.parametrize("sig,to_group,code,line", [
    (signal.SIGINT, True, 130, "advisor: interrupted"),       # Ctrl-C: the terminal signals the whole group
    (signal.SIGHUP, False, 129, "advisor: hung up"),          # the terminal or ssh session closed
])
def test_a_signal_during_execute_stops_the_ranks_and_removes_the_temporary_folder(tmp_path, sig, to_group, code, line):
    """One line, the shell's 128 + signal exit code, the ranks stopped and the temporary folder removed."""
    plan = _tiny_plan_file(tmp_path)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "advisor", "execute", str(plan), "--steps", "100000"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(TMPDIR=str(scratch)), start_new_session=True)
    _wait_until(lambda: _ranks_ready(scratch, "advisor-exec-", 2), proc, "both ranks joined")
    if to_group:
        os.killpg(proc.pid, sig)
    else:
        proc.send_signal(sig)
    out, err = proc.communicate(timeout=WAIT_S)
    assert proc.returncode == code and _lines(err) == [line]
    assert _ours(scratch) == [] and processes_naming(str(scratch)) == []


@pytest.mark.slow
def test_sigterm_during_calibrate_stops_the_ranks_and_removes_the_temporary_folder(tmp_path):
    pytest.importorskip("torch")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "advisor", "calibrate", "--nproc", "2", "--backend", "gloo"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(TMPDIR=str(scratch)), start_new_session=True)
    _wait_until(lambda: _ranks_ready(scratch, "advisor-calibrate-", 2), proc, "both ranks joined")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=WAIT_S)
    assert proc.returncode == 143 and _lines(err) == ["advisor: terminated"]
    assert _ours(scratch) == [] and processes_naming(str(scratch)) == []


@pytest.mark.slow
@pytest.mark.parametrize("command", ["execute", "calibrate"])
def test_a_rank_killed_by_sigkill_is_named_and_the_temporary_folder_removed(tmp_path, command):
    """Rank 1 dies by SIGKILL (as from the out-of-memory killer) once the process group is up; rank 0
    then loses its peer. The error names rank 1 and the signal."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    plan = _tiny_plan_file(tmp_path)
    args = ["execute", str(plan)] if command == "execute" else ["calibrate", "--nproc", "2", "--quick"]
    proc = subprocess.run([sys.executable, "-m", "advisor", *args], capture_output=True, text=True, timeout=WAIT_S,
                          env=_env(TMPDIR=str(scratch), ADVISOR_TEST_SIGKILL_RANK="1"))
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert proc.stderr.startswith("error: rank 1 was killed by SIGKILL (signal 9)"), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert _ours(scratch) == [] and processes_naming(str(scratch)) == []


def test_diagnosis_blames_the_rank_behind_a_lost_connection(tmp_path):
    """A rank whose error is caused by gloo's lost connection (the pipeline's "Failed to run stage
    backward" around it) is not the culprit: the rank that was killed, or that left with an exit code
    and no error of its own, is."""
    import json as _json

    from advisor.runtime.launch import diagnose

    wrapped = {"error": "RuntimeError: Failed to run stage backward", "traceback":
               "...RuntimeError: [../gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:5\n"
               "The above exception was the direct cause of the following exception: ..."}
    (tmp_path / "rank5.error.json").write_text(_json.dumps({"rank": 5, **wrapped}))
    assert diagnose(tmp_path, {5: 1, 2: -9}, False, 60)[0] == 2                 # killed by SIGKILL
    rank, message = diagnose(tmp_path, {5: 1, 3: 3}, False, 60)
    assert rank == 3 and "exited with code 3 and no error of its own" in message
    (tmp_path / "rank1.error.json").write_text(_json.dumps({"rank": 1, "error": "ValueError: bad shape",
                                                           "traceback": "ValueError: bad shape"}))
    assert diagnose(tmp_path, {5: 1, 1: 1, 3: 3}, False, 60)[0] == 1             # a real error comes first


def test_test_hooks_are_read_only_under_pytest(monkeypatch):
    """A user's environment that happens to hold ADVISOR_TEST_SIGKILL_RANK kills no rank of theirs (#33)."""
    from advisor.runtime.rank import TEST_SIGKILL_RANK, test_hook

    monkeypatch.setenv(TEST_SIGKILL_RANK, "1")
    assert test_hook(TEST_SIGKILL_RANK) == "1"
    monkeypatch.delenv("PYTEST_CURRENT_TEST")
    assert test_hook(TEST_SIGKILL_RANK) is None
    r = subprocess.run([sys.executable, "-c", "from advisor.runtime.rank import test_hook; print(test_hook('X'))"],
                       capture_output=True, text=True, timeout=60, env=dict(_env(), X="1"))
    assert r.stdout.strip() == "None"


def test_an_output_path_that_is_not_a_regular_file_is_written_through_not_replaced(tmp_path, capfd):
    """#33: --out /dev/full used to leave a regular file where the device was; a link was replaced by a file."""
    import stat

    from advisor.errors import AdvisorError
    from advisor.runtime.files import write_atomic

    write_atomic("/dev/null", "{}\n", "the plan")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    if os.path.exists("/dev/full"):
        with pytest.raises(AdvisorError, match="cannot write the plan to /dev/full: No space left on device"):
            write_atomic("/dev/full", "{}\n", "the plan")
        assert stat.S_ISCHR(os.stat("/dev/full").st_mode)
    target = tmp_path / "real.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    write_atomic(link, "new", "the plan")
    assert link.is_symlink() and target.read_text() == "new"
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        write_atomic(fifo, "through", "the plan")
        assert os.read(reader, 100) == b"through" and stat.S_ISFIFO(os.stat(fifo).st_mode)
    finally:
        os.close(reader)
    write_atomic("-", "to stdout\n", "the plan")
    assert capfd.readouterr().out == "to stdout\n"


@pytest.mark.parametrize("args", [["calibrate", "--quick"], ["execute", "PLAN", "--tiny"],
                                  ["recommend", "--model", "llama3-8b", "--hardware", "dgx-h100", "--nodes", "1"]])
def test_an_unwritable_out_is_refused_before_any_work(tmp_path, args):
    """#33: execute --out and calibrate --out were checked after the run (a 35 s run lost)."""
    args = [str(_tiny_plan_file(tmp_path)) if a == "PLAN" else a for a in args]
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    r = subprocess.run([sys.executable, "-m", "advisor", *args, "--out", str(tmp_path / "missing" / "x")],
                       capture_output=True, text=True, timeout=120, env=_env(TMPDIR=str(scratch)))
    assert r.returncode == 2 and _lines(r.stderr) == [f"error: --out {tmp_path / 'missing' / 'x'}: folder "
                                                      f"{tmp_path / 'missing'} does not exist; nothing was run"]
    assert list(scratch.iterdir()) == []          # no rank was started, no temporary folder made
    r = subprocess.run([sys.executable, "-m", "advisor", *args, "--out", str(tmp_path)], capture_output=True, text=True,
                       timeout=120, env=_env(TMPDIR=str(scratch)))
    assert r.returncode == 2 and "it is a folder" in r.stderr


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
@pytest.mark.parametrize("args", [["recommend", "--model", "llama3-8b", "--hardware", "dgx-h100", "--nodes", "1", "--top",
                                   "1", "--json"], ["list", "models"]])
def test_a_full_stdout_is_one_sentence_not_a_traceback(args):
    with open("/dev/full", "w") as full:
        r = subprocess.run([sys.executable, "-m", "advisor", *args], stdout=full, stderr=subprocess.PIPE, text=True,
                           timeout=120, env=_env())
    assert r.returncode == 1 and _lines(r.stderr) == ["error: cannot write the output: No space left on device"]


@pytest.mark.parametrize("args", [["list", "models"], ["recommend", "--model", "llama3-8b", "--hardware", "dgx-h100",
                                                        "--nodes", "1", "--top", "1", "--json"]])
def test_a_closed_pipe_ends_quietly_as_the_shell_would(args):
    """#33: `advisor list models | head -1` used to exit 1 silently; a reader that has gone is the shell's
    128 + SIGPIPE = 141, with nothing on stderr. The pipe's read end is closed before the command starts, so
    its first write fails whatever the machine's speed."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        r = subprocess.run([sys.executable, "-m", "advisor", *args], stdout=write_end, stderr=subprocess.PIPE,
                           text=True, timeout=120, env=_env())
    finally:
        os.close(write_end)
    assert (r.returncode, r.stderr) == (141, "")


def test_an_ascii_terminal_gets_escapes_not_a_traceback():
    r = subprocess.run([sys.executable, "-m", "advisor", "list", "models"], capture_output=True, timeout=120,
                       env=_env(PYTHONIOENCODING="ascii"))
    assert r.returncode == 0 and b"Traceback" not in r.stderr and r.stdout.isascii() and b"llama3-8b" in r.stdout


def test_an_output_over_one_of_the_inputs_is_refused(tmp_path):
    """#33: output could overwrite its own input file."""
    plan = _tiny_plan_file(tmp_path)
    before = plan.read_text()
    for args in (["estimate", "--plan", str(plan)], ["export", str(plan), "--to", "megatron"],
                 ["execute", str(plan), "--tiny"]):
        r = subprocess.run([sys.executable, "-m", "advisor", *args, "--out", str(plan)], capture_output=True, text=True,
                           timeout=120, env=_env())
        assert r.returncode == 2 and f"--out {plan} is the" in r.stderr, (args, r.stderr)
    assert plan.read_text() == before
