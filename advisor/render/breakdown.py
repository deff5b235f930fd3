"""Rich rendering of one estimate: headline figures, memory by part, time by part."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from advisor.cost.estimate import Estimate
from advisor.render.formatting import band_line, duration, step_time, training_figures
from advisor.space.strategy import Strategy


def offload_knob(s: Strategy) -> str:
    """'+off' (optimizer), '+off50%' (half of it), '+offp' (parameters too), or ''; '+hemb' after it
    for the word embedding on the host."""
    emb = "+hemb" if s.host_embedding else ""
    if s.offload_params:
        return "+offp"
    if not s.offload_optimizer:
        return emb
    return ("+off" if s.offload_fraction == 1.0 else f"+off{s.offload_fraction:.0%}") + emb


def strategy_line(s: Strategy) -> str:
    parts = [f"dp={s.dp}", f"tp={s.tp}", f"pp={s.pp}"]
    if s.cp > 1:
        parts.append(f"cp={s.cp}")
    if s.ep > 1:
        parts.append(f"ep={s.ep}" + (" (folded: experts whole)" if s.fold_experts else ""))
    if s.sequence_parallel:
        parts.append("sp")
    if s.virtual_pipeline_stages > 1:
        parts.append(f"vpp={s.virtual_pipeline_stages}")
    parts += [f"mbs={s.micro_batch_size}", f"m={s.num_micro_batches}", f"zero={s.zero_stage}",
              f"recompute={s.recompute}" + (f"({s.recompute_layers})" if s.recompute_layers else "")]
    if s.pp > 1:
        parts.append(s.pipeline_schedule)
    if s.offload_optimizer:
        parts.append("offload-params" if s.offload_params else "offload" + (
            f"({s.offload_fraction:g})" if s.offload_fraction != 1.0 else ""))
    if s.swap_layers is not None:
        parts.append(f"swap_layers={list(s.swap_layers)}")
    if s.full_batch:
        parts.append("full_batch")
    if s.host_embedding:
        parts.append("host_embedding")
    return " ".join(parts)


WIDE_PARTS = 6      # more columns than this do not fit 80 columns: the parts are listed one per row


def time_table(title: str, time_s: dict[str, float], step_s: float) -> Table:
    """The step's non-zero parts and the step (seconds): one row, or one row per part with its share of the step
    when there are more than WIDE_PARTS of them (an 80-column terminal would cut their names)."""
    parts = {k: v for k, v in time_s.items() if v > 0}
    table = Table(title=title, title_justify="left", min_width=min(len(title), 80))
    if len(parts) + 1 > WIDE_PARTS:
        for name, justify in (("part", "left"), ("s", "right"), ("of step", "right")):
            table.add_column(name, justify=justify)
        for k, v in parts.items():
            table.add_row(k, step_time(v), f"{v / step_s:.1%}" if step_s > 0 else "")
        table.add_row("step", step_time(step_s), "")
        return table
    for k in parts:
        table.add_column(k, justify="right")
    table.add_column("step", justify="right")
    table.add_row(*(step_time(v) for v in parts.values()), step_time(step_s))
    return table


def render_estimate(console: Console, title: str, s: Strategy, e: Estimate) -> None:
    console.print(f"[bold]{title}[/bold]")
    console.print(strategy_line(s))
    status = "[green]fits[/green]" if e.feasible else "[red]does not fit[/red]"
    console.print(
        f"{status}: {e.memory_gib.total:.1f} of {e.capacity_gib:g} GiB per device | step {step_time(e.step_time_s)} s | "
        f"{e.tokens_per_s:,.0f} tokens/s ({e.tokens_per_s_per_device:,.0f} per device) | "
        f"{e.tflops_per_device:.1f} TFLOP/s per device | MFU {e.mfu:.1%} | HFU {e.hfu:.1%} | bottleneck: {e.bottleneck}"
    )
    for reason in e.reasons:
        console.print(f"  [red]-[/red] {reason}")
    line = band_line("band", e) if e.feasible else None
    if line:
        console.print(line, highlight=False, markup=False)
    if e.confidence is not None and not e.confidence.calibrated:
        console.print("extrapolates (outside the profile's calibrated region): " + "; ".join(e.confidence.extrapolated),
                      highlight=False, markup=False)
    if e.time_to_train_s is not None:
        console.print(" | ".join([f"time to train: {duration(e.time_to_train_s)}", *training_figures(e)]))
    if e.host_embedding_gib > 0:
        console.print(f"host: the word-embedding slice with its fp32 states and gradient takes "
                      f"{e.host_embedding_gib:.2f} GiB of host memory per device")
    if e.input_read_gb_per_step is not None:
        reader = "every rank the whole global batch" if s.full_batch else "each rank its data-parallel shard"
        console.print(f"input: {e.input_read_gb_per_step:.3g} GB of samples read per step across the cluster "
                      f"({reader}; {e.input_read_gb_per_step / max(e.step_time_s, 1e-12):.3g} GB/s)")

    mem = Table(title=f"memory per device (GiB), pipeline stage {e.worst_memory_stage}", title_justify="left")
    for part in ("parameters", "gradients", "optimizer", "activations", "buffers", "total"):
        mem.add_column(part, justify="right")
    m = e.memory_gib
    mem.add_row(*(f"{v:.2f}" for v in (m.parameters, m.gradients, m.optimizer, m.activations, m.buffers, m.total)))
    console.print(mem)

    console.print(time_table(f"step time by part (s), slowest stage {e.slowest_stage}", e.time_s, e.step_time_s))
