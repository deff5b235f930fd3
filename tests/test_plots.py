"""Plots: files are written (PNG, Agg backend) with the series, the ideal-scaling lines and the parts
they should show. Checked on the figure objects matplotlib builds, not on pixels."""

from __future__ import annotations

import pytest

pytest.importorskip("matplotlib")

import matplotlib  # noqa: E402

from advisor.errors import AdvisorError  # noqa: E402
from advisor.plots import MEMORY_PARTS, recommend_plot, recommendation_plot, whatif_plot  # noqa: E402
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
    from advisor.inputs import resolve_inputs
    from advisor.recommend import recommend

    inputs = resolve_inputs("gpt3-1.3b", "dgx-a100-80g", nodes=1, global_batch=64)
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
