"""Command line: parse options, call one library function, render, map errors to exit codes.

Each command is a thin wrapper. The project's own AdvisorError is caught once, in main(), and
printed as one sentence on stderr with its exit code (2 bad input, 1 infeasible).
"""

from __future__ import annotations

import sys
from typing import Optional

import typer

from advisor.commands.cli_options import (
    CRITICAL_HELP, DEVICES_HELP, FP8_HELP, FRAMEWORK_HELP, GRAPHS_HELP, GRID_HELP, HARDWARE_HELP, HOST_EMBEDDING_HELP,
    MODULES_HELP, NODES_HELP, OBJECTIVE_HELP, OPTIMIZER_IMPL_HELP,
    OPSTRAT_HELP, PRIORITY_HELP, PS_MODE_HELP, PUE_HELP, SEQ_HELP, TARGET_LOSS_HELP, TARGET_TOKENS_HELP, TOKEN_DROP_HELP, console,
    err_console,
    print_json, print_warnings,
)
from advisor.commands.cli_run import calibrate_cmd, execute_cmd
from advisor.errors import AdvisorError, InfeasibleError

# Plain click help (rich_markup_mode=None): flags show no "<bool>", and option names are never cut at
# narrow terminals (rich's option table shortens them to "--hardwa…"); up to 200 columns wide.
app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None,
                  context_settings={"max_content_width": 200},
                  help="Parallelization advice for training large models: search, estimate, what-if, export, execute.")

# Moved to advisor.commands.cli_options and advisor.commands.cli_run; still importable from here.
__all__ = ["app", "calibrate_cmd", "console", "err_console", "execute_cmd", "main", "print_json", "print_warnings"]


@app.callback()
def _root() -> None:
    """advisor: how to split a model over devices, whether it fits, how fast it trains."""


# ---- list ---------------------------------------------------------------------------------------
@app.command("list")
def list_cmd(what: str = typer.Argument(..., help="models | hardware")) -> None:
    """List the bundled model descriptions or hardware profiles."""
    from advisor.render.listing import render_list
    from advisor.specs.untrusted import prefix

    if what not in ("models", "hardware"):
        raise AdvisorError(f"advisor list: expected 'models' or 'hardware', got {prefix(what)}")
    render_list(console, what)


# ---- estimate -----------------------------------------------------------------------------------
@app.command("estimate")
def estimate_cmd(
    model: Optional[str] = typer.Option(None, "--model", help="bundled model name or path"),
    hardware: Optional[str] = typer.Option(None, "--hardware", help=HARDWARE_HELP),
    nodes: Optional[int] = typer.Option(None, "--nodes", help=NODES_HELP),
    devices: Optional[int] = typer.Option(None, "--devices", help=DEVICES_HELP),
    tp: int = typer.Option(1, "--tp", help="tensor-parallel degree"),
    pp: int = typer.Option(1, "--pp", help="pipeline-parallel degree (stages)"),
    dp: Optional[int] = typer.Option(None, "--dp", help="data-parallel degree (default: devices / (tp x pp x cp))"),
    cp: int = typer.Option(1, "--cp", help="context-parallel degree (the sequence split over devices)"),
    ep: int = typer.Option(1, "--ep", help="expert-parallel degree (MoE models)"),
    mbs: int = typer.Option(1, "--mbs", help="micro-batch size (sequences)"),
    gbs: Optional[int] = typer.Option(None, "--gbs", "--global-batch", help="global batch (sequences); default ~4M tokens"),
    seq_len: Optional[int] = typer.Option(None, "--seq-len", help=SEQ_HELP),
    vpp: int = typer.Option(1, "--vpp", help="virtual pipeline stages (interleaved 1F1B when > 1)"),
    zero: int = typer.Option(0, "--zero", help="ZeRO stage 0-3"),
    recompute: str = typer.Option("none", "--recompute", help="none | selective | full"),
    recompute_layers: Optional[int] = typer.Option(None, "--recompute-layers", help="with full: layers per stage"),
    sequence_parallel: bool = typer.Option(False, "--sequence-parallel", help="sequence parallelism over the tp group"),
    schedule: Optional[str] = typer.Option(None, "--schedule", help="gpipe | 1f1b | interleaved-1f1b"),
    offload_optimizer: bool = typer.Option(False, "--offload-optimizer", help="keep optimizer states in host memory"),
    offload_params: bool = typer.Option(False, "--offload-params", help="keep weights and gradients in host memory too "
                                        "(ZeRO-Infinity; with --zero 3 --offload-optimizer)"),
    offload_fraction: float = typer.Option(1.0, "--offload-fraction", help="share of the optimizer offloaded "
                                           "(Megatron --optimizer-offload-fraction)"),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="bf16 | fp16 | fp32 | fp8 (default: bf16 if the device has it)"),
    tokens: Optional[str] = typer.Option(None, "--tokens", help="token budget for time/cost to train, e.g. 2T"),
    attention: str = typer.Option("flash", "--attention", help="flash | math (unfused, stores the s x s scores)"),
    dropout: bool = typer.Option(False, "--dropout", help="train with dropout (its masks are kept for backward)"),
    framework: str = typer.Option("megatron", "--framework", help=FRAMEWORK_HELP),
    fp8_recipe: Optional[str] = typer.Option(None, "--fp8-recipe", help=FP8_HELP),
    cp_comm: str = typer.Option("p2p", "--cp-comm", help="p2p (ring attention) | a2a (Ulysses)"),
    recompute_modules: Optional[str] = typer.Option(None, "--recompute-modules", help=MODULES_HELP),
    cuda_graphs: Optional[str] = typer.Option(None, "--cuda-graphs", help=GRAPHS_HELP),
    token_drop: bool = typer.Option(False, "--moe-token-drop", help=TOKEN_DROP_HELP),
    bucket_mb: Optional[float] = typer.Option(None, "--bucket-mb", help="gradient bucket size in MiB (communication "
                                              "fusion, ZeRO 0/1; default: the framework's)"),
    copies: int = typer.Option(1, "--copies", help="multi-copy parallelism: split each micro-batch into this many "
                               "copies (MindSpore micro_batch_interleave_num)"),
    full_batch: bool = typer.Option(False, "--full-batch", help="every rank reads the whole global batch "
                                    "(MindSpore full_batch=True) instead of its data-parallel shard"),
    host_embedding: bool = typer.Option(False, "--host-embedding", help=HOST_EMBEDDING_HELP),
    plan: Optional[str] = typer.Option(None, "--plan", help="score the strategy of a plan JSON instead"),
    operator_strategies: Optional[str] = typer.Option(None, "--operator-strategies", help=OPSTRAT_HELP),
    ps_mode: Optional[str] = typer.Option(None, "--ps-mode", help=PS_MODE_HELP),
    ps_servers: Optional[int] = typer.Option(None, "--ps-servers", help="pin the parameter-server count"),
    ps_async: bool = typer.Option(False, "--ps-async", help="asynchronous parameter servers (staleness reported)"),
    grid: Optional[str] = typer.Option(None, "--grid-intensity", help=GRID_HELP),
    pue: Optional[float] = typer.Option(None, "--pue", help=PUE_HELP),
    priority: bool = typer.Option(False, "--comm-priority", help=PRIORITY_HELP),
    optimizer_impl: Optional[str] = typer.Option(None, "--optimizer-impl", help=OPTIMIZER_IMPL_HELP),
    as_json: bool = typer.Option(False, "--json", help="print only JSON"),
) -> None:
    """Score one given strategy, with the full breakdown of memory and time."""
    from advisor.render.breakdown import render_estimate
    from advisor.commands.estimate_request import estimate_request
    from advisor.commands.recsys_request import estimate_recsys_cmd, wants_recsys
    from advisor.commands.route import route
    from advisor.specs.input_notes import input_warnings

    if route("estimate", dict(locals())):
        return
    if wants_recsys(model, plan):
        if (full_batch or offload_params or offload_fraction != 1.0 or cuda_graphs is not None or token_drop
                or host_embedding):
            raise AdvisorError("--full-batch, --offload-params, --offload-fraction, --cuda-graphs, --moe-token-drop and "
                               "--host-embedding are transformer settings; a "
                               "recommendation model's tables are placed by --ps-mode (replicated, sharded, host, "
                               "servers)")
        return estimate_recsys_cmd(model, hardware, nodes, devices, gbs, dtype, plan, ps_mode, ps_servers, ps_async,
                                   as_json)
    if ps_mode not in (None, "none") or ps_servers is not None or ps_async:
        raise AdvisorError("--ps-mode/--ps-servers/--ps-async: parameter servers serve recommendation models "
                           "(family: recommendation); this model is a transformer")

    result = estimate_request(
        model=model, hardware=hardware, nodes=nodes, devices=devices, tp=tp, pp=pp, dp=dp, cp=cp, ep=ep,
        mbs=mbs, gbs=gbs, seq_len=seq_len, vpp=vpp, zero=zero, recompute=recompute,
        recompute_layers=recompute_layers, sequence_parallel=sequence_parallel, schedule=schedule,
        offload_optimizer=offload_optimizer, dtype=dtype, tokens=tokens, attention=attention, dropout=dropout,
        plan=plan, framework=framework, fp8_recipe=fp8_recipe, cp_comm=cp_comm, recompute_modules=recompute_modules,
        cuda_graphs=cuda_graphs, token_drop=token_drop, bucket_mb=bucket_mb, copies=copies, operator_strategies=operator_strategies, grid_intensity=grid, pue=pue,
        comm_priority=priority, full_batch=full_batch, offload_params=offload_params, offload_fraction=offload_fraction,
        host_embedding=host_embedding, optimizer_impl=optimizer_impl,
    )
    warnings = input_warnings(result.inputs.hardware, result.inputs.cluster)
    if as_json:
        print_json({**result.to_dict(), "warnings": warnings})
    else:
        print_warnings(warnings)
        render_estimate(console, result.title, result.strategy, result.estimate)
        if result.alternative:
            console.print(f"closest change that fits: {result.alternative}")
    if not result.estimate.feasible:
        hint = f"; closest change that fits: {result.alternative}" if result.alternative else ""
        raise InfeasibleError(f"the strategy does not fit: {result.estimate.reasons[0]}{hint}")


# ---- recommend ----------------------------------------------------------------------------------
@app.command("recommend")
def recommend_cmd(
    model: str = typer.Option(..., "--model", help="bundled model name or path"),
    hardware: str = typer.Option(..., "--hardware", help=HARDWARE_HELP),
    nodes: Optional[int] = typer.Option(None, "--nodes", help=NODES_HELP),
    devices: Optional[int] = typer.Option(None, "--devices", help=DEVICES_HELP),
    gbs: Optional[int] = typer.Option(None, "--global-batch", "--gbs", help="global batch (sequences); default ~4M tokens"),
    seq_len: Optional[int] = typer.Option(None, "--seq-len", help=SEQ_HELP),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="bf16 | fp16 | fp32 | fp8 (default: bf16 if the device has it)"),
    tokens: Optional[str] = typer.Option(None, "--tokens", help="token budget for time/cost to train, e.g. 2T"),
    attention: str = typer.Option("flash", "--attention", help="flash | math"),
    framework: str = typer.Option("megatron", "--framework", help=FRAMEWORK_HELP),
    fp8_recipe: Optional[str] = typer.Option(None, "--fp8-recipe", help=FP8_HELP),
    recompute_modules: Optional[str] = typer.Option(None, "--recompute-modules", help=MODULES_HELP),
    cuda_graphs: Optional[str] = typer.Option(None, "--cuda-graphs", help=GRAPHS_HELP),
    token_drop: bool = typer.Option(False, "--moe-token-drop", help=TOKEN_DROP_HELP),
    searcher: str = typer.Option("enumerate", "--searcher", help="enumerate | drec | ilp"),
    top: int = typer.Option(5, "--top", help="how many plans to show"),
    tp: Optional[int] = typer.Option(None, "--tp", help="pin the tensor-parallel degree"),
    pp: Optional[int] = typer.Option(None, "--pp", help="pin the pipeline-parallel degree"),
    dp: Optional[int] = typer.Option(None, "--dp", help="pin the data-parallel degree"),
    cp: Optional[int] = typer.Option(None, "--cp", help="pin the context-parallel degree"),
    ep: Optional[int] = typer.Option(None, "--ep", help="pin the expert-parallel degree"),
    zero: Optional[int] = typer.Option(None, "--zero", help="pin the ZeRO stage 0-3"),
    recompute: Optional[str] = typer.Option(None, "--recompute", help="pin none | selective | full"),
    mbs: Optional[int] = typer.Option(None, "--mbs", help="pin the micro-batch size"),
    vpp: Optional[int] = typer.Option(None, "--vpp", help="pin the virtual pipeline stages"),
    schedule: Optional[str] = typer.Option(None, "--schedule", help="pin gpipe | 1f1b | interleaved-1f1b"),
    sequence_parallel: Optional[bool] = typer.Option(None, "--sequence-parallel/--no-sequence-parallel", help="pin sequence parallelism"),
    offload: Optional[bool] = typer.Option(None, "--offload/--no-offload", help="pin optimizer offload"),
    offload_params: Optional[bool] = typer.Option(None, "--offload-params/--no-offload-params",
                                                  help="pin parameter offload (ZeRO-Infinity)"),
    host_embedding: Optional[bool] = typer.Option(None, "--host-embedding/--no-host-embedding",
                                                  help="pin " + HOST_EMBEDDING_HELP),
    cp_comm: Optional[str] = typer.Option(None, "--cp-comm", help="pin p2p (ring) | a2a (Ulysses) context parallelism"),
    operator_strategies: Optional[str] = typer.Option(None, "--operator-strategies", help=OPSTRAT_HELP),
    out: Optional[str] = typer.Option(None, "--out", help="write the best plan JSON here"),
    plot: Optional[str] = typer.Option(None, "--plot", help="write the top plans' time and memory breakdown (PNG) here"),
    ps_mode: Optional[str] = typer.Option(None, "--ps-mode", help=PS_MODE_HELP),
    ps_servers: Optional[int] = typer.Option(None, "--ps-servers", help="pin the parameter-server count"),
    ps_async: bool = typer.Option(False, "--ps-async", help="asynchronous parameter servers (staleness reported)"),
    objective: str = typer.Option("throughput", "--objective", help=OBJECTIVE_HELP),
    target_tokens: Optional[str] = typer.Option(None, "--target-tokens", help=TARGET_TOKENS_HELP),
    target_loss: Optional[float] = typer.Option(None, "--target-loss", help=TARGET_LOSS_HELP),
    critical_batch: Optional[str] = typer.Option(None, "--critical-batch-tokens", help=CRITICAL_HELP),
    grid: Optional[str] = typer.Option(None, "--grid-intensity", help=GRID_HELP),
    pue: Optional[float] = typer.Option(None, "--pue", help=PUE_HELP),
    priority: bool = typer.Option(False, "--comm-priority", help=PRIORITY_HELP),
    optimizer_impl: Optional[str] = typer.Option(None, "--optimizer-impl", help=OPTIMIZER_IMPL_HELP),
    as_json: bool = typer.Option(False, "--json", help="print only JSON: {plans, search}"),
) -> None:
    """Search the strategy space and rank the plans; the best is saved with --out."""
    from advisor.commands.route import route

    if route("recommend", dict(locals())):
        return
    from advisor.commands.inputs import resolve_inputs
    from advisor.plan import save_plan
    from advisor.commands.objective import target_for, time_to_target
    from advisor.commands.objective_cost import cheapest
    from advisor.commands.recommend import recommend
    from advisor.render.report import render_recommendation, search_progress
    from advisor.search import Pins
    from advisor.search.parameter_server import PsPins
    from advisor.specs.input_notes import input_warnings
    from advisor.specs.operator_strategies import load_operator_strategies

    ps_pins = PsPins(ps_mode, ps_servers, not ps_async)
    fixed = load_operator_strategies(operator_strategies) if operator_strategies is not None else None
    inputs = resolve_inputs(model, hardware, nodes=nodes, devices=devices, global_batch=gbs, seq_len=seq_len,
                            dtype=dtype, tokens=tokens, attention=attention, framework=framework, fp8_recipe=fp8_recipe,
                            recompute_modules=recompute_modules, grid_intensity=grid, pue=pue,
                            comm_priority=priority, cuda_graphs=cuda_graphs, token_drop=token_drop,
                            optimizer_impl=optimizer_impl or "fused")
    warnings = input_warnings(inputs.hardware, inputs.cluster)
    if not as_json:   # before the search: a mistaken cluster size is seen at once
        print_warnings(warnings)
    pins = Pins(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, zero_stage=zero, recompute=recompute, micro_batch_size=mbs,
                virtual_pipeline_stages=vpp, pipeline_schedule=schedule, sequence_parallel=sequence_parallel,
                offload_optimizer=offload, cp_comm=cp_comm, offload_params=offload_params, host_embedding=host_embedding)
    target = target_for(objective, target_tokens, target_loss, critical_batch)
    if objective in ("time-to-target", "cost"):
        if fixed is not None or ps_pins.mode not in (None, "none"):
            raise AdvisorError(f"--objective {objective} ranks the collective searchers' plans; it does not take "
                               "--operator-strategies or --ps-mode")
        result, trials = (time_to_target(inputs.model, inputs.hardware, inputs.cluster, inputs.job, target, pins=pins,
                                         top_k=top, searcher=searcher) if target is not None else
                          cheapest(inputs.model, inputs.hardware, inputs.cluster, inputs.job, pins, top, searcher))
    else:
        trials = None
        with search_progress(console, enabled=not as_json and sys.stdout.isatty()) as progress:
            result = recommend(inputs.model, inputs.hardware, inputs.cluster, inputs.job, pins=pins, top_k=top,
                               searcher=searcher, progress=progress, ps_pins=ps_pins, operator_strategies=fixed,
                               objective=objective)
    if plot and getattr(result, "family", None) == "recommendation":
        raise AdvisorError("--plot draws transformer plans' breakdowns; it is not available for recommendation models")
    if out:
        save_plan(result.best, out)
    if plot:
        from advisor.render.plots import recommend_plot

        recommend_plot(result, plot)
    if as_json:
        print_json({**result.to_dict(), "warnings": warnings,
                    **({"sizes" if objective == "cost" else "batches": [t.to_dict() for t in trials]} if trials else {})})
    else:
        render_recommendation(console, result, saved_to=out)
        if trials:
            from advisor.render.objective import trials_table

            console.print(trials_table(trials, result))
        if plot:
            console.print(f"plot written to {plot}", markup=False, highlight=False)


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
    framework: Optional[str] = typer.Option(None, "--framework", help="with --to k8s: mindspore writes a MindSpore "
                                            "Operator MSJob instead of a PyTorchJob (the default for Ascend plans)"),
    hosts: Optional[str] = typer.Option(None, "--hosts", help="with --to mindspore: the nodes' addresses or host "
                                        "names, comma-separated, node 0 first (default: placeholders)"),
    master_port: Optional[int] = typer.Option(None, "--master-port", help="with --to mindspore: the scheduler's "
                                              "port (msrun --master_port; default 8118)"),
) -> None:
    """Launch configuration for Megatron-LM, DeepSpeed, torchtitan, MindSpore or Kubernetes."""
    from advisor.export import export_plan, write_export
    from advisor.export._common import display
    from advisor.plan import load_plan

    if framework is not None and (to != "k8s" or framework not in ("pytorch", "mindspore")):
        raise AdvisorError(f"--framework goes with --to k8s and takes pytorch or mindspore, got {display(framework[:20])!r}")
    plan = load_plan(plan_path)
    ascend_default = to == "k8s" and framework is None and "ascend" in plan.hardware.device.name.lower()
    if framework == "mindspore" or ascend_default:   # on Ascend the job runs MindSpore unless asked otherwise
        from dataclasses import replace as replaced

        from advisor.export.k8s_mindspore import export as export_msjob

        result = export_msjob(plan, target_version)
        if ascend_default:
            result = replaced(result, notes=result.notes + (
                "an Ascend plan: a MindSpore Operator MSJob with MindSpore's Ascend image (--framework pytorch "
                "writes a PyTorchJob instead)",))
    else:
        launch = None
        if hosts is not None or master_port is not None:
            from advisor.export.mindspore_launch import DEFAULT_MASTER_PORT, LaunchOptions

            launch = LaunchOptions(hosts=tuple(h.strip() for h in hosts.split(",")) if hosts else (),
                                   master_port=DEFAULT_MASTER_PORT if master_port is None else master_port)
        result = export_plan(plan, to, target_version, launch)
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


def main() -> None:
    from advisor.runtime import signals

    # Ctrl-C and SIGTERM: one line, exit 130 / 143; launched ranks are stopped, temporary folders removed
    with signals.handled():
        _main(signals.Interrupted)


def _main(interrupted: type[BaseException]) -> None:
    if not sys.argv[1:]:
        err_console.print("error: no command given; run 'advisor --help' to see the commands", markup=False,
                          highlight=False, soft_wrap=True)
        sys.exit(2)
    try:
        code = app(standalone_mode=False)
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
                message += f" (got {given[:40]!r}{'...' if len(given) > 40 else ''})"
            err_console.print(f"error: {message} (see 'advisor --help')", markup=False, highlight=False, soft_wrap=True)
            sys.exit(2)
        raise
    if isinstance(code, int) and code:   # typer hands back the code of an Exit raised inside a command
        sys.exit(code)


if __name__ == "__main__":
    main()
