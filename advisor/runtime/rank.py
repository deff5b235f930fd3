"""The started process's side of advisor.runtime.launch: what every rank (the executor's worker,
the calibration probes) does besides its own work.

* ``start_watchdog()``: exit when the launcher disappears (its pid is no longer the parent) or the
  hard deadline passes, read from ADVISOR_EXECUTOR_PARENT_PID and ADVISOR_EXECUTOR_DEADLINE.
* ``mark_ready(out, rank)``: out/rank<R>.ready once the rank has joined its process group (the
  launcher's progress counts them).
* ``write_result(path, obj)``: a rank's JSON, written atomically (the launcher never reads half a file).
* ``fail(out, rank)``: record the exception in out/rank<R>.error.json and leave at once.
* ``leave_without_finalization(code)``: exit without interpreter finalization (see there).
* ``run_spec_rank(prog, body, argv)``: the whole life of a rank started with ``--spec FILE --out-dir
  DIR``: the watchdog, ``body(spec, out, rank)``, the failure record, the exit.
* ``die_if_asked(rank)``: for tests only, ADVISOR_TEST_SIGKILL_RANK=R makes rank R kill itself with
  SIGKILL, as the kernel's out-of-memory killer would.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Callable, NoReturn

from advisor.runtime.files import write_atomic

TEST_SIGKILL_RANK = "ADVISOR_TEST_SIGKILL_RANK"

# What a PyTorch rank that builds a torch.optim optimizer imports on first use, for the rank starter to import
# once before it forks the ranks (advisor.runtime.starter; the PRELOAD of the parameter-server roles and of the
# calibration probes starts with it; advisor.executor.worker says why its does not). The first optimizer imports
# torch._dynamo, and with it torch._inductor (torch._compile._disable_dynamo imports it lazily): about 1 s of CPU
# in every rank, paid once per launch when the starter has imported it.
TORCH_PRELOAD = ("torch", "torch.distributed", "torch._dynamo")


def start_watchdog(poll_s: float = 0.5) -> None:
    parent = os.environ.get("ADVISOR_EXECUTOR_PARENT_PID")
    deadline = os.environ.get("ADVISOR_EXECUTOR_DEADLINE")
    if parent is None and deadline is None:
        return

    def watch():
        while True:
            time.sleep(poll_s)
            if parent is not None and os.getppid() != int(parent):
                os._exit(3)
            if deadline is not None and time.time() > float(deadline):
                sys.stderr.write("advisor: rank passed its deadline, exiting\n")
                sys.stderr.flush()
                os._exit(124)

    threading.Thread(target=watch, daemon=True).start()


def write_result(path: Path, obj) -> None:
    """Internal rank files keep NaN as json does (a diverged loss is a result); the report that the
    user reads is made finite by the command."""
    write_atomic(path, json.dumps(obj, indent=1), what="the rank's result")


def mark_ready(out: Path, rank: int) -> None:
    if os.environ.get("ADVISOR_EXECUTOR_PARENT_PID") is None:   # torchrun: nobody counts them
        return
    write_atomic(out / f"rank{rank}.ready", "", what="the rank's ready mark")


def fail(out: Path, rank: int, exc: BaseException) -> NoReturn:
    """Report the exception being handled and leave at once; the launcher stops the other ranks."""
    try:
        write_result(out / f"rank{rank}.error.json", {
            "rank": rank, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()})
    finally:
        sys.stderr.write(f"rank {rank} failed: {type(exc).__name__}: {exc}\n")
        sys.stderr.flush()
        os._exit(1)


def leave_without_finalization(code: int) -> NoReturn:
    """Exit without interpreter finalization. Everything this rank owes is written and the process
    group is destroyed by now; what finalization would still do is run C++ static destructors, and
    after FSDP2 on gloo (PyTorch 2.13) one of them aborts with "terminate called without an active
    exception" in about one run in seven (a 12-line script with fully_shard, three steps and
    destroy_process_group reproduces it, no advisor code involved). torchrun then reports the
    finished run as failed."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def test_hook(name: str) -> str | None:
    """The value of a test-only environment variable, read only under pytest (which sets PYTEST_CURRENT_TEST in
    the environment its tests, and the processes they start, run with): a user's run never obeys one."""
    return os.environ.get(name) if "PYTEST_CURRENT_TEST" in os.environ else None


def die_if_asked(rank: int) -> None:
    """Tests only: the rank named by ADVISOR_TEST_SIGKILL_RANK dies here by SIGKILL."""
    if test_hook(TEST_SIGKILL_RANK) == str(rank):
        os.kill(os.getpid(), signal.SIGKILL)


def report_progress(out: Path, rank: int, done: int, total: int, label: str) -> None:
    """Every rank marks how far it is in out/rank<R>.step (the launcher names a rank that stops there when the run
    does not finish: advisor.runtime.launch.diagnose); rank 0 also tells the launcher's progress bar
    (advisor.runtime.progress)."""
    if os.environ.get("ADVISOR_EXECUTOR_PARENT_PID") is None:
        return
    mark = json.dumps({"done": done, "total": total, "label": label})
    write_atomic(out / f"rank{rank}.step", mark, what="the step mark")
    if rank == 0:
        write_atomic(out / "progress.json", mark, what="the progress mark")


def run_spec_rank(prog: str, body: Callable[[dict, Path, int], None], argv: list[str] | None = None) -> NoReturn:
    """Parse ``--spec FILE --out-dir DIR``, start the watchdog, run ``body(spec, out, rank)`` with the
    JSON spec, record any exception (``fail``) and leave without finalization."""
    import argparse

    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--spec", required=True)
    parser.add_argument("--out-dir", required=True)
    args = parser.parse_args(argv)
    start_watchdog()
    out = Path(args.out_dir)
    rank = int(os.environ.get("RANK", "0"))
    try:
        body(json.loads(Path(args.spec).read_text()), out, rank)
    except BaseException as exc:  # report and leave; the launcher (or the PS scheduler) stops the others
        fail(out, rank, exc)
    leave_without_finalization(0)
