"""Plots: files are written (PNG, Agg backend) with the series, the ideal-scaling lines and the parts
they should show. Checked on the figure objects matplotlib builds, not on pixels."""

from __future__ import annotations

import pytest

pytest.importorskip("matplotlib")

import matplotlib  # noqa: E402

from advisor.errors import AdvisorError  # noqa: E402
from advisor.render.plots import MEMORY_PARTS, recommend_plot, recommendation_plot, whatif_plot  # noqa: E402
from advisor.whatif import whatif  # noqa: E402


@pytest.fixture()
def keep_figures(monkeypatch):
    """Keep the figures the plot functions close, to look inside them."""
    import matplotlib.pyplot as plt

    figures = []
    monkeypatch.setattr(plt, "close", lambda fig=None: figures.append(fig))
    return figures


def test_whatif_plot(tmp_path, keep_figures):
    result = whatif("gpt3-1.3b", ["dgx-a100-80g", "dgx-h100"], nodes=[1, 2, 4], global_batch=[256], tokens="300B",
                    workers=1)
    out = whatif_plot(result, tmp_path / "w.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert matplotlib.get_backend().lower() == "agg"
    (fig,) = keep_figures
    ax_tps, ax_time = fig.axes
    solid = [ln for ln in ax_tps.get_lines() if ln.get_linestyle() == "-"]
    dashed = [ln for ln in ax_tps.get_lines() if ln.get_linestyle() == "--"]
    assert {ln.get_label() for ln in solid} == {"dgx-a100-80g", "dgx-h100"}
    assert len(dashed) == 2
    for line, ideal in zip(solid, dashed):
        x, y = line.get_xdata(), line.get_ydata()
        xi, yi = ideal.get_xdata(), ideal.get_ydata()
        assert list(x) == [8, 16, 32] and list(xi) == list(x)
        assert yi[0] == pytest.approx(y[0]) and yi[2] == pytest.approx(4 * y[0])     # ideal: linear from the base
    assert "300" in ax_time.get_title() or "3e+11" in ax_time.get_title()
    times = [ln for ln in ax_time.get_lines() if ln.get_linestyle() == "-"]
    for line in times:
        assert list(line.get_ydata()) == sorted(line.get_ydata(), reverse=True)   # more devices, less time


def test_recommendation_plot(tmp_path, keep_figures):
    from advisor.commands.inputs import resolve_inputs
    from advisor.commands.recommend import recommend

    inputs = resolve_inputs("gpt3-1.3b", "dgx-a100-80g", nodes=1, global_batch_size=64)
    result = recommend(inputs.model, inputs.hardware, inputs.cluster, inputs.job, top_k=3)
    out = recommend_plot(result, tmp_path / "r.png")
    assert out.stat().st_size > 10_000
    (fig,) = keep_figures
    ax_time, ax_mem = fig.axes
    n = len(result.plans)
    # stacked bars: each time bar segment sums to the parts of the prediction
    heights = [0.0] * n
    for container in ax_time.containers:
        for i, bar in enumerate(container):
            heights[i] += bar.get_height()
    for h, plan in zip(heights, result.plans):
        assert h == pytest.approx(sum(plan.prediction["time_s"].values()), rel=1e-6)
    labels = {c.get_label() for c in ax_mem.containers}
    assert labels == set(MEMORY_PARTS)
    mem = [0.0] * n
    for container in ax_mem.containers:
        for i, bar in enumerate(container):
            mem[i] += bar.get_height()
    for total, plan in zip(mem, result.plans):
        assert total == pytest.approx(sum(plan.prediction["memory_gib"][k] for k in MEMORY_PARTS), rel=1e-6)
    capacity = [ln for ln in ax_mem.get_lines() if "capacity" in ln.get_label()]
    assert capacity and capacity[0].get_ydata()[0] == pytest.approx(inputs.hardware.device.memory_gib)


def test_plot_errors_name_the_flag(tmp_path):
    result = whatif("gpt3-1.3b", ["dgx-h100"], nodes=[1], global_batch=[64], workers=1)
    with pytest.raises(AdvisorError, match="--plot"):
        whatif_plot(result, tmp_path / "no" / "such" / "dir" / "w.png")
    with pytest.raises(AdvisorError, match="--plot"):
        recommendation_plot([], tmp_path / "r.png")


def test_recommend_cli_plot(tmp_path):
    from typer.testing import CliRunner

    from advisor.cli import app

    out = tmp_path / "rec.png"
    res = CliRunner().invoke(app, ["recommend", "--model", "gpt3-1.3b", "--hardware", "dgx-a100-80g", "--nodes", "1",
                                   "--global-batch", "64", "--top", "3", "--plot", str(out), "--json"])
    assert res.exit_code == 0, res.output
    assert out.read_bytes()[:4] == b"\x89PNG"


# ---- readability: distinct labels, legends off the data, ideal line, axes -----------------------------
def _overlaps_data(fig) -> list:
    """(legend, axes) pairs whose drawn boxes overlap: a legend over some axes' data area."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    assert legends
    return [(leg, ax) for leg in legends for ax in fig.axes
            if leg.get_window_extent(renderer).overlaps(ax.get_window_extent(renderer))]


def test_recommendation_plot_labels_tell_plans_apart_and_legends_stay_off_the_bars(tmp_path, keep_figures):
    from advisor.commands.inputs import resolve_inputs
    from advisor.commands.recommend import recommend

    inputs = resolve_inputs("gpt3-1.3b", "dgx-a100-80g", nodes=1, global_batch_size=64)
    result = recommend(inputs.model, inputs.hardware, inputs.cluster, inputs.job, top_k=5)
    recommend_plot(result, tmp_path / "r.png")
    (fig,) = keep_figures
    ticks = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert len(ticks) == len(result.plans) == 5
    described = [t.split(" ", 1)[1] for t in ticks]               # without the "#1" rank
    assert len(set(described)) == len(described)                   # the strategies alone tell them apart
    for text, plan in zip(described, result.plans):
        s = plan.strategy
        assert text.startswith(f"dp{s.dp} tp{s.tp} pp{s.pp}") and f"z{s.zero_stage}" in text
    assert _overlaps_data(fig) == []
    assert "(s)" in fig.axes[0].get_ylabel() and "GiB" in fig.axes[1].get_ylabel()


def test_plan_labels_add_only_the_settings_that_differ():
    from dataclasses import replace
    from types import SimpleNamespace

    from advisor.render.plots import plan_labels
    from advisor.space.strategy import Strategy

    base = Strategy(dp=8, tp=4, pp=2, zero_stage=1, recompute="selective", micro_batch_size=1)
    plans = [SimpleNamespace(strategy=s) for s in (
        base, replace(base, micro_batch_size=2), replace(base, tp=2, dp=16), base)]
    labels = plan_labels(plans)
    assert labels[0] == "dp8 tp4 pp2\nz1 sel mbs1 (1)" and labels[3] == "dp8 tp4 pp2\nz1 sel mbs1 (2)"
    assert labels[1] == "dp8 tp4 pp2\nz1 sel mbs2"
    assert labels[2] == "dp16 tp2 pp2\nz1 sel"                     # already distinct: nothing added
    assert len(set(labels)) == 4


def test_whatif_plot_has_the_ideal_line_a_legend_off_the_data_and_readable_axes(tmp_path, keep_figures):
    result = whatif("gpt3-1.3b", ["dgx-h100"], nodes=[1, 2, 16], global_batch=[256], tokens="300B", workers=1)
    whatif_plot(result, tmp_path / "w.png")
    (fig,) = keep_figures
    ax_tps, ax_time = fig.axes
    (measured,) = [ln for ln in ax_tps.get_lines() if ln.get_linestyle() == "-"]
    (ideal,) = [ln for ln in ax_tps.get_lines() if ln.get_linestyle() == "--"]
    x, y = list(measured.get_xdata()), list(measured.get_ydata())
    xi, yi = list(ideal.get_xdata()), list(ideal.get_ydata())
    assert x == xi == [8, 16, 128]
    for d, v in zip(xi, yi):                                       # linear from the smallest point
        assert v == pytest.approx(y[0] * d / x[0])
    # each point over the ideal line is the scaling efficiency whatif reports (above 1 where more data-parallel
    # ranks shard ZeRO's states thinner and a faster micro-batch fits)
    for m, i, p in zip(y, yi, sorted(result.points, key=lambda p: p.devices)):
        assert m / i == pytest.approx(p.scaling_efficiency)
    (ideal_time,) = [ln for ln in ax_time.get_lines() if ln.get_linestyle() == "--"]
    t = ideal_time.get_ydata()
    assert t[2] == pytest.approx(t[0] * 8 / 128)                  # time inversely proportional
    # 8..128 devices and throughput spanning more than 10x: log axes; numbers with separators
    assert ax_tps.get_xscale() == "log" and ax_tps.get_yscale() == "log"
    fig.canvas.draw()
    texts = [t.get_text() for t in ax_tps.get_yticklabels() if t.get_text()]
    assert any("," in t for t in texts)
    assert "tokens / s" in ax_tps.get_ylabel() and "days" in ax_time.get_ylabel()
    assert "300B" in ax_time.get_title()
    assert len(fig.legends) == 1 and any("ideal" in t.get_text() for t in fig.legends[0].get_texts())
    assert _overlaps_data(fig) == []


def test_whatif_plot_stays_linear_over_a_small_range(tmp_path, keep_figures):
    result = whatif("gpt3-1.3b", ["dgx-h100"], nodes=[1, 2], global_batch=[256], workers=1)
    whatif_plot(result, tmp_path / "w.png")
    (fig,) = keep_figures
    assert fig.axes[0].get_xscale() == "linear" and fig.axes[0].get_yscale() == "linear"


def test_recommend_cli_says_where_the_plot_is(tmp_path):
    from typer.testing import CliRunner

    from advisor.cli import app

    out = tmp_path / "rec.png"
    res = CliRunner().invoke(app, ["recommend", "--model", "gpt3-1.3b", "--hardware", "dgx-a100-80g", "--nodes", "1",
                                   "--global-batch", "64", "--top", "2", "--plot", str(out)])
    assert res.exit_code == 0, res.output
    assert f"plot written to {out}" in " ".join(res.output.split())
