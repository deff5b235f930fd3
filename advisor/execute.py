"""Run a plan on torch.distributed and compare what happened with what advisor predicted.

    load plan -> refuse what cannot run or does not fit (before any process starts) -> start one
    process per device -> collect per-rank results -> single-process reference run -> compare
    losses, memory by part and step time with the prediction -> report (dict, JSON-ready)

The executor proper (advisor.executor) reads only the plan JSON; this module is where the cost
model comes in: ``advisor.cost.estimate`` gives the predicted memory (for the executed model: the
--tiny shrink when asked, in the executed dtype and attention) and, with a profile of this machine
(``advisor calibrate``), the predicted step time.

Across machines, start the same worker with torchrun on every node, then compare here:

    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
        -m advisor.executor.worker --plan plan.json --tiny --steps 5 --out-dir /shared/run1
    advisor execute plan.json --tiny --steps 5 --results /shared/run1/results.json
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from advisor.errors import AdvisorError, InfeasibleError
from advisor.executor.config import RunConfig, run_config_from_plan, run_config_to_dict

LOSS_GOAL = 1e-4
MEMORY_GOAL = 0.10
TIME_GOAL = 0.25
GIB = 2.0 ** 30
# per-rank measured part -> the prediction it is compared with
COMPARED_PARTS = {
    "parameters": "parameters",
    "gradients": "gradients",
    "optimizer": "optimizer",
    "activations_per_microbatch": "activations_per_microbatch",
}


@dataclass(frozen=True)
class ExecuteOptions:
    nproc: int | None = None
    steps: int = 5
    tiny: bool = False
    tiny_scale: int = 1                   # --tiny-scale: wider and longer tiny model (time checks on CPU)
    dtype: str | None = None             # run in this dtype instead of the plan's (fp32 only today)
    time_hardware: str | None = None      # profile of this machine (advisor calibrate) for the time prediction
    timeout_s: float = 900.0
    pg_timeout_s: float = 60.0
    backend: str = "auto"
    results: str | None = None            # results.json written by torchrun workers: compare, do not launch
    workdir: str | None = None


# ---- plan --------------------------------------------------------------------------------------
def read_plan(path: str | Path) -> dict[str, Any]:
    from advisor.plan import read_plan_dict

    return read_plan_dict(path)


def _validated_plan(plan: dict[str, Any], origin: str):
    """advisor's own Plan (for the cost model), or None where the plan uses an executor-only
    extension (zero-bubble schedules). Other validation errors refuse the plan."""
    from advisor.executor.config import ZERO_BUBBLE
    from advisor.plan import plan_from_dict

    if plan.get("parallel", {}).get("pipeline_schedule") in ZERO_BUBBLE:
        return None
    return plan_from_dict(plan, origin)


# ---- prediction --------------------------------------------------------------------------------
def _strategy(cfg: RunConfig):
    from advisor.space.strategy import Strategy

    p = cfg.parallel
    return Strategy(dp=p.dp, tp=p.tp, pp=p.pp, cp=p.cp, ep=p.ep, sequence_parallel=p.sequence_parallel,
                    virtual_pipeline_stages=p.virtual_pipeline_stages, micro_batch_size=p.micro_batch_size,
                    num_micro_batches=p.num_micro_batches, zero_stage=p.zero_stage, recompute=p.recompute,
                    recompute_layers=p.recompute_layers, pipeline_schedule=p.pipeline_schedule,
                    stage_layers=tuple(p.stage_layers), offload_optimizer=p.offload_optimizer,
                    mesh_order=tuple(p.mesh_order))


def _model_spec(cfg: RunConfig):
    from advisor.specs.model import model_from_dict

    m = cfg.model
    return model_from_dict({
        "name": "executed", "source": "advisor execute", "num_layers": m.num_layers, "hidden_size": m.hidden_size,
        "num_attention_heads": m.num_attention_heads, "num_kv_heads": m.num_kv_heads,
        "ffn_hidden_size": m.ffn_hidden_size, "ffn_activation": m.ffn_activation, "vocab_size": m.vocab_size,
        "seq_length": m.seq_length, "tie_embeddings": m.tie_embeddings, "norm": m.norm, "use_bias": m.use_bias,
        "position_embedding": m.position_embedding}, "executed model")


def _estimate(cfg: RunConfig, hardware):
    """advisor's Estimate for exactly the executed run (model, dtype, attention, strategy), or None
    when the cost model cannot express it (zero-bubble schedules)."""
    from advisor.cost.estimate import estimate
    from advisor.executor.config import ZERO_BUBBLE
    from advisor.specs.job import Cluster, TrainingJob

    if cfg.parallel.pipeline_schedule in ZERO_BUBBLE:
        return None
    # what the executor runs: no dropout, PyTorch's tensor/sequence-parallel layers
    job = TrainingJob(global_batch_size=cfg.global_batch_size, seq_length=cfg.seq_length, dtype=cfg.dtype,
                      optimizer=cfg.optimizer, attention=cfg.model.attention, dropout=False, framework="pytorch",
                      overlap_grad_reduce=False)   # ZeRO-0/1 average gradients after accumulation
    per_node = hardware.node.devices_per_node
    world = cfg.parallel.world_size
    cluster = Cluster(nodes=-(-world // per_node), devices=world)
    return estimate(_model_spec(cfg), hardware, cluster, job, _strategy(cfg))


predict = _estimate


def memory_prediction(est) -> dict[str, float] | None:
    if est is None:
        return None
    m = est.memory_gib
    out = {k: getattr(m, k) * GIB for k in ("parameters", "gradients", "optimizer", "activations", "buffers", "total")}
    out["activations_per_microbatch"] = est.activation_gib_per_microbatch * GIB
    out["stage"] = est.worst_memory_stage
    return out


# ---- refusals before launch --------------------------------------------------------------------
def _host_memory_bytes() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def check_fits(plan: dict[str, Any], cfg: RunConfig, hardware, validated, options: ExecuteOptions) -> list[str]:
    """Sentences for what does not fit: the plan on its own hardware, the run on this machine."""
    problems = []
    if validated is not None:
        from advisor.cost.estimate import estimate

        e = estimate(validated.model, validated.hardware, validated.cluster, validated.training, validated.strategy)
        if not e.feasible:
            problems.append(f"the plan does not fit its hardware ({validated.hardware.name}): " + "; ".join(e.reasons))
    run_est = _estimate(cfg, hardware)
    if run_est is not None:
        per_rank = (run_est.memory_gib.total - run_est.memory_gib.buffers) * GIB
        need = per_rank * cfg.parallel.world_size
        avail = _host_memory_bytes()
        if _device_type(options) == "cpu" and avail is not None and need > 0.8 * avail:
            problems.append(f"the run needs about {need / GIB:.1f} GiB on this machine ({cfg.parallel.world_size} ranks x "
                            f"{per_rank / GIB:.2f} GiB) but {avail / GIB:.1f} GiB is available; use --tiny")
    return problems


def _device_type(options: ExecuteOptions) -> str:
    if options.backend == "gloo":
        return "cpu"
    try:
        import torch
        return "cuda" if (options.backend == "nccl" or torch.cuda.is_available()) else "cpu"
    except ImportError:
        return "cpu"


# ---- comparison --------------------------------------------------------------------------------
def _rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b) if b else (0.0 if a == b else math.inf)


def compare_losses(parallel: list[float], reference: list[float]) -> float:
    return max(_rel(a, b) for a, b in zip(parallel, reference, strict=True))


def compare_memory(ranks: list[dict], prediction: dict[str, float] | None) -> dict[str, Any]:
    """Per rank: measured bytes by part; on the predicted worst stage's ranks, the relative error of
    each compared part (the prediction describes one device of that stage)."""
    rows, worst = [], None
    stage = prediction["stage"] if prediction else None
    for r in ranks:
        measured = r["memory_bytes"]
        row = {"rank": r["rank"], "coords": r["coords"], "measured_bytes": measured, "predicted_bytes": None,
               "rel_error": None}
        if prediction is not None and r["coords"]["pp"] == stage:
            row["predicted_bytes"] = {m: prediction[p] for m, p in COMPARED_PARTS.items()}
            row["rel_error"] = {m: _rel(measured[m], prediction[p]) for m, p in COMPARED_PARTS.items()}
            row["predicted_bytes"]["activations_in_flight"] = prediction["activations"]
            row["rel_error_in_flight"] = _rel(measured["activations_in_flight"], prediction["activations"])
            top = max(row["rel_error"].values())
            worst = top if worst is None else max(worst, top)
        rows.append(row)
    return {"predicted_stage": stage, "prediction_bytes": prediction, "ranks": rows, "max_rel_error": worst,
            "compared_parts": list(COMPARED_PARTS), "goal": MEMORY_GOAL}


def measured_step_time_s(ranks: list[dict]) -> float:
    """The slowest rank's median step time (steps after the first)."""
    return max(r["median_step_time_s"] for r in ranks)


def calibrated_probe_us(hw) -> float | None:
    """What ``advisor calibrate``'s host probe (one tiny layer forward + backward) took when the
    profile was measured: its launch overhead is that time over the cost model's kernels per layer."""
    from advisor.cost.estimate import KERNELS_BACKWARD, KERNELS_FORWARD

    us = hw.device.launch_overhead_us * (KERNELS_FORWARD + KERNELS_BACKWARD)
    return us if us > 0 else None


def host_speed(ranks: list[dict], calibrated_us: float | None) -> dict[str, Any] | None:
    """The host probe run on every rank right before and after the timed steps, next to the
    profile's: above 1, this machine ran slower during the run than when it was calibrated."""
    probes = [x for r in ranks for x in r.get("host_probe_us", [])]
    if not probes:
        return None
    during = statistics.median(probes)
    return {"probes_us": [r.get("host_probe_us") for r in ranks], "during_run_us": during,
            "calibrated_us": calibrated_us, "slowdown": during / calibrated_us if calibrated_us else None,
            "spread": max(probes) / min(probes)}


def slowest_phases(ranks: list[dict]) -> dict[str, float] | None:
    """The median phases (forward + backward, gradient sync, optimizer) of the slowest rank."""
    slowest = max(ranks, key=lambda r: r["median_step_time_s"])
    return slowest.get("median_phase_times_s")


def build_report(cfg: RunConfig, ranks: list[dict], reference: dict, memory_pred, time_est, backend: str,
                 notes: list[str], calibrated_us: float | None = None) -> dict[str, Any]:
    ranks = sorted(ranks, key=lambda r: r["rank"])
    losses = ranks[0]["losses"]
    loss_diff = compare_losses(losses, reference["losses"])
    norm_diff = compare_losses(ranks[0]["grad_norms"], reference["grad_norms"])
    memory = compare_memory(ranks, memory_pred)
    step = measured_step_time_s(ranks)
    cpu_step = max(r["median_cpu_step_time_s"] for r in ranks) if all("median_cpu_step_time_s" in r for r in ranks) else None
    predicted_step = time_est.step_time_s if time_est is not None else None
    ratio = step / predicted_step if predicted_step else None
    return {
        "name": cfg.name,
        "executed": {"model": run_config_to_dict(cfg)["model"], "parallel": run_config_to_dict(cfg)["parallel"],
                     "seq_length": cfg.seq_length, "global_batch_size": cfg.global_batch_size, "dtype": cfg.dtype,
                     "optimizer": cfg.optimizer, "steps": cfg.steps, "world_size": cfg.parallel.world_size,
                     "backend": backend},
        "notes": list(cfg.notes) + notes,
        "loss_max_rel_diff": loss_diff,
        "grad_norm_max_rel_diff": norm_diff,
        "memory_max_rel_error": memory["max_rel_error"],
        "time_ratio": ratio,
        "loss": {"parallel": losses, "reference": reference["losses"], "goal": LOSS_GOAL, "ok": loss_diff <= LOSS_GOAL},
        "grad_norm": {"parallel": ranks[0]["grad_norms"], "reference": reference["grad_norms"]},
        "memory": memory,
        "time": {"measured_step_s": step, "predicted_step_s": predicted_step, "ratio": ratio, "goal": TIME_GOAL,
                 "measured_cpu_step_s": cpu_step,
                 "cpu_ratio": cpu_step / predicted_step if (predicted_step and cpu_step is not None) else None,
                 "load_average": max((r.get("load_average") or 0.0) for r in ranks),
                 "predicted_parts_s": dict(time_est.time_s) if time_est is not None else None,
                 "per_rank_median_s": [r["median_step_time_s"] for r in ranks],
                 "measured_phases_s": slowest_phases(ranks), "host_speed": host_speed(ranks, calibrated_us)},
        "ranks": ranks,
    }


# ---- the command -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Prepared:
    """A plan checked and predicted, ready to run."""

    cfg: RunConfig
    memory_prediction: dict[str, float] | None
    time_estimate: Any
    notes: tuple[str, ...]
    calibrated_probe_us: float | None = None   # the time profile's host-speed probe (see host_speed)


def prepare_plan(plan: dict[str, Any], origin: str, options: ExecuteOptions) -> Prepared:
    """Everything done before any process starts: refuse, check the fit, predict."""
    from advisor.specs.hardware import hardware_from_dict, load_hardware

    cfg = run_config_from_plan(plan, steps=options.steps, tiny=options.tiny, dtype=options.dtype,
                               tiny_scale=options.tiny_scale)
    world = cfg.parallel.world_size
    if options.nproc is not None and options.nproc != world:
        raise AdvisorError(f"--nproc {options.nproc} differs from the plan's device count dp x tp x pp x cp = {world}")
    if options.steps < 2:
        raise AdvisorError(f"--steps must be at least 2 (the first step is warm-up), got {options.steps}")
    validated = _validated_plan(plan, origin)
    hardware = validated.hardware if validated is not None else hardware_from_dict(plan["hardware"], f"{origin}: hardware")
    problems = check_fits(plan, cfg, hardware, validated, options)
    if problems:
        raise InfeasibleError("refused before starting any process: " + "; ".join(problems))
    notes = []
    memory_pred = memory_prediction(_estimate(cfg, hardware))
    if memory_pred is None:
        notes.append("advisor's cost model does not model zero-bubble schedules: no prediction")
    time_est, probe_us = None, None
    if options.time_hardware is not None:
        time_hw = load_hardware(options.time_hardware)
        time_est = _estimate(cfg, time_hw)
        probe_us = calibrated_probe_us(time_hw)
    else:
        notes.append("no profile of this machine given (--hardware, from advisor calibrate): no time prediction")
    if cfg.parallel.recompute == "selective" and cfg.model.attention == "flash":
        notes.append("selective recomputation with flash attention recomputes nothing (the fused kernel keeps no scores)")
    return Prepared(cfg, memory_pred, time_est, tuple(notes), probe_us)


def run_prepared(prepared: list[Prepared], options: ExecuteOptions) -> list[dict[str, Any]]:
    """Run prepared plans, one launch per world size (plans of one size share the processes), and
    report each against its single-process reference."""
    from advisor.executor.launch import LaunchOptions, launch
    from advisor.executor.train import run_reference

    backend = "nccl" if _device_type(options) == "cuda" else "gloo"
    by_world: dict[int, list[int]] = {}
    for i, prep in enumerate(prepared):
        by_world.setdefault(prep.cfg.parallel.world_size, []).append(i)
    ranks_of: dict[int, list[dict]] = {}
    for world, indices in by_world.items():
        workdir = None if options.workdir is None else str(Path(options.workdir) / f"world{world}")
        opts = LaunchOptions(nproc=world, timeout_s=options.timeout_s, pg_timeout_s=options.pg_timeout_s,
                             backend=options.backend, workdir=workdir)
        per_rank = launch([run_config_to_dict(prepared[i].cfg) for i in indices], opts)
        for j, i in enumerate(indices):
            ranks_of[i] = [runs[j] for runs in per_rank]
    reports = []
    for i, prep in enumerate(prepared):
        reference = run_reference(prep.cfg)
        reports.append(build_report(prep.cfg, ranks_of[i], reference, prep.memory_prediction, prep.time_estimate,
                                    backend, list(prep.notes), prep.calibrated_probe_us))
    return reports


def execute(plan_path: str | Path, options: ExecuteOptions) -> dict[str, Any]:
    """Run the plan (or read torchrun results), compare, and return the report."""
    from advisor.executor.train import run_reference

    prep = prepare_plan(read_plan(plan_path), str(plan_path), options)
    if options.results is None:
        return run_prepared([prep], options)[0]
    ranks, backend = _read_results(options.results, prep.cfg)
    reference = run_reference(prep.cfg)
    return build_report(prep.cfg, ranks, reference, prep.memory_prediction, prep.time_estimate, backend,
                        list(prep.notes), prep.calibrated_probe_us)


def _read_results(path: str, cfg: RunConfig) -> tuple[list[dict], str]:
    p = Path(path)
    if p.is_dir():
        p = p / "results.json"
    if not p.is_file():
        raise AdvisorError(f"--results: {path} has no results.json (written by rank 0 of the torchrun workers)")
    data = json.loads(p.read_text())
    if data["world_size"] != cfg.parallel.world_size:
        raise AdvisorError(f"--results: {p} has {data['world_size']} ranks, the plan needs {cfg.parallel.world_size}")
    if data["configs"][0] != json.loads(json.dumps(run_config_to_dict(cfg))):
        raise AdvisorError(f"--results: {p} was produced by a different run (plan, --tiny, --steps or --dtype differ)")
    return [runs[0] for runs in data["ranks"]], data["backend"]


def summary_rows(report: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(what, measured, predicted, verdict) rows for the rich table."""
    rows = []
    lo = report["loss"]
    rows.append(("loss (last step)", f"{lo['parallel'][-1]:.6f}", f"{lo['reference'][-1]:.6f} (1 process)",
                 f"max rel diff {report['loss_max_rel_diff']:.1e} ({'ok' if lo['ok'] else 'FAIL'} <= {LOSS_GOAL:g})"))
    mem = report["memory"]
    stage_rows = [r for r in mem["ranks"] if r["rel_error"] is not None]
    for part in COMPARED_PARTS:
        if stage_rows:
            worst_row = max(stage_rows, key=lambda r: r["rel_error"][part])
            rows.append((f"{part} (rank {worst_row['rank']})", _mib(worst_row["measured_bytes"][part]),
                         _mib(worst_row["predicted_bytes"][part]), f"rel err {worst_row['rel_error'][part]:.1%}"))
        else:
            rows.append((part, _mib(max(r["measured_bytes"][part] for r in mem["ranks"])), "-", "no prediction"))
    t = report["time"]
    if t.get("load_average"):
        rows.append(("machine load (1-min average)", f"{t['load_average']:.1f}", "-",
                     f"CPU time {t['measured_cpu_step_s'] * 1e3:.1f} ms per step"))
    speed = t.get("host_speed")
    if speed and speed["slowdown"]:
        rows.append(("host probe (tiny layer fwd+bwd)", f"{speed['during_run_us']:.0f} us",
                     f"{speed['calibrated_us']:.0f} us (calibrated)",
                     f"machine {speed['slowdown']:.2f}x as slow as when calibrated"))
    phases, parts = t.get("measured_phases_s"), t.get("predicted_parts_s")
    if phases and parts:
        busy = sum(v for k, v in parts.items() if k not in ("dp_comm", "optimizer", "offload"))
        rows.append(("  forward + backward", f"{phases['forward_backward'] * 1e3:.1f} ms", f"{busy * 1e3:.1f} ms",
                     "compute, host, bubble, tp/pp comm"))
        rows.append(("  gradient sync + optimizer", f"{(phases['gradient_sync'] + phases['optimizer']) * 1e3:.1f} ms",
                     f"{(parts['dp_comm'] + parts['optimizer']) * 1e3:.1f} ms", "dp comm, optimizer"))
    rows.append(("step time (median)", f"{t['measured_step_s'] * 1e3:.1f} ms",
                 f"{t['predicted_step_s'] * 1e3:.1f} ms" if t["predicted_step_s"] else "-",
                 f"ratio {t['ratio']:.2f}" if t["ratio"] else "no profile (--hardware)"))
    return rows


def _mib(nbytes: float) -> str:
    return f"{nbytes / 2 ** 20:.3f} MiB"


def write_report(report: dict[str, Any], path: str | Path) -> None:
    try:
        Path(path).write_text(json.dumps(report, indent=1) + "\n")
    except OSError as exc:
        raise AdvisorError(f"cannot write the report to {path}: {exc.strerror}") from None


def render_report(console, report: dict[str, Any], saved_to: str | None = None) -> None:
    """The rich table: measured next to predicted, with the verdicts."""
    from rich.table import Table

    ex = report["executed"]
    p = ex["parallel"]
    vpp = f" x{p['virtual_pipeline_stages']} virtual" if p["virtual_pipeline_stages"] > 1 else ""
    title = (f"{report['name']}: dp {p['dp']} x tp {p['tp']}{' (sp)' if p['sequence_parallel'] else ''} x pp {p['pp']}"
             f" ({p['pipeline_schedule']}{vpp}), ZeRO {p['zero_stage']}, recompute {p['recompute']}; "
             f"{ex['world_size']} ranks over {ex['backend']}, {ex['steps']} steps")
    table = Table(title=title)
    for col in ("", "measured", "predicted", "verdict"):
        table.add_column(col)
    for row in summary_rows(report):
        table.add_row(*row)
    console.print(table)
    for note in report["notes"]:
        console.print(f"note: {note}", markup=False, highlight=False)
    if saved_to:
        console.print(f"report written to {saved_to}", markup=False, highlight=False)
