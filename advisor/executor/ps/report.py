"""The report of a parameter-server run, in the structure of the other executor reports
(``loss_max_rel_diff``, ``memory_max_rel_error``, ``time_ratio``, ``ranks``), plus the roles.

* loss: server 0's mean of the losses pushed to it each step (the workers that contributed to that
  step's update) against the single-process reference on exactly those workers' samples.
  Asynchronous: every worker's loss of every step against the single-process replay of the
  servers' records (advisor.executor.ps.replay; ``mode: ps`` only), and the staleness of the
  applied pushes (updates between a gradient's pull and its push) against the cost model's.
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
    notes = list(cfg.notes) + notes
    if cfg.synchronous:
        losses, reference_losses = first["losses"], reference["losses"]
        loss_diff = max(_rel(a, b) for a, b in zip(losses, reference_losses, strict=True))
    else:
        losses, reference_losses, loss_diff = _async_losses(workers, reference, notes)
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
    failover = _failover(result, servers, workers)
    for f in failover:
        notes.append(f"server {f['server']} was killed by {f['signal']} in step {f['step']}; server {f['backup']} took "
                     f"its shard over from its copy at step {f['from_step']}, and every worker replayed to it from "
                     f"there (answers equal to the lost server's: no update lost)")
    ps = {"mode": cfg.mode, "synchronous": cfg.synchronous, "servers": cfg.servers, "workers": cfg.workers,
          "replicas": cfg.replicas, "failover": failover,
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
        "loss": {"parallel": losses, "reference": reference_losses, "goal": LOSS_GOAL,
                 "ok": loss_diff is not None and loss_diff <= LOSS_GOAL},
        **({} if cfg.synchronous else {"staleness": _staleness(servers, prediction)}),
        "memory": {"ranks": rows, "max_rel_error": worst, "goal": MEMORY_GOAL,
                   "prediction_gib": {k: prediction.get(k) for k in ("worker_memory_gib", "server_memory_gib")} if compare else None},
        "time": {"measured_step_s": step, "predicted_step_s": predicted_step, "ratio": ratio,
                 "per_worker_median_s": [_median_after_first(w["step_times_s"]) for w in workers],
                 "per_server_median_s": [_median_after_first(s["step_times_s"]) for s in servers],
                 "per_step_s": {f"rank{r['rank']}": r["step_times_s"] for r in ranks}},
        "ranks": ranks,
    }


def _failover(result: dict, servers: list[dict], workers: list[dict]) -> list[dict]:
    """Each server lost and taken over: the scheduler's record, the step the backup's copy had reached, and the
    steps each worker replayed (advisor.executor.ps.server, worker)."""
    out = []
    for lost in result.get("servers_left", []):
        taken = next((a for s in servers for a in s.get("adopted", []) if a["server"] == lost["server"]), None)
        if taken is None:
            continue
        replays = [{"worker": w["index"], "from_step": t["from_step"], "at_step": t["at_step"]}
                   for w in workers for t in w.get("takeovers", []) if t["shard"] == lost["server"]]
        out.append({**lost, "from_step": taken["from_step"], "replays": replays})
    return out


def _async_losses(workers: list[dict], replayed: dict | None, notes: list[str]):
    """(mean worker loss per step, the replay's mean on the same workers, max relative difference
    over every worker and step) of an asynchronous run; the last two None without a replay."""
    steps = max(len(w["losses"]) for w in workers)
    mean = [statistics.fmean(w["losses"][k] for w in workers if k < len(w["losses"])) for k in range(steps)]
    if replayed is None:
        notes.append("loss: an asynchronous hybrid run is not replayed (its replicated tensors follow the workers' "
                     "all-reduce groups); the workers' losses are reported alone")
        return mean, None, None
    pairs = [(w["losses"][k], replayed[(w["index"], k)]) for w in workers for k in range(len(w["losses"]))]
    reference = [statistics.fmean(replayed[(w["index"], k)] for w in workers if k < len(w["losses"]))
                 for k in range(steps)]
    return mean, reference, max(_rel(a, b) for a, b in pairs)


def _staleness(servers: list[dict], prediction: dict | None) -> dict[str, Any]:
    """Updates applied between a push's pull and itself, over every server: mean and largest, from
    the second step on (the first pushes land on weights few updates have changed yet)."""
    later = [x for s in servers for x, (_, step, _) in zip(s["async"]["staleness"], s["async"]["applied"]) if step >= 1]
    every = [x for s in servers for x in s["async"]["staleness"]]
    return {"mean": statistics.fmean(later) if later else None, "max": max(every) if every else None,
            "predicted": (prediction or {}).get("staleness_steps")}


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
    ps = report["parameter_server"]
    if lo["reference"] is None:
        rows = [("loss (last step, mean of workers)", f"{lo['parallel'][-1]:.6f}", "-", "not replayed (hybrid, async)")]
    else:
        ref = "1 process" if ps["synchronous"] else "1-process replay"
        rows = [("loss (last step)", f"{lo['parallel'][-1]:.6f}", f"{lo['reference'][-1]:.6f} ({ref})",
                 f"max rel diff {report['loss_max_rel_diff']:.1e} ({'ok' if lo['ok'] else 'FAIL'} <= {LOSS_GOAL:g})")]
    st = report.get("staleness")
    if st is not None and st["mean"] is not None:
        rows.append(("staleness (updates, mean from step 1)", f"{st['mean']:.2f} (max {st['max']})",
                     f"{st['predicted']:g}" if st["predicted"] is not None else "-", "asynchronous"))
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
    return (f"{report['name']}: {ps['mode']}{'' if ps['synchronous'] else ' (asynchronous)'}, {ps['servers']} "
            f"servers + {ps['workers']} workers "
            f"({ps['server_placement']}), {ex['optimizer']}, {ex['steps']} steps over gloo")
