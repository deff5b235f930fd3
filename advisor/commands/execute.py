"""Run a plan on torch.distributed and compare what happened with what advisor predicted.

    load plan -> refuse what cannot run or does not fit (before any process starts) -> start one
    process per device -> collect per-rank results -> single-process reference run -> compare
    losses, memory by part and step time with the prediction -> report (dict, JSON-ready)

The executor proper (advisor.executor) reads only the plan JSON; this module is where the cost
model comes in: ``advisor.cost.estimate`` gives the predicted memory (for the executed model: the
--tiny shrink when asked, in the executed dtype and attention) and, with a profile of this machine
(``advisor calibrate``), the predicted step time.

Across machines, start the same worker with torchrun on every node, then compare here:

    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
        -m advisor.executor.worker --plan plan.json --tiny --steps 5 --out-dir /shared/run1
    advisor execute plan.json --tiny --steps 5 --results /shared/run1/results.json
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from advisor.errors import AdvisorError, InfeasibleError
from advisor.export._common import display
from advisor.families import family_of_plan
from advisor.validation.execute_report import (COMPARED_PARTS, GIB, LOSS_GOAL, MEMORY_GOAL, TIME_GOAL, build_report,
                                               render_report, summary_rows, verdict, write_report)
from advisor.executor.config import RunConfig, run_config_from_plan, run_config_to_dict
from advisor.runtime.capacity import capacity_problems

__all__ = ["COMPARED_PARTS", "LOSS_GOAL", "MEMORY_GOAL", "TIME_GOAL", "BACKENDS", "ExecuteOptions", "Prepared",
           "check_options", "execute", "prepare_plan", "render_report", "run_prepared", "summary_rows",
           "write_report"]
BACKENDS = ("auto", "gloo", "nccl")


@dataclass(frozen=True)
class ExecuteOptions:
    nproc: int | None = None
    steps: int = 5
    tiny: bool = False
    tiny_scale: int = 1                   # --tiny-scale: wider and longer tiny model (time checks on CPU)
    dtype: str | None = None             # run in this dtype instead of the plan's (fp32 or bf16)
    time_hardware: str | None = None      # profile of this machine (advisor calibrate) for the time prediction
    timeout_s: float = 900.0
    pg_timeout_s: float = 60.0
    backend: str = "auto"
    results: str | None = None            # results.json written by torchrun workers: compare, do not launch
    workdir: str | None = None            # keep the rank files here (default: a temporary folder, removed)
    oversubscribe: bool = False           # allow more than RANKS_PER_CORE ranks per core (advisor.runtime.capacity)
    progress: bool = False                # a progress bar on stderr


def check_options(options: ExecuteOptions) -> None:
    """Refuse unusable options before anything is read or started."""
    if options.backend not in BACKENDS:
        raise AdvisorError(f"--backend must be one of {', '.join(BACKENDS)}, got {options.backend[:40]!r}")
    for flag, value in (("--timeout", options.timeout_s), ("the process-group timeout", options.pg_timeout_s)):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise AdvisorError(f"{flag} must be a positive number of seconds, got {value}")
    if options.nproc is not None and options.nproc < 1:
        raise AdvisorError(f"--nproc must be at least 1, got {options.nproc}")
    if options.steps < 2:
        raise AdvisorError(f"--steps must be at least 2 (the first step is warm-up), got {options.steps}")


# ---- plan --------------------------------------------------------------------------------------
def read_plan(path: str | Path) -> dict[str, Any]:
    from advisor.plan import read_plan_dict

    return read_plan_dict(path)


def _validated_plan(plan: dict[str, Any], origin: str):
    """advisor's own Plan (for the cost model), or None where the plan uses an executor-only
    extension (zero-bubble schedules). Other validation errors refuse the plan."""
    from advisor.executor.config import ZERO_BUBBLE
    from advisor.plan import plan_from_dict

    if plan.get("parallel", {}).get("pipeline_schedule") in ZERO_BUBBLE:
        return None
    return plan_from_dict(plan, origin)


# ---- prediction --------------------------------------------------------------------------------
def _strategy(cfg: RunConfig):
    from advisor.space.strategy import Strategy

    p = cfg.parallel
    return Strategy(dp=p.dp, tp=p.tp, pp=p.pp, cp=p.cp, ep=p.ep, sequence_parallel=p.sequence_parallel,
                    virtual_pipeline_stages=p.virtual_pipeline_stages, micro_batch_size=p.micro_batch_size,
                    num_micro_batches=p.num_micro_batches, zero_stage=p.zero_stage, recompute=p.recompute,
                    recompute_layers=p.recompute_layers, pipeline_schedule=p.pipeline_schedule,
                    stage_layers=tuple(p.stage_layers), offload_optimizer=p.offload_optimizer,
                    offload_fraction=p.offload_fraction, swap_layers=p.swap_layers,
                    micro_batch_copies=p.micro_batch_copies, offload_params=p.offload_params, cp_comm=p.cp_comm,
                    host_embedding=p.host_embedding,
                    mesh_order=tuple(p.mesh_order), grad_bucket_mb=p.grad_bucket_mb)


def _model_spec(cfg: RunConfig):
    from advisor.specs.model import model_from_dict

    m = cfg.model
    return model_from_dict({
        "name": "executed", "source": "advisor execute", "num_layers": m.num_layers, "hidden_size": m.hidden_size,
        "num_attention_heads": m.num_attention_heads, "num_kv_heads": m.num_kv_heads,
        "ffn_hidden_size": m.ffn_hidden_size, "ffn_activation": m.ffn_activation, "vocab_size": m.vocab_size,
        "seq_length": m.seq_length, "tie_embeddings": m.tie_embeddings, "norm": m.norm, "use_bias": m.use_bias,
        "position_embedding": m.position_embedding}, "executed model")


def _job(cfg: RunConfig):
    """The training job the executor runs: no dropout, PyTorch's tensor/sequence-parallel layers."""
    from advisor.specs.job import TrainingJob

    return TrainingJob(global_batch_size=cfg.global_batch_size, seq_length=cfg.seq_length, dtype=cfg.dtype,
                       optimizer=cfg.optimizer, attention=cfg.model.attention, dropout=False, framework="pytorch",
                       overlap_grad_reduce=False,   # ZeRO-0/1 average gradients after accumulation
                       grad_reduce_dtype=cfg.grad_reduce_dtype)


def _estimate(cfg: RunConfig, hardware):
    """advisor's Estimate for exactly the executed run (model, dtype, attention, strategy), or None
    when the cost model cannot express it (zero-bubble schedules)."""
    from advisor.cost.estimate import estimate
    from advisor.executor.config import ZERO_BUBBLE
    from advisor.specs.job import Cluster

    if cfg.parallel.pipeline_schedule in ZERO_BUBBLE:
        return None
    per_node = hardware.node.devices_per_node
    world = cfg.parallel.world_size
    cluster = Cluster(nodes=-(-world // per_node), devices=world)
    return estimate(_model_spec(cfg), hardware, cluster, _job(cfg), _strategy(cfg))


def stage_predictions(cfg: RunConfig) -> list[dict[str, float]]:
    """Per pipeline stage, the predicted bytes of each compared part on one device of that stage
    (advisor.cost.memory's stage_parts), so that every rank is compared with its own stage."""
    from advisor.cost.host_embedding import table_host_bytes
    from advisor.cost.memory import memory
    from advisor.space.strategy import StrategyBatch

    model, job = _model_spec(cfg), _job(cfg)
    batch = StrategyBatch.from_strategies([_strategy(cfg)], model.num_layers)
    parts = dict(memory(model, job, batch).stage_parts)
    # a host table is the first stage's (advisor.cost.host_embedding prices it per step, beside the stages)
    table = float(table_host_bytes(model, job, batch)[0]) if cfg.parallel.host_embedding else 0.0
    return [{**{part: float(parts[part][0, stage]) for part in COMPARED_PARTS.values() if part != "host_embedding"},
             "host_embedding": table if stage == 0 else 0.0} for stage in range(cfg.parallel.pp)]


def layout_activation_bytes(cfg: RunConfig, hardware) -> list[float]:
    """Per pipeline stage, the bytes one micro-batch's saved activations take per device under the run's
    operator layout beyond Megatron's cut of the same group (advisor.search.sharding's ShardingProblem prices both:
    each operator saves its inputs at its cut); the embedding, head and loss are in the graph only without
    pipelining (with it they run Megatron's cut, as the plan's pricing has them). A layer under full
    recomputation keeps only its input (the last residual add's output, at that operator's cut); under selective
    recomputation the attention keeps its inputs and no scores (priced as the fused kernel's graph)."""
    from dataclasses import replace

    from advisor.graph.transformer import transformer_graph
    from advisor.search.intra_op import megatron_assignment
    from advisor.search.sharding import REPLICATE, DeviceMesh, ShardingOptions, ShardingProblem

    p, layout = cfg.parallel, cfg.operator_layout
    model, job = _model_spec(cfg), _job(cfg)
    if p.recompute == "selective":
        job = replace(job, attention="flash")
    mesh = DeviceMesh.for_devices(hardware, p.tp, shape=layout.mesh_shape)

    def saved_per_micro_batch(layers: int, whole: bool) -> float:
        graph = transformer_graph(model, job, batch=p.micro_batch_size, layers=(0, layers), first_stage=whole,
                                  last_stage=whole)
        executed = [tuple(REPLICATE if a is None else a for a in layout.axes(op.name.rsplit(".", 1)[-1]))
                    for op in graph.operators]
        delta = []
        for flight in (1.0, 0.0):       # the difference is the saved activations of one micro-batch
            problem = ShardingProblem(graph, mesh, hardware, job, ShardingOptions(
                num_micro_batches=p.num_micro_batches, activations_in_flight=flight, zero_stage=min(p.zero_stage, 3)))
            reference = megatron_assignment(problem, p.sequence_parallel, executed)
            delta.append(problem.evaluate(executed).memory_bytes - problem.evaluate(reference).memory_bytes)
        return delta[0] - delta[1]

    per_layer = saved_per_micro_batch(1, False)
    ends = saved_per_micro_batch(1, True) - per_layer if p.pp == 1 else 0.0
    # a recomputed layer's input: the tokens' hidden states at the cut of the layer's last operator (res2), against
    # Megatron's (the sequence-parallel shard, or whole)
    whole = p.micro_batch_size * cfg.seq_length * model.hidden_size * job.dtype_bytes
    cut = math.prod(n for a, n in zip(layout.axes("res2"), layout.mesh_shape) if a in ("b", "s", "h"))
    input_delta = whole / cut - (whole / p.tp if p.sequence_parallel else whole)
    out = []
    for stage, layers in enumerate(p.stage_layers):
        recomputed = 0 if p.recompute != "full" else min(layers, p.recompute_layers or layers)
        out.append((layers - recomputed) * per_layer + recomputed * input_delta + (ends if stage == 0 else 0.0))
    return out


def layout_parameter_ratios(cfg: RunConfig) -> list[float]:
    """Per pipeline stage, the parameter elements one device holds under the run's operator layout over those it
    holds under Megatron's cut of the same group: each weight divided by the mesh axes that cut one of its labels
    (the operator graph's tensors and labels). The executor's ZeRO shards the model states over data
    parallelism only, the same for both, so parameters, gradients and optimizer states scale by this ratio."""
    from advisor.graph.transformer import transformer_graph
    from advisor.specs.operator_strategies import MEGATRON_CUTS, SEQUENCE

    p, layout = cfg.parallel, cfg.operator_layout
    model, job = _model_spec(cfg), _job(cfg)
    megatron = (lambda op: (MEGATRON_CUTS.get(op, SEQUENCE if p.sequence_parallel else None),) * len(layout.mesh_shape))

    def elements(axes_of) -> dict[str, float]:
        """Local parameter elements of one layer, and of the first and the last stage's ends."""
        graph = transformer_graph(model, job, batch=p.micro_batch_size, layers=(0, 1))
        out = {"layer": 0.0, "first": 0.0, "last": 0.0}
        for op in graph.operators:
            base = op.name.rsplit(".", 1)[-1]
            where = "layer" if op.name.startswith("layer.") else "first" if base == "embed" else "last"
            axes = axes_of(base)
            for t, labels in zip(op.inputs, op.labels):
                tensor = graph.tensors[t]
                if tensor.param and not (tensor.tied_to and p.pp == 1):   # a tied head on the embedding's stage
                    parts = math.prod(n for a, n in zip(axes, layout.mesh_shape) if a is not None and a in labels)
                    out[where] += math.prod(tensor.shape) / parts
        return out

    mine, theirs = elements(layout.axes), elements(megatron)
    ratios = []
    for stage, layers in enumerate(p.stage_layers):
        ends = [e for e, on in (("first", stage == 0), ("last", stage == p.pp - 1)) if on]
        ratios.append((layers * mine["layer"] + sum(mine[e] for e in ends))
                      / (layers * theirs["layer"] + sum(theirs[e] for e in ends)))
    return ratios


def with_layout_memory(pred: dict[str, Any], cfg: RunConfig, hardware) -> None:
    """A memory prediction (memory_prediction with its stages) moved by the run's operator layout, in place: the model
    states by the layout's parameter elements (layout_parameter_ratios), the saved activations per micro-batch and
    in flight by layout_activation_bytes."""
    from advisor.cost.memory import in_flight
    from advisor.space.strategy import StrategyBatch

    extra = layout_activation_bytes(cfg, hardware)
    ratios = layout_parameter_ratios(cfg)
    flight = in_flight(StrategyBatch.from_strategies([_strategy(cfg)], cfg.model.num_layers))[0]
    for stage, part in enumerate(pred["stages"]):
        part["activations_per_microbatch"] += extra[stage]
        for k in MODEL_STATES:
            part[k] *= ratios[stage]
    worst = int(pred["stage"])
    states = sum(pred[k] for k in MODEL_STATES if not k.startswith("host_"))    # the device's
    for k in MODEL_STATES:
        pred[k] *= ratios[worst]
    pred["activations_per_microbatch"] += extra[worst]
    pred["activations"] += extra[worst] * float(flight[worst])
    pred["total"] += extra[worst] * float(flight[worst]) + states * (ratios[worst] - 1.0)


MODEL_STATES = ("parameters", "gradients", "optimizer", "host_optimizer", "host_params")


predict = _estimate


def memory_prediction(est) -> dict[str, float] | None:
    if est is None:
        return None
    m = est.memory_gib
    out = {k: getattr(m, k) * GIB for k in ("parameters", "gradients", "optimizer", "activations", "buffers", "total")}
    out["activations_per_microbatch"] = est.activation_gib_per_microbatch * GIB
    out["host_optimizer"] = est.host_optimizer_gib * GIB
    out["host_activations"] = est.host_activations_gib * GIB
    out["host_params"] = est.host_params_gib * GIB
    out["host_embedding"] = est.host_embedding_gib * GIB
    out["stage"] = est.worst_memory_stage
    return out


# ---- refusals before launch --------------------------------------------------------------------
def check_fits(plan: dict[str, Any], cfg: RunConfig, hardware, validated, options: ExecuteOptions) -> list[str]:
    """Sentences for what does not fit: the plan on its own hardware, the run on this machine."""
    problems = []
    if validated is not None:
        from advisor.cost.estimate import estimate

        e = estimate(validated.model, validated.hardware, validated.cluster, validated.training, validated.strategy)
        if not e.feasible:
            problems.append(f"the plan does not fit its hardware ({validated.hardware.name}): " + "; ".join(e.reasons))
    # this machine: the ranks' processes (cores, Python and torch) when they are started here, and
    # on CPU the model's share of every rank (with --results, the single-process reference holds it)
    run_est = _estimate(cfg, hardware) if _device_type(options) == "cpu" else None
    per_rank = (run_est.memory_gib.total - run_est.memory_gib.buffers) * GIB if run_est is not None else 0.0
    launching = options.results is None
    problems += capacity_problems(cfg.parallel.world_size, per_rank, oversubscribe=options.oversubscribe,
                                  processes=launching, hint="; use --tiny" if per_rank > 0 else "")
    return problems


def _device_type(options: ExecuteOptions) -> str:
    if options.backend == "gloo":
        return "cpu"
    try:
        import torch
        return "cuda" if (options.backend == "nccl" or torch.cuda.is_available()) else "cpu"
    except ImportError:
        return "cpu"


def calibrated_probe_us(hw) -> float | None:
    """What ``advisor calibrate``'s host probe (one tiny layer forward + backward) took when the
    profile was measured: its launch overhead is that time over the cost model's kernels per layer."""
    from advisor.cost.estimate import KERNELS_BACKWARD, KERNELS_FORWARD

    us = hw.device.launch_overhead_us * (KERNELS_FORWARD + KERNELS_BACKWARD)
    return us if us > 0 else None


# ---- the command -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Prepared:
    """A plan checked and predicted, ready to run."""

    cfg: RunConfig
    memory_prediction: dict[str, float] | None
    time_estimate: Any
    notes: tuple[str, ...]
    calibrated_probe_us: float | None = None   # the time profile's host-speed probe (see host_speed)


def prepare_plan(plan: dict[str, Any], origin: str, options: ExecuteOptions) -> Prepared:
    """Everything done before any process starts: refuse, check the fit, predict."""
    from advisor.specs.hardware import hardware_from_dict, load_hardware

    check_options(options)
    cfg = run_config_from_plan(plan, steps=options.steps, tiny=options.tiny, dtype=options.dtype,
                               tiny_scale=options.tiny_scale)
    world = cfg.parallel.world_size
    if options.nproc is not None and options.nproc != world:
        raise AdvisorError(f"--nproc {options.nproc} differs from the plan's device count dp x tp x pp x cp = {world}")
    validated = _validated_plan(plan, origin)
    hardware = validated.hardware if validated is not None else hardware_from_dict(plan["hardware"], f"{origin}: hardware")
    problems = check_fits(plan, cfg, hardware, validated, options)
    if problems:
        raise InfeasibleError("refused before starting any process: " + "; ".join(problems))
    notes = []
    memory_pred = memory_prediction(_estimate(cfg, hardware))
    if memory_pred is not None:
        memory_pred["stages"] = stage_predictions(cfg)
        if cfg.operator_layout is not None:
            with_layout_memory(memory_pred, cfg, hardware)
            notes.append("memory predicted for the operator layout: its weights' cuts, and its saved activations "
                         "against Megatron's cut (advisor.search's sharding model); the executor shards the optimizer "
                         "states over data parallelism only, also for weights the layout keeps whole on several ranks "
                         "of the group (which MindSpore's optimizer parallelism would shard over them)")
    if memory_pred is None:
        notes.append("advisor's cost model does not model zero-bubble schedules: no prediction")
    time_est, probe_us = None, None
    if options.time_hardware is not None:
        time_hw = load_hardware(options.time_hardware)
        time_est = _estimate(cfg, time_hw)
        probe_us = calibrated_probe_us(time_hw)
    else:
        notes.append("no profile of this machine given (--hardware, from advisor calibrate): no time prediction")
    if cfg.parallel.recompute == "selective" and cfg.model.attention == "flash":
        notes.append("selective recomputation with flash attention recomputes nothing (the fused kernel keeps no scores)")
    return Prepared(cfg, memory_pred, time_est, tuple(notes), probe_us)


def run_prepared(prepared: list[Prepared], options: ExecuteOptions) -> list[dict[str, Any]]:
    """Run prepared plans, one launch per world size (plans of one size share the processes), and
    report each against its single-process reference."""
    from advisor.executor.launch import LaunchOptions, launch
    from advisor.executor.train import reference_key, run_reference
    from advisor.runtime import progress

    backend = "nccl" if _device_type(options) == "cuda" else "gloo"
    by_world: dict[int, list[int]] = {}
    for i, prep in enumerate(prepared):
        by_world.setdefault(prep.cfg.parallel.world_size, []).append(i)
    ranks_of: dict[int, list[dict]] = {}
    reports = []
    with progress.bar(options.progress, "executing") as update:
        for world, indices in by_world.items():
            workdir = None if options.workdir is None else str(Path(options.workdir) / f"world{world}")
            opts = LaunchOptions(nproc=world, timeout_s=options.timeout_s, pg_timeout_s=options.pg_timeout_s,
                                 backend=options.backend, workdir=workdir)
            hook = progress.ranks_progress(update, world) if options.progress else None
            per_rank = launch([run_config_to_dict(prepared[i].cfg) for i in indices], opts, hook)
            for j, i in enumerate(indices):
                ranks_of[i] = [runs[j] for runs in per_rank]
        references: dict[str, dict] = {}       # plans that differ only in their layout share one reference
        for i, prep in enumerate(prepared):
            update(i, len(prepared), "single-process reference")
            key = reference_key(prep.cfg)
            if key not in references:
                references[key] = run_reference(prep.cfg)
            reference = copy.deepcopy(references[key])
            reports.append(build_report(prep.cfg, ranks_of[i], reference, prep.memory_prediction, prep.time_estimate,
                                        backend, list(prep.notes), prep.calibrated_probe_us))
    return reports


def predict_ps(executed: dict[str, Any], time_hardware: str | None) -> dict[str, Any] | None:
    """The cost model's figures for the parameter-server run as it ran (the --tiny model and batch,
    the plan's servers and sharding): memory per role, and the step time on this machine's profile
    when one is given (--hardware, from advisor calibrate)."""
    from advisor.cost.recsys_estimate import estimate_recsys
    from advisor.plan import plan_from_dict
    from advisor.commands.recsys_request import config_of
    from advisor.specs.hardware import load_hardware

    if not isinstance(executed.get("hardware"), dict):       # a hand-written plan without a profile
        return None
    try:        # a plan the executor runs but the cost model cannot price (e.g. adagrad): measured only
        plan = plan_from_dict(executed, "the executed plan")
        config = config_of(plan)
        memory = estimate_recsys(plan.model, plan.hardware, plan.cluster, plan.training, config).to_dict()
    except AdvisorError:
        return None
    out = {k: memory[k] for k in ("worker_memory_gib", "server_memory_gib", "staleness_steps") if k in memory}
    if time_hardware is not None:
        timed = estimate_recsys(plan.model, load_hardware(time_hardware), plan.cluster, plan.training, config)
        out["step_time_s"] = timed.step_time_s
    return out


def execute(plan_path: str | Path, options: ExecuteOptions) -> dict[str, Any]:
    """Run the plan (or read torchrun results), compare, and return the report with its verdict
    (advisor.validation.execute_report.verdict)."""
    report = _execute(plan_path, options)
    report["verdict"] = verdict(report)
    return report


def _execute(plan_path: str | Path, options: ExecuteOptions) -> dict[str, Any]:
    from advisor.executor.train import run_reference

    check_options(options)
    plan = read_plan(plan_path)
    family = family_of_plan(plan)
    if family.execute is not None:          # the family's own runner (advisor.families)
        return family.hook("execute")(plan, str(plan_path), options)
    prep = prepare_plan(plan, str(plan_path), options)
    if options.results is None:
        return run_prepared([prep], options)[0]
    ranks, backend = _read_results(options.results, prep.cfg)
    reference = run_reference(prep.cfg)
    try:
        return build_report(prep.cfg, ranks, reference, prep.memory_prediction, prep.time_estimate, backend,
                            list(prep.notes), prep.calibrated_probe_us)
    except (KeyError, TypeError, ValueError) as exc:
        raise AdvisorError(f"--results: {options.results} lacks what advisor's workers write (at {exc!r:.60})") from None


def _read_results(path: str, cfg: RunConfig) -> tuple[list[dict], str]:
    """The ranks' results of a torchrun run (advisor.executor.worker --plan), checked to be that."""
    p = Path(path)
    if p.is_dir():
        p = p / "results.json"
    if not p.is_file():
        raise AdvisorError(f"--results: {path} has no results.json (written by rank 0 of the torchrun workers)")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise AdvisorError(f"--results: {p} is not a results file of advisor's workers ({type(exc).__name__})") from None
    world = cfg.parallel.world_size
    ranks = data.get("ranks") if isinstance(data, dict) else None
    if not (isinstance(ranks, list) and isinstance(data.get("configs"), list) and data["configs"]
            and isinstance(data.get("backend"), str) and data.get("world_size") == len(ranks)
            and all(isinstance(r, list) and r and isinstance(r[0], dict) for r in ranks)):
        raise AdvisorError(f"--results: {p} is not a results file of advisor's workers "
                           "(expected the keys backend, world_size, configs and ranks, one list of runs per rank)")
    if data["world_size"] != world:
        raise AdvisorError(f"--results: {p} has {data['world_size']} ranks, the plan needs {world}")
    if data["configs"][0] != json.loads(json.dumps(run_config_to_dict(cfg))):
        raise AdvisorError(f"--results: {p} was produced by a different run (plan, --tiny, --steps or --dtype differ)")
    return [runs[0] for runs in ranks], data["backend"]


def execute_recommendation(plan: dict[str, Any], plan_path: str, options: ExecuteOptions) -> dict[str, Any]:
    """A recommendation plan with parameter servers: servers and workers (advisor.executor.ps)."""
    if not (plan.get("parallel") or {}).get("parameter_server"):
        raise AdvisorError(f"{plan_path}: a recommendation plan without parameter servers (tables "
                           f"{display(str((plan.get('parallel') or {}).get('embedding_placement') or 'replicated'))[:20]}): "
                           "the executor runs transformer plans and parameter-server or hybrid plans; price it with "
                           "advisor estimate --plan")
    from advisor.executor.ps.run import run_ps

    return run_ps(plan, plan_path, steps=options.steps, tiny=options.tiny, dtype=options.dtype,
                  nproc=options.nproc, timeout_s=options.timeout_s, pg_timeout_s=options.pg_timeout_s,
                  workdir=options.workdir, results=options.results, oversubscribe=options.oversubscribe,
                  predict=lambda executed: predict_ps(executed, options.time_hardware))


def refuse_mixed(plan: dict[str, Any], plan_path: str, options: ExecuteOptions) -> dict[str, Any]:
    raise AdvisorError(f"{plan_path} is a plan for a mixed cluster: the executor runs one device type (this "
                       "machine's), so it cannot measure what the plan predicts per type; price it with "
                       "advisor estimate --plan")
