"""Command line: parse options, call one library function, render, map errors to exit codes.

Each command is a thin wrapper. The project's own AdvisorError is caught once, in main(), and
printed as one sentence on stderr with its exit code (2 bad input, 1 infeasible).
"""

from __future__ import annotations

import sys
from typing import Optional

import typer

from advisor.commands.cli_options import (
    CRITICAL_HELP, GRID_HELP, OBJECTIVE_HELP, PUE_HELP, TARGET_LOSS_HELP, TARGET_TOKENS_HELP, console, err_console,
    print_json, print_warnings,
)
from advisor.commands.cli_run import calibrate_cmd, execute_cmd
from advisor.commands.cli_settings import Request, family_of_request, settings_command
from advisor.commands.command_options import ALL_CLASSES
from advisor.errors import AdvisorError

# Plain click help (rich_markup_mode=None): flags show no "<bool>", and option names are never cut at
# narrow terminals (rich's option table shortens them to "--hardwa…"); up to 200 columns wide.
app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None,
                  context_settings={"max_content_width": 200},
                  help="Parallelization advice for training large models: search, estimate, what-if, export, execute.")

# Moved to advisor.commands.cli_options and advisor.commands.cli_run; still importable from here.
__all__ = ["app", "calibrate_cmd", "console", "err_console", "execute_cmd", "main", "print_json", "print_warnings"]


def _show_version(value: bool) -> None:
    if value:
        from advisor import __version__

        console.print(f"advisor {__version__}", markup=False, highlight=False)
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_show_version, is_eager=True,
                                       help="print the version and exit")) -> None:
    """advisor: how to split a model over devices, whether it fits, how fast it trains."""


# ---- list ---------------------------------------------------------------------------------------
@app.command("list")
def list_cmd(what: str = typer.Argument(..., help="models | hardware"),
             as_json: bool = typer.Option(False, "--json", help="print only JSON: {models|hardware: [...]}")) -> None:
    """List the bundled model descriptions or hardware profiles."""
    from advisor.render.listing import hardware_rows, model_rows, render_list
    from advisor.specs.untrusted import prefix

    if what not in ("models", "hardware"):
        raise AdvisorError(f"advisor list: expected 'models' or 'hardware', got {prefix(what)}")
    if as_json:
        print_json({what: model_rows() if what == "models" else hardware_rows()})
    else:
        render_list(console, what)


# ---- estimate and recommend: their options come from the settings' records -----------------------
def _family_command(command: str, request: Request) -> None:
    """Run ``command`` for the request's model family or cluster kind (advisor.families)."""
    family = family_of_request(request)
    request.refuse(family.refuses)
    family.hook(command)(request)


@app.command("estimate")
@settings_command("estimate", *ALL_CLASSES)
def estimate_cmd(request: Request) -> None:
    """Score one given strategy, with the full breakdown of memory and time."""
    _family_command("estimate", request)


@app.command("recommend")
@settings_command("recommend", *ALL_CLASSES)
def recommend_cmd(request: Request) -> None:
    """Search the strategy space and rank the plans; the best is saved with --out."""
    _family_command("recommend", request)


# ---- whatif ------------------------------------------------------------------------------------
@app.command("whatif")
def whatif_cmd(
    model: str = typer.Option(..., "--model", help="bundled model name or path"),
    hardware: str = typer.Option(..., "--hardware", help="comma-separated hardware profiles (names or paths)"),
    nodes: Optional[str] = typer.Option(None, "--nodes", help="comma-separated node counts, e.g. 8,16,32"),
    devices: Optional[str] = typer.Option(None, "--devices", help="comma-separated device counts (instead of --nodes)"),
    inter_node_gbps: Optional[str] = typer.Option(None, "--inter-node-gbps", help="inter-node GB/s per device, e.g. 25,50"),
    intra_node_gbps: Optional[str] = typer.Option(None, "--intra-node-gbps", help="intra-node GB/s per device"),
    memory_gib: Optional[str] = typer.Option(None, "--memory-gib", help="device memory in GiB, e.g. 80,141"),
    gbs: Optional[str] = typer.Option(None, "--global-batch", "--gbs", help="global batch sizes (sequences)"),
    seq_len: Optional[str] = typer.Option(None, "--seq-len", help="sequence lengths"),
    tokens: Optional[str] = typer.Option(None, "--tokens", help="token budget for time, cost and energy to train, e.g. 2T"),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="bf16 | fp16 | fp32 | fp8 (default: per profile)"),
    searcher: str = typer.Option("enumerate", "--searcher", help="enumerate | drec | ilp"),
    workers: Optional[int] = typer.Option(None, "--workers", help="worker processes (default: one per core)"),
    plot: Optional[str] = typer.Option(None, "--plot", help="write a throughput / time-to-train plot (PNG) here"),
    objective: str = typer.Option("throughput", "--objective", help=OBJECTIVE_HELP),
    target_tokens: Optional[str] = typer.Option(None, "--target-tokens", help=TARGET_TOKENS_HELP),
    target_loss: Optional[float] = typer.Option(None, "--target-loss", help=TARGET_LOSS_HELP),
    critical_batch: Optional[str] = typer.Option(None, "--critical-batch-tokens", help=CRITICAL_HELP),
    grid: Optional[str] = typer.Option(None, "--grid-intensity", help=GRID_HELP),
    pue: Optional[float] = typer.Option(None, "--pue", help=PUE_HELP),
    replace_half: Optional[str] = typer.Option(None, "--replace-half", help="also price each even node count "
                                               "with half its nodes of this profile (a mixed cluster)"),
    as_json: bool = typer.Option(False, "--json", help="print only JSON: {points: [...]}"),
) -> None:
    """Best plan per hardware variant and cluster size: throughput, time, cost and energy to train."""
    from advisor.runtime import progress
    from advisor.commands.objective import target_for
    from advisor.render.whatif import render_whatif
    from advisor.whatif import parse_list, parse_names, whatif

    with progress.bar(progress.enabled(as_json), "what-if points") as update:
        result = whatif(
            model, parse_names("--hardware", hardware),
            nodes=parse_list("--nodes", nodes), devices=parse_list("--devices", devices),
            inter_node_gbps=parse_list("--inter-node-gbps", inter_node_gbps, float),
            intra_node_gbps=parse_list("--intra-node-gbps", intra_node_gbps, float),
            memory_gib=parse_list("--memory-gib", memory_gib, float),
            global_batch=parse_list("--global-batch", gbs), seq_len=parse_list("--seq-len", seq_len),
            tokens=tokens, dtype=dtype, searcher=searcher, workers=workers, progress=update,
            target=target_for(objective, target_tokens, target_loss, critical_batch), objective=objective,
            grid_intensity=grid, pue=pue, replace_half=replace_half,
        )
    if plot:
        from advisor.render.plots import whatif_plot

        whatif_plot(result, plot)
    if as_json:
        print_json(result.to_dict())
    else:
        render_whatif(console, result, plot_path=plot)


# ---- export ------------------------------------------------------------------------------------
@app.command("export")
def export_cmd(
    plan_path: str = typer.Argument(..., metavar="PLAN", help="plan JSON (from advisor recommend --out)"),
    to: str = typer.Option(..., "--to", help="megatron | deepspeed | torchtitan | mindspore | k8s"),
    out: Optional[str] = typer.Option(None, "--out", help="write here (a file, or a folder for several files)"),
    as_json: bool = typer.Option(False, "--json", help="print only JSON: {target, files, unsupported, notes}"),
    target_version: Optional[str] = typer.Option(
        None, "--target-version", help="release of the target: Megatron-Core (megatron, k8s), DeepSpeed, torchtitan "
        "or MindFormers (mindspore); default the newest the export supports"),
    framework: Optional[str] = typer.Option(None, "--framework", help="with --to k8s: the framework the job launches "
                                            "(megatron, torchtitan, deepspeed: a PyTorchJob; mindspore: a MindSpore "
                                            "Operator MSJob); default the plan's"),
    image: Optional[str] = typer.Option(None, "--image", help="with --to k8s: the container image (needed for "
                                        "torchtitan and DeepSpeed, which publish none; Megatron-LM: default the NGC "
                                        "container its release names)"),
    hosts: Optional[str] = typer.Option(None, "--hosts", help="with --to mindspore: the nodes' addresses or host "
                                        "names, comma-separated, node 0 first (default: placeholders)"),
    master_port: Optional[int] = typer.Option(None, "--master-port", help="with --to mindspore: the scheduler's "
                                              "port (msrun --master_port; default 8118)"),
    lossy: bool = typer.Option(False, "--lossy", help="write the closest launch even where the target cannot run "
                               "the plan as priced (a warning names each difference); without it such an export "
                               "exits 2"),
) -> None:
    """Launch configuration for Megatron-LM, DeepSpeed, torchtitan, MindSpore or Kubernetes: exactly the plan as
    priced, or exit 2 naming what the target cannot run."""

    from advisor.export import export_plan, write_export
    from advisor.export._common import display
    from advisor.plan import load_plan

    from advisor.runtime.files import refuse_inputs

    if out:       # a file or a folder of several files: only the plan it reads is refused here
        refuse_inputs(out, "the export", "--out", {"PLAN": plan_path})
    plan = load_plan(plan_path)
    launch = None
    if hosts is not None or master_port is not None:
        from advisor.export.mindspore_launch import DEFAULT_MASTER_PORT, LaunchOptions

        launch = LaunchOptions(hosts=tuple(h.strip() for h in hosts.split(",")) if hosts else (),
                               master_port=DEFAULT_MASTER_PORT if master_port is None else master_port)
    result = export_plan(plan, to, target_version, launch, k8s_framework=framework, image=image)
    if result.unsupported and not lossy:
        if as_json:
            print_json(result.to_dict())
        more = f" (and {len(result.unsupported) - 1} more)" if len(result.unsupported) > 1 else ""
        raise AdvisorError(f"--to {to} cannot launch this plan as priced: {display(result.unsupported[0])}{more}; "
                           "--lossy writes the closest launch with a warning for each difference")
    if as_json:
        print_json(result.to_dict())
    elif out:
        for path in write_export(result, out):
            console.print(f"wrote {path}", markup=False, highlight=False)
    else:
        sys.stdout.write(result.text())
    for item in result.unsupported:
        err_console.print(f"warning: {to} cannot express {display(item)}", markup=False, highlight=False, soft_wrap=True)
    if not as_json:   # with --json the notes are in the JSON
        for item in result.notes:
            err_console.print(f"note: {display(item)}", markup=False, highlight=False, soft_wrap=True)


# ---- execute / calibrate (reference executor on torch.distributed; advisor.commands.cli_run) ---------------
app.command("execute")(execute_cmd)
app.command("calibrate")(calibrate_cmd)


def _offending_value(exc) -> str | None:
    """The command-line value that a bad-parameter error refers to (click does not keep it)."""
    param = getattr(exc, "param", None)
    opts = getattr(param, "opts", None) or []
    args = sys.argv[1:]
    for i, arg in enumerate(args):
        for opt in opts:
            if arg == opt and i + 1 < len(args):
                return args[i + 1]
            if arg.startswith(opt + "="):
                return arg[len(opt) + 1:]
    return None


def _ascii_safe_streams() -> None:
    """On a terminal or pipe whose encoding cannot show every character (PYTHONIOENCODING=ascii, LANG=C), write
    what it cannot as backslash escapes instead of failing on the first one."""
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure") and (stream.encoding or "").lower().replace("-", "") not in ("utf8", "utf16"):
            stream.reconfigure(errors="backslashreplace")


def _output_failed(exc: OSError) -> None:
    """Standard output or error could not be written: a closed pipe ends the command quietly as the shell's
    128 + SIGPIPE (``advisor list models | head -1``); another failure (a full device) is one sentence, exit 1."""
    import errno
    import os

    try:                                   # nothing more reaches the broken stream, not even at exit
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    if isinstance(exc, BrokenPipeError) or exc.errno == errno.EPIPE:
        os._exit(141)
    try:
        sys.stderr.write(f"error: cannot write the output: {exc.strerror or exc}\n")
        sys.stderr.flush()
    except OSError:
        pass
    os._exit(1)


def _closed_pipe_seen_by_click() -> None:
    """click (typer's, vendored or not) turns a closed standard output (EPIPE) into exit 1, after wrapping the
    streams in its PacifyFlushWrapper; that wrapper is how a closed pipe is told from a command's own exit 1."""
    import errno

    if type(sys.stdout).__name__ == "PacifyFlushWrapper":
        _output_failed(BrokenPipeError(errno.EPIPE, "Broken pipe"))


def main() -> None:
    from advisor.runtime import signals

    _ascii_safe_streams()
    # Ctrl-C, SIGTERM and SIGHUP: one line, exit 130 / 143 / 129; launched ranks are stopped, temporary folders removed
    try:
        with signals.handled():
            _main(signals.Interrupted)
        sys.stdout.flush()
    except OSError as exc:
        if _is_output_error(exc):
            _output_failed(exc)
        raise


def _is_output_error(exc: OSError) -> bool:
    """Whether the error is one of writing a stream: a closed pipe, a full device or quota, an I/O error. Files
    the command reads or writes itself fail as AdvisorError (advisor.specs.untrusted, advisor.runtime.files), so
    what escapes with these codes is standard output or error."""
    import errno

    return isinstance(exc, BrokenPipeError) or exc.errno in (errno.EPIPE, errno.ENOSPC, errno.EDQUOT, errno.EFBIG,
                                                             errno.EIO)


def _main(interrupted: type[BaseException]) -> None:
    if not sys.argv[1:]:
        err_console.print("error: no command given; run 'advisor --help' to see the commands", markup=False,
                          highlight=False, soft_wrap=True)
        sys.exit(2)
    try:
        code = app(standalone_mode=False)
    except SystemExit:
        _closed_pipe_seen_by_click()
        raise
    except interrupted as exc:
        err_console.print(f"advisor: {exc}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(exc.exit_code)
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
                                  "BadArgumentUsage", "ClickException", "FileError", "NoArgsIsHelpError") \
                and hasattr(exc, "format_message"):
            message = " ".join(exc.format_message().split())
            given = _offending_value(exc)
            if given is not None:
                if len(given) > 40:     # click's own message quotes the whole value (typer before 0.29)
                    message = message.replace(given, given[:40] + "...")
                message += f" (got {given[:40]!r}{'...' if len(given) > 40 else ''})"
            err_console.print(f"error: {message} (see 'advisor --help')", markup=False, highlight=False, soft_wrap=True)
            sys.exit(2)
        raise
    if isinstance(code, int) and code:   # typer hands back the code of an Exit raised inside a command
        sys.exit(code)


if __name__ == "__main__":
    main()
