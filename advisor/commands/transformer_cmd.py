"""``estimate`` and ``recommend`` for transformers (the transformer family, advisor.families): the
command-line side, from a Request (advisor.commands.cli_settings) to the printed report."""

from __future__ import annotations

import sys
from dataclasses import replace

from advisor.commands.cli_options import console, print_json, print_warnings
from advisor.commands.cli_settings import Request
from advisor.errors import AdvisorError, InfeasibleError
from advisor.runtime.files import check_writable
from advisor.space.strategy import Strategy
from advisor.specs.job import TrainingJob


def _input_files(r: Request) -> dict:
    """The files a command reads, by flag (an output over one of them is refused)."""
    return {"--model": r.get("model"), "--hardware": r.get("hardware"), "--plan": r.get("plan"),
            "--from": r.get("from_file"), "--operator-strategies": r.get("operator_strategies")}


def estimate_cmd(request: Request) -> None:
    """Score one strategy, with the full breakdown of memory and time."""
    from advisor.commands.estimate_request import estimate_request
    from advisor.render.breakdown import render_estimate
    from advisor.specs.input_notes import input_warnings

    r = request
    check_writable(r.get("out"), "the plan", inputs=_input_files(r))
    result = estimate_request(r.get("model"), r.get("hardware"), r.get("nodes"), r.get("devices"),
                              job=r.values_of(TrainingJob), strategy=r.values_of(Strategy), plan=r.get("plan"),
                              operator_strategies=r.get("operator_strategies"), launch=r.get("from_file"))
    warnings = input_warnings(result.inputs.hardware, result.inputs.cluster)
    if r.get("json"):
        print_json({**result.to_dict(), "warnings": warnings})
    else:
        print_warnings(warnings)
        render_estimate(console, result.title, result.strategy, result.estimate)
        if result.alternative:
            console.print(f"closest change that fits: {result.alternative}")
    if not result.estimate.feasible:
        hint = f"; closest change that fits: {result.alternative}" if result.alternative else ""
        raise InfeasibleError(f"the strategy does not fit: {result.estimate.reasons[0]}{hint}")
    if r.get("out"):
        from advisor.commands.recommend import prediction_of
        from advisor.plan import Plan, save_plan

        i = result.inputs
        save_plan(Plan(model=i.model, hardware=i.hardware, cluster=i.cluster, training=i.job, strategy=result.strategy,
                       operator_strategies=result.operator_strategies, prediction=prediction_of(result.estimate)),
                  r.get("out"))
        if not r.get("json"):
            console.print(f"plan saved to {r.get('out')}", markup=False, highlight=False)


def recommend_cmd(request: Request) -> None:
    """Search the strategy space and rank the plans; the best is saved with --out."""
    from advisor.commands.inputs import resolve_inputs
    from advisor.commands.objective import target_for
    from advisor.cost.band import memory_headroom
    from advisor.render.report import search_progress
    from advisor.search import Pins
    from advisor.specs.input_notes import input_warnings
    from advisor.specs.operator_strategies import load_operator_strategies

    r = request
    check_writable(r.get("out"), "the plan", inputs=_input_files(r))
    check_writable(r.get("plot"), "the plot", "--plot", inputs=_input_files(r))
    check_writable(r.get("all_candidates"), "the candidate table", "--all-candidates", inputs=_input_files(r))
    if r.get("all_candidates") and (r.get("searcher") != "enumerate" or r.get("objective") != "throughput"):
        raise AdvisorError("--all-candidates writes the exhaustive enumerator's space: it goes with --searcher "
                           "enumerate and --objective throughput")
    job, nodes, devices, imported = r.values_of(TrainingJob), r.get("nodes"), r.get("devices"), None
    if r.get("from_file"):         # a launch configuration: its settings under the flags given
        from advisor.importers import read_launch_config
        from advisor.specs.setting import as_given

        imported = read_launch_config(r.get("from_file"))
        job = {**as_given(TrainingJob, imported.job), **job}
        if nodes is None and devices is None:
            nodes, devices = (None, imported.devices) if imported.devices else (imported.nodes, None)
    inputs = resolve_inputs(r.get("model"), r.get("hardware"), nodes=nodes, devices=devices, **job)
    headroom = None
    if "memory_margin" not in job:      # fit at the upper end of the memory band (advisor.cost.band)
        headroom = memory_headroom()
        inputs = replace(inputs, job=replace(inputs.job, memory_margin=headroom))
    warnings = input_warnings(inputs.hardware, inputs.cluster)
    if not r.get("json"):   # before the search: a mistaken cluster size is seen at once
        print_warnings(warnings)
    pinned = r.values_of(Strategy)
    if imported is not None:
        from advisor.importers import check_model, pins_of, strategy_settings
        from advisor.search import SEARCHED

        check_model(imported, inputs.model)
        settings = strategy_settings(imported, inputs.model.num_layers, inputs.job.grad_reduce_bytes)
        pinned = {**pins_of(imported, settings, {name for name, _ in SEARCHED}, inputs.model.num_layers),
                  **{k: v for k, v in pinned.items() if v is not None}}
    pins = Pins.from_values(pinned)
    objective, top, searcher = r.get("objective"), r.get("top"), r.get("searcher")
    target = target_for(objective, r.get("target_tokens"), r.get("target_loss"), r.get("critical_batch"))
    fixed = load_operator_strategies(r.get("operator_strategies")) if r.given("operator_strategies") else None
    trials = None
    if objective in ("time-to-target", "cost"):
        if fixed is not None:
            raise AdvisorError(f"--objective {objective} ranks the collective searchers' plans; it does not take "
                               "--operator-strategies or --ps-mode")
        from advisor.commands.objective import time_to_target
        from advisor.commands.objective_cost import cheapest

        result, trials = (time_to_target(inputs.model, inputs.hardware, inputs.cluster, inputs.job, target, pins=pins,
                                         top_k=top, searcher=searcher) if target is not None else
                          cheapest(inputs.model, inputs.hardware, inputs.cluster, inputs.job, pins, top, searcher))
    else:
        from advisor.commands.recommend import recommend

        with search_progress(console, enabled=not r.get("json") and sys.stdout.isatty()) as progress:
            result = recommend(inputs.model, inputs.hardware, inputs.cluster, inputs.job, pins=pins, top_k=top,
                               searcher=searcher, progress=progress, operator_strategies=fixed, objective=objective)
    if r.get("all_candidates"):
        write_candidates(r.get("all_candidates"), inputs, pins, quiet=r.get("json"))
    recipe = None
    if objective == "throughput" and fixed is None and getattr(result, "estimates", None):
        from advisor.search.recipes import recipe_for

        recipe = recipe_for(inputs.model, inputs.hardware, inputs.cluster, inputs.job)
    show(r, result, warnings, trials, objective, headroom, recipe)


def write_candidates(path: str, inputs, pins, quiet: bool) -> None:
    """--all-candidates: every fitting candidate as CSV (advisor.search.all_candidates), with a line on stderr."""
    from advisor.runtime import progress
    from advisor.runtime.files import write_atomic
    from advisor.search.all_candidates import write_all

    done = {}
    with progress.bar(progress.enabled(quiet), "all candidates") as update:
        def body(fh) -> None:
            done["result"] = write_all(fh, inputs.model, inputs.hardware, inputs.cluster, inputs.job, pins, update)
        write_atomic(path, body, what="the candidate table")
    w = done["result"]
    pruned = ", ".join(f"{n:,} {why}" for why, n in sorted(w.pruned.items()) if n)
    print(f"--all-candidates: {w.rows:,} of the {w.candidates:,} legal candidates fit and are written to {path}"
          + (f" (not written: {pruned})" if pruned else ""), file=sys.stderr)


def headroom_line(headroom: float | None) -> str | None:
    """What the memory margin recommend chose is for (None: the user gave --memory-margin)."""
    if not headroom:
        return None
    return (f"memory: plans leave {headroom:.0%} of each device free, so that they fit at the upper end of the memory "
            f"band (measured peaks up to {1.0 / (1.0 - headroom) - 1.0:.0%} above the prediction, advisor/cost/"
            "error_bands.json); --memory-margin sets another share (0: the point figure)")


def show(r: Request, result, warnings: list[str], trials=None, objective: str = "throughput",
         headroom: float | None = None, recipe=None) -> None:
    """Save, plot and print a recommendation (the plans table, or --json)."""
    from advisor.plan import save_plan
    from advisor.render.report import render_recommendation

    out, plot = r.get("out"), r.get("plot")
    if out:
        save_plan(result.best, out)
    if plot:
        from advisor.render.plots import recommend_plot

        recommend_plot(result, plot)
    if r.get("json"):
        extra = {"sizes" if objective == "cost" else "batches": [t.to_dict() for t in trials]} if trials else {}
        if objective == "throughput":
            extra["recipe"] = None if recipe is None else recipe.to_dict(result.estimates[0])
        print_json({**result.to_dict(), "warnings": warnings, **extra})
        return
    notes = [line for line in (headroom_line(headroom),) if line]
    if recipe is not None:
        from advisor.render.report import recipe_line

        notes.append(recipe_line(recipe, result.estimates[0]))
    render_recommendation(console, result, saved_to=out, notes=tuple(notes))
    if trials:
        from advisor.render.objective import trials_table

        console.print(trials_table(trials, result))
    if plot:
        console.print(f"plot written to {plot}", markup=False, highlight=False)
