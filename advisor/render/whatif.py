"""What-if results as tables: one per hardware profile (advisor.whatif runs the sweep)."""

from __future__ import annotations

from typing import Any

from advisor.render.formatting import duration, energy, money, step_time
from advisor.render.breakdown import offload_knob


def _degrees(plan: Any) -> str:
    s = plan.strategy
    text = f"{s.dp}.{s.tp}.{s.pp}.{s.cp}" + (f".{s.ep}" if plan.model.moe is not None else "")
    knobs = [f"z{s.zero_stage}" + offload_knob(s)]
    if s.recompute != "none":
        knobs.append("rc=" + ("sel" if s.recompute == "selective" else "full"))
    if s.virtual_pipeline_stages > 1:
        knobs.append(f"v{s.virtual_pipeline_stages}")
    return text + " " + " ".join(knobs)


def whatif_tables(result: Any) -> list:
    """One rich table per hardware profile (its override variants are rows, told apart by the swept columns)."""
    from rich import box
    from rich.table import Table

    swept = {k for k, v in result.axes.items() if k not in ("hardware", "nodes", "devices") and len(v) > 1}
    budget = f", {result.train_tokens:.3g} tokens" if result.train_tokens else ""
    extra = [("inter_node_gbps", "inter GB/s"), ("intra_node_gbps", "intra GB/s"), ("memory_gib", "mem GiB"),
             ("global_batch", "gbs"), ("seq_len", "seq")]
    columns = ["nodes", "devices"] + [label for key, label in extra if key in swept]
    columns += ["plan dp.tp.pp.cp", "tokens/s", "MFU", "step s", "scaling"]
    if result.train_tokens:
        columns += ["time", "cost", "energy"]
    carbon = any(p.emissions_tco2e is not None for p in result.points)
    if carbon:
        columns += ["tCO2e"]
    targeted = any(p.time_to_target_s is not None for p in result.points)
    if targeted:
        columns += ["chosen gbs", "to target"]
    tables = []
    for hw in dict.fromkeys(p.hardware for p in result.points):
        pts = [p for p in result.points if p.hardware == hw]
        first = pts[0].plan.hardware if pts[0].plan is not None else None
        device = f" - {first.device.name}, {first.node.devices_per_node} per node" if first is not None else ""
        mixed = next((p.plan.mixed for p in pts if p.plan is not None and p.plan.mixed is not None), None)
        if mixed is not None:
            device = " - half the nodes each: " + " + ".join(p.profile.device.name for p in mixed.parts)
        table = Table(title=f"{hw}{device}: {result.model} ({result.dtype}{budget})", title_justify="left",
                      box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
        for name in columns:
            if name == "plan dp.tp.pp.cp":
                table.add_column(name, justify="left", overflow="fold", min_width=12)
            else:
                table.add_column(name, justify="right", no_wrap=True)
        for p in pts:
            values = {"inter_node_gbps": f"{p.inter_node_gbps:g}", "intra_node_gbps": f"{p.intra_node_gbps:g}",
                      "memory_gib": f"{p.memory_gib:g}", "global_batch": str(p.global_batch_size),
                      "seq_len": str(p.seq_length)}
            row = [str(p.nodes), str(p.devices)] + [values[key] for key, _ in extra if key in swept]
            if not p.fits:
                row += ["does not fit"] + ["-"] * (len(columns) - len(row) - 1)
            else:
                row += [_degrees(p.plan), f"{p.tokens_per_s:,.0f}", f"{p.mfu:.1%}", step_time(p.step_time_s),
                        "-" if p.scaling_efficiency is None else f"{p.scaling_efficiency:.0%}"]
                if result.train_tokens:
                    row += [duration(p.time_to_train_s), money(p.cost_usd), energy(p.energy_kwh)]
                if carbon:
                    row += [f"{p.emissions_tco2e:.3g}" if p.emissions_tco2e is not None else "-"]
                if targeted:
                    row += [str(p.target_batch_size), duration(p.time_to_target_s)]
            table.add_row(*row)
        tables.append(table)
    return tables


def render_whatif(console, result: Any, plot_path: str | None = None) -> None:
    if not console.is_terminal and console.width < 140:
        # piped output (a file, a pager): don't squeeze the columns to 80 characters
        from advisor.runtime.terminal import OutputConsole

        console = OutputConsole(file=console.file, width=140, no_color=console.no_color, highlight=False)
    for table in whatif_tables(result):
        console.print(table)
    for p in result.points:
        if not p.fits:
            console.print(f"{p.variant} x {p.nodes} nodes ({p.devices} devices): {p.reason}", style="dim",
                          markup=False, highlight=False)
    console.print(f"{len(result.points)} points in {result.seconds:.2f} s (searcher {result.searcher}); "
                  "scaling = tokens/s per device against the smallest fitting cluster of the same series",
                  style="dim", markup=False, highlight=False)
    if plot_path:
        console.print(f"plot written to {plot_path}", markup=False, highlight=False)
