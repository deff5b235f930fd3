"""The reference executor's commands (advisor.cli): execute a plan on torch.distributed, and
calibrate this machine into a hardware profile. advisor.cli registers them on its app.
"""

from __future__ import annotations

import sys
from typing import Optional

import typer

from advisor.commands.cli_options import console, print_json
from advisor.errors import AdvisorError
from advisor.runtime.files import check_writable


def execute_cmd(
    plan_path: str = typer.Argument(..., metavar="PLAN", help="plan JSON (from advisor recommend --out, or by hand)"),
    nproc: Optional[int] = typer.Option(None, "--nproc", help="processes to start (must equal the plan's devices)"),
    steps: int = typer.Option(5, "--steps", help="optimizer steps (the first is warm-up for timing)"),
    tiny: bool = typer.Option(False, "--tiny", help="a tiny model of the same family, every parallel knob kept"),
    tiny_scale: int = typer.Option(1, "--tiny-scale", help="with --tiny: head size and sequence length times this "
                                   "(4 for time checks on a CPU, where the smallest model is all overhead)"),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="run in this dtype instead of the plan's: fp32 or bf16"),
    hardware: Optional[str] = typer.Option(None, "--hardware", help="profile of this machine (advisor calibrate) for the time prediction"),
    backend: str = typer.Option("auto", "--backend", help="auto | gloo | nccl"),
    timeout: float = typer.Option(900.0, "--timeout", help="hard limit in seconds for the whole run"),
    oversubscribe: bool = typer.Option(False, "--oversubscribe", help="start more than 4 ranks per core"),
    results: Optional[str] = typer.Option(None, "--results", help="compare results.json written by torchrun workers instead of launching"),
    out: Optional[str] = typer.Option(None, "--out", help="write the validation report (JSON) here"),
    as_json: bool = typer.Option(False, "--json", help="print only the report JSON"),
) -> None:
    """Run the plan on torch.distributed; compare losses, memory and time with the prediction (exit 1 when one
    misses its goal)."""
    from advisor.commands.execute import ExecuteOptions, execute, render_report, write_report
    from advisor.validation.execute_report import json_ready
    from advisor.runtime.progress import enabled

    if tiny_scale != 1 and not tiny:
        raise AdvisorError(f"--tiny-scale {tiny_scale} needs --tiny (it widens the tiny model)")
    check_writable(out, "the validation report", inputs={"PLAN": plan_path, "--results": results})  # before the run
    report = execute(plan_path, ExecuteOptions(nproc=nproc, steps=steps, tiny=tiny, tiny_scale=tiny_scale,
                                               dtype=dtype, time_hardware=hardware,
                                               backend=backend, timeout_s=timeout, results=results,
                                               oversubscribe=oversubscribe, progress=enabled(as_json)))
    if out:
        write_report(report, out)
    if as_json:
        print_json(json_ready(report))
    else:
        render_report(console, report, saved_to=out)
    failed = report["verdict"]["failures"]
    if failed:          # the run missed a goal: a proof that fails exits 1, like a failing test
        print(f"advisor execute: the run missed {len(failed)} goal(s): {'; '.join(failed)}", file=sys.stderr)
        raise typer.Exit(1)



def calibrate_cmd(
    backend: str = typer.Option("auto", "--backend", help="gloo | nccl (default: nccl when GPUs are present)"),
    nproc: Optional[int] = typer.Option(None, "--nproc", help="ranks to measure with (default: GPUs, or CPU cores up to 8)"),
    out: Optional[str] = typer.Option(None, "--out", help="write the profile YAML here"),
    quick: bool = typer.Option(False, "--quick", help="fewer sizes and repeats, one round"),
    rounds: Optional[int] = typer.Option(None, "--rounds", help="at most this many measurement rounds (default 8)"),
    spread_target: float = typer.Option(0.10, "--spread-target", help="stop once every key figure's rounds agree within this fraction"),
    oversubscribe: bool = typer.Option(False, "--oversubscribe", help="start more than 4 ranks per core"),
    as_json: bool = typer.Option(False, "--json", help="print only the profile as JSON"),
) -> None:
    """Measure this machine (matmul, memory, collectives) into a hardware profile."""
    from advisor.calibrate import CalibrateOptions, calibrate, calibration_warnings, render_profile, write_profile
    from advisor.runtime.progress import enabled

    check_writable(out, "the profile")                 # before the measurement, not after it
    profile = calibrate(CalibrateOptions(backend=backend, nproc=nproc, quick=quick, oversubscribe=oversubscribe,
                                         progress=enabled(as_json), max_rounds=rounds, spread_target=spread_target))
    for warning in calibration_warnings(profile):
        print(f"warning: {warning}", file=sys.stderr)
    if out:
        write_profile(profile, out)
    if as_json:
        print_json(profile)
    else:
        render_profile(console, profile, saved_to=out)

