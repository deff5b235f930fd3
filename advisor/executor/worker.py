"""The per-rank entry point. ``advisor execute`` starts one per device on this machine; ``torchrun``
starts the same module on every machine:

    python -m advisor.executor.worker --spec runs.json --out-dir DIR          (what execute does)
    torchrun ... -m advisor.executor.worker --plan plan.json --out-dir DIR [--tiny [--tiny-scale S]] [--steps K]

It reads the rendezvous from the environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT, as torchrun and the local launcher set them), runs every run of the spec in one
process group, and writes DIR/rank<R>.json (its own results) and, on rank 0, DIR/results.json
(everyone's, gathered over the process group). A rank that raises writes DIR/rank<R>.error.json and
exits 1 at once, without waiting for the others (the launcher then stops them).

Environment knobs: ADVISOR_EXECUTOR_PG_TIMEOUT_S (process-group timeout, default 60),
ADVISOR_EXECUTOR_THREADS (intra-op threads per rank, default 1 on CPU),
ADVISOR_EXECUTOR_PARENT_PID and ADVISOR_EXECUTOR_DEADLINE (set by the local launcher: exit when the
launcher disappears or the deadline passes; advisor.runtime.rank), ADVISOR_TEST_SIGKILL_RANK (tests
only: that rank kills itself with SIGKILL once the process group is up).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from pathlib import Path
from typing import NoReturn

from advisor.runtime.rank import (die_if_asked, fail, leave_without_finalization, mark_ready, report_progress,
                                  start_watchdog, write_result)

# what main imports, for the rank starter to import once before it forks the ranks (advisor.runtime.starter).
# Not advisor.runtime.rank.TORCH_PRELOAD's torch._dynamo: with it, one launch of the executor matrix hung once
# (its four ranks stuck 812 s in one collective of the multi-copy pp x tp plan, 1 of 7 runs; not yet explained),
# and its saving was not measurable over the matrix's run-to-run noise.
PRELOAD = ("torch", "torch.distributed", "advisor.executor.config", "advisor.executor.train")


def _runs(args) -> list[dict]:
    from advisor.executor.config import run_config_from_plan, run_config_to_dict

    if args.spec:
        return json.loads(Path(args.spec).read_text())["runs"]
    plan = json.loads(Path(args.plan).read_text())
    cfg = run_config_from_plan(plan, steps=args.steps, tiny=args.tiny, dtype=args.dtype, tiny_scale=args.tiny_scale)
    return [run_config_to_dict(cfg)]


def main(argv: list[str] | None = None) -> NoReturn:
    parser = argparse.ArgumentParser(prog="python -m advisor.executor.worker")
    parser.add_argument("--spec", help="JSON file {'runs': [RunConfig dicts]} (written by advisor execute)")
    parser.add_argument("--plan", help="a plan JSON (torchrun use)")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--tiny-scale", type=int, default=1)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto")
    parser.add_argument("--out-dir", required=True)
    args = parser.parse_args(argv)
    if not (args.spec or args.plan):
        parser.error("give --spec or --plan")
    start_watchdog()
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rank = int(os.environ.get("RANK", "0"))
    try:
        code = _main(args, out, rank)
    except BaseException as exc:  # report and leave at once; the others are stopped by the launcher
        fail(out, rank, exc)
    # PyTorch's teardown after FSDP2 on gloo aborts about one finished run in seven: see there
    leave_without_finalization(code)


def _main(args, out: Path, rank: int) -> int:
    import torch
    import torch.distributed as dist

    from advisor.executor.config import run_config_from_dict
    from advisor.executor.train import run_distributed

    runs = [run_config_from_dict(d) for d in _runs(args)]
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    backend = args.backend
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(int(os.environ.get("ADVISOR_EXECUTOR_THREADS", "1")))
    timeout = datetime.timedelta(seconds=float(os.environ.get("ADVISOR_EXECUTOR_PG_TIMEOUT_S", "60")))
    dist.init_process_group(backend, timeout=timeout)
    mark_ready(out, rank)
    die_if_asked(rank)
    results = []
    total, done = sum(cfg.steps for cfg in runs), 0
    for i, cfg in enumerate(runs):
        label = f"run {i + 1} of {len(runs)}"
        report_progress(out, rank, done, total, f"{label}, step 1 of {cfg.steps}")

        def stepped(k, label=label, base=done, steps=cfg.steps):   # steps done so far, over every run
            report_progress(out, rank, base + k + 1, total, f"{label}, step {min(k + 2, steps)} of {steps}")

        # the host probe after one run is the one before the next (advisor.executor.train.run_distributed)
        previous = results[-1]["host_probe_us"][-1] if results else None
        results.append(run_distributed(cfg, device, on_step=stepped, probe_before_us=previous))
        done += cfg.steps
        write_result(out / f"rank{rank}.json", {"rank": rank, "backend": backend, "runs": results})
    report_progress(out, rank, total, total, "gathering results")
    gathered = [None] * dist.get_world_size() if rank == 0 else None
    dist.gather_object(results, gathered, dst=0)
    if rank == 0:
        from advisor.executor.config import run_config_to_dict

        write_result(out / "results.json", {"backend": backend, "world_size": dist.get_world_size(),
                                            "configs": [run_config_to_dict(c) for c in runs], "ranks": gathered})
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
