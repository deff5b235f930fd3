"""What one executor run does, read from the plan JSON (plain dicts only), plus the up-front refusals.

The executor never imports the cost model or the searchers: a plan written by any advisor version,
or by hand, runs the same way. Everything a rank needs travels as a RunConfig (JSON-serializable).

``shrink_plan`` implements ``--tiny``: the same model family (GQA ratio, SwiGLU/GELU, norm, biases,
position embedding, tied embeddings) at a few MB, with every parallel degree, the micro-batch count,
the schedule, virtual stages, ZeRO stage, recomputation and mesh order of the plan kept.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from advisor.errors import AdvisorError
from advisor.executor.model import ModelConfig
from advisor.executor.operator_layout import OperatorLayout, check_divides, layout_from_plan

SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b",
             # beyond the plan schema's three: accepted in hand-written plans
             "interleaved-zero-bubble", "zbv-zero-bubble", "dualpipev")
ZERO_BUBBLE = ("interleaved-zero-bubble", "zbv-zero-bubble", "dualpipev")
V_SCHEDULES = ("zbv-zero-bubble", "dualpipev")
RECOMPUTE = ("none", "selective", "full")
CP_KINDS = ("p2p", "a2a")       # ring attention (context_parallel) or all-to-alls (ulysses)
OPTIMIZERS = ("adamw", "adam", "sgd")
MESH_DIMS = ("pp", "dp", "cp", "tp")
DTYPES = ("fp32", "tf32", "fp16", "bf16", "fp8")


@dataclass(frozen=True)
class ParallelConfig:
    dp: int
    tp: int
    pp: int
    cp: int = 1
    ep: int = 1
    sequence_parallel: bool = False
    virtual_pipeline_stages: int = 1
    micro_batch_size: int = 1
    num_micro_batches: int = 1
    micro_batch_copies: int = 1             # multi-copy: each micro-batch cut into this many interleaved copies
    cp_comm: str = "p2p"                    # context parallelism as ring attention (p2p) or all-to-alls (a2a)
    zero_stage: int = 0
    recompute: str = "none"
    recompute_layers: int | None = None
    pipeline_schedule: str = "1f1b"
    stage_layers: tuple[int, ...] = (1,)
    mesh_order: tuple[str, ...] = ("pp", "dp", "cp", "tp")
    offload_optimizer: bool = False
    offload_fraction: float = 1.0           # the share of the optimizer state offloaded (with offload_optimizer)
    offload_params: bool = False
    swap_layers: tuple[int, ...] | None = None   # per stage, its first layers whose saved activations go to the host
    host_embedding: bool = False
    grad_bucket_mb: float | None = None     # ZeRO-0: the gradients all-reduced in buckets of this size

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def local_batch_size(self) -> int:
        """Sequences one data-parallel rank trains per step."""
        return self.micro_batch_size * self.num_micro_batches


@dataclass(frozen=True)
class RunConfig:
    """One training run on all ranks of one launch."""

    name: str
    model: ModelConfig
    parallel: ParallelConfig
    seq_length: int
    dtype: str = "fp32"
    optimizer: str = "adamw"
    steps: int = 5
    seed: int = 1234
    learning_rate: float = 3e-3
    inject_failure: tuple[int, int] | None = None   # (rank, step): raise there (tests)
    notes: tuple[str, ...] = field(default=())
    grad_reduce_dtype: str | None = None    # mixed precision's data-parallel reduction dtype (None: fp32)
    operator_layout: OperatorLayout | None = None   # the plan's operator layouts (D-Rec, ILP, shard()), or Megatron's

    @property
    def global_batch_size(self) -> int:
        return self.parallel.dp * self.parallel.local_batch_size


TORCH_DTYPES = {"fp32": "float32", "tf32": "float32", "bf16": "bfloat16",
                "fp64": "float64"}   # fp64: a diagnostic, not from plans
# Mixed precision as Megatron-LM and ZeRO run it (Micikevicius et al. 2018; Rajbhandari et al. 2020,
# section 3.1): weights, activations and gradients in the compute dtype, an fp32 master copy of the
# weights and the optimizer's moments in fp32, gradients reduced over data parallelism in fp32
MIXED_PRECISION = ("bf16",)


def torch_dtype(cfg: RunConfig):
    import torch

    return getattr(torch, TORCH_DTYPES[cfg.dtype])


def mixed_precision(cfg: RunConfig) -> bool:
    """Whether the run keeps fp32 master weights beside compute-dtype weights."""
    return cfg.dtype in MIXED_PRECISION


# The largest relative loss difference from the single-process run that still counts as the same
# training, by dtype: fp32 accumulates in a different order on every layout (1e-4 covers it); bf16
# rounds each element to 8 significant bits (its unit roundoff is 2^-8), so layouts that sum partial
# products in another order differ by a few of those roundings: 2^-7, bf16's machine epsilon
LOSS_GOALS = {"fp32": 1e-4, "tf32": 1e-4, "fp64": 1e-4, "bf16": 2.0 ** -7}


def run_config_to_dict(cfg: RunConfig) -> dict[str, Any]:
    return asdict(cfg)


def run_config_from_dict(d: dict[str, Any]) -> RunConfig:
    par = dict(d["parallel"])
    par["stage_layers"] = tuple(par["stage_layers"])
    par["mesh_order"] = tuple(par["mesh_order"])
    if par.get("swap_layers") is not None:
        par["swap_layers"] = tuple(par["swap_layers"])
    fail = d.get("inject_failure")
    return RunConfig(
        name=d["name"], model=ModelConfig(**d["model"]), parallel=ParallelConfig(**par),
        seq_length=d["seq_length"], dtype=d["dtype"], optimizer=d["optimizer"], steps=d["steps"],
        seed=d["seed"], learning_rate=d["learning_rate"],
        inject_failure=tuple(fail) if fail is not None else None, notes=tuple(d.get("notes", ())),
        grad_reduce_dtype=d.get("grad_reduce_dtype"),
        operator_layout=(OperatorLayout.from_dict(d["operator_layout"]) if d.get("operator_layout") is not None
                         else None),
    )


# ---- reading the plan --------------------------------------------------------------------------
def _section(plan: dict[str, Any], key: str) -> dict[str, Any]:
    value = plan.get(key)
    if not isinstance(value, dict):
        raise AdvisorError(f"plan: key '{key}' must be a mapping, got {value!r}")
    return value


def _int(d: dict[str, Any], key: str, where: str, default: int | None = None, minimum: int = 1) -> int:
    value = d.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise AdvisorError(f"plan: {where}.{key} must be an integer >= {minimum}, got {value!r}")
    return value


def _bool(d: dict[str, Any], key: str, where: str, default: bool) -> bool:
    value = d.get(key, default)
    if not isinstance(value, bool):
        raise AdvisorError(f"plan: {where}.{key} must be true or false, got {value!r}")
    return value


def _choice(d: dict[str, Any], key: str, where: str, options, default: str | None = None) -> str:
    value = d.get(key, default)
    if value not in options:
        raise AdvisorError(f"plan: {where}.{key} must be one of {', '.join(options)}, got {value!r}")
    return value


def model_config_from_plan(model: dict[str, Any], attention: str = "flash") -> ModelConfig:
    w = "model"
    hidden = _int(model, "hidden_size", w)
    heads = _int(model, "num_attention_heads", w)
    kv = _int(model, "num_kv_heads", w, default=heads)
    if hidden % heads:
        raise AdvisorError(f"plan: model.num_attention_heads = {heads} does not divide model.hidden_size = {hidden}")
    if heads % kv:
        raise AdvisorError(f"plan: model.num_kv_heads = {kv} does not divide model.num_attention_heads = {heads}")
    return ModelConfig(
        num_layers=_int(model, "num_layers", w),
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=kv,
        ffn_hidden_size=_int(model, "ffn_hidden_size", w, default=4 * hidden),
        ffn_activation=_choice(model, "ffn_activation", w, ("gelu", "swiglu"), "gelu"),
        vocab_size=_int(model, "vocab_size", w),
        seq_length=_int(model, "seq_length", w),
        tie_embeddings=_bool(model, "tie_embeddings", w, False),
        norm=_choice(model, "norm", w, ("layernorm", "rmsnorm"), "layernorm"),
        use_bias=_bool(model, "use_bias", w, False),
        position_embedding=_choice(model, "position_embedding", w, ("learned", "rotary", "none"), "rotary"),
        attention=attention,
    )


def even_stage_layers(num_layers: int, pp: int) -> tuple[int, ...]:
    """Same rule as advisor.space.strategy.even_stage_layers (extra layers to the middle stages)."""
    base, extra = divmod(num_layers, pp)
    counts = [base] * pp
    order = sorted(range(pp), key=lambda i: (i in (0, pp - 1), abs(i - (pp - 1) / 2)))
    for i in order[:extra]:
        counts[i] += 1
    return tuple(counts)


def parallel_config_from_plan(par: dict[str, Any], num_layers: int) -> ParallelConfig:
    w = "parallel"
    pp = _int(par, "pp", w)
    stage_layers = par.get("stage_layers")
    if stage_layers is None:
        stage_layers = even_stage_layers(num_layers, pp)
    if not isinstance(stage_layers, (list, tuple)) or not all(
            isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in stage_layers):
        raise AdvisorError(f"plan: parallel.stage_layers must be a list of layer counts, got {stage_layers!r}")
    mesh_order = par.get("mesh_order", list(MESH_DIMS))
    if not isinstance(mesh_order, (list, tuple)) or sorted(mesh_order) != sorted(MESH_DIMS):
        raise AdvisorError(f"plan: parallel.mesh_order must order all of pp, dp, cp, tp, got {mesh_order!r}")
    recompute_layers = par.get("recompute_layers")
    if recompute_layers is not None:
        recompute_layers = _int(par, "recompute_layers", w)
    return ParallelConfig(
        dp=_int(par, "dp", w), tp=_int(par, "tp", w), pp=pp, cp=_int(par, "cp", w, 1), ep=_int(par, "ep", w, 1),
        sequence_parallel=_bool(par, "sequence_parallel", w, False),
        virtual_pipeline_stages=_int(par, "virtual_pipeline_stages", w, 1),
        micro_batch_size=_int(par, "micro_batch_size", w, 1),
        num_micro_batches=_int(par, "num_micro_batches", w, 1),
        micro_batch_copies=_int(par, "micro_batch_copies", w, 1),
        cp_comm=_choice(par, "cp_comm", w, CP_KINDS, "p2p"),
        zero_stage=_int(par, "zero_stage", w, 0, minimum=0),
        recompute=_choice(par, "recompute", w, RECOMPUTE, "none"),
        recompute_layers=recompute_layers,
        pipeline_schedule=_choice(par, "pipeline_schedule", w, SCHEDULES, "1f1b"),
        stage_layers=tuple(stage_layers),
        mesh_order=tuple(mesh_order),
        offload_optimizer=_bool(par, "offload_optimizer", w, False),
        offload_fraction=_fraction(par, "offload_fraction", w, 1.0),
        offload_params=_bool(par, "offload_params", w, False),
        swap_layers=_swap_layers(par, pp),
        host_embedding=_bool(par, "host_embedding", w, False),
        grad_bucket_mb=_bucket_mb(par),
    )


def _swap_layers(par: dict[str, Any], pp: int) -> tuple[int, ...] | None:
    value = par.get("swap_layers")
    if value is None:
        return None
    if (not isinstance(value, (list, tuple)) or len(value) != pp
            or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in value)):
        raise AdvisorError(f"plan: parallel.swap_layers must list {pp} non-negative layer counts (one per pipeline "
                           f"stage), got {value!r}")
    return tuple(value) if any(value) else None


def _fraction(d: dict[str, Any], key: str, where: str, default: float) -> float:
    value = d.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not 0 < value <= 1:
        raise AdvisorError(f"plan: {where}.{key} must be a number in (0, 1], got {value!r}")
    return float(value)


def _bucket_mb(par: dict[str, Any]) -> float | None:
    value = par.get("grad_bucket_mb")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise AdvisorError(f"plan: parallel.grad_bucket_mb must be a positive number of MiB, got {value!r}")
    return float(value)


# Plan settings (advisor.space.strategy.Strategy) the executor runs without a ParallelConfig field of
# their own, and how; every other setting it has no field for is refused when it is not its default
# (unrun_settings), so that no plan runs as something else.
RUN_WITHOUT_FIELD = {
    "full_batch": "every rank builds the whole global batch and keeps its data-parallel rows, which is what "
                  "full_batch reads (the executor's synthetic batches are made on every rank for every plan)",
}
# Why the others are not run, by setting (a sentence after the value)
NOT_RUN = {
    "fold_experts": "expert parallelism needs MoE layers, which the executor does not run",
}


# Training settings (advisor.specs.job.TrainingJob) and how the executor treats each one away from its default:
# RUN_TRAINING it reads; PLANNING_ONLY describe the plan, not the training arithmetic; TIME_ONLY change how
# fast a framework runs the same arithmetic (overlaps, kernels, graphs), which the executor runs its own way
# and prices as it runs (advisor.commands.execute._job), so they are noted; NOT_RUN_TRAINING are refused.
RUN_TRAINING = ("global_batch_size", "seq_length", "dtype", "optimizer", "attention", "grad_reduce_dtype")
PLANNING_ONLY = ("train_tokens", "memory_margin", "pue", "grid_gco2e_per_kwh")
TIME_ONLY = ("framework_release", "overlap_grad_reduce", "tp_comm_overlap", "ep_comm_overlap",
             "attention_kernel", "fsdp_backward_prefetch", "fused_kernels", "comm_priority", "cuda_graphs",
             "optimizer_impl")
EXECUTOR_TIME = {"overlap_grad_reduce": False}   # how the executor itself runs a time-only setting
NOT_RUN_TRAINING = {
    "dropout": "the executor's model has no dropout (its losses are compared with a single-process run "
               "step for step); give the plan dropout = false",
    "recompute_modules": "the executor's selective recomputation recomputes the attention core only "
                         "(core_attn)",
    "fp8_recipe": "the executor runs no FP8 GEMMs",
    "fp8_param_gather": "the executor runs no FP8 GEMMs",
    "moe_dropless": "the executor runs dense models only",
}


def _is_default(value: Any, default: Any) -> bool:
    """Whether a plan value is the setting's default (None, equal, or a JSON list of a tuple default)."""
    return value is None or value == default or (isinstance(default, tuple) and list(default) == value)


def unrun_training(train: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(refusals, notes) for the plan's training settings the executor does not read (see above)."""
    from dataclasses import fields as dc_fields

    from advisor.specs.job import TrainingJob
    from advisor.specs.setting import field_default

    refusals, time_only, notes = [], [], []
    framework = train.get("framework")
    if framework not in (None, "pytorch"):
        notes.append(f"priced for {framework}, run on PyTorch's own stack (DeviceMesh, DTensor, FSDP2, "
                     "torch.distributed.pipelining): the same layout and arithmetic")
    for fl in dc_fields(TrainingJob):
        if fl.name not in train or fl.name in RUN_TRAINING or fl.name in PLANNING_ONLY or fl.name == "framework":
            continue
        value = train[fl.name]
        if _is_default(value, EXECUTOR_TIME.get(fl.name, field_default(fl))):
            continue
        if fl.name == "recompute_modules" and list(value) == ["core_attn"]:
            continue
        if fl.name in TIME_ONLY:
            time_only.append(f"{fl.name} = {value!r}")
        else:
            why = NOT_RUN_TRAINING.get(fl.name, "the executor does not run this setting")
            refusals.append(f"training.{fl.name} = {value!r}: {why}")
    if time_only:
        notes.append("ran without " + ", ".join(time_only) + ": they change how fast a framework runs the same "
                     "layout and arithmetic, not what it computes; the time prediction is for the run as executed")
    return refusals, notes


def unrun_settings(par: dict[str, Any], plan: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(refusals, notes) for the plan's settings the executor has no field for: each Strategy setting away
    from its default is run as RUN_WITHOUT_FIELD says (a note) or refused by name; so are operator layouts."""
    from dataclasses import fields as dc_fields

    from advisor.space.strategy import Strategy
    from advisor.specs.setting import field_default

    own = {f.name for f in dc_fields(ParallelConfig)}
    refusals, notes = [], []
    for fl in dc_fields(Strategy):
        if fl.name in own or fl.name not in par:
            continue
        value = par[fl.name]
        if _is_default(value, field_default(fl)):
            continue
        if fl.name in RUN_WITHOUT_FIELD:
            if RUN_WITHOUT_FIELD[fl.name]:
                notes.append(f"parallel.{fl.name} = {value!r}: {RUN_WITHOUT_FIELD[fl.name]}")
            continue
        why = NOT_RUN.get(fl.name, "the executor does not run this setting")
        refusals.append(f"parallel.{fl.name} = {value!r}: {why}")
    return refusals, notes


def run_config_from_plan(plan: dict[str, Any], *, steps: int = 5, tiny: bool = False, seed: int = 1234,
                         dtype: str | None = None, name: str | None = None, tiny_scale: int = 1) -> RunConfig:
    """The run a plan asks for (``tiny``: its --tiny shrink, widened ``tiny_scale`` times). Refuses
    what cannot run, up front."""
    if not isinstance(plan, dict):
        raise AdvisorError(f"plan: the top level must be a mapping, got {type(plan).__name__}")
    if isinstance(tiny_scale, bool) or not isinstance(tiny_scale, int) or tiny_scale < 1:
        raise AdvisorError(f"--tiny-scale must be a positive integer, got {tiny_scale!r}")
    if tiny:
        plan = shrink_plan(plan, tiny_scale)
    model_d, train_d, par_d = _section(plan, "model"), _section(plan, "training"), _section(plan, "parallel")
    if model_d.get("moe") is not None:
        raise AdvisorError("plan: model.moe is set, but the executor runs dense models only (no expert layers)")
    attention = _choice(train_d, "attention", "training", ("flash", "math"), "flash")
    model = model_config_from_plan(model_d, attention)
    par = parallel_config_from_plan(par_d, model.num_layers)
    seq = _int(train_d, "seq_length", "training")
    plan_dtype = _choice(train_d, "dtype", "training", DTYPES, "bf16")
    if dtype is not None and dtype not in DTYPES:
        raise AdvisorError(f"--dtype must be one of {', '.join(DTYPES)}, got {str(dtype)[:40]!r}")
    run_dtype = plan_dtype if dtype is None else dtype
    notes = []
    if dtype is not None and dtype != plan_dtype:
        notes.append(f"ran in {dtype} instead of the plan's {plan_dtype} (--dtype)")
    unrun, run_notes = unrun_settings(par_d, plan)
    unrun_t, train_notes = unrun_training(train_d)
    unrun += unrun_t
    notes += run_notes + train_notes
    reduce = train_d.get("grad_reduce_dtype")
    if reduce is not None and run_dtype not in MIXED_PRECISION:
        if reduce != run_dtype:
            notes.append(f"gradients reduced in {run_dtype}, the run's dtype, not the plan's grad_reduce_dtype "
                         f"{reduce}")
        reduce = None
    elif reduce is not None and reduce not in ("fp32", "bf16"):
        unrun.append(f"training.grad_reduce_dtype = {reduce!r}: the executor reduces gradients in fp32 or bf16")
    layout = None
    if plan.get("operator_strategies") and par.tp == 1:
        notes.append("operator_strategies on a one-device tensor-parallel group: nothing to cut")
    elif plan.get("operator_strategies"):
        layout = layout_from_plan(plan["operator_strategies"], par.tp, par.sequence_parallel)
        unrun += layout_refusals(layout, model, par, seq)
        notes.append(f"operator layouts of the {layout.searcher} searcher run as planned with DTensor placements "
                     f"on a {' x '.join(map(str, layout.mesh_shape))} tensor-parallel mesh: "
                     + "; ".join(f"{op} cuts {'/'.join(a or '-' for a in axes)}" for op, axes in layout.cuts
                                 if op in layout.listed))
    cfg = RunConfig(
        name=name or str(model_d.get("name", "plan")),
        model=model, parallel=par, seq_length=seq, dtype=run_dtype,
        optimizer=_choice(train_d, "optimizer", "training", OPTIMIZERS, "adamw"),
        steps=steps, seed=seed, notes=tuple(notes), grad_reduce_dtype=reduce, operator_layout=layout,
    )
    gbs = _int(train_d, "global_batch_size", "training")
    problems = unrun + refusals(cfg, global_batch_size=gbs, devices=_cluster_devices(plan))
    if problems:
        raise AdvisorError("the executor cannot run this plan: " + "; ".join(problems))
    return cfg


# Settings the executor does not combine with operator layouts, and why (a sentence after the name)
NOT_WITH_LAYOUTS = {
    "cp": "context parallelism splits the sequence outside the tensor-parallel group's operator layout",
    "micro_batch_copies": "multi-copy cuts each block's batch in copies, which the layout's placements already cut",
    "host_embedding": "a host table is looked up outside the group's mesh",
}


def layout_refusals(layout: OperatorLayout, model: ModelConfig, par: ParallelConfig, seq: int) -> list[str]:
    """Why a plan's operator layout cannot run with this model and these settings (empty: it can)."""
    out = []
    for name, why in NOT_WITH_LAYOUTS.items():
        value = getattr(par, name)
        if value not in (1, False):
            out.append(f"operator_strategies with parallel.{name} = {value!r}: {why}")
    table = {"v", "h"}
    embed, head = ([a if a in table else None for a in layout.axes(op)] for op in ("embed", "head"))
    if model.tie_embeddings and embed != head:
        out.append(f"operator_strategies: the tied embedding and LM head cut the table differently (embed "
                   f"{'/'.join(a or '-' for a in embed)}, head {'/'.join(a or '-' for a in head)}); the executor "
                   "keeps one tied table")
    sizes = {"b": par.micro_batch_size, "s": seq, "t": seq, "h": model.hidden_size, "g": model.num_kv_heads,
             "f": model.ffn_hidden_size, "v": model.vocab_size}
    return out + check_divides(layout, sizes)


def _cluster_devices(plan: dict[str, Any]) -> int | None:
    cluster = plan.get("cluster")
    if isinstance(cluster, dict) and "devices" in cluster:
        return _int(cluster, "devices", "cluster")
    return None


# ---- refusals ----------------------------------------------------------------------------------
def refusals(cfg: RunConfig, global_batch_size: int | None = None, devices: int | None = None) -> list[str]:
    """Sentences, each naming the field, for everything this executor cannot run as asked."""
    m, p = cfg.model, cfg.parallel
    out = []
    if cfg.dtype == "fp16":
        out.append("training.dtype = fp16: the executor runs no loss scaler, which fp16 training needs; pass "
                   "--dtype bf16 (the same mixed-precision layout of weights, gradients and optimizer) or fp32")
    elif cfg.dtype not in TORCH_DTYPES:
        out.append(f"training.dtype = {cfg.dtype}: the executor trains in fp32 or bf16 (FP8 GEMMs need "
                   "TransformerEngine or torchao kernels on a GPU); pass --dtype bf16 or fp32")
    if p.cp != 1 and p.cp_comm == "a2a":
        m_heads, kv = cfg.model.num_attention_heads, cfg.model.num_kv_heads
        if m_heads % (p.tp * p.cp) or kv % (p.tp * p.cp):
            out.append(f"parallel.cp_comm = a2a with tp x cp = {p.tp * p.cp}: the all-to-alls give each rank whole "
                       f"heads, so tp x cp must divide the {m_heads} query and {kv} key/value heads")
        if cfg.seq_length % (2 * p.cp):
            out.append(f"training.seq_length = {cfg.seq_length} is not divisible by 2 x parallel.cp = {2 * p.cp} "
                       "(each cp rank keeps two of 2 x cp chunks)")
    elif p.cp != 1:
        if cfg.model.attention != "flash":
            out.append(f"parallel.cp = {p.cp} with training.attention = {cfg.model.attention}: ring attention is "
                       "fused attention (it keeps no score matrix); give the plan flash attention")
        if cfg.seq_length % (2 * p.cp):
            out.append(f"training.seq_length = {cfg.seq_length} is not divisible by 2 x parallel.cp = {2 * p.cp} "
                       "(each cp rank keeps two of 2 x cp chunks)")
    if p.ep != 1:
        out.append(f"parallel.ep = {p.ep}: expert parallelism needs MoE layers, which the executor does not run")
    if p.offload_optimizer and cfg.dtype not in MIXED_PRECISION:
        out.append(f"parallel.offload_optimizer = true with training.dtype = {cfg.dtype}: the executor offloads "
                   "mixed precision's fp32 master weights and moments (ZeRO-Offload); run the plan in bf16")
    if p.offload_fraction != 1.0 and not p.offload_optimizer:
        out.append(f"parallel.offload_fraction = {p.offload_fraction:g} with offload_optimizer = false: a share of "
                   "the optimizer is offloaded only when the optimizer is")
    if p.micro_batch_size % p.micro_batch_copies:
        out.append(f"parallel.micro_batch_copies = {p.micro_batch_copies} does not divide micro_batch_size = "
                   f"{p.micro_batch_size}")
    out += _swap_refusals(p)
    if p.offload_params and (p.zero_stage != 3 or p.dp * p.cp == 1):
        out.append(f"parallel.offload_params = true with zero_stage = {p.zero_stage} over dp x cp = {p.dp * p.cp}: the "
                   "executor offloads FSDP2's parameter shards (CPUOffloadPolicy), which needs ZeRO-3 over more than "
                   "one rank")
    if p.offload_params and not p.offload_optimizer:
        out.append("parallel.offload_params = true with offload_optimizer = false: the offloaded shards are stepped "
                   "on the host, so the optimizer is offloaded with them")
    if p.host_embedding and p.zero_stage != 0:
        out.append(f"parallel.host_embedding = true with zero_stage = {p.zero_stage}: the executor keeps the host "
                   "table whole on every replica (MindSpore's data-parallel host tables), outside ZeRO's sharding")
    if p.host_embedding and m.tie_embeddings:
        out.append("parallel.host_embedding = true with tied embeddings: the output head keeps its weights on the "
                   "device, so the table cannot be shared with it")
    if p.zero_stage > 3:
        out.append(f"parallel.zero_stage = {p.zero_stage}: must be 0, 1, 2 or 3")
    if p.grad_bucket_mb is not None and p.zero_stage != 0:
        out.append(f"parallel.grad_bucket_mb = {p.grad_bucket_mb:g} with zero_stage = {p.zero_stage}: the executor "
                   "buckets ZeRO-0's all-reduce only (ZeRO-1 reduce-scatters one flat buffer, FSDP2 one unit per layer)")
    if devices is not None and devices != p.world_size:
        out.append(f"cluster.devices = {devices} but dp x tp x pp x cp = {p.world_size}")
    if global_batch_size is not None and global_batch_size != cfg.global_batch_size:
        out.append(f"training.global_batch_size = {global_batch_size} but dp x micro_batch_size x num_micro_batches "
                   f"= {cfg.global_batch_size}")
    out += _tp_refusals(cfg)
    out += _pp_refusals(cfg)
    if p.sequence_parallel and p.tp == 1:
        out.append("parallel.sequence_parallel = true needs tp > 1")
    if m.position_embedding == "learned" and cfg.seq_length > m.seq_length:
        out.append(f"training.seq_length = {cfg.seq_length} exceeds model.seq_length = {m.seq_length} "
                   "(the learned position table)")
    return out


def _swap_refusals(p: ParallelConfig) -> list[str]:
    """Swapped layers (advisor.executor.swap) as the cost model prices them: full activations, one chunk per rank."""
    if p.swap_layers is None:
        return []
    out = []
    if any(k > n for k, n in zip(p.swap_layers, p.stage_layers)):
        out.append(f"parallel.swap_layers = {list(p.swap_layers)} swaps more layers than a stage has "
                   f"(stage_layers = {list(p.stage_layers)})")
    if p.recompute != "none":
        out.append(f"parallel.swap_layers with recompute = {p.recompute}: a layer keeps, swaps or recomputes its "
                   "activations, not two of them")
    if p.virtual_pipeline_stages > 1:
        out.append("parallel.swap_layers with virtual_pipeline_stages > 1: swapping counts a stage's first layers, "
                   "which interleaving splits over chunks")
    if p.tp > 1:
        out.append(f"parallel.swap_layers with tp = {p.tp}: the executor swaps plain tensors, and tensor-parallel "
                   "layers save DTensors")
    return out


def _tp_refusals(cfg: RunConfig) -> list[str]:
    m, p = cfg.model, cfg.parallel
    out = []
    for key, value in (("num_attention_heads", m.num_attention_heads), ("num_kv_heads", m.num_kv_heads),
                       ("ffn_hidden_size", m.ffn_hidden_size), ("vocab_size", m.vocab_size)):
        if value % p.tp:
            out.append(f"model.{key} = {value} is not divisible by parallel.tp = {p.tp}")
    if p.sequence_parallel and (cfg.seq_length // p.cp) % p.tp:
        out.append(f"training.seq_length / parallel.cp = {cfg.seq_length // p.cp} is not divisible by parallel.tp = "
                   f"{p.tp} (sequence parallelism splits each rank's sequence)")
    return out


def _pp_refusals(cfg: RunConfig) -> list[str]:
    m, p = cfg.model, cfg.parallel
    out = []
    v, n, sched = p.virtual_pipeline_stages, p.num_micro_batches, p.pipeline_schedule
    if len(p.stage_layers) != p.pp:
        return [f"parallel.stage_layers has {len(p.stage_layers)} entries but parallel.pp = {p.pp}"]
    if sum(p.stage_layers) != m.num_layers:
        out.append(f"parallel.stage_layers sum to {sum(p.stage_layers)} but model.num_layers = {m.num_layers}")
    if any(x < v or x % v for x in p.stage_layers):
        out.append(f"parallel.stage_layers = {list(p.stage_layers)}: each stage needs a positive multiple of "
                   f"virtual_pipeline_stages = {v} layers")
    if p.recompute_layers is not None and (p.recompute != "full" or p.recompute_layers > max(p.stage_layers)):
        out.append(f"parallel.recompute_layers = {p.recompute_layers} needs recompute = full and at most the "
                   "layers of a stage")
    if p.pp == 1:
        if v != 1:
            out.append(f"parallel.virtual_pipeline_stages = {v} needs pp > 1")
        return out
    interleaved = sched in ("interleaved-1f1b", "interleaved-zero-bubble")
    if interleaved and v < 2:
        out.append(f"parallel.pipeline_schedule = {sched} needs virtual_pipeline_stages > 1")
    if sched in ("gpipe", "1f1b") and v != 1:
        out.append(f"parallel.virtual_pipeline_stages = {v} needs an interleaved schedule, not {sched}")
    if sched in V_SCHEDULES and v != 2:
        out.append(f"parallel.pipeline_schedule = {sched} needs virtual_pipeline_stages = 2 (two stages per rank)")
    if sched == "1f1b" and n < p.pp:
        out.append(f"parallel.num_micro_batches = {n} is below pp = {p.pp}, which torch's Schedule1F1B refuses")
    if interleaved and n % p.pp:
        out.append(f"parallel.num_micro_batches = {n} must be a multiple of pp = {p.pp} for {sched}")
    if sched == "dualpipev" and n < 2 * p.pp:
        out.append(f"parallel.num_micro_batches = {n} must be at least 2 x pp for dualpipev")
    if sched in ZERO_BUBBLE and p.zero_stage == 3 and p.dp > 1:
        out.append(f"parallel.pipeline_schedule = {sched} with zero_stage = 3 (FSDP resharding after forward) gives "
                   "wrong gradients in PyTorch 2.13 (verified: losses off by 0.05-0.6); use zero_stage <= 2 or a "
                   "non-zero-bubble schedule")
    return out


# ---- --tiny ------------------------------------------------------------------------------------
TINY_HEAD_DIM = 16
TINY_VOCAB = 256
TINY_SEQ = 32


def shrink_plan(plan: dict[str, Any], scale: int = 1) -> dict[str, Any]:
    """A copy of the plan with a tiny model of the same family; parallel knobs kept (see module doc).
    ``scale`` multiplies the head size and the sequence length (scale 4: hidden 256, 128 tokens for
    a four-head model), for time checks on a CPU, where the smallest model's steps are dominated
    by per-operator overhead rather than arithmetic."""
    model, par, train = _section(plan, "model"), dict(_section(plan, "parallel")), dict(_section(plan, "training"))
    tp = _int(par, "tp", "parallel")
    pp = _int(par, "pp", "parallel")
    vpp = _int(par, "virtual_pipeline_stages", "parallel", 1)
    heads = _int(model, "num_attention_heads", "model")
    kv = _int(model, "num_kv_heads", "model", default=heads)
    ratio = max(1, heads // kv)
    kv_tiny = tp if ratio > 1 else tp * math.ceil(4 / tp)
    heads_tiny = kv_tiny * min(ratio, 4)
    hidden = heads_tiny * TINY_HEAD_DIM * scale
    ffn_ratio = model.get("ffn_hidden_size", 4 * model["hidden_size"]) / model["hidden_size"]
    unit = 8 * tp
    ffn = max(unit, round(hidden * ffn_ratio / unit) * unit)
    orig_layers = par.get("stage_layers") or list(even_stage_layers(_int(model, "num_layers", "model"), pp))
    smallest = max(1, min(orig_layers))
    stage_layers = [vpp * max(1, round(x / smallest)) if x else 0 for x in orig_layers]
    cp = _int(par, "cp", "parallel", 1)
    unit = 2 * cp * tp      # ring attention's 2 x cp chunks, each rank's share split again by sequence parallelism
    seq = -(-max(TINY_SEQ * scale, unit) // unit) * unit
    tiny_model = {k: v for k, v in model.items() if k not in ("published_params", "notes")}
    tiny_model.update(name=f"{model.get('name', 'model')}-tiny", num_layers=sum(stage_layers), hidden_size=hidden,
                      num_attention_heads=heads_tiny, num_kv_heads=heads_tiny // min(ratio, 4),
                      ffn_hidden_size=ffn, vocab_size=TINY_VOCAB * math.ceil(tp / TINY_VOCAB),
                      seq_length=seq)
    rl = par.get("recompute_layers")
    if isinstance(rl, int) and not isinstance(rl, bool) and rl > 0:
        par["recompute_layers"] = min(max(stage_layers), max(1, round(rl * max(stage_layers) / max(orig_layers))))
    par["stage_layers"] = stage_layers
    # at most 2 sequences, or as many as the plan's operator layout cuts the batch into
    rec = plan.get("operator_strategies")
    layout = layout_from_plan(rec, tp, _bool(par, "sequence_parallel", "parallel", False)) if rec and tp > 1 else None
    batch_cut = max((layout.parts(op, "b") for op in layout.listed), default=1) if layout else 1
    mbs = min(_int(par, "micro_batch_size", "parallel", 1), max(2, batch_cut))
    par["micro_batch_size"] = mbs
    dp, nmb = _int(par, "dp", "parallel"), _int(par, "num_micro_batches", "parallel", 1)
    train.update(seq_length=seq, global_batch_size=dp * mbs * nmb)
    out = dict(plan)
    out.update(model=tiny_model, parallel=par, training=train)
    out["prediction"] = None   # the plan's prediction was for the full model
    return out


def with_parallel(cfg: RunConfig, **changes) -> RunConfig:
    """A copy with some parallel knobs changed (tests build their matrix with it)."""
    return replace(cfg, parallel=replace(cfg.parallel, **changes))
