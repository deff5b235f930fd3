"""The validation report of ``advisor execute``: compare what the ranks measured with the
single-process reference (losses, gradient norms) and with advisor's prediction (memory by part,
step time), and render or write it.

A report is a dict; ``json_ready`` makes the copy that is printed or written: a figure that is not
finite (a diverged loss, a relative error against a prediction of zero) becomes null, with a note.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from advisor.executor.config import LOSS_GOALS, RunConfig, run_config_to_dict
from advisor.runtime.files import write_json

LOSS_GOAL = LOSS_GOALS["fp32"]     # the goal of fp32 runs; each dtype's in LOSS_GOALS
MEMORY_GOAL = 0.10
TIME_GOAL = 0.25
GIB = 2.0 ** 30
# per-rank measured part -> the prediction it is compared with
COMPARED_PARTS = {
    "parameters": "parameters",
    "gradients": "gradients",
    "optimizer": "optimizer",
    "activations_per_microbatch": "activations_per_microbatch",
    "host_optimizer": "host_optimizer",     # optimizer offload: the states the host keeps and steps
    "host_activations": "host_activations",     # swapped layers: their saved activations on the host, at the peak
    "host_params": "host_params",     # parameter offload: the weight and gradient shards the host keeps
    "host_embedding": "host_embedding",     # the word embedding on the host: its fp32 table, gradient and states
}
# shown only where a run or its prediction has them
HOST_PARTS = ("host_optimizer", "host_activations", "host_params", "host_embedding")


# ---- comparison --------------------------------------------------------------------------------
def _rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b) if b else (0.0 if a == b else math.inf)


def compare_losses(parallel: list[float], reference: list[float]) -> float:
    return max(_rel(a, b) for a, b in zip(parallel, reference, strict=True))


def compare_memory(ranks: list[dict], prediction: dict[str, float] | None) -> dict[str, Any]:
    """Per rank: measured bytes by part and the relative error of each compared part against the prediction for
    one device of its own pipeline stage (``prediction["stages"]``; a prediction without it describes the worst
    stage only, whose ranks alone are then compared). The activations in flight are compared on the worst stage."""
    rows, worst = [], None
    stage = prediction["stage"] if prediction else None
    stages = prediction.get("stages") if prediction else None
    for r in ranks:
        measured = r["memory_bytes"]
        row = {"rank": r["rank"], "coords": r["coords"], "measured_bytes": measured, "predicted_bytes": None,
               "rel_error": None}
        own = r["coords"]["pp"]
        predicted = (stages[own] if stages is not None and own < len(stages) else
                     {p: prediction[p] for p in COMPARED_PARTS.values()} if prediction is not None and own == stage
                     else None)
        if predicted is not None:
            row["predicted_bytes"] = {m: predicted[p] for m, p in COMPARED_PARTS.items()}
            row["rel_error"] = {m: _rel(measured[m], predicted[p]) for m, p in COMPARED_PARTS.items()}
            if own == stage:
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
    loss_goal = LOSS_GOALS.get(cfg.dtype, LOSS_GOAL)
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
        "loss": {"parallel": losses, "reference": reference["losses"], "goal": loss_goal, "ok": loss_diff <= loss_goal},
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


# ---- the verdict --------------------------------------------------------------------------------
def verdict(report: dict[str, Any]) -> dict[str, Any]:
    """Each figure against its goal, for every report kind (transformer, parameter server, supernet):
    the losses within LOSS_GOAL of the single-process reference (a supernet's within its tolerance),
    every compared memory part within MEMORY_GOAL of the prediction, and, where the profile given
    with --hardware was calibrated by advisor calibrate (it carries the host probe), the step time
    within TIME_GOAL. ``ok`` is False when any fails; ``failures`` says which, one sentence each;
    ``unchecked`` names what had nothing to compare with."""
    failures, unchecked = [], []
    if report.get("kind") == "supernet":
        if not report["losses_match"]:
            failures.append(f"the pipeline's losses differ from sequential training's by up to "
                            f"{report['max_loss_difference']:.1e}")
        return {"ok": not failures, "failures": failures, "unchecked": unchecked}
    loss = report["loss_max_rel_diff"]
    goal = (report.get("loss") or {}).get("goal", LOSS_GOAL)
    if loss is None or not math.isfinite(loss) or loss > goal:
        failures.append(f"loss: largest relative difference from the single-process run {_figure(loss)} is above "
                        f"the goal {goal:g}")
    memory = report["memory_max_rel_error"]
    if memory is None:
        unchecked.append("memory: no prediction to compare with")
    elif not math.isfinite(memory) or memory > MEMORY_GOAL:
        failures.append(f"memory: {_worst_memory(report)} is {_figure(memory, '.1%')} off the prediction, above the "
                        f"goal {MEMORY_GOAL:.0%}")
    t = report.get("time") or {}
    speed = t.get("host_speed") or {}
    if t.get("ratio") is None:
        unchecked.append("time: no profile of this machine (--hardware)")
    elif not speed.get("calibrated_us"):
        unchecked.append("time: the profile was not calibrated by advisor calibrate on a machine like this one")
    elif abs(t["ratio"] - 1.0) > TIME_GOAL:
        failures.append(f"time: the measured step is {t['ratio']:.2f}x the predicted one, outside the goal of "
                        f"+-{TIME_GOAL:.0%}")
    return {"ok": not failures, "failures": failures, "unchecked": unchecked}


def _figure(x: float | None, fmt: str = ".1e") -> str:
    return "not finite" if x is None or not math.isfinite(x) else format(x, fmt)


def _worst_memory(report: dict[str, Any]) -> str:
    """'activations_per_microbatch on rank 1' (or a role: 'parameters on server 0') of the largest error."""
    worst = None
    for r in report["memory"]["ranks"]:
        for part, err in (r.get("rel_error") or {}).items():
            if err is not None and (worst is None or not math.isfinite(err) or err > worst[0]):
                who = f"rank {r['rank']}" if "rank" in r else f"{r.get('role', 'process')} {r.get('index', '')}".strip()
                worst = (err, f"{part} on {who}")
    return worst[1] if worst else "a compared part"


def summary_rows(report: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(what, measured, predicted, verdict) rows for the rich table."""
    rows = []
    lo = report["loss"]
    rows.append(("loss (last step)", f"{lo['parallel'][-1]:.6f}", f"{lo['reference'][-1]:.6f} (1 process)",
                 f"max rel diff {report['loss_max_rel_diff']:.1e} ({'ok' if lo['ok'] else 'FAIL'} <= {lo['goal']:g})"))
    mem = report["memory"]
    stage_rows = [r for r in mem["ranks"] if r["rel_error"] is not None]
    for part in COMPARED_PARTS:
        if part in HOST_PARTS and not any(
                r["measured_bytes"].get(part) or (r["predicted_bytes"] or {}).get(part) for r in mem["ranks"]):
            continue    # no offload or swapping: nothing on the host either way
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


def json_ready(report: dict[str, Any]) -> dict[str, Any]:
    """A copy of the report with every non-finite number (a diverged loss, a relative error against
    a prediction of zero) as null, and a note saying so: JSON has no Infinity or NaN (RFC 8259)."""
    replaced: list[int] = []

    def clean(x):
        if isinstance(x, float) and not math.isfinite(x):
            replaced.append(1)
            return None
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        return x

    out = clean(report)
    if replaced:
        out["notes"] = list(out.get("notes", [])) + [
            f"{len(replaced)} figure(s) were not finite (NaN or infinity) and are written as null"]
    return out


def write_report(report: dict[str, Any], path: str | Path) -> None:
    write_json(path, json_ready(report), what="the report")


def render_report(console, report: dict[str, Any], saved_to: str | None = None) -> None:
    """The rich table: measured next to predicted, with the verdicts."""
    from rich.table import Table

    if report.get("kind") == "supernet":
        return _render_supernet(console, report, saved_to)
    if "parameter_server" in report:
        from advisor.executor.ps.report import ps_title, summary_rows as rows_of
        title = ps_title(report)
    else:
        ex = report["executed"]
        p = ex["parallel"]
        vpp = f" x{p['virtual_pipeline_stages']} virtual" if p["virtual_pipeline_stages"] > 1 else ""
        title = (f"{report['name']}: dp {p['dp']} x tp {p['tp']}{' (sp)' if p['sequence_parallel'] else ''} x pp "
                 f"{p['pp']} ({p['pipeline_schedule']}{vpp}), ZeRO {p['zero_stage']}, recompute {p['recompute']}; "
                 f"{ex['world_size']} ranks over {ex['backend']}, {ex['steps']} steps")
        rows_of = summary_rows
    table = Table(title=title)
    for col in ("", "measured", "predicted", "verdict"):
        table.add_column(col)
    for row in rows_of(report):
        table.add_row(*row)
    console.print(table)
    for note in report["notes"]:
        console.print(f"note: {note}", markup=False, highlight=False)
    _render_verdict(console, report)
    if saved_to:
        console.print(f"report written to {saved_to}", markup=False, highlight=False)


def _render_verdict(console, report: dict[str, Any]) -> None:
    v = report.get("verdict")
    if v is None:
        return
    head = "verdict: every checked figure meets its goal" if v["ok"] else "verdict: FAIL"
    console.print(head + (f" (not checked: {'; '.join(v['unchecked'])})" if v["unchecked"] else ""),
                  markup=False, highlight=False)
    for failure in v["failures"]:
        console.print(f"  FAIL {failure}", markup=False, highlight=False)


def _render_supernet(console, report: dict[str, Any], saved_to: str | None) -> None:
    """A supernet run (advisor.executor.supernet.run): the pipeline's losses next to sequential training's."""
    from rich.table import Table

    table = Table(title=f"{report['model']} supernet{' (tiny)' if report['tiny'] else ''}: {report['subnets']} "
                        f"subnets on {report['stages']} pipeline stages {report['stage_layers']} in NASPipe's order, "
                        "against sequential training on one process")
    for col in ("subnet", "pipeline loss", "sequential loss", "difference"):
        table.add_column(col, justify="right")
    for j, (a, b) in enumerate(zip(report["losses"], report["sequential_losses"])):
        table.add_row(str(j), f"{a:.6f}", f"{b:.6f}", f"{abs(a - b):.1e}")
    console.print(table)
    word = "match" if report["losses_match"] else "DIFFER"
    console.print(f"losses {word}: largest difference {report['max_loss_difference']:.1e} (tolerance "
                  f"{report['tolerance']:g}); {report['overtakes']} forwards ran ahead of an earlier subnet "
                  f"held back by a shared block; pipeline {report['pipeline_s']:.2f} s, sequential {report['sequential_s']:.2f} s "
                  "(CPU ranks: times are not the plan's)", markup=False, highlight=False)
    if saved_to:
        console.print(f"report written to {saved_to}", markup=False, highlight=False)
