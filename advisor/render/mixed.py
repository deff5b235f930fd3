"""Rich rendering of plans on a mixed cluster (advisor.commands.mixed): who runs what, and the figures."""

from __future__ import annotations

from itertools import groupby
from typing import TYPE_CHECKING

from rich import box
from rich.console import Console
from rich.table import Table

from advisor.render.formatting import duration, step_time
from advisor.render.report import _knobs
from advisor.specs.mixed import MixedLayout

if TYPE_CHECKING:  # pragma: no cover - annotations only
    from advisor.commands.mixed import MixedResult
    from advisor.cost.mixed_estimate import MixedEstimate
    from advisor.space.strategy import Strategy


def placement_text(layout: MixedLayout, stage_layers: tuple[int, ...] = ()) -> str:
    """'pipeline: dgx-a100-80g stages 0-1 (layers 10+10) | dgx-h100 stages 2-3 (layers 6+6)' or
    'data: 16 x dgx-a100-80g at 9 micro-batches | 16 x dgx-h100 at 23'."""
    if layout.kind == "pipeline":
        out, start = [], 0
        for name, run in groupby(layout.stage_devices):
            n = len(list(run))
            layers = "+".join(str(x) for x in stage_layers[start:start + n])
            span = f"stage {start}" if n == 1 else f"stages {start}-{start + n - 1}"
            out.append(f"{name} {span}" + (f" (layers {layers})" if layers else ""))
            start += n
        return "pipeline: " + " | ".join(out)
    out = []
    for name, run in groupby(zip(layout.replica_devices, layout.replica_micro_batches), key=lambda x: x[0]):
        run = [m for _, m in run]
        counts = sorted(set(run), reverse=True)
        out.append(f"{len(run)} x {name} at {'/'.join(str(c) for c in counts)} micro-batches")
    return "data: " + " | ".join(out)


def render_mixed_recommendation(console: Console, result: MixedResult, saved_to: str | None = None) -> None:
    first = result.best
    table = Table(title=f"{first.model.name} on {result.mixed.label} ({result.mixed.devices} devices), batch "
                  f"{first.training.global_batch_size} x {first.training.seq_length}, {first.training.dtype}",
                  title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False, collapse_padding=True)
    for name in ("#", "dp.tp.pp.cp", "mbs", "knobs", "layout", "GiB", "step s", "tokens/s", "MFU", "limit"):
        table.add_column(name, justify="right" if name in ("#", "mbs", "GiB", "step s", "tokens/s", "MFU") else "left",
                         no_wrap=name != "knobs", min_width=10 if name == "knobs" else None)
    names = {p.profile.name: chr(ord("A") + i) for i, p in enumerate(result.mixed.parts)}
    for i, (plan, e) in enumerate(zip(result.plans, result.estimates), start=1):
        s = plan.strategy
        table.add_row(str(i), f"{s.dp}.{s.tp}.{s.pp}.{s.cp}", str(s.micro_batch_size), _knobs(s), e.layout.kind,
                      f"{e.memory_gib:.1f} {names[e.fullest_device]}", step_time(e.step_time_s),
                      f"{e.tokens_per_s:,.0f}", f"{e.mfu:.1%}", f"{e.bottleneck} {names[e.slowest_device]}")
    console.print(table)
    console.print("devices: " + ", ".join(f"{v} = {k}" for k, v in names.items()), highlight=False)
    for i, (plan, e) in enumerate(zip(result.plans, result.estimates), start=1):
        console.print(f"{i}. {placement_text(e.layout, plan.strategy.stage_layers or ())}", highlight=False,
                      markup=False)
    console.print("GiB: the fullest device (its type); MFU: model FLOPs over the sum of every device's peak; limit: "
                  "the largest part of the step (the type that paces it)", highlight=False)
    st = result.stats
    left = "; ".join(f"{why} ({n:,})" for why, n in st.left_out.items())
    console.print(f"search: mixed, {st.candidates:,} candidates priced, {st.feasible:,} fit, {st.seconds:.1f} s"
                  + (f"; left out: {left}" if left else ""), highlight=False)
    if result.estimates[0].time_to_train_s is not None:
        e = result.estimates[0]
        cost = f", ${e.cost_to_train_usd:,.0f}" if e.cost_to_train_usd is not None else ""
        console.print(f"plan 1 trains the token budget in {duration(e.time_to_train_s)}{cost}", highlight=False)
    if saved_to:
        console.print(f"best plan saved to {saved_to}")


def render_mixed_estimate(console: Console, title: str, s: Strategy, e: MixedEstimate) -> None:
    from advisor.render.breakdown import strategy_line, time_table

    console.print(f"[bold]{title}[/bold]")
    console.print(strategy_line(s) + f" mesh={'-'.join(s.mesh_order)}", highlight=False)
    console.print(placement_text(e.layout, s.stage_layers or ()), highlight=False, markup=False)
    status = "[green]fits[/green]" if e.feasible else "[red]does not fit[/red]"
    console.print(f"{status}: {e.memory_gib:.1f} of {e.capacity_gib:g} GiB on {e.fullest_device} | step "
                  f"{step_time(e.step_time_s)} s | {e.tokens_per_s:,.0f} tokens/s | MFU {e.mfu:.1%} | bottleneck: "
                  f"{e.bottleneck} (paced by {e.slowest_device})")
    for reason in e.reasons:
        console.print(f"  [red]-[/red] {reason}")
    console.print(time_table("step time by part (s), on the type that paces it", e.time_s, e.step_time_s))
