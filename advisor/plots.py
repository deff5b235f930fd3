"""Plots (matplotlib, Agg backend: files only, no display needed).

* whatif_plot: throughput and time to train versus device count, one line per hardware variant
  (series), each with its ideal linear-scaling line from the series' smallest fitting point.
* recommendation_plot: the top plans' step time broken down by part as stacked bars, and their
  memory per device by part against the device capacity.

matplotlib is an optional dependency (pip install 'advisor[plot]'); without it these functions raise
AdvisorError naming the --plot flag.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from advisor.errors import AdvisorError

if TYPE_CHECKING:  # pragma: no cover
    from advisor.plan import Plan
    from advisor.whatif import WhatIfResult

TIME_PARTS = ("compute", "recompute", "tp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm", "bubble", "optimizer",
              "offload")
TIME_LABELS = {"compute": "compute", "recompute": "recompute", "tp_comm": "TP comm", "cp_comm": "CP comm",
               "ep_comm": "EP comm", "pp_comm": "PP comm", "dp_comm": "DP comm", "bubble": "pipeline bubble",
               "optimizer": "optimizer step", "offload": "offload (host)"}
MEMORY_PARTS = ("parameters", "gradients", "optimizer", "activations", "buffers")


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise AdvisorError("--plot needs matplotlib: pip install 'advisor[plot]'") from None
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: str | Path) -> Path:
    path = Path(path)
    if path.parent and not path.parent.exists():
        raise AdvisorError(f"--plot: folder {path.parent} does not exist")
    try:
        fig.savefig(path, dpi=120, bbox_inches="tight")
    except (OSError, ValueError) as exc:
        raise AdvisorError(f"--plot: cannot write {path}: {exc}") from None
    return path


def _series_label(key: tuple, many_batches: bool) -> str:
    variant, gbs, seq = key
    return f"{variant} (gbs {gbs}, seq {seq})" if many_batches else variant


def whatif_plot(result: "WhatIfResult", path: str | Path) -> Path:
    """Throughput and time to train versus devices, per hardware variant, with ideal linear scaling."""
    plt = _pyplot()
    series: dict[tuple, list] = {}
    for p in result.points:
        series.setdefault(p.series, []).append(p)
    many_batches = len({(k[1], k[2]) for k in series}) > 1
    fig, (ax_tps, ax_time) = plt.subplots(1, 2, figsize=(13, 5))
    budget = result.train_tokens
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    tokens = budget if budget else 1e9
    longest_h = max((tokens / p.tokens_per_s / 3600.0 for p in result.points if p.fits), default=0.0)
    unit, per_hour = ("days", 1 / 24.0) if longest_h > 72 else ("hours", 1.0)
    drew = False
    for i, (key, pts) in enumerate(series.items()):
        color = colors[i % len(colors)]
        fit = sorted((p for p in pts if p.fits), key=lambda p: p.devices)
        if not fit:
            continue
        drew = True
        label = _series_label(key, many_batches)
        x = [p.devices for p in fit]
        tps = [p.tokens_per_s for p in fit]
        base = fit[0]
        ideal = [base.tokens_per_s * d / base.devices for d in x]
        ax_tps.plot(x, tps, "o-", color=color, label=label)
        ax_tps.plot(x, ideal, "--", color=color, alpha=0.5, linewidth=1)
        for p in fit:
            if p.scaling_efficiency is not None and p is not base and len(series) <= 3:
                ax_tps.annotate(f"{p.scaling_efficiency:.0%}", (p.devices, p.tokens_per_s), textcoords="offset points",
                                xytext=(4, -10), fontsize=7, color=color)
        hours = [tokens / p.tokens_per_s / 3600.0 * per_hour for p in fit]
        ideal_h = [tokens / base.tokens_per_s / 3600.0 * per_hour * base.devices / d for d in x]
        ax_time.plot(x, hours, "o-", color=color, label=label)
        ax_time.plot(x, ideal_h, "--", color=color, alpha=0.5, linewidth=1)
        bad = [p for p in pts if not p.fits]
        if bad:
            ax_tps.plot([p.devices for p in bad], [min(tps) * 0.5] * len(bad), "x", color=color)
    from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter

    ticks = sorted({p.devices for p in result.points})
    for ax in (ax_tps, ax_time):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.set_xlabel("devices")
        ax.grid(True, which="both", alpha=0.3)
    ax_tps.set_ylabel("tokens / s")
    ax_tps.set_title(f"{result.model}: throughput (dashed: ideal linear scaling)")
    ax_time.set_ylabel(unit + ("" if budget else " per 1B tokens"))
    ax_time.set_title(f"time to train {budget:.3g} tokens" if budget else "time per 1B tokens (give --tokens for a budget)")
    if drew:
        ax_tps.legend(fontsize=8)
        ax_time.legend(fontsize=8)
    else:
        ax_tps.text(0.5, 0.5, "no point fits", ha="center", va="center", transform=ax_tps.transAxes)
    fig.tight_layout()
    out = _save(fig, path)
    plt.close(fig)
    return out


def _plan_label(rank: int, plan: "Plan") -> str:
    s = plan.strategy
    text = f"#{rank} dp{s.dp} tp{s.tp} pp{s.pp}"
    if s.cp > 1:
        text += f" cp{s.cp}"
    if s.ep > 1:
        text += f" ep{s.ep}"
    return text + f"\nz{s.zero_stage} {s.recompute}"


def recommendation_plot(plans: Sequence["Plan"], path: str | Path, capacity_gib: float | None = None) -> Path:
    """Stacked step-time breakdown and memory by part of ranked plans (their ``prediction`` blocks)."""
    plt = _pyplot()
    plans = [p for p in plans if p.prediction]
    if not plans:
        raise AdvisorError("--plot: the plans carry no prediction to plot")
    capacity = capacity_gib if capacity_gib is not None else plans[0].hardware.device.memory_gib
    labels = [_plan_label(i, p) for i, p in enumerate(plans, start=1)]
    x = list(range(len(plans)))
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(max(10, 2.2 * len(plans) + 4), 5))
    colors = plt.get_cmap("tab10").colors

    bottom = [0.0] * len(plans)
    found = [k for p in plans for k in (p.prediction.get("time_s") or {})]
    parts = list(TIME_PARTS) + [k for k in dict.fromkeys(found) if k not in TIME_PARTS]   # parts added later too
    for j, part in enumerate(parts):
        values = [float((p.prediction.get("time_s") or {}).get(part, 0.0)) for p in plans]
        if not any(values):
            continue
        label = TIME_LABELS.get(part, part.replace("_", " "))
        ax_t.bar(x, values, bottom=bottom, label=label, color=colors[j % len(colors)])
        bottom = [b + v for b, v in zip(bottom, values)]
    for xi, p in zip(x, plans):
        step = p.prediction.get("step_time_s")
        if step:
            ax_t.plot([xi - 0.4, xi + 0.4], [step, step], color="black", linewidth=1)
    ax_t.set_xticks(x, labels, fontsize=8)
    ax_t.set_ylabel("seconds per step")
    ax_t.set_title("step time by part (line: predicted step time after overlap)")
    ax_t.legend(fontsize=8)

    bottom = [0.0] * len(plans)
    for j, part in enumerate(MEMORY_PARTS):
        values = [float((p.prediction.get("memory_gib") or {}).get(part, 0.0)) for p in plans]
        ax_m.bar(x, values, bottom=bottom, label=part, color=colors[(j + 3) % len(colors)])
        bottom = [b + v for b, v in zip(bottom, values)]
    ax_m.axhline(capacity, color="red", linestyle="--", linewidth=1.2, label=f"device capacity {capacity:g} GiB")
    ax_m.set_xticks(x, labels, fontsize=8)
    ax_m.set_ylabel("GiB per device (worst pipeline stage)")
    ax_m.set_title("memory by part")
    ax_m.set_ylim(0, max(max(bottom), capacity) * 1.1)
    ax_m.legend(fontsize=8)
    first = plans[0]
    fig.suptitle(f"{first.model.name} on {first.cluster.devices} x {first.hardware.device.name} "
                 f"({first.hardware.name}): top {len(plans)} plans", fontsize=11)
    fig.tight_layout()
    out = _save(fig, path)
    plt.close(fig)
    return out


def recommend_plot(result, path: str | Path) -> Path:
    """recommendation_plot for an advisor.recommend.RecommendResult."""
    return recommendation_plot(result.plans, path)
