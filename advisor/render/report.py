"""Rich rendering for `advisor recommend`: the ranked plans, what limits each, and what the search did."""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator

from rich import box
from rich.console import Console
from rich.table import Table

from advisor.cost.estimate import Estimate
from advisor.families import family
from advisor.render.formatting import band_line, duration, step_time, training_figures
from advisor.render.breakdown import offload_knob
from advisor.search import Progress as ProgressHook
from advisor.search import SearchStats
from advisor.space.strategy import Strategy

if TYPE_CHECKING:  # pragma: no cover - annotations only: render never imports the commands
    from advisor.commands.recommend import RecommendResult

PROGRESS_AFTER_S = 1.0   # searches shorter than this never show a bar


def _knobs(s: Strategy) -> str:
    """Everything but the degrees and batch split: 'sp z1+off rc=sel int.x4 mesh=tdp'."""
    parts = ["sp"] if s.sequence_parallel else []
    if s.fold_experts:
        parts.append("fold")
    parts.append(f"z{s.zero_stage}" + offload_knob(s))
    if s.recompute != "none":
        parts.append("rc=" + ("sel" if s.recompute == "selective" else s.recompute))
    if s.swap_layers is not None:
        parts.append("swap=" + ",".join(str(k) for k in s.swap_layers))
    if s.pp > 1:
        parts.append(f"int.x{s.virtual_pipeline_stages}" if s.pipeline_schedule == "interleaved-1f1b" else s.pipeline_schedule)
    parts.append("mesh=" + _mesh(s))
    return " ".join(parts)


def _mesh(s: Strategy) -> str:
    """Mesh order innermost first, one letter per dimension of degree > 1 (e.g. 'tdp': tp, dp, pp)."""
    degree = {"dp": s.dp, "tp": s.tp, "pp": s.pp, "cp": s.cp}
    return "".join(d[0] for d in reversed(s.mesh_order) if degree[d] > 1) or "-"


_BOTTLENECK = {"memory headroom": "memory", "tp_comm": "TP comm", "dp_comm": "DP comm", "pp_comm": "PP comm",
               "cp_comm": "CP comm", "ep_comm": "EP comm"}


def plans_table(result: RecommendResult) -> Table:
    first = result.best
    moe = first.model.moe is not None
    title = (f"{first.model.name} on {first.cluster.devices} x {first.hardware.device.name} ({first.hardware.name}), "
             f"batch {first.training.global_batch_size} x {first.training.seq_length}, {first.training.dtype}"
             + (f" ({first.training.recipe})" if first.training.recipe else ""))
    # one space between columns (the box's divider), so that the table fits an 80-column terminal
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, padding=0, pad_edge=False)
    degrees = "dp.tp.pp.cp" + (".ep" if moe else "")
    for name in ("#", degrees, "mbs x m", "knobs", "GiB", "step s", "tokens/s", "MFU", "limit", "calib."):
        table.add_column(name, justify="left" if name in (degrees, "knobs", "limit", "calib.") else "right",
                         no_wrap=name != "knobs", min_width=10 if name == "knobs" else None)
    for rank, (plan, e) in enumerate(zip(result.plans, result.estimates), start=1):
        s = plan.strategy
        table.add_row(
            str(rank), f"{s.dp}.{s.tp}.{s.pp}.{s.cp}" + (f".{s.ep}" if moe else ""),
            f"{s.micro_batch_size}x{s.num_micro_batches}", _knobs(s), f"{e.memory_gib.total:.1f}",
            step_time(e.step_time_s), f"{e.tokens_per_s:,.0f}", f"{e.mfu:.1%}", _BOTTLENECK.get(e.bottleneck, e.bottleneck),
            _calibrated(e))
    return table


def _calibrated(e: Estimate) -> str:
    """'yes', or 'no (n)' with the number of parts outside the profile's calibrated region."""
    if e.confidence is None:
        return "-"
    return "yes" if e.confidence.calibrated else f"no ({len(e.confidence.extrapolated)})"


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{reason} {n:,}" for reason, n in sorted(counts.items(), key=lambda kv: -kv[1]))


def search_lines(stats: SearchStats) -> list[str]:
    lines = [f"searcher {stats.searcher}: {stats.candidates:,} legal candidates; {stats.scored:,} scored exactly, "
             f"the rest bounded ({stats.bound_evaluations:,} bound evaluations); {stats.seconds:.2f} s"]
    if stats.pruned:
        lines.append(f"pruned: {_counts(stats.pruned)}")
    if stats.deduplicated:
        lines.append(f"not generated (provably equivalent to a kept candidate): {_counts(stats.deduplicated)}")
    return lines


def _training_time(e: Estimate) -> str | None:
    if e.time_to_train_s is None:
        return None
    return ", ".join([f"time to train the token budget with plan 1: {duration(e.time_to_train_s)}",
                      *training_figures(e)])


def recipe_line(recipe, first: Estimate) -> str:
    """The framework's published recipe (advisor.search.recipes) under recommend's table."""
    from advisor.render.breakdown import strategy_line

    e = recipe.entry
    head = (f"recipe ({e['framework']}, {e['run']}: {strategy_line(recipe.strategy)}, measured "
            f"{e['measured_tokens_per_s_per_device']:,.0f} tokens/s per device at {e['dtype']})")
    if recipe.estimate is None:
        return f"{head}: not priced here, {recipe.why_not}"
    if not recipe.estimate.feasible:
        return (f"{head}: does not fit under this job ({recipe.estimate.memory_gib.total:.1f} of "
                f"{recipe.estimate.capacity_gib:.4g} GiB)")
    vs = recipe.vs(first)
    where = "inside plan 1's band" if vs["inside_band"] else "outside plan 1's band: " + ", ".join(
        f"{d['part']} {d['recipe_minus_first_s']:+.3g} s" for d in vs["differences"]) + " in the recipe"
    return (f"{head}: {recipe.estimate.tokens_per_s:,.0f} tokens/s priced under this job; plan 1 vs recipe "
            f"{vs['gain']:+.1%}, {where}")


def layout_lines(plan) -> list[str]:
    """What an operator-level searcher (--searcher drec|ilp) changed in plan 1: each operator whose cut differs
    from Megatron's uniform split, and what it changed in time and memory (advisor.search.intra_op.record)."""
    rec = plan.operator_strategies
    if not isinstance(rec, dict) or "layout" not in rec:
        return []
    head = f"operator layouts ({rec.get('searcher')}) of plan 1"
    if rec["layout"] != "searched":
        return [f"{head}: Megatron's uniform split kept" + (f" ({rec['note']})" if rec.get("note") else "")]
    if "changed" not in rec or "delta_compute_s" not in rec.get("pricing", {}):
        return [f"{head}: a searched layout (a plan written before advisor listed its changes)"]
    changed = rec["changed"]
    pricing = rec["pricing"]
    n = pricing["graph_layers"]

    def secs(x: float) -> str:
        return f"{x:+.3g} s" if abs(x) >= 1.0 else f"{x * 1e3:+.3g} ms"

    def cut(axes) -> str:
        return "x".join(a or "-" for a in axes)

    lines = [f"{head}: {len(changed)} operator(s) cut otherwise than Megatron's split; over {n} layer(s) per step "
             f"the layout changes compute by {secs(pricing['delta_compute_s'])} and communication (tp_comm) by "
             f"{secs(pricing['delta_communication_s'])}, memory by {pricing['delta_memory_bytes'] / 2 ** 20:+.4g} MiB "
             "per device (labels: advisor/graph/transformer.py; b batch, s sequence, h hidden, g key/value heads, "
             "f FFN, v vocabulary)"]
    for op in changed:
        lines.append(f"  {op['operator']}: mesh axes cut {cut(op['megatron'])} -> {cut(op['searched'])}, "
                     f"{secs(op['delta_s'])}, {op['delta_bytes'] / 2 ** 20:+.4g} MiB")
    return lines


def render_recommendation(console: Console, result: RecommendResult, saved_to: str | None = None,
                          notes: tuple[str, ...] = ()) -> None:
    """The plans table and what it rests on; ``notes``: the command's lines printed before where the plan went."""
    fam = family(getattr(result, "family", None))
    if fam.render_recommend is not None:            # the family's own report (advisor.families)
        return fam.hook("render_recommend")(console, result, saved_to)
    console.print(plans_table(result))
    folded = any(p.strategy.fold_experts for p in result.plans)
    console.print(f"GiB: memory per device (of {result.estimates[0].capacity_gib:.4g}); knobs: sp = sequence parallel, "
                  + ("fold = MoE parallel folding (experts whole, ep over tp x dp x cp), " if folded else "")
                  + "z = ZeRO stage (+off: optimizer offload, +off50%: half of it, +offp: parameters too, +hemb: the "
                  "word embedding on the host), rc = recomputation, pipeline schedule, mesh order "
                  "innermost (fastest links) first (t = tp, c = cp, d = dp, p = pp); limit: the largest part of "
                  "the step time, or memory when over 95% is used; calib.: inside the profile's calibrated region "
                  "(no (n): n parts outside it)", highlight=False)
    for line in search_lines(result.search):
        console.print(line, highlight=False)
    line = band_line("plan 1", result.estimates[0])
    if line:
        from advisor.search.rank import TIE_BAND

        console.print(line + f"; plans rank by the low end, those within {TIE_BAND:.0%} of each other (the model's "
                      "error comparing two plans) simpler first", highlight=False, markup=False)
    first = result.estimates[0].confidence
    if first is not None and not first.calibrated:
        console.print("plan 1 extrapolates: " + "; ".join(first.extrapolated), highlight=False, markup=False)
    train = _training_time(result.estimates[0])
    if train:
        console.print(train)
    for line in layout_lines(result.plans[0]):
        console.print(line, highlight=False, markup=False)
    for note in notes:
        console.print(note, highlight=False, markup=False)
    if saved_to:
        console.print(f"best plan saved to {saved_to}")


@contextmanager
def search_progress(console: Console, enabled: bool) -> Iterator[ProgressHook]:
    """A progress hook that shows a rich bar once a search has run for PROGRESS_AFTER_S (only when
    enabled: on a terminal and not --json)."""
    if not enabled:
        yield None
        return
    start = time.perf_counter()
    state: dict = {}

    def hook(done: float, total: float) -> None:
        if "bar" not in state:
            if time.perf_counter() - start < PROGRESS_AFTER_S:
                return
            from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

            bar = Progress(TextColumn("searching"), BarColumn(), TaskProgressColumn(), TimeElapsedColumn(),
                           console=console, transient=True)
            bar.start()
            state["bar"], state["task"] = bar, bar.add_task("search", total=max(total, 1))
        state["bar"].update(state["task"], completed=done, total=max(total, 1))

    try:
        yield hook
    finally:
        if "bar" in state:
            state["bar"].stop()
