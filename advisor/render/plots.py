"""Plots (matplotlib, Agg backend: files only, no display needed).

* whatif_plot: throughput and time to train versus device count, one line per hardware variant
  (series), each with its ideal linear-scaling line from the series' smallest fitting point
  (throughput proportional to devices, time inversely proportional).
* recommendation_plot: the top plans' step time broken down by part as stacked bars, and their
  memory per device by part against the device capacity. Each plan is labelled by its strategy
  ("dp8 tp4 pp2 / z1 sel"), with the settings that tell otherwise equal labels apart added.

Readability: legends sit outside the data area (beside the axes, or below the figure); axes name
their units and print numbers with thousands separators; a line plot's axis is logarithmic when
its values span more than 10x, linear otherwise. Stacked bars stay linear (a log scale distorts
the parts of a stack).

matplotlib is an optional dependency (pip install 'advisor[plot]'); without it these functions raise
AdvisorError naming the --plot flag.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from advisor.errors import AdvisorError
from advisor.render.breakdown import offload_knob

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
    from advisor.runtime.files import write_atomic

    fmt = path.suffix[1:].lower() or "png"    # the temporary file's name does not end in the format
    try:
        write_atomic(path, lambda fh: fig.savefig(fh, format=fmt, dpi=120, bbox_inches="tight"), what="the plot")
    except ValueError as exc:   # a format matplotlib does not write
        raise AdvisorError(f"--plot: cannot write {path}: {exc}") from None
    return path


LOG_SPAN = 10.0   # an axis whose values span more than this factor is drawn logarithmic
RECOMPUTE_SHORT = {"none": "no-rc", "selective": "sel", "full": "full"}


def number(value: float, _pos=None) -> str:
    """Tick text with thousands separators: 1,234,567; 12.5; 0.034."""
    if value == 0:
        return "0"
    a = abs(value)
    if a >= 1000:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def _span(values: Sequence[float]) -> float:
    positive = [v for v in values if v and v > 0]
    return max(positive) / min(positive) if positive else 1.0


def _scale_y(ax, values: Sequence[float]) -> None:
    """Log scale when the values span more than LOG_SPAN; numbers with separators either way."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    if _span(values) > LOG_SPAN:
        ax.set_yscale("log")
        if _span(values) < 1000:   # few decades: label 1, 2 and 5 of each so the axis has several numbers
            ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_formatter(FuncFormatter(number))


def _scale_devices(ax, ticks: Sequence[int]) -> None:
    """Device counts: a tick at each count; log base 2 when they span more than LOG_SPAN."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    if _span(ticks) > LOG_SPAN:
        ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(list(ticks)))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(number))
    ax.set_xlabel("devices")


def _tokens(n: float) -> str:
    """300000000000 -> '300B', 2e12 -> '2T' (the --tokens flag's own suffixes)."""
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M")):
        if n >= scale:
            return number(n / scale) + suffix
    return number(n)


def _series_label(key: tuple, many_batches: bool) -> str:
    variant, gbs, seq = key
    return f"{variant} (gbs {gbs:,}, seq {seq:,})" if many_batches else variant


def whatif_plot(result: "WhatIfResult", path: str | Path) -> Path:
    """Throughput and time to train versus devices, per hardware variant, with ideal linear scaling."""
    plt = _pyplot()
    from matplotlib.lines import Line2D

    series: dict[tuple, list] = {}
    for p in result.points:
        series.setdefault(p.series, []).append(p)
    many_batches = len({(k[1], k[2]) for k in series}) > 1
    fig, (ax_tps, ax_time) = plt.subplots(1, 2, figsize=(13, 5.5), layout="constrained")
    budget = result.train_tokens
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    tokens = budget if budget else 1e9
    longest_h = max((tokens / p.tokens_per_s / 3600.0 for p in result.points if p.fits), default=0.0)
    unit, per_hour = ("days", 1 / 24.0) if longest_h > 72 else ("hours", 1.0)
    handles, all_tps, all_time, some_missing = [], [], [], False
    for i, (key, pts) in enumerate(series.items()):
        color = colors[i % len(colors)]
        fit = sorted((p for p in pts if p.fits), key=lambda p: p.devices)
        if not fit:
            continue
        label = _series_label(key, many_batches)
        x = [p.devices for p in fit]
        tps = [p.tokens_per_s for p in fit]
        base = fit[0]   # ideal scaling: linear from the smallest point that fits
        ideal = [base.tokens_per_s * d / base.devices for d in x]
        (line,) = ax_tps.plot(x, tps, "o-", color=color, label=label)
        handles.append(line)
        ax_tps.plot(x, ideal, "--", color=color, alpha=0.5, linewidth=1, label=f"{label}: ideal linear scaling")
        for p in fit:
            if p.scaling_efficiency is not None and p is not base and len(series) <= 3:
                ax_tps.annotate(f"{p.scaling_efficiency:.0%}", (p.devices, p.tokens_per_s), textcoords="offset points",
                                xytext=(4, -10), fontsize=7, color=color)
        hours = [tokens / p.tokens_per_s / 3600.0 * per_hour for p in fit]
        ideal_h = [hours[0] * base.devices / d for d in x]
        ax_time.plot(x, hours, "o-", color=color, label=label)
        ax_time.plot(x, ideal_h, "--", color=color, alpha=0.5, linewidth=1, label=f"{label}: ideal linear scaling")
        all_tps += tps + ideal
        all_time += hours + ideal_h
        bad = [p for p in pts if not p.fits]
        if bad:
            some_missing = True
            ax_tps.plot([p.devices for p in bad], [min(tps) * 0.5] * len(bad), "x", color=color,
                        label=f"{label}: does not fit")
            all_tps.append(min(tps) * 0.5)
    _scale_y(ax_tps, all_tps)
    _scale_y(ax_time, all_time)
    for ax in (ax_tps, ax_time):
        _scale_devices(ax, sorted({p.devices for p in result.points}))
        ax.grid(True, which="both", alpha=0.3)
    ax_tps.set_ylabel("throughput (tokens / s, whole cluster)")
    ax_tps.set_title(f"{result.model}: throughput (dashed: ideal linear scaling)")
    ax_time.set_ylabel(f"time to train ({unit})" if budget else f"time per 1B tokens ({unit})")
    ax_time.set_title(f"time to train {_tokens(budget)} tokens" if budget else
                      "time per 1B tokens (give --tokens for a budget)")
    if handles:
        handles.append(Line2D([], [], linestyle="--", color="gray", label="ideal linear scaling from the smallest point"))
        if some_missing:
            handles.append(Line2D([], [], marker="x", linestyle="", color="gray", label="does not fit"))
        fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 4), fontsize=8, frameon=False)
    else:
        ax_tps.text(0.5, 0.5, "no point fits", ha="center", va="center", transform=ax_tps.transAxes)
    out = _save(fig, path)
    plt.close(fig)
    return out


# ---- recommendation: labels that tell the plans apart ---------------------------------------------
# (name, text of a strategy's setting): added to the labels of plans whose labels would otherwise be equal
_DETAILS: tuple[tuple[str, Callable], ...] = (
    ("micro-batch", lambda s: f"mbs{s.micro_batch_size}"),
    ("virtual stages", lambda s: f"vpp{s.virtual_pipeline_stages}"),
    ("sequence parallel", lambda s: "sp" if s.sequence_parallel else "no-sp"),
    ("schedule", lambda s: s.pipeline_schedule),
    ("offload", lambda s: ("offload" + offload_knob(s)) if s.offload_optimizer or s.host_embedding else "no-offload"),
    ("cp communication", lambda s: f"cp-{s.cp_comm}"),
    ("recomputed layers", lambda s: f"rc-layers {s.recompute_layers}"),
    ("stage layers", lambda s: "layers " + "/".join(map(str, s.stage_layers or ()))),
    ("copies", lambda s: f"copies{s.micro_batch_copies}"),
    ("bucket", lambda s: f"bucket {s.grad_bucket_mb} MiB"),
    ("mesh order", lambda s: "-".join(s.mesh_order)),
)


def _base_label(s) -> list[str]:
    dims = [f"dp{s.dp}", f"tp{s.tp}", f"pp{s.pp}"] + [f"{d}{getattr(s, d)}" for d in ("cp", "ep") if getattr(s, d) > 1]
    return [" ".join(dims), f"z{s.zero_stage} {RECOMPUTE_SHORT.get(s.recompute, s.recompute)}"]


def plan_labels(plans: Sequence["Plan"]) -> list[str]:
    """One label per plan from its strategy ("dp8 tp4 pp2\nz1 sel"); where labels are equal, the
    settings in which those plans differ are added, and plans with equal strategies are numbered."""
    lines = [_base_label(p.strategy) for p in plans]
    for _, text in _DETAILS:
        groups: dict[str, list[int]] = {}
        for i, parts in enumerate(lines):
            groups.setdefault(" ".join(parts), []).append(i)
        for members in groups.values():
            if len(members) > 1 and len({text(plans[i].strategy) for i in members}) > 1:
                for i in members:
                    lines[i] = lines[i][:-1] + [lines[i][-1] + " " + text(plans[i].strategy)]
    labels = ["\n".join(parts) for parts in lines]
    counts = {label: labels.count(label) for label in labels}
    seen: dict[str, int] = {}
    out = []
    for label in labels:
        if counts[label] > 1:
            seen[label] = seen.get(label, 0) + 1
            label = f"{label} ({seen[label]})"
        out.append(label)
    return out


def recommendation_plot(plans: Sequence["Plan"], path: str | Path, capacity_gib: float | None = None) -> Path:
    """Stacked step-time breakdown and memory by part of ranked plans (their ``prediction`` blocks)."""
    plt = _pyplot()
    from matplotlib.ticker import FuncFormatter

    plans = [p for p in plans if p.prediction]
    if not plans:
        raise AdvisorError("--plot: the plans carry no prediction to plot")
    capacity = capacity_gib if capacity_gib is not None else plans[0].hardware.device.memory_gib
    labels = [f"#{i} {label}" for i, label in enumerate(plan_labels(plans), start=1)]
    x = list(range(len(plans)))
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(max(12, 2.2 * len(plans) + 7), 5.5), layout="constrained")
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
            ax_t.plot([xi - 0.4, xi + 0.4], [step, step], color="black", linewidth=1,
                      label="step time after overlap" if xi == 0 else "_nolegend_")
    ax_t.set_xticks(x, labels, fontsize=8)
    ax_t.set_ylabel("time per step (s), summed by part")
    ax_t.yaxis.set_major_formatter(FuncFormatter(number))
    ax_t.set_title("step time by part (line: predicted step time after overlap)")
    ax_t.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)

    bottom = [0.0] * len(plans)
    for j, part in enumerate(MEMORY_PARTS):
        values = [float((p.prediction.get("memory_gib") or {}).get(part, 0.0)) for p in plans]
        ax_m.bar(x, values, bottom=bottom, label=part, color=colors[(j + 3) % len(colors)])
        bottom = [b + v for b, v in zip(bottom, values)]
    ax_m.axhline(capacity, color="red", linestyle="--", linewidth=1.2, label=f"device capacity {number(capacity)} GiB")
    ax_m.set_xticks(x, labels, fontsize=8)
    ax_m.set_ylabel("memory per device (GiB, worst pipeline stage)")
    ax_m.yaxis.set_major_formatter(FuncFormatter(number))
    ax_m.set_title("memory by part")
    ax_m.set_ylim(0, max(max(bottom), capacity) * 1.1)
    ax_m.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    first = plans[0]
    fig.suptitle(f"{first.model.name} on {first.cluster.devices:,} x {first.hardware.device.name} "
                 f"({first.hardware.name}): top {len(plans)} plans, best first", fontsize=11)
    out = _save(fig, path)
    plt.close(fig)
    return out


def recommend_plot(result, path: str | Path) -> Path:
    """recommendation_plot for an advisor.commands.recommend.RecommendResult."""
    return recommendation_plot(result.plans, path)
