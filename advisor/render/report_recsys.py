"""Rich rendering for recommendation models: the ranked plans (mode, servers, what limits each) and
one estimate's breakdown (worker and server memory by part, the step's parts, PS traffic)."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table

from advisor.cost.recsys import RecEstimate
from advisor.render.formatting import count, step_time

_MODE = {"replicated": "allreduce (replicated)", "sharded": "sharded + all-to-all", "host": "host tables",
         "ps": "PS", "hybrid": "hybrid PS"}


def mode_text(e: RecEstimate) -> str:
    c = e.config
    text = _MODE[c.mode]
    if c.mode == "host":
        text = f"{len(c.host_tables) or 'all'} tables on host"
    if c.mode in ("ps", "hybrid") and not c.synchronous:
        text += " async"
    return text


def servers_text(e: RecEstimate) -> str:
    c = e.config
    if c.mode not in ("ps", "hybrid"):
        return "-"
    where = "ded" if c.server_placement == "dedicated" else "col"
    tables = f", {len([t for t in c.server_tensors if not t.startswith(('bottom_mlp_', 'top_mlp_'))])} tables" \
        if c.mode == "hybrid" else ""
    return f"{c.servers} {where}{' +copy' if c.replicas else ''}{tables}"


def plans_table(result) -> Table:
    first = result.best
    title = (f"{first.model.name} on {first.cluster.devices} x {first.hardware.device.name} ({first.hardware.name}), "
             f"batch {first.training.global_batch_size} samples, {first.training.dtype}")
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0), pad_edge=False,
                  show_edge=False)
    # the text columns wrap within their cells and the headers take two lines, so the table fits 80 columns
    widths = {"mode": 10, "servers": 7, "limit": 9}      # each its longest word ("all-to-all", "tables", "optimizer")
    for name in ("#", "mode", "servers", "worker\nGiB", "server\nGiB", "step s", "samples/s", "limit", "stale-\nness"):
        text = name in widths
        table.add_column(name, justify="left" if text else "right", no_wrap=not text, min_width=widths.get(name),
                         max_width=widths[name] + 4 if text else None)
    for rank, e in enumerate(result.estimates, start=1):
        server = f"{e.server_memory.total_gib:.1f}" if e.server_memory is not None else "-"
        stale = f"{e.staleness_steps:g}" if e.staleness_steps is not None else "-"
        table.add_row(str(rank), mode_text(e), servers_text(e), f"{e.worker_memory.total_gib:.2f}", server,
                      step_time(e.step_time_s), count(e.samples_per_s), e.bottleneck, stale)
    return table


def render_recsys(console: Console, result, saved_to: str | None = None) -> None:
    console.print(plans_table(result))
    console.print("servers: count, ded = dedicated hosts / col = co-located with workers, +copy = each shard copied on "
                  "the next server (--ps-replicas 1), tables on servers (hybrid); "
                  "limit: the largest part of the step; staleness: updates a gradient misses (asynchronous PS); "
                  "ranked by samples/s per charged device: the cluster's devices plus one per dedicated server host",
                  highlight=False)
    s = result.search
    console.print(f"searcher {s.searcher}: {s.candidates:,} candidates priced, {s.feasible:,} fit; {s.seconds:.2f} s",
                  highlight=False)
    if saved_to:
        console.print(f"best plan saved to {saved_to}", markup=False, highlight=False)


def render_recsys_estimate(console: Console, title: str, e: RecEstimate) -> None:
    console.print(title, markup=False, highlight=False)
    console.print(f"mode {mode_text(e)}, servers {servers_text(e)}: step {step_time(e.step_time_s)} s, "
                  f"{e.samples_per_s:,.0f} samples/s, limit {e.bottleneck}"
                  + (f", staleness {e.staleness_steps:g} updates" if e.staleness_steps is not None else ""),
                  markup=False, highlight=False)
    table = Table(box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
    table.add_column("part")
    table.add_column("value", justify="right")
    w = e.worker_memory
    for name, value in (("parameters", w.parameters_gib), ("gradients", w.gradients_gib), ("optimizer", w.optimizer_gib),
                        ("activations", w.activations_gib), ("buffers", w.buffers_gib), ("total", w.total_gib)):
        table.add_row(f"worker {name} GiB", f"{value:.3f}")
    if e.server_memory is not None:
        s = e.server_memory
        for name, value in (("parameters", s.parameters_gib), ("optimizer", s.optimizer_gib), ("buffers", s.buffers_gib),
                            ("total", s.total_gib)):
            table.add_row(f"server {name} GiB", f"{value:.3f}")
    for name, value in e.time_s.items():
        table.add_row(f"{name.removesuffix('_s')} s", step_time(value))
    for name, value in e.traffic_bytes.items():
        table.add_row(f"{name} MB", f"{value / 1e6:.2f}")
    console.print(table)
    for reason in e.reasons:
        console.print(f"does not fit: {reason}", markup=False, highlight=False)
