"""Command line: parse options, call one library function, render, map errors to exit codes.

Each command is a thin wrapper. The project's own AdvisorError is caught once, in main(), and
printed as one sentence on stderr with its exit code (2 bad input, 1 infeasible).
"""

from __future__ import annotations

import json
import sys
from typing import Optional

import typer
from rich.console import Console

from advisor.errors import AdvisorError, InfeasibleError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Parallelization advice for training large models: search, estimate, what-if, export, execute.")
console = Console()
err_console = Console(stderr=True)


def print_json(obj) -> None:
    """--json output: only JSON on stdout."""
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=False) + "\n")


@app.callback()
def _root() -> None:
    """advisor: how to split a model over devices, whether it fits, how fast it trains."""


# ---- list ---------------------------------------------------------------------------------------
@app.command("list")
def list_cmd(what: str = typer.Argument(..., help="models | hardware")) -> None:
    """List the bundled model descriptions or hardware profiles."""
    from advisor.specs.hardware import bundled_hardware
    from advisor.specs.model import bundled_models

    if what == "models":
        names = bundled_models()
    elif what == "hardware":
        names = bundled_hardware()
    else:
        raise AdvisorError(f"advisor list: expected 'models' or 'hardware', got {what!r}")
    for name in names:
        console.print(name)


# ---- estimate -----------------------------------------------------------------------------------
@app.command("estimate")
def estimate_cmd(
    model: Optional[str] = typer.Option(None, "--model", help="bundled model name or path"),
    hardware: Optional[str] = typer.Option(None, "--hardware", help="bundled hardware profile or path"),
    nodes: Optional[int] = typer.Option(None, "--nodes"),
    devices: Optional[int] = typer.Option(None, "--devices"),
    tp: int = typer.Option(1, "--tp"),
    pp: int = typer.Option(1, "--pp"),
    dp: Optional[int] = typer.Option(None, "--dp", help="default: devices / (tp x pp x cp)"),
    cp: int = typer.Option(1, "--cp"),
    ep: int = typer.Option(1, "--ep"),
    mbs: int = typer.Option(1, "--mbs", help="micro-batch size (sequences)"),
    gbs: Optional[int] = typer.Option(None, "--gbs", "--global-batch", help="global batch (sequences); default ~4M tokens"),
    seq_len: Optional[int] = typer.Option(None, "--seq-len"),
    vpp: int = typer.Option(1, "--vpp", help="virtual pipeline stages (interleaved 1F1B when > 1)"),
    zero: int = typer.Option(0, "--zero", help="ZeRO stage 0-3"),
    recompute: str = typer.Option("none", "--recompute", help="none | selective | full"),
    recompute_layers: Optional[int] = typer.Option(None, "--recompute-layers", help="with full: layers per stage"),
    sequence_parallel: bool = typer.Option(False, "--sequence-parallel"),
    schedule: Optional[str] = typer.Option(None, "--schedule", help="gpipe | 1f1b | interleaved-1f1b"),
    offload_optimizer: bool = typer.Option(False, "--offload-optimizer"),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="bf16 | fp16 | fp32 | fp8 (default: bf16 if the device has it)"),
    tokens: Optional[str] = typer.Option(None, "--tokens", help="token budget for time/cost to train, e.g. 2T"),
    attention: str = typer.Option("flash", "--attention", help="flash | math (unfused, stores the s x s scores)"),
    plan: Optional[str] = typer.Option(None, "--plan", help="score the strategy of a plan JSON instead"),
    as_json: bool = typer.Option(False, "--json", help="print only JSON"),
) -> None:
    """Score one given strategy, with the full breakdown of memory and time."""
    from advisor.breakdown import render_estimate
    from advisor.estimate_request import estimate_request

    result = estimate_request(
        model=model, hardware=hardware, nodes=nodes, devices=devices, tp=tp, pp=pp, dp=dp, cp=cp, ep=ep,
        mbs=mbs, gbs=gbs, seq_len=seq_len, vpp=vpp, zero=zero, recompute=recompute,
        recompute_layers=recompute_layers, sequence_parallel=sequence_parallel, schedule=schedule,
        offload_optimizer=offload_optimizer, dtype=dtype, tokens=tokens, attention=attention, plan=plan,
    )
    if as_json:
        print_json(result.to_dict())
    else:
        render_estimate(console, result.title, result.strategy, result.estimate)
        if result.alternative:
            console.print(f"closest change that fits: {result.alternative}")
    if not result.estimate.feasible:
        hint = f"; closest change that fits: {result.alternative}" if result.alternative else ""
        raise InfeasibleError(f"the strategy does not fit: {result.estimate.reasons[0]}{hint}")


def main() -> None:
    try:
        app(standalone_mode=False)
    except AdvisorError as exc:
        err_console.print(f"error: {exc}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(exc.exit_code)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        err_console.print("aborted", markup=False)
        sys.exit(130)
    except Exception as exc:
        # Usage errors (unknown option, bad flag value) come from typer's click layer: show them
        # as click would and exit 2, without a traceback.
        if type(exc).__name__ in ("UsageError", "BadParameter", "NoSuchOption", "MissingParameter", "BadOptionUsage",
                                  "BadArgumentUsage", "ClickException", "FileError") and hasattr(exc, "show"):
            exc.show()
            sys.exit(2)
        raise


if __name__ == "__main__":
    main()
