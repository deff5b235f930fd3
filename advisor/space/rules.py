"""Legality rules of a strategy, in one place, vectorized over a StrategyBatch.

Each rule is a function (model, cluster, job, batch) -> boolean array, True where the candidate is
ILLEGAL, and a sentence that explains it. The scalar check `violations` runs the same rules on a
batch of one, so the enumerator and `advisor estimate` can never disagree.
Sources: Megatron-LM's argument checks (megatron/training/arguments.py) for tp/heads, sequence
parallelism, interleaving and context parallelism; DeepSpeed ZeRO-Offload (Ren et al. 2021) for
offload requiring a sharded optimizer.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Callable

import numpy as np

from advisor.space.strategy import (CP_COMM, INTERLEAVED, MESH_DIMS, RECOMPUTE, RECOMPUTE_FULL, RECOMPUTE_NONE,
                                    RECOMPUTE_SELECTIVE, SCHEDULES, Strategy, StrategyBatch)
from advisor.specs.frameworks import Framework
from advisor.specs.job import WHOLE_LAYER_GRAPHS, Cluster, TrainingJob
from advisor.specs.model import ModelSpec
from advisor.specs.setting import Setting, settings_of, spelling

Rule = Callable[[ModelSpec, Cluster, TrainingJob, StrategyBatch], np.ndarray]



def _device_count(m, c, j, b):
    return b.dp * b.tp * b.pp * b.cp != c.devices


def _tp_heads(m, c, j, b):
    return (m.num_attention_heads % b.tp != 0) | (m.num_kv_heads % b.tp != 0)


def _tp_ffn(m, c, j, b):
    bad = m.ffn_hidden_size % b.tp != 0
    if m.moe is not None:
        bad |= m.moe.expert_ffn_hidden_size % b.tp != 0
    return bad


def _global_batch(m, c, j, b):
    return b.dp * b.micro_batch_size * b.num_micro_batches != j.global_batch_size


def _sequence_parallel(m, c, j, b):
    return b.sequence_parallel & (b.tp == 1)


def _sp_seq(m, c, j, b):
    return b.sequence_parallel & ((j.seq_length // np.maximum(b.cp, 1)) % b.tp != 0)


def _cp_seq(m, c, j, b):
    # Megatron's load-balanced causal CP splits each sequence into 2*cp chunks.
    return (b.cp > 1) & (j.seq_length % (2 * b.cp) != 0)


def _cp_a2a(m, c, j, b):
    # Ulysses gives each cp rank whole heads: tp x cp must divide the query and key/value heads
    # (Megatron-Core's a2a context parallelism; DeepSpeed-Ulysses, Jacobs et al. 2023, section 3).
    split = b.tp * b.cp
    return (b.cp_comm == 1) & ((b.cp == 1) | (m.num_attention_heads % split != 0) | (m.num_kv_heads % split != 0))


def _expert_parallel(m, c, j, b):
    """ep divides the ranks it takes its groups from: dp x cp, or tp x dp x cp with the experts folded (which
    needs experts, ep > 1 and tp > 1: with tp = 1 folding is the same plan)."""
    if m.moe is None:
        return (b.ep != 1) | b.fold_experts
    ranks = b.dp * b.cp * b.tp // b.expert_tp
    pointless = b.fold_experts & ((b.ep == 1) | (b.tp == 1))
    return (ranks % b.ep != 0) | (m.moe.num_experts % b.ep != 0) | pointless


def _stage_layers(m, c, j, b):
    cols = np.arange(b.stage_layers.shape[1])[None, :]
    active = cols < b.pp[:, None]
    total = np.where(active, b.stage_layers, 0).sum(axis=1)
    too_few = np.where(active, b.stage_layers < 1, False).any(axis=1)
    padded = np.where(~active, b.stage_layers != 0, False).any(axis=1)
    return (total != m.num_layers) | too_few | padded | (b.pp > m.num_layers)


def _interleaving(m, c, j, b):
    interleaved = b.pipeline_schedule == INTERLEAVED
    needs = (b.virtual_pipeline_stages > 1) != interleaved
    # every virtual stage (model chunk) holds a layer; the first and last stages may give one chunk to the
    # embedding or the loss instead (Megatron-Core's account_for_embedding/loss_in_pipeline_split: Llama 3.1
    # 405B's 126 layers over pp 16 x vpp 8): a middle stage of 2 layers cannot run 4 chunks
    cols = np.arange(b.stage_layers.shape[1])[None, :]
    active = cols < b.pp[:, None]
    ends = (cols == 0) | (cols == b.pp[:, None] - 1)
    room = np.where(active, b.stage_layers + ends, np.iinfo(np.int64).max)
    empty_chunk = np.min(room, axis=1) < b.virtual_pipeline_stages
    return needs | (interleaved & ((b.pp < 2) | (b.num_micro_batches % b.pp != 0) | empty_chunk))


def _zero(m, c, j, b):
    return (b.zero_stage < 0) | (b.zero_stage > 3)


def _offload(m, c, j, b):
    return b.offload_optimizer & (b.zero_stage < 1)


def _recompute_layers(m, c, j, b):
    """Layer counts go with full recomputation (Megatron's block method, MindFormers' recompute
    list) or, in MindFormers, with selective recomputation (its select_recompute list)."""
    active = np.arange(b.stage_layers.shape[1])[None, :] < b.pp[:, None]
    counts = np.where(active, b.recompute_layers, -1)
    given = (counts >= 0).any(axis=1)
    per_stage_max = np.max(b.stage_layers, axis=1)
    kind_ok = (b.recompute == RECOMPUTE_FULL) | ((b.recompute == RECOMPUTE_SELECTIVE) & j.framework_record.selective_layer_counts)
    bad_count = (np.where(active, counts < 0, False).any(axis=1) | (counts.max(axis=1) < 1)
                 | (counts > per_stage_max[:, None]).any(axis=1))
    return given & (~kind_ok | bad_count)


def _recompute_modules(m, c, j, b):
    # Megatron-Core refuses mla_up_proj without multi-latent attention and moe_act without (grouped-GEMM)
    # experts (TransformerConfig.__post_init__)
    wrong = (("mla_up_proj" in j.selective_modules and m.mla is None)
             or ("moe_act" in j.selective_modules and m.moe is None))
    return (b.recompute == RECOMPUTE_SELECTIVE) & j.framework_record.recompute_modules & wrong


def _cuda_graphs(m, c, j, b):
    # Megatron-Core (transformer_config.py __post_init__; the job's own check,
    # advisor.specs.job.check_cuda_graphs, does not know the model or the strategy): moe scopes need
    # experts and 'mlp' dense layers; whole MoE layers are graphed only with token dropping; full
    # recomputation goes only with the full-iteration graph; with dropout, a graphed attention or MLP
    # is not recomputed (selective core_attn, mlp)
    g = j.cuda_graphs
    if not g:
        return np.zeros(len(b), dtype=bool)
    moe_scope = any(x in g for x in ("moe", "moe_router", "moe_preprocess"))
    whole = any(x in g for x in WHOLE_LAYER_GRAPHS)
    wrong = ((moe_scope and m.moe is None) or ("mlp" in g and m.num_dense_layers == 0)
             or (whole and m.moe is not None and j.moe_dropless))
    full = (b.recompute == RECOMPUTE_FULL) & ("full_iteration" not in g)
    whole_graph = "full" in g or "full_iteration" in g
    graphed_attn = "attn" in g or whole_graph
    graphed_mlp = "mlp" in g or whole_graph
    modules = j.selective_modules
    dropout = (b.recompute == RECOMPUTE_SELECTIVE) & (j.dropout and ((graphed_attn and "core_attn" in modules)
                                                                    or (graphed_mlp and "mlp" in modules)))
    return wrong | full | dropout


def _positive(m, c, j, b):
    bad = np.zeros(len(b), dtype=bool)
    for name in ("dp", "tp", "pp", "cp", "ep", "virtual_pipeline_stages", "micro_batch_size", "num_micro_batches"):
        bad |= getattr(b, name) < 1
    return bad


def _micro_batch_copies(m, c, j, b):
    # MindSpore's MicroBatchInterleaved splits the micro-batch along its batch dimension into
    # interleave_num parts (MindFormers: batch_size is then per copy), so the copies must divide it
    return (b.micro_batch_copies < 1) | (b.micro_batch_size % np.maximum(b.micro_batch_copies, 1) != 0)


def _grad_bucket(m, c, j, b):
    # ZeRO-2/3 are priced per wrapped unit (FSDP), not per bucket (advisor.cost.fusion)
    return ~np.isfinite(b.grad_bucket_mb) | (b.grad_bucket_mb < 0) | ((b.grad_bucket_mb > 0) & (b.zero_stage > 1))


def _swap_layers(m, c, j, b):
    """Swapped layers: at most a stage's layers, and only without recomputation (a layer either keeps
    its activations, swaps them or recomputes them; the priced swap is of full activations)."""
    active = np.arange(b.stage_layers.shape[1])[None, :] < b.pp[:, None]
    swapped = np.where(active, b.swap_layers, 0)
    given = swapped.any(axis=1)
    over = (swapped < 0).any(axis=1) | (swapped > np.where(active, b.stage_layers, 0)).any(axis=1)
    return given & (over | (b.recompute != RECOMPUTE_NONE) | (b.virtual_pipeline_stages > 1))


def _offload_params(m, c, j, b):
    return b.offload_params & ((b.zero_stage < 3) | ~b.offload_optimizer | (not j.framework_record.parameter_offload))


def _offload_fraction(m, c, j, b):
    """A share below 1 exists in Megatron-LM (--optimizer-offload-fraction) and DeepSpeed (ratio,
    ZeRO-3 only); FSDP2 and MindSpore offload all of the optimizer or none."""
    f = b.offload_fraction
    has_it = np.isin(b.zero_stage, j.framework_record.offload_fraction_zero_stages)
    return ~np.isfinite(f) | (f <= 0.0) | (f > 1.0) | ((f < 1.0) & (~b.offload_optimizer | b.offload_params | ~has_it))


def _host_embedding(m, c, j, b):
    """The word embedding on the host (advisor.cost.host_embedding): MindSpore's Host&Device switch
    (Primitive.set_device, Optimizer.target); a table tied to the output head stays on the device."""
    return b.host_embedding & ((not j.framework_record.host_embedding) | bool(m.tie_embeddings) | b.offload_params)


def _full_batch(m, c, j, b):
    """Every rank reading the whole batch is MindSpore's full_batch; the other stacks' loaders shard it."""
    return b.full_batch & (not j.framework_record.full_batch)


# ---- what the framework runs (its record's "what it can run" fields, advisor.specs.frameworks) ---------------
def zero_illegal(fw: Framework, zero, pp, offload_optimizer, offload_params, ep, cp, folded_tp=1) -> np.ndarray:
    """True where the framework cannot run the ZeRO stage and offload at that pipeline depth (vectorized; the
    enumerator crosses its skeletons with ZeRO/offload pairs through this too, advisor.search.enumerate_space).
    ``folded_tp``: tp where the experts are folded, 1 elsewhere."""
    stages = np.where(pp > 1, np.isin(zero, fw.zero_stages_under_pipeline), np.isin(zero, fw.zero_stages))
    bad = (~stages & (zero >= 0) & (zero <= 3)) | (offload_optimizer & ~offload_params & (not fw.optimizer_offload))
    if fw.experts_from_sharded_dp:
        # torchtitan's ep is a multiple of cp, of tp x cp with the experts folded (parallel_dims.py, v0.2.0)
        bad = bad | ((ep > 1) & ((zero == 0) | (ep % (cp * folded_tp) != 0)))
    if fw.shards_over_cp:
        bad = bad | ((zero == 0) & (cp > 1))
    return bad


def _framework_zero(m, c, j, b):
    return zero_illegal(j.framework_record, b.zero_stage, b.pp, b.offload_optimizer, b.offload_params, b.ep, b.cp,
                        b.tp // b.expert_tp)


def _framework_schedule(m, c, j, b):
    runs = [SCHEDULES.index(name) for name in j.framework_record.schedules]
    return (b.pp > 1) & ~np.isin(b.pipeline_schedule, runs)


def _framework_stages(m, c, j, b):
    """Stages of different sizes, and stages whose layers the virtual stages do not divide (chunks of different
    sizes), where the framework's record says it has no way to give them."""
    fw = j.framework_record
    active = np.arange(b.stage_layers.shape[1])[None, :] < b.pp[:, None]
    low = np.where(active, b.stage_layers, np.iinfo(np.int64).max).min(axis=1)
    high = np.where(active, b.stage_layers, 0).max(axis=1)
    uneven_chunks = np.where(active, b.stage_layers % b.virtual_pipeline_stages[:, None] != 0, False).any(axis=1)
    return (b.pp > 1) & (((low != high) & (not fw.uneven_stages)) | (uneven_chunks & (not fw.uneven_chunks)))


def _framework_cp(m, c, j, b):
    fw = j.framework_record
    kinds = np.zeros(len(b), dtype=np.int64) if b.cp_comm is None else b.cp_comm
    runs = [CP_COMM.index(kind) for kind in fw.cp_kinds]
    return (b.cp > 1) & (~np.isin(kinds, runs) | ((b.pp > 1) & (not fw.cp_under_pipeline)))


def _framework_cp_attention(m, c, j, b):
    """Context parallelism on an attention the framework's context parallelism does not run: the unfused (math)
    one for the kinds of Framework.cp_unfused_attention, a fused kernel outside Framework.cp_attention_kernels."""
    fw = j.framework_record
    if j.attention != "math":
        return (b.cp > 1) & (j.kernel not in fw.cp_attention_kernels)
    kinds = np.zeros(len(b), dtype=np.int64) if b.cp_comm is None else b.cp_comm
    return (b.cp > 1) & ~np.isin(kinds, [CP_COMM.index(kind) for kind in fw.cp_unfused_attention])


def _framework_recompute(m, c, j, b):
    """A recomputation policy the framework does not launch, or a layer count where it recomputes every layer or
    none (Framework.recompute_some_layers)."""
    fw = j.framework_record
    runs = [RECOMPUTE.index(kind) for kind in fw.recompute_kinds]
    active = np.arange(b.stage_layers.shape[1])[None, :] < b.pp[:, None]
    counted = (np.where(active, b.recompute_layers, -1) >= 0).any(axis=1) & (b.recompute != RECOMPUTE_NONE)
    return ~np.isin(b.recompute, runs) | (counted & (not fw.recompute_some_layers))


def _framework_sp(m, c, j, b):
    return (b.tp > 1) & ~np.isin(b.sequence_parallel, j.framework_record.sequence_parallel)


def active_order(order: tuple[str, ...], degrees: dict[str, int]) -> tuple[str, ...]:
    """The mesh dimensions whose place matters, outermost first: degree above 1, and dp also when cp or ep is
    (the data-parallel group spans dp x cp ranks and hosts the experts)."""
    active = {d: degrees[d] > 1 for d in MESH_DIMS}
    active["dp"] = active["dp"] or active["cp"] or degrees.get("ep", 1) > 1
    return tuple(d for d in order if active[d])


@lru_cache(maxsize=None)
def builds_order(fw: Framework, order: tuple[str, ...], code: int) -> bool:
    """Whether the framework builds its rank groups in ``order`` (outermost first) for the mesh dimensions whose
    place matters, bit i of ``code`` set for MESH_DIMS[i] (advisor.search.enumerate_rows._active_code)."""
    if fw.mesh_orders is None:
        return True
    degrees = {d: 2 if code >> i & 1 else 1 for i, d in enumerate(MESH_DIMS)}
    return active_order(order, degrees) in {active_order(a, degrees) for a in fw.mesh_orders}


def _framework_mesh(m, c, j, b):
    """The mesh order is one the framework builds (checked where the batch carries its orders: the enumerator
    generates only those, advisor.search.enumerate_space.order_variants)."""
    fw = j.framework_record
    if fw.mesh_orders is None or not b.mesh_order:
        return np.zeros(len(b), dtype=bool)
    active = {d: getattr(b, d) > 1 for d in MESH_DIMS}
    active["dp"] = active["dp"] | active["cp"] | (b.ep > 1)
    code = sum(active[d].astype(np.int64) << i for i, d in enumerate(MESH_DIMS))
    return np.array([not builds_order(fw, tuple(order), int(k)) for order, k in zip(b.mesh_order, code)], dtype=bool)


RULES: dict[str, tuple[Rule, str]] = {
    "positive degrees": (_positive, "every degree, the micro-batch size and the micro-batch count must be at least 1"),
    "device count": (_device_count, "dp x tp x pp x cp must equal the number of devices"),
    "tp divides heads": (_tp_heads, "tp must divide the attention heads and the key/value heads"),
    "tp divides ffn": (_tp_ffn, "tp must divide the FFN hidden size"),
    "global batch": (_global_batch, "dp x micro-batch size x micro-batches must equal the global batch"),
    "sequence parallel needs tp": (_sequence_parallel, "sequence parallelism needs tp > 1"),
    "sequence parallel divides seq": (_sp_seq, "sequence parallelism needs tp to divide the sequence (per cp rank)"),
    "cp divides seq": (_cp_seq, "context parallelism needs the sequence length divisible by 2 x cp"),
    "ulysses heads": (_cp_a2a, "all-to-all (Ulysses) context parallelism needs cp > 1 and tp x cp dividing the "
                      "attention and key/value heads"),
    "expert parallel": (_expert_parallel, "ep must be 1 for dense models, and for MoE divide dp x cp (tp x dp x cp "
                        "with the experts folded, which needs ep > 1 and tp > 1) and the expert count"),
    "stage layers": (_stage_layers, "stage layers must sum to the layer count, one entry per stage, each at least one layer"),
    "interleaving": (_interleaving, "the interleaved schedule goes with virtual stages > 1, pp > 1, micro-batches divisible by pp and a layer per virtual stage (the first and last stages may give one to the embedding or the loss)"),
    "zero stage": (_zero, "the ZeRO stage must be 0, 1, 2 or 3"),
    "recompute modules": (_recompute_modules, "Megatron's mla_up_proj recompute needs multi-latent attention and "
                          "moe_act needs MoE layers"),
    "cuda graphs": (_cuda_graphs, "CUDA graphs as Megatron-Core takes them: moe scopes need MoE layers and mlp "
                    "dense ones, whole MoE layers need token dropping, full recomputation needs the "
                    "full_iteration graph, and with dropout a graphed attention or MLP is not recomputed"),
    "offload needs zero": (_offload, "optimizer offload needs ZeRO stage 1 or more"),
    "offload fraction": (_offload_fraction, "an optimizer offload fraction lies in (0, 1] and below 1 goes with the "
                         "optimizer offloaded, the parameters on the device and a framework that has it (megatron, "
                         "or deepspeed with ZeRO-3)"),
    "parameter offload": (_offload_params, "parameter offload needs ZeRO stage 3, the optimizer offloaded and a "
                          "framework that has it (deepspeed's ZeRO-Infinity, pytorch's FSDP2, torchtitan, mindspore; "
                          "not megatron)"),
    "recompute layers": (_recompute_layers, "recomputed-layer counts need full recomputation (or selective with "
                         "framework mindspore), at least one layer, and at most the layers of a stage"),
    "micro-batch copies": (_micro_batch_copies, "multi-copy parallelism needs the copies (at least 1) to divide the "
                           "micro-batch size"),
    "gradient bucket": (_grad_bucket, "a gradient bucket size must be a positive number of MiB and goes with ZeRO "
                        "stage 0 or 1"),
    "swap layers": (_swap_layers, "swapped layers (one count per stage, at most its layers) go without "
                    "recomputation and without interleaving"),
    "host embedding": (_host_embedding, "the word embedding on the host is MindSpore's Host&Device training (give "
                       "framework mindspore), needs a table not tied to the output head, and goes without parameter "
                       "offload (which keeps every weight on the host already)"),
    "full batch": (_full_batch, "reading the full batch on every rank (full_batch) is MindSpore's: give framework "
                   "mindspore"),
    "framework zero": (_framework_zero, "the framework does not run this ZeRO stage or offload"),
    "framework schedule": (_framework_schedule, "the framework does not run this pipeline schedule"),
    "framework stage layers": (_framework_stages, "the framework does not run these pipeline stage sizes"),
    "framework context parallel": (_framework_cp, "the framework does not run this context parallelism"),
    "framework cp attention": (_framework_cp_attention, "the framework does not run context parallelism on this "
                               "attention"),
    "framework recompute": (_framework_recompute, "the framework does not launch this recomputation"),
    "framework sequence parallel": (_framework_sp, "the framework does not run tensor parallelism with this "
                                    "sequence-parallel setting"),
    "framework mesh order": (_framework_mesh, "the framework does not build its rank groups in this mesh order"),
}


def _framework_rules() -> dict[str, tuple[Rule, str]]:
    """A rule per Strategy setting whose record names the frameworks that run it (Setting.frameworks): set
    (on) with a framework that does not run it is illegal. Only on/off settings can declare one here; the
    others are refused at import, so that no declared framework support goes unenforced in the search."""
    out: dict[str, tuple[Rule, str]] = {}
    for fl, s in settings_of(Strategy):
        if s.frameworks is None:
            continue
        out[f"{fl.name} framework"] = framework_rule(fl.name, s)
    return out


def framework_rule(name: str, s: Setting) -> tuple[Rule, str]:
    """The rule and sentence of an on/off Strategy setting that only the frameworks of its record run."""
    if s.kind != "boolean":
        raise TypeError(f"Strategy.{name}: a frameworks map is enforced for on/off settings only")

    def rule(m, c, j, b):
        runs = spelling(s, True, j.framework, j.compute_dtype) is not None
        return getattr(b, name).astype(bool) & (not runs)

    return rule, f"{s.flag or name} needs a framework that runs it ({', '.join(sorted(s.frameworks))})"


RULES.update(_framework_rules())


# The rules on what the job's framework runs, read from its record (the "what it can run" fields), each with
# the plan field it judges
FRAMEWORK_RULES = {"framework zero": "zero_stage", "framework schedule": "pipeline_schedule",
                   "framework stage layers": "stage_layers", "framework context parallel": "cp_comm",
                   "framework sequence parallel": "sequence_parallel", "framework mesh order": "mesh_order",
                   "framework recompute": "recompute", "framework cp attention": "cp"}


def illegal_masks(model: ModelSpec, cluster: Cluster, job: TrainingJob, batch: StrategyBatch) -> dict[str, np.ndarray]:
    """Rule name -> True where the candidate breaks that rule."""
    return {name: rule(model, cluster, job, batch) for name, (rule, _) in RULES.items()}


def legal_mask(model: ModelSpec, cluster: Cluster, job: TrainingJob, batch: StrategyBatch,
               framework_rules: bool = True) -> np.ndarray:
    """True where the candidate breaks no rule (without ``framework_rules``: none of the others than FRAMEWORK_RULES,
    which are left out)."""
    masks = {name: mask for name, mask in illegal_masks(model, cluster, job, batch).items()
             if framework_rules or name not in FRAMEWORK_RULES}
    return ~np.logical_or.reduce(list(masks.values())) if masks else np.ones(len(batch), dtype=bool)


def broken_rules(model: ModelSpec, cluster: Cluster, job: TrainingJob, strategy: Strategy,
                 framework_rules: bool = True) -> list[tuple[str, str]]:
    """(rule name, sentence) for every rule a single strategy breaks (empty when legal); without
    ``framework_rules`` the rules on what the job's framework runs (FRAMEWORK_RULES) are left out."""
    if strategy.stage_layers is not None and len(strategy.stage_layers) != strategy.pp:
        return [("stage layers", f"stage_layers has {len(strategy.stage_layers)} entries but pp = {strategy.pp}")]
    if isinstance(strategy.recompute_layers, tuple) and len(strategy.recompute_layers) != strategy.pp:
        return [("recompute layers", f"recompute_layers has {len(strategy.recompute_layers)} entries but pp = {strategy.pp}")]
    if min(strategy.dp, strategy.tp, strategy.pp, strategy.cp) < 1:
        return [("positive degrees", RULES["positive degrees"][1])]
    batch = StrategyBatch.from_strategies([strategy], model.num_layers)
    out = []
    for name, (rule, sentence) in RULES.items():
        if not framework_rules and name in FRAMEWORK_RULES:
            continue
        if bool(rule(model, cluster, job, batch)[0]):
            detail = _detail(name, model, cluster, job, strategy)
            out.append((name, f"{sentence} ({detail})" if detail else sentence))
    return out


def violations(model: ModelSpec, cluster: Cluster, job: TrainingJob, strategy: Strategy,
               framework_rules: bool = True) -> list[str]:
    """Sentences for every rule a single strategy breaks (broken_rules)."""
    return [sentence for _, sentence in broken_rules(model, cluster, job, strategy, framework_rules)]


def _zero_detail(fw: Framework, s: Strategy) -> str:
    stages = fw.zero_stages_under_pipeline if s.pp > 1 else fw.zero_stages
    where = "with pp > 1" if s.pp > 1 else "without pipelining"
    parts = [f"{fw.label} runs ZeRO {', '.join(map(str, stages))} {where}"]
    if not fw.optimizer_offload:
        parts.append("no optimizer-only offload (its CPU offload moves the parameters too: offload_params)")
    if fw.experts_from_sharded_dp:
        parts.append("ep > 1 with ZeRO >= 1 and ep a multiple of cp (tp x cp with the experts folded)")
    if fw.shards_over_cp:
        parts.append("ZeRO >= 1 with cp > 1 (its FSDP shards over dp x cp whenever cp > 1)")
    return "; ".join(parts) + (f"; zero = {s.zero_stage}, pp = {s.pp}, offload_optimizer = "
                               f"{str(s.offload_optimizer).lower()}, offload_params = {str(s.offload_params).lower()}"
                               f", ep = {s.ep}, cp = {s.cp}")


def _cp_attention_detail(j: TrainingJob, s: Strategy) -> str:
    fw = j.framework_record
    fused = f"{j.framework} runs it on the fused attention kernels {', '.join(fw.cp_attention_kernels)}"
    unfused = (f" and with the math attention for cp_comm {', '.join(fw.cp_unfused_attention)}"
               if fw.cp_unfused_attention else " only (give --attention flash)")
    return f"{fused}{unfused}; cp = {s.cp}, attention = {j.attention}, attention kernel = {j.kernel}"


def _detail(name: str, m: ModelSpec, c: Cluster, j: TrainingJob, s: Strategy) -> str:
    details = {
        "device count": f"{s.dp} x {s.tp} x {s.pp} x {s.cp} = {s.devices}, devices = {c.devices}",
        "tp divides heads": f"tp = {s.tp}, heads = {m.num_attention_heads}, kv heads = {m.num_kv_heads}",
        "tp divides ffn": f"tp = {s.tp}, ffn = {m.ffn_hidden_size}",
        "global batch": f"{s.dp} x {s.micro_batch_size} x {s.num_micro_batches} = {s.dp * s.micro_batch_size * s.num_micro_batches}, global batch = {j.global_batch_size}",
        "cp divides seq": f"cp = {s.cp}, seq = {j.seq_length}",
        "ulysses heads": f"cp = {s.cp}, tp = {s.tp}, heads = {m.num_attention_heads}, kv heads = {m.num_kv_heads}",
        "sequence parallel divides seq": f"tp = {s.tp}, seq = {j.seq_length}, cp = {s.cp}",
        "expert parallel": f"ep = {s.ep}, dp x cp = {s.dp * s.cp}" + (f", tp = {s.tp}, folded" if s.fold_experts else "")
                           + (f", experts = {m.moe.num_experts}" if m.moe else ", dense model"),
        "stage layers": f"stage_layers = {list(s.resolved_stage_layers(m.num_layers))}, layers = {m.num_layers}, vpp = {s.virtual_pipeline_stages}",
        "interleaving": f"schedule = {s.pipeline_schedule}, vpp = {s.virtual_pipeline_stages}, pp = {s.pp}, micro-batches = {s.num_micro_batches}, stage layers = {min(s.resolved_stage_layers(m.num_layers))} at fewest",
        "zero stage": f"zero = {s.zero_stage}",
        "recompute modules": f"recompute_modules = {', '.join(j.selective_modules)}, model {m.name}",
        "sequence parallel needs tp": f"tp = {s.tp}",
        "offload needs zero": f"zero = {s.zero_stage}",
        "offload fraction": f"offload_fraction = {s.offload_fraction}, offload_optimizer = {s.offload_optimizer}, "
                            f"offload_params = {s.offload_params}, framework = {j.framework}, zero = {s.zero_stage}",
        "parameter offload": f"zero = {s.zero_stage}, offload_optimizer = {s.offload_optimizer}, framework = {j.framework}",
        "positive degrees": f"dp = {s.dp}, tp = {s.tp}, pp = {s.pp}, cp = {s.cp}, ep = {s.ep}",
        "recompute layers": f"recompute = {s.recompute}, recompute_layers = {s.recompute_layers}",
        "micro-batch copies": f"copies = {s.micro_batch_copies}, micro-batch size = {s.micro_batch_size}",
        "gradient bucket": f"grad_bucket_mb = {s.grad_bucket_mb}, zero = {s.zero_stage}",
        "full batch": f"framework = {j.framework}",
        "framework zero": _zero_detail(j.framework_record, s),
        "framework recompute": f"{j.framework} launches recompute {', '.join(j.framework_record.recompute_kinds)}"
                               + ("" if j.framework_record.recompute_some_layers else " of every layer")
                               + f"; recompute = {s.recompute}, recompute_layers = {s.recompute_layers}",
        "framework schedule": f"{j.framework} runs {', '.join(j.framework_record.schedules)}; "
                              f"schedule = {s.pipeline_schedule}, pp = {s.pp}",
        "framework stage layers": f"{j.framework} runs " + ("stages of any size" if j.framework_record.uneven_stages
                                                             else "equal stages") + (
                                  ", chunks of any size" if j.framework_record.uneven_chunks else
                                  ", each stage a multiple of the virtual stages")
                                  + f"; stage_layers = {list(s.resolved_stage_layers(m.num_layers))}, "
                                  f"vpp = {s.virtual_pipeline_stages}",
        "framework context parallel": f"{j.framework} runs cp_comm {', '.join(j.framework_record.cp_kinds)}"
                                      + ("" if j.framework_record.cp_under_pipeline else " and no cp with pp > 1")
                                      + f"; cp = {s.cp}, cp_comm = {s.cp_comm}, pp = {s.pp}",
        "framework cp attention": _cp_attention_detail(j, s),
        "framework sequence parallel": f"{j.framework} runs sequence_parallel = "
                                       f"{' or '.join(str(v).lower() for v in j.framework_record.sequence_parallel)} "
                                       f"with tp > 1; tp = {s.tp}, sequence_parallel = {str(s.sequence_parallel).lower()}",
        "framework mesh order": f"{j.framework} builds " + " or ".join(" > ".join(o) for o in j.framework_record.mesh_orders or ())
                                + f"; mesh_order = {' > '.join(s.mesh_order)}",
        "host embedding": f"framework = {j.framework}, tied embeddings = {m.tie_embeddings}, offload_params = "
                          f"{s.offload_params}, model {m.name}",
        "cuda graphs": f"cuda_graphs = {', '.join(j.cuda_graphs)}, recompute = {s.recompute}, dropout = {j.dropout}, "
                       f"moe_dropless = {j.moe_dropless}, model {m.name}",
        "swap layers": f"swap_layers = {list(s.swap_layers or ())}, stage_layers = "
                       f"{list(s.resolved_stage_layers(m.num_layers))}, recompute = {s.recompute}",
    }
    return details.get(name, "")
