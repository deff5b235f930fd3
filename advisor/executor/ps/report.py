"""The report of a parameter-server run, in the structure of the other executor reports
(``loss_max_rel_diff``, ``memory_max_rel_error``, ``time_ratio``, ``ranks``), plus the roles.

* loss: server 0's mean of the losses pushed to it each step (the workers that contributed to that
  step's update) against the single-process reference on exactly those workers' samples.
* memory per role, measured: a server's parameters (its pieces), optimizer state and aggregated
  gradients; a worker's pulled and replicated parameters, their gradients, its local optimizer
  state (hybrid) and the bytes saved for backward by one step's forward.
* prediction: ``worker_memory_gib`` / ``server_memory_gib`` (the fullest server) and
  ``step_time_s``, either the plan's own ``prediction`` (compared only when the run is not --tiny:
  it describes the plan's model) or one made for the executed model by the caller (run_ps's
  ``predict``); without one the report holds the measurements and says so.
"""

from __future__ import annotations

import statistics
from typing import Any

from advisor.executor.ps.config import PsConfig

LOSS_GOAL = 1e-4
MEMORY_GOAL = 0.10
GIB = 2.0 ** 30
WORKER_PARTS = {"parameters": "parameters", "gradients": "gradients", "optimizer": "optimizer",
                "activations_per_microbatch": "activations"}
SERVER_PARTS = {"parameters": "parameters", "optimizer": "optimizer"}


def _rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b) if b else (0.0 if a == b else float("inf"))


def _median_after_first(times: list[float]) -> float:
    return statistics.median(times[1:] if len(times) > 1 else times)


def _compare(measured: dict, predicted_gib: dict | None, parts: dict[str, str]):
    if not predicted_gib:
        return None, None
    predicted = {m: float(predicted_gib[p]) * GIB for m, p in parts.items() if p in predicted_gib}
    return predicted, {m: _rel(measured[m], v) for m, v in predicted.items()}


def build_ps_report(cfg: PsConfig, result: dict, reference: dict, prediction: dict | None,
                    notes: list[str], prediction_is_executed: bool = False) -> dict[str, Any]:
    """``prediction_is_executed``: the prediction was made for the executed (--tiny) model and batch."""
    ranks = sorted(result["ranks"], key=lambda r: r["rank"])
    servers = [r for r in ranks if r["role"] == "server"]
    workers = [r for r in ranks if r["role"] == "worker"]
    first = servers[0]
    losses = first["losses"]
    loss_diff = max(_rel(a, b) for a, b in zip(losses, reference["losses"], strict=True))
    notes = list(cfg.notes) + notes
    if any(s["contributors"] != first["contributors"] for s in servers):
        notes.append("servers disagree on which workers contributed to a step (a worker died between its pushes)")
    left = []
    for x in result["left"]:
        step = next((e["step"] for e in first["left"] if e["worker"] == x["worker"]), None)
        left.append({**x, "step": step})
    compare = prediction is not None and (prediction_is_executed or not cfg.tiny)
    if not compare:
        notes.append("memory and time: measured only (" + ("--tiny runs a smaller model than the plan's prediction"
                     if prediction is not None else "no per-role prediction (prediction.worker_memory_gib, "
                     "prediction.server_memory_gib)") + ")")
    rows, worst = [], None
    fullest = max(servers, key=lambda s: s["memory_bytes"]["parameters"] + s["memory_bytes"]["optimizer"])
    for r in ranks:
        measured = r["memory_bytes"]
        pred, err = None, None
        if compare and r["role"] == "worker":
            pred, err = _compare(measured, prediction.get("worker_memory_gib"), WORKER_PARTS)
        elif compare and r is fullest:
            pred, err = _compare(measured, prediction.get("server_memory_gib"), SERVER_PARTS)
        if err:
            worst = max(worst or 0.0, max(err.values()))
        rows.append({"rank": r["rank"], "role": r["role"], "index": r["index"], "measured_bytes": measured,
                     "predicted_bytes": pred, "rel_error": err})
    step = max(_median_after_first(w["step_times_s"]) for w in workers)
    predicted_step = prediction.get("step_time_s") if compare else None
    ratio = step / predicted_step if predicted_step else None
    ps = {"mode": cfg.mode, "synchronous": cfg.synchronous, "servers": cfg.servers, "workers": cfg.workers,
          "server_placement": cfg.server_placement, "server_tensors": list(cfg.server_tensors),
          "pieces": [{"param": p.param, "server": p.server, "rows": [p.start, p.end]} for p in cfg.pieces],
          "replicated": cfg.replicated_params(), "left": left, "contributors": first["contributors"]}
    return {
        "name": cfg.name,
        "executed": {"model": executed_model(cfg), "parameter_server": {k: ps[k] for k in ("mode", "servers", "workers")},
                     "global_batch_size": cfg.global_batch_size, "dtype": "fp32", "optimizer": cfg.optimizer,
                     "learning_rate": cfg.learning_rate, "steps": cfg.steps, "world_size": cfg.servers + cfg.workers,
                     "backend": "gloo", "tiny": cfg.tiny},
        "parameter_server": ps,
        "notes": notes,
        "loss_max_rel_diff": loss_diff,
        "memory_max_rel_error": worst,
        "time_ratio": ratio,
        "loss": {"parallel": losses, "reference": reference["losses"], "goal": LOSS_GOAL, "ok": loss_diff <= LOSS_GOAL},
        "memory": {"ranks": rows, "max_rel_error": worst, "goal": MEMORY_GOAL,
                   "prediction_gib": {k: prediction.get(k) for k in ("worker_memory_gib", "server_memory_gib")} if compare else None},
        "time": {"measured_step_s": step, "predicted_step_s": predicted_step, "ratio": ratio,
                 "per_worker_median_s": [_median_after_first(w["step_times_s"]) for w in workers],
                 "per_server_median_s": [_median_after_first(s["step_times_s"]) for s in servers],
                 "per_step_s": {f"rank{r['rank']}": r["step_times_s"] for r in ranks}},
        "ranks": ranks,
    }


def executed_model(cfg: PsConfig, name: str = "executed") -> dict[str, Any]:
    """The model that ran, as a ``family: recommendation`` description (what a cost model reads)."""
    m = cfg.model
    tables = []
    for t in m.tables:
        row = {"name": t.name, "rows": t.rows, "dim": t.dim, "lookups_per_sample": t.lookups, "sparse": t.sparse}
        if t.pooling != "sum":
            row["pooling"] = t.pooling
        tables.append(row)
    return {"family": "recommendation", "name": name, "source": "advisor execute", "embedding_tables": tables,
            "dense": {"bottom_mlp": list(m.bottom_mlp), "top_mlp": list(m.top_mlp), "interaction": m.interaction},
            "dense_features": m.dense_features}


def summary_rows(report: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(what, measured, predicted, verdict) rows for the table."""
    lo = report["loss"]
    rows = [("loss (last step)", f"{lo['parallel'][-1]:.6f}", f"{lo['reference'][-1]:.6f} (1 process)",
             f"max rel diff {report['loss_max_rel_diff']:.1e} ({'ok' if lo['ok'] else 'FAIL'} <= {LOSS_GOAL:g})")]
    for row in report["memory"]["ranks"]:
        m = row["measured_bytes"]
        what = f"{row['role']} {row['index']} (rank {row['rank']})"
        measured = ", ".join(f"{k} {_size(v)}" for k, v in m.items())
        if row["rel_error"]:
            rows.append((what, measured, ", ".join(f"{k} {_size(v)}" for k, v in row["predicted_bytes"].items()),
                         f"max rel err {max(row['rel_error'].values()):.1%}"))
        else:
            rows.append((what, measured, "-", "measured only"))
    for x in report["parameter_server"]["left"]:
        rows.append((f"worker {x['worker']} (rank {x['rank']})", f"left at step {x['step']} ({x['signal']})", "-",
                     "isolated; the run went on without it"))
    t = report["time"]
    rows.append(("step time (median, slowest worker)", f"{t['measured_step_s'] * 1e3:.1f} ms",
                 f"{t['predicted_step_s'] * 1e3:.1f} ms" if t["predicted_step_s"] else "-",
                 f"ratio {t['ratio']:.2f}" if t["ratio"] else "no comparable prediction"))
    return rows


def _size(nbytes: float) -> str:
    return f"{nbytes / 2 ** 10:.1f} KiB" if nbytes < 2 ** 20 else f"{nbytes / 2 ** 20:.1f} MiB"


def ps_title(report: dict[str, Any]) -> str:
    """The title of the report's table (advisor.validation.execute_report.render_report draws it)."""
    ps, ex = report["parameter_server"], report["executed"]
    return (f"{report['name']}: {ps['mode']}, {ps['servers']} servers + {ps['workers']} workers "
            f"({ps['server_placement']}), {ex['optimizer']}, {ex['steps']} steps over gloo")
