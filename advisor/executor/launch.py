"""Run RunConfigs on local worker processes (advisor.executor.worker), one per rank.

The process handling (own sessions, hard deadline, no orphans, which rank to blame) is
advisor.runtime.launch, shared with ``advisor calibrate``; this module writes the runs for the
workers and reads back their results. Without ``workdir`` the rank files live in a temporary folder
that is removed when the launch ends, however it ends.
"""

from __future__ import annotations

import json

from advisor.runtime.files import temporary_folder, write_json
from advisor.runtime.launch import ExecutionFailed, LaunchOptions, Progress, launch_module

__all__ = ["ExecutionFailed", "LaunchOptions", "launch", "launch_module"]


def launch(runs: list[dict], opts: LaunchOptions, progress: Progress | None = None) -> list[list[dict]]:
    """Run the RunConfig dicts on ``opts.nproc`` local processes; per rank, its list of run results."""
    with temporary_folder("advisor-exec-", keep=opts.workdir) as out:
        spec = out / "spec.json"
        write_json(spec, {"runs": runs}, what="the runs for the workers")
        launch_module("advisor.executor.worker", ["--spec", str(spec), "--backend", opts.backend], out, opts,
                      progress, temporary=opts.workdir is None)
        return [json.loads((out / f"rank{r}.json").read_text())["runs"] for r in range(opts.nproc)]
