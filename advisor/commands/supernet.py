"""`recommend`, `estimate` and `execute` for supernets (models of ``family: supernet``): plans priced with
NASPipe's schedule (advisor.search.supernet, advisor.cost.supernet) and run on CPU ranks
(advisor.executor.supernet). advisor.cli hands the options over as given (see advisor.commands.route).

The job: ``--global-batch`` sequences per subnet (each subnet trains one step on one batch; default
NASPipe's 2,560 tokens), the model's sequence length unless ``--seq-len``; ``--pp`` pins the pipeline depth. What a supernet plan
does not take (tensor or context parallelism, the other searchers) is refused in one sentence.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from rich import box
from rich.table import Table

from advisor.commands.cli_options import console, print_json, wide_console
from advisor.cost.supernet import SupernetEstimate, SupernetRun
from advisor.errors import AdvisorError, InfeasibleError
from advisor.plan import Plan, plan_to_dict, save_plan, strategy_to_dict
from advisor.render.formatting import count, step_time

# tokens per subnet step: NASPipe's default batch (hku-systems/naspipe reproducible/translation/
# main_with_runtime.py, --max-tokens 2560); --global-batch gives it in sequences
DEFAULT_BATCH_TOKENS = 2560
LEGEND = ("NASPipe, sequential, bound: seconds for the subnets; sequential: one subnet at a time through the "
          "stages (exact training without NASPipe); x: the speed-up over it; bound: the same pipeline if no two "
          "subnets shared a block; ahead: forwards run ahead of an earlier subnet held back by a shared block (NASPipe's out-of-order starts); "
          "fit: what NASPipe's runtime does where the plain run does not fit: ckpt recomputes each stage's "
          "forward, host keeps the candidates' weights in host memory and swaps each subnet's blocks in (context "
          "switching)")

def _description(model: str) -> tuple[str, dict[str, Any]]:
    """(path, mapping) of a --model value: a bundled name or a file."""
    from advisor.specs import _fields as f
    from advisor.specs.model import MODELS_DIR

    path = f.resolve_bundled(model, MODELS_DIR, "model")
    return str(path), f.read_mapping(path, "model description")


def _refuse(r) -> None:
    """What the supernet record (advisor.families) does not refuse by name: recomputation other than none, and
    another searcher or objective."""
    if r.get("recompute") not in (None, "none"):
        raise AdvisorError("--recompute is not available for a supernet: where a plan does not fit, recommend and "
                           "estimate checkpoint each stage as NASPipe does (parallel.supernet.checkpoint)")
    if r.get("searcher", "enumerate") != "enumerate" or r.get("objective", "throughput") != "throughput":
        raise AdvisorError("a supernet plan is ranked by subnets per second with NASPipe's schedule; --searcher and "
                           "--objective do not apply")


def _inputs(r):
    from advisor.commands.inputs import check_dtype, default_dtype, given_settings
    from advisor.specs.hardware import load_hardware
    from advisor.specs.job import Cluster, TrainingJob
    from advisor.specs.model import model_from_dict

    if r.get("model") is None or r.get("hardware") is None:
        raise AdvisorError("a supernet plan needs --model and --hardware")
    path, raw = _description(r.get("model"))
    net = model_from_dict(raw, path)
    hw = load_hardware(r.get("hardware"))
    cluster = Cluster.of(hw, nodes=r.get("nodes"), devices=r.get("devices"))
    given = given_settings(TrainingJob, r.values_of(TrainingJob))
    dtype = check_dtype(hw, given.get("dtype") or default_dtype(hw))
    seq = given.get("seq_length") or net.base.seq_length
    job = TrainingJob(global_batch_size=given.get("global_batch_size") or max(1, DEFAULT_BATCH_TOKENS // seq),
                      seq_length=seq, dtype=dtype)
    return net, raw, hw, cluster, job


def _plan(net, raw, hw, cluster, job, p, run: SupernetRun, rank: int, seconds: float) -> Plan:
    e = p.estimate
    prediction = {"step_time_s": e.naspipe.makespan_s / e.subnets, "tokens_per_s": e.tokens_per_s,
                  "memory_gib": {"total": e.memory_gib}, "supernet": e.to_dict()}
    return Plan(model=net, hardware=hw, cluster=cluster, training=job, strategy=p.strategy, prediction=prediction,
                search={"searcher": "naspipe", "rank": rank, "seconds": round(seconds, 3)}, model_raw=raw, supernet=run)


def _table(title: str, rows: list[tuple]) -> Table:
    # the separator's one space between columns, two-line headers, counts with a suffix and the stage layers folding: it fits 80
    # columns
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, padding=0, pad_edge=False, show_edge=False)
    for name in ("#", "dp.pp", "layers", "subnet\n/s", "tokens\n/s", "NASPipe", "sequen-\ntial", "x", "bound", "ahead",
                 "GiB", "fit"):
        table.add_column(name, justify="left" if name in ("dp.pp", "layers") else "right", no_wrap=name != "layers",
                         min_width=6 if name == "layers" else None, overflow="fold")
    for i, (s, e) in enumerate(rows, start=1):
        layers = "+".join(str(n) for n in s.stage_layers) if s.stage_layers else "all"
        table.add_row(str(i), f"{s.dp}.{s.pp}", layers, f"{e.subnets_per_s:,.1f}", count(e.tokens_per_s),
                      step_time(e.naspipe.makespan_s), step_time(e.sequential_s), f"{e.speedup:.2f}x",
                      step_time(e.no_dependency.makespan_s), str(e.naspipe.overtakes), f"{e.memory_gib:.1f}",
                      SupernetRun(context_switch=e.context_switch, checkpoint=e.checkpoint).memory_knobs)
    return table


def recommend_supernet_cmd(o) -> None:
    import time

    from advisor.search.supernet import search_supernet

    _refuse(o)
    net, raw, hw, cluster, job = _inputs(o)
    run = SupernetRun()
    started = time.perf_counter()
    plans = search_supernet(net, hw, cluster, job, run, pp=o.get("pp"), top_k=o.get("top") or 5)
    seconds = time.perf_counter() - started
    saved = [_plan(net, raw, hw, cluster, job, p, replace(run, context_switch=p.estimate.context_switch,
                                                          checkpoint=p.estimate.checkpoint), i, seconds)
             for i, p in enumerate(plans, start=1)]
    if o.get("out"):
        save_plan(saved[0], o.get("out"))
    if o.get("json"):     # as every recommend --json: the plans (their prediction holds the figures) and the search
        print_json({"plans": [plan_to_dict(p) for p in saved], "search": {"searcher": "naspipe", "seconds": seconds}})
        return
    wide_console().print(_table(f"{net.name} supernet on {cluster.devices} x {hw.device.name}: {run.subnets} subnets of "
                         f"{job.global_batch_size} x {job.seq_length} tokens, NASPipe schedule",
                         [(p.strategy, p.estimate) for p in plans]))
    console.print(LEGEND, highlight=False)
    if o.get("out"):
        console.print(f"best plan saved to {o.get('out')}")


def estimate_supernet_plan(plan: Plan) -> SupernetEstimate:
    from advisor.cost.supernet import estimate_supernet

    return estimate_supernet(plan.model, plan.hardware, plan.training, plan.strategy, plan.supernet or SupernetRun())


def estimate_supernet_cmd(o) -> None:
    from advisor.plan import load_plan
    from advisor.search.supernet import supernet_strategy

    _refuse(o)
    if o.get("plan"):
        plan = load_plan(o.get("plan"))
        s, e, layers = plan.strategy, estimate_supernet_plan(plan), plan.model.num_layers
        title = f"{plan.model.name} supernet (plan {o.get('plan')})"
        where = (plan.model.name, plan.hardware.name, plan.cluster.devices)
    else:
        net, _, hw, cluster, job = _inputs(o)
        pp = o.get("pp", 1)
        if not isinstance(pp, int) or not 1 <= pp <= net.num_layers or cluster.devices % pp \
                or job.global_batch_size % (cluster.devices // pp):
            raise AdvisorError(f"--pp {pp}: it must be 1 to the {net.num_layers} layers, divide the {cluster.devices} "
                               f"devices, and leave replicas that divide the batch {job.global_batch_size}")
        s = supernet_strategy(net, hw, job, pp, cluster.devices // pp)
        from advisor.search.supernet import fitting_estimate

        e = fitting_estimate(net, hw, job, s, SupernetRun())     # as recommend: what NASPipe does to fit
        title, layers = f"{net.name} supernet on {cluster.devices} x {hw.device.name}", net.num_layers
        where = (net.name, hw.name, cluster.devices)
    if o.get("json"):
        # as every estimate --json: title, model, hardware, devices, strategy (the plan's parallel block), figures
        print_json({"title": title, "model": where[0], "hardware": where[1], "devices": where[2],
                    "strategy": strategy_to_dict(s, layers), **e.to_dict()})
    else:
        wide_console().print(_table(title, [(s, e)]))
        console.print(LEGEND, highlight=False)
    if not e.feasible:
        raise InfeasibleError(f"the supernet plan needs {e.memory_gib:.1f} GiB per device, the device has "
                              f"{e.capacity_gib:g} GiB")


def execute_supernet(plan: Plan, *, subnets: int, tiny: bool, timeout_s: float = 600.0, workdir: str | None = None,
                     causal: bool = True) -> dict[str, Any]:
    """``advisor execute`` of a supernet plan: ``subnets`` subnets sampled as the plan says, run on the pipeline in
    the order NASPipe's schedule gives for the plan's hardware (context switching included; the executor itself
    keeps every candidate of its supernet on its ranks) and one after another; ``causal=False`` drops NASPipe's
    dependencies from the order (to show that the losses then differ)."""
    from advisor.cost.naspipe import dependencies, sample_subnets, simulate, stage_blocks
    from advisor.cost.supernet import action_times_s
    from advisor.executor.supernet.run import check_plan, run_supernet

    check_plan(plan)
    net, s, run = plan.model, plan.strategy, plan.supernet or SupernetRun()
    choices = sample_subnets(subnets, net.num_layers, len(net.candidates), run.seed)
    fwd, bwd, p2p = action_times_s(net, plan.hardware, plan.training, s, choices, run.train_shared,
                                   run.context_switch, run.checkpoint)
    layers = s.resolved_stage_layers(net.num_layers)
    schedule = simulate(fwd, bwd, p2p, dependencies(stage_blocks(choices, layers, run.train_shared), causal),
                        run.window or s.pp)
    return run_supernet(plan, choices=choices, orders=schedule.orders, overtakes=schedule.overtakes, tiny=tiny,
                        timeout_s=timeout_s, workdir=workdir, causal=causal)


def execute_plan(plan: dict[str, Any], plan_path: str, options) -> dict[str, Any]:
    """``advisor execute`` of a supernet plan (advisor.families): NASPipe's pipeline (advisor.executor.supernet)."""
    from advisor.plan import plan_from_dict

    loaded = plan_from_dict(plan, plan_path)
    if options.nproc not in (None, loaded.strategy.pp):
        raise AdvisorError(f"--nproc {options.nproc}: the supernet plan runs one rank per pipeline stage "
                           f"({loaded.strategy.pp})")
    return execute_supernet(loaded, subnets=options.steps, tiny=options.tiny, timeout_s=options.timeout_s,
                            workdir=options.workdir)
