"""The model families and the cluster kinds advisor plans for, one record each.

A family (transformer, recommendation with its parameter servers, supernet) and a cluster kind (mixed:
nodes of several hardware profiles) registers here, once, what the rest of advisor needs from it: the
reader of its model description, its ``estimate`` and ``recommend`` commands, the keys it adds to
the plan's parallel block, the legality check of its strategies, its report, where it can be
exported and whether ``whatif`` sweeps it. Commands, the plan reader, the exports and the reports
look the family up (``family_of_model``, ``family_of_plan``) instead of
testing model types (advisor.commands.cli_settings.family_of_request picks a command's). Hooks are
named "module:function" and imported when first called, so this module imports none of them and no
import cycle runs through it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable

from advisor.errors import AdvisorError


@dataclass(frozen=True)
class Family:
    name: str
    """The model description's ``family`` key (transformer, recommendation, supernet), or a cluster kind."""
    doc: str
    """What it plans, in a sentence."""
    estimate: str
    """``advisor estimate``: "module:function", called with the command's Request."""
    recommend: str
    """``advisor recommend``: "module:function", called with the command's Request."""
    model_reader: str | None = None
    """The reader of its model descriptions: "module:function(data, origin)" (None: a cluster kind)."""
    model_writer: str | None = None
    """The writer of its model descriptions: "module:function(spec)" -> mapping."""
    plan_parallel: str | None = None
    """Reads the keys it adds to a plan's parallel block: "module:function(data, origin, model, cluster,
    strategy, training, mixed)" -> the Plan's fields (None: none)."""
    plan_parallel_writer: str | None = None
    """Writes those keys: "module:function(plan)" -> mapping."""
    objectives: tuple[str, ...] = ("throughput", "time-to-target", "cost", "carbon")
    """What ``recommend`` ranks its plans by (advisor.commands.objective)."""
    optimizers: tuple[str, ...] | None = ("adamw", "adam", "sgd")
    """The optimizers its plans are priced with (None: any of advisor.specs.job.OPTIMIZERS)."""
    search: str | None = None
    """The library ``recommend`` of a family with its own searcher: "module:function(model, hardware, cluster,
    job, pins, top_k, searcher, ps_pins, objective)" (None: the collective searchers of advisor.search)."""
    violations: str = "advisor.space.rules:violations"
    """The legality check of a strategy: "module:function(model, cluster, job, strategy)" -> sentences."""
    exporters: dict[str, str] | None = None
    """The export targets its plans are written for, each with its exporter "module:function(plan, version)"
    (None: every target, with the target's own exporter, advisor.export)."""
    export_refusal: str = ""
    """Why its plans are not written for the other targets (``{target}``, ``{model}`` are filled in)."""
    execute: str | None = None
    """``advisor execute``'s runner for its plans: "module:function(plan mapping, path, options)" -> report (None:
    the reference executor's transformer path)."""
    render_recommend: str | None = None
    """Its own ``recommend`` report: "module:function(console, result, saved_to)" (None: the plans table)."""
    whatif_refusal: str | None = None
    """Why ``whatif`` does not sweep it (None: it does); ``{model}`` is filled in."""
    refuses: dict[str, str] = field(default_factory=dict)
    """Options and settings (field names) its commands do not take, with why (after the flag)."""

    def hook(self, name: str) -> Callable[..., Any]:
        """The function registered as ``name`` (an attribute holding "module:function")."""
        return resolve(getattr(self, name))


def resolve(path: str) -> Callable[..., Any]:
    """"package.module:function" -> the function."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


_TRANSFORMER_ONLY = ("belongs to the transformer settings; a recommendation model's tables are placed by --ps-mode (replicated, "
                     "sharded, host, servers)")
_NO_PS = ("serves recommendation models' parameter servers (family: recommendation); this model is a transformer")
_SUPERNET = ("is not available for a supernet (NASPipe trains each subnet as one pipeline task; give --pp and "
             "--global-batch)")
_MIXED = "is not available on a mixed cluster (--hardware PROFILE:NODES,...)"

TRANSFORMER = Family(
    name="transformer", doc="Dense and MoE transformers (models/*.yaml without a family key).",
    estimate="advisor.commands.transformer_cmd:estimate_cmd",
    recommend="advisor.commands.transformer_cmd:recommend_cmd",
    model_reader="advisor.specs.model:transformer_from_dict", model_writer="advisor.specs.model:transformer_to_dict",
    refuses={"ps_mode": _NO_PS, "ps_servers": _NO_PS, "ps_async": _NO_PS},
)
RECOMMENDATION = Family(
    name="recommendation", doc="Embedding tables feeding dense towers, with parameter servers (advisor.cost.recsys).",
    estimate="advisor.commands.recsys_request:estimate_cmd",
    recommend="advisor.commands.recsys_request:recommend_cmd",
    model_reader="advisor.specs.recommendation:rec_model_from_dict",
    model_writer="advisor.specs.recommendation:rec_model_to_dict",
    plan_parallel="advisor.plan_ps:parallel_from_dict", plan_parallel_writer="advisor.plan_ps:parallel_to_dict",
    optimizers=None, search="advisor.search.parameter_server:recommend_family", objectives=("throughput",),
    execute="advisor.commands.execute:execute_recommendation",
    render_recommend="advisor.render.report_recsys:render_recsys",
    violations="advisor.plan_ps:rec_violations",
    exporters={"mindspore": "advisor.export.mindspore_ps:export", "k8s": "advisor.export.k8s_mindspore:export"},
    export_refusal=("{model} is a recommendation model: --to {target} writes transformer launchers; export it --to "
                    "mindspore (parameter servers, host tables) or --to k8s --framework mindspore"),
    whatif_refusal=("advisor whatif sweeps transformer plans; {model} is a recommendation model (compare clusters "
                    "with advisor recommend, or benchmarks/parameter_server.py)"),
    refuses={name: _TRANSFORMER_ONLY for name in ("full_batch", "offload_params", "offload_fraction", "cuda_graphs",
                                                   "moe_dropless", "host_embedding", "plot", "swap_layers",
                                                   "ep_comm_overlap", "fsdp_backward_prefetch", "fold_experts",
                                                   "all_candidates")},
)
SUPERNET = Family(
    name="supernet", doc="Supernets for architecture search, planned with NASPipe's schedule (advisor.cost.naspipe).",
    estimate="advisor.commands.supernet:estimate_supernet_cmd",
    recommend="advisor.commands.supernet:recommend_supernet_cmd",
    model_reader="advisor.specs.supernet:supernet_from_dict", model_writer="advisor.specs.supernet:supernet_to_dict",
    plan_parallel="advisor.plan_supernet:parallel_from_dict", plan_parallel_writer="advisor.plan_supernet:parallel_to_dict",
    violations="advisor.plan_supernet:violations", execute="advisor.commands.supernet:execute_plan",
    objectives=("throughput",),
    exporters={},
    export_refusal=("{model} is a supernet: no launcher runs NASPipe's causal pipeline schedule, so there is nothing "
                    "to export; advisor execute runs the plan"),
    whatif_refusal=("advisor whatif sweeps transformer plans; {model} is a supernet (compare pipeline depths with "
                    "advisor recommend)"),
    refuses={name: _SUPERNET for name in (
        "tp", "cp", "ep", "virtual_pipeline_stages", "zero_stage", "operator_strategies", "ps_mode", "plot",
        "full_batch", "offload_params", "offload_fraction", "cuda_graphs", "moe_dropless", "host_embedding",
        "swap_layers", "ep_comm_overlap", "fsdp_backward_prefetch", "fold_experts", "all_candidates")},
)
MIXED = Family(
    name="mixed", doc="A cluster of nodes of several hardware profiles (advisor.cost.mixed, Metis' layouts).",
    estimate="advisor.commands.mixed_cli:estimate_mixed_cmd",
    recommend="advisor.commands.mixed_cli:recommend_mixed_cmd",
    plan_parallel="advisor.plan_mixed:parallel_from_dict", plan_parallel_writer="advisor.plan_mixed:parallel_to_dict",
    execute="advisor.commands.execute:refuse_mixed",
    whatif_refusal=None,
    refuses={name: _MIXED for name in (
        "recompute_layers", "grad_bucket_mb", "micro_batch_copies", "full_batch", "host_embedding", "offload_fraction",
        "operator_strategies", "ps_mode", "plot", "swap_layers", "fold_experts", "all_candidates")},
)

FAMILIES: dict[str, Family] = {f.name: f for f in (TRANSFORMER, RECOMMENDATION, SUPERNET)}
CLUSTER_KINDS: dict[str, Family] = {MIXED.name: MIXED}


def registered() -> tuple[Family, ...]:
    """Every model family and cluster kind."""
    return (*FAMILIES.values(), *CLUSTER_KINDS.values())


def family(name: str | None) -> Family:
    """The model family named by a description's ``family`` key (none: transformer)."""
    key = name or "transformer"
    if key not in FAMILIES:
        raise AdvisorError(f"unknown model family {str(key)[:40]!r} (known: {', '.join(FAMILIES)})")
    return FAMILIES[key]


def family_of_model(model: Any) -> Family:
    """The family of a model spec or of a model description (mapping)."""
    name = model.get("family") if isinstance(model, dict) else getattr(model, "family", None)
    return family(name if isinstance(name, str) else None)


def family_of_plan(data: dict[str, Any]) -> Family:
    """The family or cluster kind of a plan (its JSON mapping)."""
    if isinstance(data.get("hardware"), list):
        return MIXED
    return family_of_model(data.get("model") if isinstance(data.get("model"), dict) else {})
