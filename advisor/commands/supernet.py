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
from advisor.plan import Plan, save_plan, strategy_to_dict
from advisor.render.formatting import step_time

# tokens per subnet step: NASPipe's default batch (hku-systems/naspipe reproducible/translation/
# main_with_runtime.py, --max-tokens 2560); --global-batch gives it in sequences
DEFAULT_BATCH_TOKENS = 2560
LEGEND = ("NASPipe, sequential, bound: seconds for the subnets; sequential: one subnet at a time through the "
          "stages (exact training without NASPipe); x: the speed-up over it; bound: the same pipeline if no two "
          "subnets shared a block; ahead: forwards run ahead of an earlier subnet held back by a shared block (NASPipe's out-of-order starts); "
          "fit: what NASPipe's runtime does where the plain run does not fit: ckpt recomputes each stage's "
          "forward, host keeps the candidates' weights in host memory and swaps each subnet's blocks in (context "
          "switching)")
_REFUSED = ("tp", "cp", "ep", "vpp", "zero", "operator_strategies", "ps_mode", "plot", "full_batch", "offload_params",
            "offload_fraction", "cuda_graphs", "token_drop", "host_embedding")


def _description(model: str) -> tuple[str, dict[str, Any]]:
    """(path, mapping) of a --model value: a bundled name or a file."""
    from advisor.specs import _fields as f
    from advisor.specs.model import MODELS_DIR

    path = f.resolve_bundled(model, MODELS_DIR, "model")
    return str(path), f.read_mapping(path, "model description")


def is_supernet(model: str | None) -> bool:
    if model is None:
        return False
    try:
        return _description(model)[1].get("family") == "supernet"
    except AdvisorError:
        return False          # the regular path reports the problem


def _refuse(o: dict[str, Any]) -> None:
    for key in _REFUSED:
        value = o.get(key)
        given = value is True or (value not in (None, False, 1, 0) and not isinstance(value, bool))
        if given:
            raise AdvisorError(f"--{key.replace('_', '-')} is not available for a supernet (NASPipe trains each subnet "
                               "as one pipeline task; give --pp and --global-batch)")
    if o.get("recompute") not in (None, "none"):
        raise AdvisorError("--recompute is not available for a supernet: where a plan does not fit, recommend and "
                           "estimate checkpoint each stage as NASPipe does (parallel.supernet.checkpoint)")
    if o.get("searcher", "enumerate") != "enumerate" or o.get("objective", "throughput") != "throughput":
        raise AdvisorError("a supernet plan is ranked by subnets per second with NASPipe's schedule; --searcher and "
                           "--objective do not apply")


def _inputs(o: dict[str, Any]):
    from advisor.commands.inputs import check_dtype, default_dtype
    from advisor.specs.hardware import load_hardware
    from advisor.specs.job import Cluster, TrainingJob
    from advisor.specs.model import model_from_dict

    path, raw = _description(o["model"])
    net = model_from_dict(raw, path)
    hw = load_hardware(o["hardware"])
    cluster = Cluster.of(hw, nodes=o.get("nodes"), devices=o.get("devices"))
    dtype = check_dtype(hw, o.get("dtype") or default_dtype(hw))
    seq = o.get("seq_len") or net.base.seq_length
    job = TrainingJob(global_batch_size=o.get("gbs") or max(1, DEFAULT_BATCH_TOKENS // seq), seq_length=seq, dtype=dtype)
    return net, raw, hw, cluster, job


def _plan(net, raw, hw, cluster, job, p, run: SupernetRun, rank: int, seconds: float) -> Plan:
    e = p.estimate
    prediction = {"step_time_s": e.naspipe.makespan_s / e.subnets, "tokens_per_s": e.tokens_per_s,
                  "memory_gib": {"total": e.memory_gib}, "supernet": e.to_dict()}
    return Plan(model=net, hardware=hw, cluster=cluster, training=job, strategy=p.strategy, prediction=prediction,
                search={"searcher": "naspipe", "rank": rank, "seconds": round(seconds, 3)}, model_raw=raw, supernet=run)


def _table(title: str, rows: list[tuple]) -> Table:
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False,
                  collapse_padding=True)
    for name in ("#", "dp.pp", "layers", "subnet/s", "tokens/s", "NASPipe", "sequential", "x", "bound", "ahead",
                 "GiB", "fit"):
        table.add_column(name, justify="left" if name in ("dp.pp", "layers") else "right", no_wrap=True)
    for i, (s, e) in enumerate(rows, start=1):
        layers = "+".join(str(n) for n in s.stage_layers) if s.stage_layers else "all"
        table.add_row(str(i), f"{s.dp}.{s.pp}", layers, f"{e.subnets_per_s:,.1f}", f"{e.tokens_per_s:,.0f}",
                      step_time(e.naspipe.makespan_s), step_time(e.sequential_s), f"{e.speedup:.2f}x",
                      step_time(e.no_dependency.makespan_s), str(e.naspipe.overtakes), f"{e.memory_gib:.1f}",
                      SupernetRun(context_switch=e.context_switch, checkpoint=e.checkpoint).memory_knobs)
    return table


def recommend_supernet_cmd(o: dict[str, Any]) -> None:
    import time

    from advisor.search.supernet import search_supernet

    _refuse(o)
    net, raw, hw, cluster, job = _inputs(o)
    run = SupernetRun()
    started = time.perf_counter()
    plans = search_supernet(net, hw, cluster, job, run, pp=o.get("pp"), top_k=o.get("top") or 5)
    seconds = time.perf_counter() - started
    chosen = replace(run, context_switch=plans[0].estimate.context_switch, checkpoint=plans[0].estimate.checkpoint)
    best = _plan(net, raw, hw, cluster, job, plans[0], chosen, 1, seconds)
    if o.get("out"):
        save_plan(best, o["out"])
    if o.get("as_json"):
        print_json({"plans": [{"parallel": strategy_to_dict(p.strategy, net.num_layers), **p.estimate.to_dict()}
                              for p in plans], "search": {"searcher": "naspipe", "seconds": seconds}})
        return
    wide_console().print(_table(f"{net.name} supernet on {cluster.devices} x {hw.device.name}: {run.subnets} subnets of "
                         f"{job.global_batch_size} x {job.seq_length} tokens, NASPipe schedule",
                         [(p.strategy, p.estimate) for p in plans]))
    console.print(LEGEND, highlight=False)
    if o.get("out"):
        console.print(f"best plan saved to {o['out']}")


def estimate_supernet_plan(plan: Plan) -> SupernetEstimate:
    from advisor.cost.supernet import estimate_supernet

    return estimate_supernet(plan.model, plan.hardware, plan.training, plan.strategy, plan.supernet or SupernetRun())


def estimate_supernet_cmd(o: dict[str, Any]) -> None:
    from advisor.plan import load_plan
    from advisor.search.supernet import supernet_strategy

    _refuse(o)
    if o.get("plan"):
        plan = load_plan(o["plan"])
        s, e = plan.strategy, estimate_supernet_plan(plan)
        title = f"{plan.model.name} supernet (plan {o['plan']})"
    else:
        net, _, hw, cluster, job = _inputs(o)
        pp = 1 if o.get("pp") is None else o["pp"]
        if not isinstance(pp, int) or not 1 <= pp <= net.num_layers or cluster.devices % pp \
                or job.global_batch_size % (cluster.devices // pp):
            raise AdvisorError(f"--pp {pp}: it must be 1 to the {net.num_layers} layers, divide the {cluster.devices} "
                               f"devices, and leave replicas that divide the batch {job.global_batch_size}")
        s = supernet_strategy(net, hw, job, pp, cluster.devices // pp)
        from advisor.search.supernet import fitting_estimate

        e = fitting_estimate(net, hw, job, s, SupernetRun())     # as recommend: what NASPipe does to fit
        title = f"{net.name} supernet on {cluster.devices} x {hw.device.name}"
    if o.get("as_json"):
        print_json({"parallel": {"dp": s.dp, "pp": s.pp, "stage_layers": list(s.stage_layers or [])}, **e.to_dict()})
    else:
        wide_console().print(_table(title, [(s, e)]))
        console.print(LEGEND, highlight=False)
    if not e.feasible:
        raise InfeasibleError(f"the supernet plan needs {e.memory_gib:.1f} GiB per device, the device has "
                              f"{e.capacity_gib:g} GiB")
