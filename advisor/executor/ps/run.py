"""``advisor execute`` for a plan with ``parallel.parameter_server``: read, refuse what cannot run,
launch the roles, run the single-process reference on the samples that were trained, report."""

from __future__ import annotations

import copy
from typing import Any, Callable

from advisor.errors import AdvisorError, InfeasibleError
from advisor.executor.ps.config import PsConfig, ps_config_from_plan
from advisor.executor.ps.launch import PsLaunchOptions, launch_ps
from advisor.executor.ps.model import run_reference
from advisor.executor.ps.replay import replay
from advisor.executor.ps.report import build_ps_report, executed_model
from advisor.runtime.capacity import capacity_problems

# fp32 values per parameter this machine holds across all roles and the reference: the servers'
# copy, the workers' pulled copy and its gradient, the reference's copy and gradient (5), plus the
# optimizer's state per parameter held twice (servers and reference); 4 bytes each (fp32).
COPIES = 5
STATE_VALUES = {"sgd": 0, "adagrad": 1, "adam": 2, "adamw": 2}   # torch.optim: Adagrad's sum; Adam's m and v


def is_ps_plan(plan: dict[str, Any]) -> bool:
    return bool((plan.get("parallel") or {}).get("parameter_server"))


def check_fits(cfg: PsConfig, oversubscribe: bool = False) -> None:
    """Refuse, before any process starts, a run this machine cannot hold (advisor.runtime.capacity:
    cores per process, and the model's bytes across the roles and the reference on top of every
    process's Python and torch)."""
    params = sum(_numel(s) for s in cfg.model.param_shapes().values())
    need = 4.0 * params * (COPIES + 2 * STATE_VALUES[cfg.optimizer])
    world = cfg.servers + cfg.workers
    problems = capacity_problems(world, need / world, oversubscribe, hint="; use --tiny")
    if problems:
        raise InfeasibleError("refused before starting any process: " + "; ".join(problems))


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def run_ps(plan: dict[str, Any], origin: str, *, steps: int = 5, tiny: bool = False, dtype: str | None = None,
           nproc: int | None = None, timeout_s: float = 900.0, pg_timeout_s: float = 30.0,
           workdir: str | None = None, results: str | None = None, oversubscribe: bool = False,
           predict: Callable[[dict[str, Any]], dict[str, Any] | None] | None = None) -> dict[str, Any]:
    """Run the plan's servers and workers and report. ``predict``, when given, receives the executed
    plan (the plan with the model and batch that really ran: see ``executed_plan``) and returns
    ``{"worker_memory_gib": {...}, "server_memory_gib": {...}, "step_time_s": s}`` or None; the
    executor itself never calls the cost model."""
    if results is not None:
        raise AdvisorError("--results: parameter-server plans are run by advisor execute itself (no torchrun results)")
    if steps < 2:
        raise AdvisorError(f"--steps must be at least 2 (the first step is warm-up), got {steps}")
    try:
        cfg = ps_config_from_plan(plan, steps=steps, tiny=tiny, dtype=dtype)
    except AdvisorError as exc:
        raise AdvisorError(f"{origin}: {exc}") from None
    if nproc is not None and nproc != cfg.servers + cfg.workers:
        raise AdvisorError(f"--nproc {nproc} differs from the plan's {cfg.servers} servers + {cfg.workers} workers")
    check_fits(cfg, oversubscribe)
    spec = {"plan": plan, "steps": steps, "tiny": tiny, "dtype": dtype}
    result = launch_ps(spec, cfg, PsLaunchOptions(timeout_s=timeout_s, pg_timeout_s=pg_timeout_s, workdir=workdir))
    servers = sorted((r for r in result["ranks"] if r["role"] == "server"), key=lambda r: r["rank"])
    if cfg.synchronous:
        reference = run_reference(cfg, servers[0]["contributors"])
    else:       # the order the servers applied the pushes in, replayed (None: hybrid)
        reference = replay(cfg, servers) if cfg.mode == "ps" else None
    executed = predict(executed_plan(plan, cfg)) if predict is not None else None
    prediction = executed if executed is not None else plan.get("prediction")
    if not isinstance(prediction, dict) or not ({"worker_memory_gib", "server_memory_gib"} & set(prediction)):
        prediction = None
    return build_ps_report(cfg, result, reference, prediction, [], prediction_is_executed=executed is not None)


def executed_plan(plan: dict[str, Any], cfg: PsConfig) -> dict[str, Any]:
    """The plan as it ran: the executed model (--tiny sizes), batch, optimizer and fp32."""
    out = copy.deepcopy(plan)
    out["model"] = executed_model(cfg, str((plan.get("model") or {}).get("name", "executed")))
    out["training"] = {**(plan.get("training") or {}), "global_batch_size": cfg.global_batch_size,
                       "optimizer": cfg.optimizer, "dtype": "fp32"}
    # the batch as it ran: each worker takes an even share in one micro-batch
    out["parallel"] = {**(plan.get("parallel") or {}), "micro_batch_size": cfg.global_batch_size // cfg.workers,
                       "num_micro_batches": 1}
    out.pop("prediction", None)
    return out
